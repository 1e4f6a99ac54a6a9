//! The load generator: `streams` clients each sending streamed completions back to back, and
//! plain completions at `rate` per (scaled) second, over real HTTP through the proxy. It
//! counts requests and tokens, and the tokens produced while a fault is injected (for the
//! `limit_affected_tokens` guard). `long_streams_<N>` adds N streams held open. While the
//! kubelet emulator has the engine not ready, no new request is sent (a Service sends them
//! to another replica); requests in flight go on. Behind a router it also counts the answers
//! the draft engine gave (by the answer's `model`) and the time to the first token.

use super::experiment::Load;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Plain requests in flight at most (a hung engine must not make the load pile up sockets).
const MAX_PLAIN_IN_FLIGHT: u64 = 256;

/// Times to the first token kept for the percentiles (a run has far fewer requests).
const MAX_LATENCIES: usize = 1_000_000;

/// How requests ended, counted.
#[derive(Debug, Default)]
struct Ends {
    ok: AtomicU64,
    /// Answered with an error, or the connection failed.
    failed: AtomicU64,
    /// No answer within the client's timeout (60 s, scaled).
    timed_out: AtomicU64,
    /// Still waiting for their end when the load stopped (a stream still sending, or a
    /// request a hung engine never answered): neither a success nor a failure, so not in
    /// `attempted`; reported beside it.
    cut_off: AtomicU64,
    /// Completed requests the draft engine answered ([`LoadGen::count_answers_of`]).
    by_draft: AtomicU64,
}

impl Ends {
    fn count(&self, end: End) {
        let c = match end {
            End::Completed => &self.ok,
            End::Failed => &self.failed,
            End::TimedOut => &self.timed_out,
            End::CutOff => &self.cut_off,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot of these counts alone (no tokens, no percentile).
    fn snapshot(&self) -> LoadSnapshot {
        let completed = self.ok.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        let timed_out = self.timed_out.load(Ordering::Relaxed);
        let attempted = completed + failed + timed_out;
        LoadSnapshot {
            attempted,
            completed,
            failed,
            timed_out,
            availability: (attempted > 0).then(|| completed as f64 / attempted as f64),
            by_draft: self.by_draft.load(Ordering::Relaxed),
            cut_off: self.cut_off.load(Ordering::Relaxed),
            ..LoadSnapshot::default()
        }
    }
}

/// Counters, read at any time: every request, and apart those sent after the mark
/// ([`LoadGen::mark`]: the agent's first `abnormal`).
#[derive(Debug, Default)]
pub struct LoadStats {
    all: Ends,
    /// Requests sent after the mark, however they ended.
    after_mark: Ends,
    marked: AtomicBool,
    tokens: AtomicU64,
    /// Tokens received while the fault was injected.
    tokens_under_fault: AtomicU64,
    /// Requests not sent because the engine was not ready (a Service would have sent them
    /// to another replica): in none of the other counts.
    held_back: AtomicU64,
    /// Milliseconds from sending to the first token (a plain request: to its answer), of
    /// every completed request.
    first_token_ms: Mutex<Vec<f64>>,
    plain_in_flight: AtomicU64,
}

/// The counters at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LoadSnapshot {
    /// Requests that ended: completed, failed or timed out.
    pub attempted: u64,
    pub completed: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub tokens: u64,
    pub tokens_under_fault: u64,
    /// Requests held back while the engine was not ready.
    pub held_back: u64,
    /// Completed over attempted; `None` with nothing attempted.
    pub availability: Option<f64>,
    /// Completed requests the draft engine answered (behind a router; 0 otherwise).
    pub by_draft: u64,
    /// The 99th percentile of the time to the first token, milliseconds, over completed
    /// requests; `None` with none.
    pub first_token_p99_ms: Option<f64>,
    /// Requests cut off by the end of the load, in none of the counts above.
    #[serde(default)]
    pub cut_off: u64,
}

impl LoadStats {
    pub fn snapshot(&self) -> LoadSnapshot {
        LoadSnapshot {
            tokens: self.tokens.load(Ordering::Relaxed),
            tokens_under_fault: self.tokens_under_fault.load(Ordering::Relaxed),
            held_back: self.held_back.load(Ordering::Relaxed),
            first_token_p99_ms: p99(&self
                .first_token_ms
                .lock()
                .unwrap_or_else(|p| p.into_inner())),
            ..self.all.snapshot()
        }
    }

