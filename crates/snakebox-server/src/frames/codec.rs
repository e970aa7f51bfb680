//! Newline-delimited frames of bounded size, as a `tokio_util` decoder.
//!
//! The decoder takes every byte it is given at once (the reader's buffer stays one read
//! long), collects the current line in a buffer of its own that never grows past the limit,
//! and hands the line over whole, buffer and all, so its memory goes with the frame. A line
//! that passes the limit is discarded as it streams: only its first [`HEAD_BYTES`] are kept,
//! so the caller can still read the `id` that clients write near the start.

use tokio_util::bytes::BytesMut;
use tokio_util::codec::Decoder;

/// How much of an oversized line is kept to read its `id` from.
pub(crate) const HEAD_BYTES: usize = 64 * 1024;

/// One newline-delimited frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A whole line, without its `\n` (and without a `\r` before it).
    Line(Vec<u8>),
    /// A line longer than the limit: its first bytes, and how long it was.
    Oversized {
        /// The first [`HEAD_BYTES`] bytes of the line.
        head: Vec<u8>,
        /// Its length in bytes (without the `\n`); a lower bound when the input ended first.
        length: u64,
    },
}

/// The decoder: `\n`-terminated lines of at most `limit` bytes (the `\n` not counted).
#[derive(Debug)]
pub(crate) struct FrameCodec {
    limit: usize,
    /// The line so far (never longer than `limit`).
    line: Vec<u8>,
    /// Set while the rest of an oversized line is skipped: its head and its length so far.
    discarding: Option<(Vec<u8>, u64)>,
}

impl FrameCodec {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            line: Vec::new(),
            discarding: None,
        }
    }

    /// Append `bytes` to the line, or start discarding when the line would pass the limit.
    fn take(&mut self, bytes: &[u8]) {
        if let Some((_, length)) = &mut self.discarding {
            *length += bytes.len() as u64;
            return;
        }
        let wanted = self.line.len() + bytes.len();
        if wanted > self.limit {
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(
                &bytes[..bytes.len().min(HEAD_BYTES.saturating_sub(head.len()))],
            );
            head.truncate(HEAD_BYTES);
            head.shrink_to_fit();
            self.discarding = Some((head, wanted as u64));
            return;
        }
        if wanted > self.line.capacity() {
            // Grow by doubling, but never past the limit: the bound holds for the allocation too.
            let target = wanted.max(self.line.capacity() * 2).min(self.limit);
            self.line.reserve_exact(target - self.line.len());
        }
        self.line.extend_from_slice(bytes);
    }

    /// The frame that ends here; the line's buffer goes with it.
    fn finish(&mut self) -> Frame {
        if let Some((head, length)) = self.discarding.take() {
            return Frame::Oversized { head, length };
        }
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Frame::Line(line)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(end) = src.iter().position(|byte| *byte == b'\n') {
            let chunk = src.split_to(end + 1);
            self.take(&chunk[..end]);
            return Ok(Some(self.finish()));
        }
        let chunk = src.split();
        self.take(&chunk);
        Ok(None)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        // A last line without its `\n` is still a frame.
        if self.line.is_empty() && self.discarding.is_none() {
            return Ok(None);
        }
        Ok(Some(self.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `chunks` one at a time (as reads would), then the end of input.
    fn frames(limit: usize, chunks: &[&[u8]]) -> Vec<Frame> {
        let mut codec = FrameCodec::new(limit);
        let mut buffer = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buffer.extend_from_slice(chunk);
            while let Some(frame) = codec.decode(&mut buffer).expect("decode") {
                out.push(frame);
            }
            assert!(
                buffer.is_empty(),
                "the decoder leaves nothing in the read buffer"
            );
            assert!(
                codec.line.capacity() <= limit,
                "the line buffer passed the limit"
            );
        }
        while let Some(frame) = codec.decode_eof(&mut buffer).expect("decode_eof") {
            out.push(frame);
        }
        out
    }

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    #[test]
    fn lines_split_across_reads_come_out_whole() {
        assert_eq!(
            frames(100, &[b"{\"a\":", b"1}\n{\"b\"", b":2}\r\n\n"]),
            vec![line("{\"a\":1}"), line("{\"b\":2}"), line("")]
        );
    }

    #[test]
    fn a_line_at_the_limit_passes_and_one_byte_more_does_not() {
        assert_eq!(frames(5, &[b"12345\n"]), vec![line("12345")]);
        assert_eq!(
            frames(5, &[b"123456\nok\n"]),
            vec![
                Frame::Oversized {
                    head: b"123456".to_vec(),
                    length: 6
                },
                line("ok")
            ]
        );
    }

    #[test]
    fn an_oversized_line_is_discarded_as_it_streams_and_keeps_its_head() {
        let limit = HEAD_BYTES * 2;
        let chunk = vec![b'x'; HEAD_BYTES];
        let chunks: Vec<&[u8]> = std::iter::repeat_n(chunk.as_slice(), 10)
            .chain([b"\n{}\n".as_slice()])
            .collect();
        let out = frames(limit, &chunks);
        assert_eq!(out.len(), 2);
        match &out[0] {
            Frame::Oversized { head, length } => {
                assert_eq!(head.len(), HEAD_BYTES);
                assert_eq!(*length, 10 * HEAD_BYTES as u64);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(out[1], line("{}"));
    }

    #[test]
    fn the_last_line_without_a_newline_is_a_frame() {
        assert_eq!(frames(10, &[b"{}\n[1]"]), vec![line("{}"), line("[1]")]);
        assert_eq!(frames(10, &[b"{}\n"]), vec![line("{}")]);
        assert_eq!(
            frames(2, &[b"abc"]),
            vec![Frame::Oversized {
                head: b"abc".to_vec(),
                length: 3
            }]
        );
    }
}
