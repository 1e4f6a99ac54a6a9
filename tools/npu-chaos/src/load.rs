//! The load generator: `streams` clients each sending streamed completions back to back, and
//! plain completions at `rate` per (scaled) second, over real HTTP through the proxy. It
//! counts requests and tokens, and the tokens produced while a fault is injected (for the
//! `limit_affected_tokens` guard). `long_streams_<N>` adds N streams held open.

use super::experiment::Load;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Plain requests in flight at most (a hung engine must not make the load pile up sockets).
const MAX_PLAIN_IN_FLIGHT: u64 = 256;

/// Counters, read at any time.
#[derive(Debug, Default)]
pub struct LoadStats {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub tokens: AtomicU64,
    /// Tokens received while the fault was injected.
    pub tokens_under_fault: AtomicU64,
    plain_in_flight: AtomicU64,
}

impl LoadStats {
    /// `(ok, failed, tokens, tokens under fault)`.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.tokens.load(Ordering::Relaxed),
            self.tokens_under_fault.load(Ordering::Relaxed),
        )
    }
}

/// A running load.
#[derive(Debug, Clone)]
pub struct LoadGen {
    pub stats: Arc<LoadStats>,
    under_fault: Arc<AtomicBool>,
    client: reqwest::Client,
    url: String,
    model: String,
    prompt: String,
    /// Pause before retrying after a failed stream (scaled).
    retry: Duration,
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
        // A request held by a hung engine gives up after 60 s (scaled) and is counted failed,
        // so the load does not stay wedged once the fault is gone.
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs_f64(60.0 * time_scale))
            .build()
            .expect("HTTP client");
        let g = LoadGen {
            stats: Arc::new(LoadStats::default()),
            under_fault: Arc::new(AtomicBool::new(false)),
            client,
            url: format!("{base}/v1/completions"),
            model: model.to_owned(),
            // The fake engine counts 4 characters a token.
            prompt: "tok ".repeat(load.prompt_tokens.max(1) as usize),
            retry: Duration::from_secs_f64(0.1 * time_scale).max(Duration::from_millis(1)),
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
                    let g = g.clone();
                    tokio::spawn(async move {
                        g.stats.plain_in_flight.fetch_add(1, Ordering::Relaxed);
                        tokio::select! {
                            _ = g.cancel.cancelled() => {}
                            _ = g.plain(max) => {}
                        }
                        g.stats.plain_in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            });
        }
        g
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
        let send = self
            .client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .body(self.body(max_tokens, true))
            .send();
        let resp = tokio::select! {
            _ = cancel.cancelled() => return false,
            r = send => r,
        };
        let ok = match resp {
            Ok(mut r) if r.status().is_success() => {
                // Events are counted by line, so one split across reads counts once.
                let mut buf: Vec<u8> = Vec::new();
                let mut done = false;
                loop {
                    let chunk = tokio::select! {
                        _ = cancel.cancelled() => break,
                        c = r.chunk() => c,
                    };
                    let Ok(Some(c)) = chunk else { break };
                    buf.extend_from_slice(&c);
                    while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=nl).collect();
                        if line.starts_with(b"data: {") {
                            self.count_tokens(1);
                        } else if line.starts_with(b"data: [DONE]") {
                            done = true;
                        }
                    }
                }
                done
            }
            _ => false,
        };
        let counter = if ok {
            &self.stats.ok
        } else {
            &self.stats.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ok
    }

    /// One plain completion.
    async fn plain(&self, max_tokens: u32) {
        let r = self
            .client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .body(self.body(max_tokens, false))
            .send()
            .await;
        // Tokens as the answer reports them (`usage.completion_tokens`).
        let tokens = match r {
            Ok(r) if r.status().is_success() => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .map(|v| v["usage"]["completion_tokens"].as_u64().unwrap_or(0)),
            _ => None,
        };
        match tokens {
            Some(n) => {
                self.stats.ok.fetch_add(1, Ordering::Relaxed);
                self.count_tokens(n);
            }
            None => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