    /// Tokens received so far (a peer's sign of real traffic).
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// The requests sent after the mark, by how they ended; `None` before the mark.
    pub fn after_mark(&self) -> Option<LoadSnapshot> {
        self.marked().then(|| self.after_mark.snapshot())
    }

    /// Whether a request sent now is sent after the mark.
    fn marked(&self) -> bool {
        self.marked.load(Ordering::Relaxed)
    }

    /// Notes a completed request: how long its first token took, and who answered.
    fn answered(&self, first_token: Duration, by_draft: bool, sent_marked: bool) {
        if by_draft {
            self.all.by_draft.fetch_add(1, Ordering::Relaxed);
            if sent_marked {
                self.after_mark.by_draft.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut l = self
            .first_token_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if l.len() < MAX_LATENCIES {
            l.push(first_token.as_secs_f64() * 1000.0);
        }
    }

    /// Counts how a request ended; `sent_marked`: it was sent after the mark.
    fn count(&self, end: End, sent_marked: bool) {
        self.all.count(end);
        if sent_marked {
            self.after_mark.count(end);
        }
    }
}

/// The 99th percentile of `v` (nearest rank); `None` when empty.
fn p99(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((s.len() as f64) * 0.99).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Completed,
    Failed,
    TimedOut,
    /// The experiment (or its fault window) ended first: counted apart, not as attempted.
    CutOff,
}

fn ended_by(e: &reqwest::Error) -> End {
    if e.is_timeout() {
        End::TimedOut
    } else {
        End::Failed
    }
}

/// A running load.
#[derive(Debug, Clone)]
pub struct LoadGen {
    pub stats: Arc<LoadStats>,
    under_fault: Arc<AtomicBool>,
    /// The engine takes new requests (the kubelet emulator's readiness).
    ready: Arc<AtomicBool>,
    client: reqwest::Client,
    url: String,
    model: String,
    prompt: String,
    /// Pause before retrying after a failed stream (scaled).
    retry: Duration,
    /// Tokens asked for per request.
    max_tokens: u32,
    /// The draft engine's model name, behind a router.
    draft: Arc<OnceLock<String>>,
    cancel: CancellationToken,
}

impl LoadGen {
    /// Starts the load against `base` (`http://host:port`) until `cancel`. `time_scale`
    /// compresses time: the request rate is per scaled second.
    pub fn start(
        base: &str,
        model: &str,
        load: &Load,
        time_scale: f64,
        cancel: CancellationToken,
    ) -> LoadGen {
        // A request held by a hung engine gives up after 60 s (scaled) without a byte and is
        // counted timed out, so the load does not stay wedged once the fault is gone. A read
        // timeout, not a total one: a long stream that keeps sending is not cut.
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .read_timeout(Duration::from_secs_f64(60.0 * time_scale))
            .build()
            .expect("HTTP client");
        let g = LoadGen {
            stats: Arc::new(LoadStats::default()),
            under_fault: Arc::new(AtomicBool::new(false)),
            ready: Arc::new(AtomicBool::new(true)),
            client,
            url: format!("{base}/v1/completions"),
            model: model.to_owned(),
            // The fake engine counts 4 characters a token.
            prompt: "tok ".repeat(load.prompt_tokens.max(1) as usize),
            retry: Duration::from_secs_f64(0.1 * time_scale).max(Duration::from_millis(1)),
            max_tokens: load.max_tokens,
            draft: Arc::default(),
            cancel,
        };
        for _ in 0..load.streams {
            let (g, max) = (g.clone(), load.max_tokens);
            tokio::spawn(async move {
                while !g.cancel.is_cancelled() {
                    if !g.stream(max, &g.cancel).await {
                        // A failing engine: do not spin.
                        tokio::select! {
                            _ = g.cancel.cancelled() => return,
                            _ = tokio::time::sleep(g.retry) => {}
                        }
                    }
                }
            });
        }
        if load.rate > 0.0 {
            let period = Duration::from_secs_f64(time_scale / load.rate);
            let (g, max) = (g.clone(), load.max_tokens);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = g.cancel.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    if g.stats.plain_in_flight.load(Ordering::Relaxed) >= MAX_PLAIN_IN_FLIGHT {
                        continue;
                    }
                    if !g.ready.load(Ordering::Relaxed) {
                        g.stats.held_back.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let g = g.clone();
                    tokio::spawn(async move {
                        g.stats.plain_in_flight.fetch_add(1, Ordering::Relaxed);
                        let marked = g.stats.marked();
                        tokio::select! {
                            _ = g.cancel.cancelled() => g.stats.count(End::CutOff, marked),
                            _ = g.plain(max, marked) => {}
                        }
                        g.stats.plain_in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            });
        }
        g
    }

    /// Counts the completed requests answered as `model` (the draft engine behind a router)
    /// from now on.
    pub fn count_answers_of(&self, model: &str) {
        let _ = self.draft.set(model.to_owned());
    }

    /// Whether `answer` (an answer, or one streamed chunk of it) names the draft's model.
    fn answered_by_draft(&self, answer: &serde_json::Value) -> bool {
        self.draft
            .get()
            .is_some_and(|d| answer["model"].as_str() == Some(d.as_str()))
    }

    /// Marks now (the agent's first `abnormal`): the requests sent from now on are also
    /// counted apart ([`LoadStats::after_mark`]).
    pub fn mark(&self) {
        self.stats.marked.store(true, Ordering::Relaxed);
    }

    /// Whether the engine takes new requests (the kubelet emulator's readiness).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Waits while the engine is not ready (counting the request held back once); false
    /// when cancelled meanwhile.
    async fn wait_ready(&self, cancel: &CancellationToken) -> bool {
        if self.ready.load(Ordering::Relaxed) {
            return true;
        }
        self.stats.held_back.fetch_add(1, Ordering::Relaxed);
        while !self.ready.load(Ordering::Relaxed) {
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(self.retry) => {}
            }
        }
        true
    }

    /// Marks whether a fault is being injected (for the affected-token count).
    pub fn set_under_fault(&self, on: bool) {
        self.under_fault.store(on, Ordering::Relaxed);
    }

    /// Opens `n` long streams (`max_tokens` each, re-opened when one ends) until the returned
    /// token is cancelled (or the whole load stops).
    pub fn long_streams(&self, n: u32, max_tokens: u32) -> CancellationToken {
        let stop = self.cancel.child_token();
        for _ in 0..n {
            let (g, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if !g.stream(max_tokens, &stop).await {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(g.retry) => {}
                        }
                    }
                }
            });
        }
        stop
    }

