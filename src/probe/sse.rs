//! The server-sent events of a streamed completion (`"stream": true`), parsed as they
//! arrive: which event is the first token, how many tokens came, whether the closing
//! `[DONE]` did. Arbitrary bytes in arbitrary chunks are an error, never a panic.

use serde_json::Value;
use std::time::{Duration, Instant};

/// Largest event kept while waiting for its blank line.
const MAX_EVENT: usize = 1 << 20;

/// Token timing of a streamed answer.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    buf: Vec<u8>,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u32,
    done: bool,
}

impl Stream {
    /// Takes one chunk of the body received at `now`; `Err` on an event that is not JSON.
    pub(crate) fn feed(&mut self, chunk: &[u8], now: Instant) -> Result<(), String> {
        self.buf.extend_from_slice(chunk);
        // Events end with a blank line (LF or CRLF).
        while let Some(end) = find_event_end(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end.1).collect();
            self.event(&event[..end.0], now)?;
        }
        if self.buf.len() > MAX_EVENT {
            return Err(format!("event larger than {MAX_EVENT} bytes"));
        }
        Ok(())
    }

    fn event(&mut self, event: &[u8], now: Instant) -> Result<(), String> {
        let text = String::from_utf8_lossy(event);
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                self.done = true;
                continue;
            }
            if self.done {
                return Err("data after [DONE]".to_owned());
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("event is not JSON: {e}"))?;
            // vLLM reports an error inside a started stream as an event with `error` (or
            // `object: "error"`) and then ends it.
            if v.get("error").is_some() || v.get("object").and_then(Value::as_str) == Some("error")
            {
                let msg = v
                    .pointer("/error/message")
                    .or_else(|| v.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                return Err(format!(
                    "the engine reported an error: {}",
                    crate::logging::quote(msg)
                ));
            }
            if v.get("choices")
                .and_then(Value::as_array)
                .is_some_and(|c| !c.is_empty())
            {
                self.first.get_or_insert(now);
                self.last = Some(now);
                self.tokens += 1;
            }
        }
        Ok(())
    }
}

/// (end of the event's text, end of its terminating blank line) of the first complete event.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

impl Stream {
    /// Ends the stream (a last event may lack its blank line): (time to first token from
    /// `started`, time per output token after the first), or why the stream was not a
    /// complete answer.
    pub(crate) fn finish(
        mut self,
        started: Instant,
        now: Instant,
    ) -> Result<(Duration, Option<Duration>), String> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.event(&rest, now)?;
        }
        let Some(first) = self.first else {
            return Err("the stream carried no token".to_owned());
        };
        if !self.done {
            return Err("the stream ended without [DONE] (truncated)".to_owned());
        }
        let tpot = match self.last {
            Some(last) if self.tokens > 1 => Some((last - first) / (self.tokens - 1)),
            _ => None,
        };
        Ok((first.saturating_duration_since(started), tpot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        // An engine's streamed answer, arbitrary bytes in arbitrary chunks (and SSE-shaped
        // ones): never a panic; an error says why.
        #[test]
        fn stream_parser_never_panics(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), 0..12),
            events in proptest::collection::vec("(data: ?(\\[DONE\\]|\\{[ -~]{0,40}\\}|[ -~]{0,20})|event: x|: c|)(\n\n|\r\n\r\n|\n)", 0..12),
        ) {
            let now = Instant::now();
            let mut s = Stream::default();
            for c in &chunks {
                if let Err(e) = s.feed(c, now) {
                    proptest::prop_assert!(!e.is_empty());
                    break;
                }
            }
            let mut s = Stream::default();
            for e in &events {
                if let Err(e) = s.feed(e.as_bytes(), now) {
                    proptest::prop_assert!(!e.is_empty());
                    break;
                }
            }
        }
    }

    // Server-sent events split anywhere, LF or CRLF: the first event with a choice is the
    // first token, the spacing of the rest gives the time per output token.
    #[test]
    fn stream_timing_from_events() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ev =
            |i: u32| format!("data: {{\"choices\": [{{\"index\": 0, \"text\": \"t{i}\"}}]}}\n\n");
        let mut st = Stream::default();
        // Role/keep-alive lines without choices are not tokens.
        st.feed(b": keep-alive\n\ndata: {\"choices\": []}\n\n", at(5))
            .unwrap();
        assert_eq!(st.tokens, 0);
        let first = ev(0);
        let (a, b) = first.split_at(10);
        st.feed(a.as_bytes(), at(10)).unwrap();
        assert_eq!(st.tokens, 0, "half an event");
        st.feed(b.as_bytes(), at(20)).unwrap();
        assert_eq!(st.first, Some(at(20)));
        st.feed(ev(1).replace("\n\n", "\r\n\r\n").as_bytes(), at(30))
            .unwrap();
        st.feed(
            format!("{}{}data: [DONE]\n\n", ev(2), ev(3)).as_bytes(),
            at(50),
        )
        .unwrap();
        assert_eq!(st.tokens, 4);
        assert!(st.done);
        assert_eq!(st.last, Some(at(50)));
        let mut bad = Stream::default();
        assert!(
            bad.feed(b"data: <html>\n\n", at(1))
                .unwrap_err()
                .contains("not JSON")
        );
    }
}
