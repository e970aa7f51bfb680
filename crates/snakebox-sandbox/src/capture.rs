//! Capped capture of stdout and stderr: one byte budget shared by both streams, head and tail
//! kept per stream, memory bounded however much the child prints.
//!
//! Each stream keeps at most `budget / 2` bytes of head and a ring of `budget / 2` bytes of tail
//! while the run is going (so at most `2 × budget` bytes in memory for the whole run). Only at
//! the end, when both totals are known, is the budget split between the streams: a stream that
//! needs less than half keeps all of it and leaves the rest to the other. A stream that is cut
//! keeps its head and its tail around a marker line, and the marker counts against the budget,
//! so `stdout.text.len() + stderr.text.len() <= budget` for valid UTF-8 output (invalid bytes are
//! replaced by U+FFFD, which may add up to two bytes each).

use std::collections::VecDeque;

use crate::Captured;

/// Bytes of one stream kept while the run goes on.
#[derive(Debug)]
pub(crate) struct StreamCapture {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl StreamCapture {
    /// A capture able to serve any share of `budget` bytes.
    pub(crate) fn new(budget: u64) -> Self {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let head_cap = budget / 2;
        Self {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: budget - head_cap,
            total: 0,
        }
    }

    /// Record bytes the child wrote.
    pub(crate) fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return;
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    /// Bytes written so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The kept text when this stream may use `share` bytes.
    fn finish(&self, share: u64) -> Captured {
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let kept = (self.head.len() + tail.len()) as u64;
        let complete = kept == self.total;
        if complete && self.total <= share {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return Captured {
                text: String::from_utf8_lossy(&all).into_owned(),
                truncated: false,
                total_bytes: self.total,
            };
        }
        // The marker's length depends on the number it shows; the total is an upper bound.
        let marker_room = marker(self.total).len() as u64;
        let keep = usize::try_from(share.saturating_sub(marker_room)).unwrap_or(usize::MAX);
        let mut head_n = (keep / 2).min(self.head.len());
        let mut tail_n = (keep - head_n).min(if complete {
            kept as usize - head_n
        } else {
            tail.len()
        });
        // Never cut a UTF-8 sequence in two: back off to a character boundary on both sides.
        let joined: Vec<u8> = if complete {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            all
        } else {
            Vec::new()
        };
        let head_src: &[u8] = &self.head;
        let tail_src: &[u8] = if complete { &joined } else { &tail };
        while head_n > 0 && is_continuation(head_src.get(head_n).copied()) {
            head_n -= 1;
        }
        while tail_n > 0 && is_continuation(tail_src.get(tail_src.len() - tail_n).copied()) {
            tail_n -= 1;
        }
        let dropped = self.total - head_n as u64 - tail_n as u64;
        let mut bytes = Vec::with_capacity(head_n + tail_n + marker_room as usize);
        bytes.extend_from_slice(&head_src[..head_n]);
        bytes.extend_from_slice(marker(dropped).as_bytes());
        bytes.extend_from_slice(&tail_src[tail_src.len() - tail_n..]);
        Captured {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            truncated: true,
            total_bytes: self.total,
        }
    }
}

fn is_continuation(byte: Option<u8>) -> bool {
    byte.is_some_and(|b| b & 0b1100_0000 == 0b1000_0000)
}

/// The line put where bytes were dropped.
pub(crate) fn marker(dropped: u64) -> String {
    format!("\n[... {dropped} bytes truncated ...]\n")
}

/// Split `budget` between the two streams and render both.
pub(crate) fn finish_pair(
    stdout: &StreamCapture,
    stderr: &StreamCapture,
    budget: u64,
) -> (Captured, Captured) {
    let (a, b) = (stdout.total(), stderr.total());
    let half = budget / 2;
    let (share_a, share_b) = if a.saturating_add(b) <= budget {
        (a, b)
    } else if a <= half {
        (a, budget - a)
    } else if b <= half {
        (budget - b, b)
    } else {
        (half, budget - half)
    };
    (stdout.finish(share_a), stderr.finish(share_b))
}

/// Streaming forwarder of chunks to the caller, with its own cap (the same budget), so a
/// flood cannot grow an unbounded channel. A UTF-8 sequence split across reads is carried over.
#[derive(Debug, Default)]
pub(crate) struct Forwarder {
    carry: Vec<u8>,
}

impl Forwarder {
    /// Text to forward for `data`, given that `allowed` more bytes may be forwarded.
    pub(crate) fn text(&mut self, data: &[u8], allowed: usize) -> Option<String> {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(&data[..data.len().min(allowed)]);
        // Keep an incomplete trailing sequence (at most 3 bytes) for the next read.
        let cut = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        self.carry = bytes.split_off(cut);
        (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(budget: u64, data: &[u8], chunk: usize) -> StreamCapture {
        let mut c = StreamCapture::new(budget);
        for part in data.chunks(chunk.max(1)) {
            c.push(part);
        }
        c
    }

    #[test]
    fn small_output_is_kept_whole() {
        let out = capture(100, b"hello\n", 3);
        let err = capture(100, b"oops\n", 3);
        let (o, e) = finish_pair(&out, &err, 100);
        assert_eq!(o.text, "hello\n");
        assert_eq!(e.text, "oops\n");
        assert!(!o.truncated && !e.truncated);
        assert_eq!((o.total_bytes, e.total_bytes), (6, 5));
    }

    #[test]
    fn big_stream_keeps_head_and_tail_within_budget() {
        let data: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let out = capture(1000, &data, 777);
        let err = capture(1000, b"", 1);
        let (o, e) = finish_pair(&out, &err, 1000);
        assert!(o.truncated);
        assert!(o.text.len() <= 1000, "{}", o.text.len());
        assert!(o.text.len() > 900);
        assert!(o.text.starts_with("abcdefghij"));
        let tail_expected = String::from_utf8(data[data.len() - 100..].to_vec()).unwrap();
        assert!(o.text.ends_with(&tail_expected));
        assert!(o.text.contains(" bytes truncated ...]"));
        assert_eq!(o.total_bytes, 100_000);
        assert_eq!(e.text, "");
    }

    #[test]
    fn marker_counts_exact_dropped_bytes() {
        let data = vec![b'x'; 10_000];
        let out = capture(200, &data, 64);
        let (o, _) = finish_pair(&out, &StreamCapture::new(200), 200);
        let dropped: u64 = o
            .text
            .split("[... ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        let kept = o.text.len() - marker(dropped).len();
        assert_eq!(dropped + kept as u64, 10_000);
    }

    #[test]
    fn both_streams_share_one_budget() {
        let out = capture(1000, &vec![b'o'; 50_000], 1000);
        let err = capture(1000, &vec![b'e'; 50_000], 1000);
        let (o, e) = finish_pair(&out, &err, 1000);
        assert!(o.truncated && e.truncated);
        assert!(o.text.len() + e.text.len() <= 1000);
        assert!(o.text.len() >= 400 && e.text.len() >= 400);
    }

    #[test]
    fn quiet_stream_leaves_its_share_to_the_other() {
        let out = capture(1000, &vec![b'o'; 50_000], 1000);
        let err = capture(1000, b"warning: x\n", 1000);
        let (o, e) = finish_pair(&out, &err, 1000);
        assert_eq!(e.text, "warning: x\n");
        assert!(!e.truncated);
        assert!(o.text.len() + e.text.len() <= 1000);
        assert!(o.text.len() > 900);
    }

    #[test]
    fn stream_just_over_half_spilled_into_tail_is_rendered_contiguously() {
        // head fills (500), tail gets 10 bytes, nothing dropped yet; share is smaller than total.
        let data: Vec<u8> = (0..510u32).map(|i| b'0' + (i % 10) as u8).collect();
        let out = capture(1000, &data, 7);
        let err = capture(1000, &vec![b'e'; 5000], 100);
        let (o, e) = finish_pair(&out, &err, 1000);
        assert!(o.truncated && e.truncated);
        assert!(o.text.len() + e.text.len() <= 1000);
        let tail_expected = String::from_utf8(data[data.len() - 50..].to_vec()).unwrap();
        assert!(o.text.ends_with(&tail_expected));
    }

    #[test]
    fn utf8_is_not_cut_inside_a_character() {
        let data = "é".repeat(10_000);
        let out = capture(101, data.as_bytes(), 33);
        let (o, _) = finish_pair(&out, &StreamCapture::new(101), 101);
        assert!(!o.text.contains('\u{FFFD}'), "{}", o.text);
        assert!(o.text.len() <= 101);
    }

    #[test]
    fn memory_stays_bounded() {
        let mut c = StreamCapture::new(4096);
        let chunk = vec![b'z'; 65536];
        for _ in 0..100 {
            c.push(&chunk);
        }
        assert!(c.head.len() + c.tail.len() <= 4096);
        assert!(c.tail.capacity() < 3 * 65536);
        assert_eq!(c.total(), 6_553_600);
    }

    #[test]
    fn forwarder_carries_split_characters_and_caps() {
        let mut f = Forwarder::default();
        let bytes = "aé".as_bytes();
        assert_eq!(f.text(&bytes[..2], 100).as_deref(), Some("a"));
        assert_eq!(f.text(&bytes[2..], 100).as_deref(), Some("é"));
        assert_eq!(f.text(b"abcdef", 3).as_deref(), Some("abc"));
        assert_eq!(f.text(b"abcdef", 0), None);
    }
}