    /// Opens `n` streams (the load's own length) spread over `ramp` — from nothing to
    /// saturation — each re-opened when it ends, until the returned token is cancelled.
    pub fn burst(&self, n: u32, ramp: Duration) -> CancellationToken {
        let stop = self.cancel.child_token();
        for i in 0..n {
            let (g, stop) = (self.clone(), stop.clone());
            let delay = ramp.mul_f64(f64::from(i) / f64::from(n.max(1)));
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                while !stop.is_cancelled() {
                    if !g.stream(g.max_tokens, &stop).await {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(g.retry) => {}
                        }
                    }
                }
            });
        }
        stop
    }

    fn count_tokens(&self, n: u64) {
        self.stats.tokens.fetch_add(n, Ordering::Relaxed);
        if self.under_fault.load(Ordering::Relaxed) {
            self.stats
                .tokens_under_fault
                .fetch_add(n, Ordering::Relaxed);
        }
    }

    fn body(&self, max_tokens: u32, stream: bool) -> String {
        serde_json::json!({
            "model": self.model,
            "prompt": self.prompt,
            "max_tokens": max_tokens,
            "stream": stream,
        })
        .to_string()
    }

    /// One streamed completion; true when it ended with `[DONE]`.
    async fn stream(&self, max_tokens: u32, cancel: &CancellationToken) -> bool {
        if !self.wait_ready(cancel).await {
            return false;
        }
        let sent = Instant::now();
        let marked = self.stats.marked();
        let mut first: Option<(Duration, bool)> = None;
        let send = self
            .client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .body(self.body(max_tokens, true))
            .send();
        let resp = tokio::select! {
            _ = cancel.cancelled() => {
                self.stats.count(End::CutOff, marked);
                return false;
            }
            r = send => r,
        };
        let end = match resp {
            Ok(mut r) if r.status().is_success() => {
                // Events are counted by line, so one split across reads counts once.
                let mut buf: Vec<u8> = Vec::new();
                let mut end = End::Failed;
                loop {
                    let chunk = tokio::select! {
                        _ = cancel.cancelled() => {
                            end = End::CutOff;
                            break;
                        }
                        c = r.chunk() => c,
                    };
                    let c = match chunk {
                        Ok(Some(c)) => c,
                        Ok(None) => break,
                        Err(e) => {
                            end = ended_by(&e);
                            break;
                        }
                    };
                    buf.extend_from_slice(&c);
                    while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=nl).collect();
                        if line.starts_with(b"data: {") {
                            self.count_tokens(1);
                            if first.is_none() {
                                let chunk: serde_json::Value =
                                    serde_json::from_slice(&line[6..]).unwrap_or_default();
                                first = Some((sent.elapsed(), self.answered_by_draft(&chunk)));
                            }
                        } else if line.starts_with(b"data: [DONE]") {
                            end = End::Completed;
                        }
                    }
                }
                end
            }
            Ok(_) => End::Failed,
            Err(e) => ended_by(&e),
        };
        self.stats.count(end, marked);
        if end == End::Completed {
            let (t, draft) = first.unwrap_or((sent.elapsed(), false));
            self.stats.answered(t, draft, marked);
        }
        end == End::Completed
    }

    /// One plain completion; `marked`: sent after the mark.
    async fn plain(&self, max_tokens: u32, marked: bool) {
        let sent = Instant::now();
        let r = self
            .client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .body(self.body(max_tokens, false))
            .send()
            .await;
        // Tokens as the answer reports them (`usage.completion_tokens`).
        let end = match r {
            Ok(r) if r.status().is_success() => match r.json::<serde_json::Value>().await {
                Ok(v) => {
                    self.count_tokens(v["usage"]["completion_tokens"].as_u64().unwrap_or(0));
                    self.stats
                        .answered(sent.elapsed(), self.answered_by_draft(&v), marked);
                    End::Completed
                }
                Err(e) => ended_by(&e),
            },
            Ok(_) => End::Failed,
            Err(e) => ended_by(&e),
        };
        self.stats.count(end, marked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A cut-off request is counted apart, never as attempted; the requests sent after the
    // mark are counted apart too, however and whenever they end.
    #[test]
    fn cut_offs_are_counted_apart_and_so_are_requests_sent_after_the_mark() {
        let stats = LoadStats::default();
        stats.count(End::Completed, false);
        stats.count(End::Failed, false);
        assert_eq!(stats.after_mark(), None, "no mark yet");
        stats.marked.store(true, Ordering::Relaxed);
        assert_eq!(stats.after_mark().unwrap().attempted, 0);
        // Sent before the mark, ended after it: not in the after-mark counts.
        stats.count(End::TimedOut, false);
        for end in [End::Completed, End::Completed, End::Completed, End::Failed] {
            stats.count(end, true);
        }
        stats.count(End::CutOff, true);
        stats.answered(Duration::from_millis(5), true, true);
        stats.answered(Duration::from_millis(5), true, false);
        let all = stats.snapshot();
        assert_eq!((all.attempted, all.completed, all.cut_off), (7, 4, 1));
        assert_eq!((all.by_draft, all.timed_out), (2, 1));
        let after = stats.after_mark().unwrap();
        assert_eq!(
            (
                after.attempted,
                after.completed,
                after.failed,
                after.timed_out
            ),
            (4, 3, 1, 0)
        );
        assert_eq!((after.cut_off, after.by_draft), (1, 1));
        assert_eq!(after.availability, Some(0.75));
        assert_eq!(after.first_token_p99_ms, None);
    }
}
