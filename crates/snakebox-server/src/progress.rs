//! What a running script prints, as progress notifications of whole lines.
//!
//! Output arrives in the pieces the pipe happened to deliver (`'step'`, `' '`, `'1\n'`),
//! and a client shows each notification as it comes: pieces read as noise. The lines of
//! each stream are put back together here; a notification carries the complete lines read
//! so far, and a partial line is sent anyway once it has waited [`FLUSH_AFTER`] (a progress
//! bar redrawn with `\r`, a prompt) or grown past [`MAX_PENDING`].

use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use snakebox_engine::{OutputChunk, Stream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

/// How long a partial line waits for the rest of it.
const FLUSH_AFTER: Duration = Duration::from_millis(200);
/// A partial line longer than this is sent without waiting.
const MAX_PENDING: usize = 64 * 1024;

/// The two streams' partial lines.
#[derive(Default)]
struct Lines {
    stdout: String,
    stderr: String,
    /// When the oldest partial line began waiting.
    waiting_since: Option<Instant>,
}

impl Lines {
    /// Add a chunk; returns the text ready to send (complete lines, or a partial line that
    /// grew too long), if any.
    fn push(&mut self, chunk: OutputChunk, now: Instant) -> Option<String> {
        let pending = match chunk.stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        pending.push_str(&chunk.text);
        let ready = match pending.rfind('\n') {
            _ if pending.len() > MAX_PENDING => std::mem::take(pending),
            Some(end) => {
                let rest = pending.split_off(end + 1);
                std::mem::replace(pending, rest)
            }
            None => String::new(),
        };
        if self.stdout.is_empty() && self.stderr.is_empty() {
            self.waiting_since = None;
        } else if self.waiting_since.is_none() {
            self.waiting_since = Some(now);
        }
        (!ready.is_empty()).then_some(ready)
    }

    /// Everything still waiting, stdout first.
    fn flush(&mut self) -> Option<String> {
        self.waiting_since = None;
        let text = std::mem::take(&mut self.stdout) + &std::mem::take(&mut self.stderr);
        (!text.is_empty()).then_some(text)
    }

    /// When the partial lines must be sent, if there are any.
    fn deadline(&self) -> Option<Instant> {
        self.waiting_since.map(|since| since + FLUSH_AFTER)
    }
}

/// Send `output` to `peer` as progress notifications of `token` until the output ends (the
/// run finished) or the client is gone.
pub(crate) async fn forward(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut output: UnboundedReceiver<OutputChunk>,
) {
    let mut lines = Lines::default();
    let mut count = 0.0_f64;
    loop {
        let next = match lines.deadline() {
            Some(deadline) => tokio::time::timeout_at(deadline, output.recv()).await,
            None => Ok(output.recv().await),
        };
        let (ready, done) = match next {
            Ok(Some(chunk)) => (lines.push(chunk, Instant::now()), false),
            Ok(None) => (lines.flush(), true),
            Err(_waited) => (lines.flush(), false),
        };
        if let Some(text) = ready {
            count += 1.0;
            let mut param = ProgressNotificationParam::new(token.clone(), count);
            param.message = Some(text);
            if peer.notify_progress(param).await.is_err() {
                return;
            }
        }
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(stream: Stream, text: &str) -> OutputChunk {
        OutputChunk {
            stream,
            text: text.to_owned(),
        }
    }

    #[test]
    fn pieces_become_whole_lines_per_stream() {
        let mut lines = Lines::default();
        let now = Instant::now();
        assert_eq!(lines.push(chunk(Stream::Stdout, "step"), now), None);
        assert_eq!(lines.push(chunk(Stream::Stderr, "warn"), now), None);
        assert_eq!(lines.push(chunk(Stream::Stdout, " "), now), None);
        assert_eq!(
            lines.push(chunk(Stream::Stdout, "1\nstep 2\nst"), now),
            Some("step 1\nstep 2\n".to_owned())
        );
        assert_eq!(lines.deadline(), Some(now + FLUSH_AFTER));
        assert_eq!(
            lines.push(chunk(Stream::Stderr, "ing\n"), now),
            Some("warning\n".to_owned())
        );
        assert_eq!(lines.flush(), Some("st".to_owned()));
        assert_eq!(lines.deadline(), None);
        assert_eq!(lines.flush(), None);
    }

    #[test]
    fn a_long_partial_line_is_sent_without_waiting() {
        let mut lines = Lines::default();
        let long = "x".repeat(MAX_PENDING + 1);
        assert_eq!(
            lines.push(chunk(Stream::Stdout, &long), Instant::now()),
            Some(long)
        );
        assert_eq!(lines.deadline(), None);
    }
}
