//! The virtual inference loop, MindIE V5 semantics (virtual-inference-reference §1.4–§1.5).
//!
//! One warm-up request (180 s timeout; failure → abnormal, the loop never starts), then
//! periodic requests (5 s timeout). After each request the AI Cube peak of the last 5 s is
//! read from the ring — instantly, instead of the reference's 4 `npu-smi` spawns that run
//! while the request is in flight; the window covers the request itself. Interval: 20 s after
//! a peak ≥ 80, back to 5 s only after a peak below the threshold. Failure accounting, in
//! the reference's order:
//! 1. peak available, below the threshold, request failed → count + 1; abnormal at max;
//! 2. request failed, peak unavailable → unchanged;
//! 3. request succeeded, or peak at or above the threshold → reset to 0.
//!
//! Two opt-in rules change that accounting (off by default, for V5 parity):
//! - stall detection (`stall_window`): in case 3, a *failed* request on a busy NPU counts
//!   (+ 1) when the engine has shown no sign of life for `stall_window`: requests running
//!   and neither the prompt nor the generation token counter advancing
//!   ([`EngineSignals::stalled_for`]), *and* no virtual request served in that time. vLLM
//!   adds a prompt to its counter only when the request's first token comes out, so a long
//!   prefill with nothing else decoding leaves both counters flat; but chunked prefill
//!   schedules the 1-token probe beside the prefill's chunks, and a served probe is
//!   evidence of life. Unknown progress (no scrape) never counts;
//! - the reference V6 rule (`skip_when_capacity_waiting`): in case 1, the engine's `/metrics`
//!   is read at once; the failure is not counted while requests wait for KV-cache capacity,
//!   or when that figure cannot be read (the scrape failed, or the value is not a number: the
//!   reference skips then too). An engine that does not export the series at all (vLLM
//!   0.18.0, SGLang) is counted as V5 counts: the rule cannot apply to it, and skipping
//!   would never count an idle failure again. (The reference skips there too, so on vLLM
//!   0.18 it never detects an idle hang; docs/qos.md.)
//!
//! Abnormal is never cleared by the loop; the loop stops at the next check.

use crate::config::Timing;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why a virtual request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Timeout,
    /// Connection refused, reset, TLS error.
    Transport(String),
    /// Non-2xx status.
    Status(u16),
    /// 2xx but the body is not JSON.
    BadBody(String),
    /// A streamed probe (`probe_max_tokens` > 1) whose stream was not a complete answer: an
    /// event not JSON, an error event, no token, or no `[DONE]`.
    BadStream(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => write!(f, "timed out"),
            Failure::Transport(e) => write!(f, "transport error: {e}"),
            Failure::Status(s) => write!(f, "HTTP {s}"),
            Failure::BadBody(e) => write!(f, "body is not JSON: {e}"),
            Failure::BadStream(e) => write!(f, "bad stream: {e}"),
        }
    }
}

/// Result of one virtual request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub outcome: Result<(), Failure>,
    /// Time to the complete answer (or to the failure).
    pub latency: Duration,
    /// Time to the first token when the probe streamed (`probe_max_tokens` > 1); for the
    /// reference's 1-token request the answer is the first token, so `latency` is the TTFT.
    pub ttft: Option<Duration>,
    /// Time per output token after the first, when the probe streamed.
    pub tpot: Option<Duration>,
}

impl ProbeResult {
    /// A result of a non-streamed request.
    pub fn new(outcome: Result<(), Failure>, latency: Duration) -> ProbeResult {
        ProbeResult {
            outcome,
            latency,
            ttft: None,
            tpot: None,
        }
    }

    /// Time to first token of a successful probe.
    pub fn first_token(&self) -> Option<Duration> {
        self.outcome
            .is_ok()
            .then(|| self.ttft.unwrap_or(self.latency))
    }
}

/// Sends the virtual request (the real HTTP client, or a test double).
pub trait Prober {
    fn send(&self, timeout: Duration) -> impl Future<Output = ProbeResult> + Send;
}

/// Peak AI Cube usage of the engine's NPUs over the last `window`; `None` when unavailable.
pub trait PeakSource {
    fn peak(&self, window: Duration) -> Option<f64>;
}

/// Engine-side signals for the opt-in accounting rules.
pub trait EngineSignals {
    /// How long the engine has made no forward progress (requests running, no token counter
    /// advancing), from the latest `/metrics` scrapes; `None` when it is not stalled or that
    /// is unknown.
    fn stalled_for(&self) -> Option<Duration>;
    /// Requests waiting for KV-cache capacity, read from the engine now (V6 rule).
    fn waiting_for_capacity(&self) -> impl Future<Output = CapacityWaiting> + Send;
}

/// What a fresh read of the engine's waiting-for-capacity figure said (V6 rule).
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityWaiting {
    /// This many requests wait for KV-cache capacity.
    Waiting(f64),
    /// The scrape succeeded and has no such series: the engine does not export it.
    NotExported,
    /// The figure could not be read (scrape failed, value not a number): why.
    Unknown(String),
}

/// No engine signals: only the reference's rules apply (the opt-in rules must be off).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSignals;

impl EngineSignals for NoSignals {
    fn stalled_for(&self) -> Option<Duration> {
        None
    }
    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        CapacityWaiting::Unknown("no engine signals".to_owned())
    }
}

/// What the loop is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for the first `/status` with a healthy engine.
    NotStarted,
    /// Disabled by a gate (see the conditions).
    Disabled,
    WarmingUp,
    Running,
    /// Stopped after `abnormal` (or shut down).
    Stopped,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::NotStarted,
            1 => Phase::Disabled,
            2 => Phase::WarmingUp,
            3 => Phase::Running,
            _ => Phase::Stopped,
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            Phase::NotStarted => 0,
            Phase::Disabled => 1,
            Phase::WarmingUp => 2,
            Phase::Running => 3,
            Phase::Stopped => 4,
        }
    }
}

/// How a probe changed the failure count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Accounting {
    /// Failed with the NPU idle (reference rule 1).
    Incremented,
    /// Failed with the NPU busy and the engine stalled for `stall_window` (stall detection).
    IncrementedStalled,
    /// Failed with AI Cube usage unavailable (reference rule 2).
    Unchanged,
    /// Failed with the NPU idle while requests wait for capacity, or that figure is unknown
    /// (V6 rule, `skip_when_capacity_waiting`).
    UnchangedCapacityWaiting,
    Reset,
    /// Warm-up requests are not counted; a failed warm-up is abnormal at once.
    WarmUp,
}

/// One probe, for `/status/detail`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeRecord {
    /// When it completed, on the monotonic clock (ages are computed from this).
    #[serde(skip)]
    pub at: tokio::time::Instant,
    /// Unix time in milliseconds.
    pub at_unix_ms: u64,
    pub warmup: bool,
    pub latency_ms: f64,
    /// `success` or the failure.
    pub outcome: String,
    pub success: bool,
    /// Time to first token of a successful probe, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time per output token when the probe streamed more than one token, milliseconds.
    pub tpot_ms: Option<f64>,
    /// Window peak read after the probe (`null`: unavailable or warm-up).
    pub peak: Option<f64>,
    pub accounting: Accounting,
    pub failure_count: i64,
}

/// Upper bounds (seconds) of the probe latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Loop state shared with `/status` (atomics) and `/status/detail` and metrics.
#[derive(Debug, Default)]
pub struct ViState {
    phase: AtomicU8,
    abnormal: AtomicBool,
    warmup_done: AtomicBool,
    failure_count: AtomicI64,
    interval_ms: AtomicU64,
    successes: AtomicU64,
    failures: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    last: Mutex<Option<ProbeRecord>>,
    abnormal_reason: Mutex<Option<String>>,
}

impl ViState {
    /// A loop state before any start, with the interval it will begin with (the reference
    /// starts at 5 s).
    pub fn new(interval: Duration) -> ViState {
        let s = ViState::default();
        s.set_interval(interval);
        s
    }

    /// What the loop is doing.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p.to_u8(), Ordering::Release);
    }
    pub fn abnormal(&self) -> bool {
        self.abnormal.load(Ordering::Acquire)
    }
    pub fn abnormal_reason(&self) -> Option<String> {
        self.abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    pub(crate) fn set_abnormal(&self, reason: &str) {
        *self
            .abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(reason.to_owned());
        self.abnormal.store(true, Ordering::Release);
    }
    pub fn warmup_done(&self) -> bool {
        self.warmup_done.load(Ordering::Acquire)
    }
    pub fn failure_count(&self) -> i64 {
        self.failure_count.load(Ordering::Acquire)
    }
    /// Current sleep between probes.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Acquire))
    }
    fn set_interval(&self, d: Duration) {
        self.interval_ms
            .store(d.as_millis() as u64, Ordering::Release);
    }
    pub fn last_probe(&self) -> Option<ProbeRecord> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// (successes, failures) since start.
    pub fn outcomes(&self) -> (u64, u64) {
        (
            self.successes.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
    /// Latency histogram: per-bucket counts (not cumulative; the last bucket is +Inf), count,
    /// sum in seconds.
    pub fn latency_histogram(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let count = self.latency_count.load(Ordering::Relaxed);
        let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .zip(&self.latency_buckets)
            .map(|(le, c)| (*le, c.load(Ordering::Relaxed)))
            .collect();
        let in_buckets: u64 = buckets.iter().map(|b| b.1).sum();
        buckets.push((f64::INFINITY, count.saturating_sub(in_buckets)));
        (
            buckets,
            count,
            self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }

    /// Back to the initial state (the engine restarted): not started, not abnormal, count 0,
    /// warm-up pending. Counters and histograms are kept.
    pub fn rearm(&self) {
        self.abnormal.store(false, Ordering::Release);
        *self
            .abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.warmup_done.store(false, Ordering::Release);
        self.failure_count.store(0, Ordering::Release);
        self.set_phase(Phase::NotStarted);
    }

    pub(crate) fn record(
        &self,
        r: &ProbeResult,
        warmup: bool,
        peak: Option<f64>,
        accounting: Accounting,
    ) {
        match r.outcome {
            Ok(()) => self.successes.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failures.fetch_add(1, Ordering::Relaxed),
        };
        let secs = r.latency.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|le| secs <= *le) {
            self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us
            .fetch_add(r.latency.as_micros() as u64, Ordering::Relaxed);
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(ProbeRecord {
            at: tokio::time::Instant::now(),
            at_unix_ms,
            warmup,
            latency_ms: secs * 1e3,
            outcome: match &r.outcome {
                Ok(()) => "success".to_owned(),
                Err(e) => format!("failed: {e}"),
            },
            success: r.outcome.is_ok(),
            ttft_ms: r.first_token().map(|d| d.as_secs_f64() * 1e3),
            tpot_ms: r.tpot.map(|d| d.as_secs_f64() * 1e3),
            peak,
            accounting,
            failure_count: self.failure_count(),
        });
    }
}

/// The loop's settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Engine name for logs.
    pub engine: String,
    pub npu_usage_threshold: f64,
    pub max_failure_count: i64,
    pub timing: Timing,
    /// Stall detection: count a busy failure once the engine is stalled this long.
    pub stall_window: Option<Duration>,
    /// The V6 rule: do not count an idle failure while requests wait for capacity.
    pub skip_when_capacity_waiting: bool,
}

/// Runs warm-up and the periodic loop until abnormal (or the task is dropped).
pub async fn run(
    cfg: &LoopConfig,
    prober: &impl Prober,
    peaks: &impl PeakSource,
    signals: &impl EngineSignals,
    state: &ViState,
) {
    let engine = cfg.engine.as_str();
    let t = &cfg.timing;
    if !state.warmup_done() {
        state.set_phase(Phase::WarmingUp);
        // No AI Cube reading during warm-up (reference): only the request.
        let r = prober.send(t.warmup_timeout).await;
        state.warmup_done.store(true, Ordering::Release);
        if let Err(e) = &r.outcome {
            tracing::warn!(
                engine,
                "warmup request failed ({e}), set abnormal status and stop health check"
            );
            state.set_abnormal(&format!("warm-up request failed: {e}"));
            state.record(&r, true, None, Accounting::WarmUp);
            state.set_phase(Phase::Stopped);
            return;
        }
        tracing::info!(engine, latency = ?r.latency, "warm-up request succeeded, virtual inference starts");
        state.record(&r, true, None, Accounting::WarmUp);
    }
    state.set_interval(t.interval);
    state.set_phase(Phase::Running);
    // When a virtual request was last served (stall detection's evidence of life).
    let mut last_served = tokio::time::Instant::now();
    while !state.abnormal() {
        let r = prober.send(t.request_timeout).await;
        let peak = peaks.peak(t.window);
        if let Some(p) = peak {
            if p >= t.high_load_threshold {
                state.set_interval(t.high_load_interval);
            } else if p < cfg.npu_usage_threshold {
                state.set_interval(t.interval);
            }
        }
        let failed = r.outcome.is_err();
        // Stall detection: how long the engine has been stalled, read once, only when it
        // matters (a failure on a busy NPU).
        let stalled = match (cfg.stall_window, peak) {
            (Some(w), Some(p)) if failed && p >= cfg.npu_usage_threshold => signals
                .stalled_for()
                .map(|s| s.min(last_served.elapsed()))
                .filter(|s| *s >= w),
            _ => None,
        };
        if !failed {
            last_served = tokio::time::Instant::now();
        }
        let accounting = match peak {
            Some(p) if p < cfg.npu_usage_threshold && failed => {
                let waiting = if cfg.skip_when_capacity_waiting {
                    Some(signals.waiting_for_capacity().await)
                } else {
                    None
                };
                let skip = match &waiting {
                    Some(CapacityWaiting::Waiting(w)) if *w > 0.0 => {
                        Some(format!("{w} requests wait for KV-cache capacity"))
                    }
                    Some(CapacityWaiting::Unknown(why)) => {
                        Some(format!("requests waiting for capacity are unknown ({why})"))
                    }
                    _ => None,
                };
                if let Some(why) = skip {
                    tracing::info!(
                        engine,
                        peak = p,
                        "virtual inference failed while the NPU is idle, but {why}; skip failure count"
                    );
                    Accounting::UnchangedCapacityWaiting
                } else {
                    if waiting == Some(CapacityWaiting::NotExported) {
                        tracing::info!(
                            engine,
                            "skip_when_capacity_waiting: the engine does not export vllm:num_requests_waiting_by_reason; counting as V5 does"
                        );
                    }
                    tracing::warn!(
                        engine,
                        peak = p,
                        "virtual inference failed while the NPU is idle. Current failure count: {}/{}",
                        state.failure_count() + 1,
                        cfg.max_failure_count
                    );
                    count_failure(
                        cfg,
                        state,
                        &format!("AI Cube peak {p} below {}", cfg.npu_usage_threshold),
                    );
                    Accounting::Incremented
                }
            }
            None if failed => {
                tracing::info!(
                    engine,
                    "virtual inference failed but AI Cube usage unavailable, skip failure count"
                );
                Accounting::Unchanged
            }
            Some(p) if stalled.is_some() => {
                let stalled = stalled.unwrap_or_default();
                tracing::warn!(
                    engine,
                    peak = p,
                    stalled_s = stalled.as_secs_f64(),
                    "virtual inference failed while the NPU is busy and the engine has made no progress for {:.0} s (stall detection). Current failure count: {}/{}",
                    stalled.as_secs_f64(),
                    state.failure_count() + 1,
                    cfg.max_failure_count
                );
                count_failure(
                    cfg,
                    state,
                    &format!(
                        "AI Cube peak {p} (busy) but no token advanced for {:.0} s with requests running",
                        stalled.as_secs_f64()
                    ),
                );
                Accounting::IncrementedStalled
            }
            _ => {
                let before = state.failure_count.swap(0, Ordering::AcqRel);
                if before > 0 {
                    tracing::info!(engine, "failure count reset from {before}");
                }
                Accounting::Reset
            }
        };
        state.record(&r, false, peak, accounting);
        tokio::time::sleep(state.interval()).await;
    }
    state.set_phase(Phase::Stopped);
}

/// Adds one to the failure count; abnormal at `max_failure_count`. `why` describes the
/// counted failure.
fn count_failure(cfg: &LoopConfig, state: &ViState, why: &str) {
    let n = state.failure_count.fetch_add(1, Ordering::AcqRel) + 1;
    if n >= cfg.max_failure_count {
        tracing::error!(
            engine = cfg.engine.as_str(),
            verdict = "abnormal",
            "Reach maximum failure count ({n}); status is abnormal"
        );
        state.set_abnormal(&format!(
            "{n} consecutive virtual requests failed and were counted (last: {why})"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::time::Instant;

    /// Scripted prober: each call takes `delay` of (paused) time and returns the next outcome.
    struct FakeProber {
        script: Mutex<VecDeque<(Duration, Result<(), Failure>)>>,
        calls: Mutex<Vec<(Instant, Duration)>>,
    }

    impl FakeProber {
        fn new(script: Vec<(Duration, Result<(), Failure>)>) -> FakeProber {
            FakeProber {
                script: Mutex::new(script.into()),
                calls: Mutex::new(Vec::new()),
            }
        }
        fn ok() -> Result<(), Failure> {
            Ok(())
        }
        fn fail() -> Result<(), Failure> {
            Err(Failure::Timeout)
        }
        fn calls(&self) -> Vec<(Instant, Duration)> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Prober for FakeProber {
        async fn send(&self, timeout: Duration) -> ProbeResult {
            self.calls.lock().unwrap().push((Instant::now(), timeout));
            let next = self.script.lock().unwrap().pop_front();
            let Some((delay, outcome)) = next else {
                // Script exhausted: park forever (the test ends the loop by dropping it).
                std::future::pending::<()>().await;
                unreachable!()
            };
            if delay > timeout {
                tokio::time::sleep(timeout).await;
                return ProbeResult::new(Err(Failure::Timeout), timeout);
            }
            tokio::time::sleep(delay).await;
            ProbeResult::new(outcome, delay)
        }
    }

    /// Scripted peaks; counts reads.
    struct Peaks(Mutex<VecDeque<Option<f64>>>, Mutex<u32>);
    impl Peaks {
        fn new(v: Vec<Option<f64>>) -> Peaks {
            Peaks(Mutex::new(v.into()), Mutex::new(0))
        }
        fn reads(&self) -> u32 {
            *self.1.lock().unwrap()
        }
    }
    impl PeakSource for Peaks {
        fn peak(&self, window: Duration) -> Option<f64> {
            assert_eq!(window, Duration::from_secs(5));
            *self.1.lock().unwrap() += 1;
            self.0.lock().unwrap().pop_front().flatten()
        }
    }

    fn cfg(max: i64) -> LoopConfig {
        LoopConfig {
            engine: "test".into(),
            npu_usage_threshold: 3.0,
            max_failure_count: max,
            timing: Timing::default(),
            stall_window: None,
            skip_when_capacity_waiting: false,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// Runs the loop until it returns or `limit` of paused time passes.
    async fn run_for(
        cfg: &LoopConfig,
        p: &FakeProber,
        peaks: &Peaks,
        st: &ViState,
        limit: Duration,
    ) -> bool {
        run_with(cfg, p, peaks, &NoSignals, st, limit).await
    }

    async fn run_with(
        cfg: &LoopConfig,
        p: &FakeProber,
        peaks: &Peaks,
        signals: &impl EngineSignals,
        st: &ViState,
        limit: Duration,
    ) -> bool {
        tokio::time::timeout(limit, run(cfg, p, peaks, signals, st))
            .await
            .is_ok()
    }

    // test_sim_inference.py: init state (initial, not abnormal, count 0, interval 5 s).
    #[test]
    fn initial_state() {
        let st = ViState::new(Timing::default().interval);
        assert_eq!(st.phase(), Phase::NotStarted);
        assert!(!st.abnormal() && !st.warmup_done());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.interval(), Duration::from_secs(5));
    }

    // Warm-up uses 180 s; failure → abnormal, loop never starts, no sampling.
    #[tokio::test(start_paused = true)]
    async fn failed_warmup_is_abnormal_and_never_samples() {
        let p = FakeProber::new(vec![(Duration::from_secs(200), FakeProber::ok())]);
        let peaks = Peaks::new(vec![]);
        let st = ViState::default();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(3600)).await);
        let calls = p.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, Duration::from_secs(180));
        assert!(st.abnormal() && st.warmup_done());
        assert_eq!(peaks.reads(), 0);
        assert_eq!(st.phase(), Phase::Stopped);
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::WarmUp);
    }

    // A successful warm-up does no sampling; the periodic loop then uses the 5 s timeout.
    #[tokio::test(start_paused = true)]
    async fn warmup_then_periodic_requests_with_5s_timeout() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
        ]);
        let peaks = Peaks::new(vec![Some(1.0), Some(1.0)]);
        let st = ViState::default();
        assert!(!run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(60)).await);
        let calls = p.calls();
        assert_eq!(calls[0].1, Duration::from_secs(180));
        assert!(calls[1..].iter().all(|c| c.1 == Duration::from_secs(5)));
        assert_eq!(peaks.reads(), 2);
        assert!(!st.abnormal());
        assert_eq!(st.phase(), Phase::Running);
        // 5 s between the periodic requests (plus the 1 ms request itself).
        assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(5) + MS);
    }

    // After a successful warm-up, the first low-usage failure already counts (no prior loop
    // success needed: V5 dropped count_failure_flag); max 1 → 1 request, 1 sleep, return.
    #[tokio::test(start_paused = true)]
    async fn abnormal_with_max_one_after_one_request_and_one_sleep() {
        let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::fail())]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        let start = Instant::now();
        assert!(run_for(&cfg(1), &p, &peaks, &st, Duration::from_secs(3600)).await);
        assert_eq!(
            p.calls().len(),
            2,
            "warm-up and exactly one periodic request"
        );
        assert!(st.abnormal());
        assert_eq!(st.failure_count(), 1);
        // 1 ms warm-up + 1 ms request + one 5 s sleep, then the loop condition ends it.
        assert_eq!(start.elapsed(), Duration::from_secs(5) + 2 * MS);
        assert_eq!(st.phase(), Phase::Stopped);
    }

    // Exits after max failures: six idle failures with the default max of 6.
    #[tokio::test(start_paused = true)]
    async fn six_idle_failures_make_it_abnormal() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..6).map(|_| (Duration::from_secs(5), FakeProber::fail())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(vec![Some(0.0); 6]);
        let st = ViState::default();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(3600)).await);
        assert_eq!(p.calls().len(), 7);
        assert_eq!(st.failure_count(), 6);
        assert!(st.abnormal());
        let (ok, failed) = st.outcomes();
        assert_eq!((ok, failed), (1, 6));
    }

    // No work if already abnormal before the loop.
    #[tokio::test(start_paused = true)]
    async fn no_work_if_already_abnormal() {
        let p = FakeProber::new(vec![]);
        let peaks = Peaks::new(vec![]);
        let st = ViState::default();
        st.warmup_done.store(true, Ordering::Release);
        st.set_abnormal("before");
        let start = Instant::now();
        assert!(run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(60)).await);
        assert!(p.calls().is_empty());
        assert_eq!(start.elapsed(), Duration::ZERO, "no sleep either");
        assert!(st.abnormal());
    }

    // Failure with usage unavailable is not counted (and does not reset).
    #[tokio::test(start_paused = true)]
    async fn failure_with_unavailable_usage_is_not_counted() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
        ]);
        let peaks = Peaks::new(vec![Some(0.0), None, None]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(14)).await;
        assert_eq!(p.calls().len(), 4);
        assert_eq!(st.failure_count(), 1, "counted once, then unchanged twice");
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Unchanged);
    }

    // A failure while the NPU is busy resets the count, and so does a success (rule 3).
    #[tokio::test(start_paused = true)]
    async fn busy_failure_resets_and_success_resets() {
        // fail idle (1), fail idle (2), fail at the threshold → reset (0).
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
        ]);
        // 0 % is an available reading and counts as idle.
        let peaks = Peaks::new(vec![Some(0.0), Some(0.0), Some(3.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(9)).await;
        assert_eq!(p.calls().len(), 3);
        assert_eq!(st.failure_count(), 2, "two idle failures counted");
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(30)).await;
        assert_eq!(st.failure_count(), 0, "a busy failure resets");
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Reset);
        // fail idle (1), fail idle (2), success while idle → reset (0).
        let p2 = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::fail()),
            (MS, FakeProber::ok()),
        ]);
        let peaks2 = Peaks::new(vec![Some(0.0), Some(0.0), Some(0.0)]);
        let st2 = ViState::default();
        run_for(&cfg(6), &p2, &peaks2, &st2, Duration::from_secs(9)).await;
        assert_eq!(st2.failure_count(), 2);
        run_for(&cfg(6), &p2, &peaks2, &st2, Duration::from_secs(30)).await;
        assert_eq!(st2.failure_count(), 0, "a success resets");
        assert_eq!(st2.last_probe().unwrap().accounting, Accounting::Reset);
    }

    /// Interval after a sequence of peaks (each probe succeeds).
    async fn interval_after(peaks: Vec<Option<f64>>) -> Duration {
        let n = peaks.len();
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..n).map(|_| (MS, FakeProber::ok())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(peaks);
        let st = ViState::default();
        // The script ends after warm-up and n probes; the next call parks forever, so the
        // interval read afterwards is the one set by the last peak.
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(1000)).await;
        assert_eq!(p.calls().len(), n + 2);
        st.interval()
    }

    // Interval cases: 85 → 20, 50 → 5, 85 then 50 → 20, 85 then 1 (threshold 3) → 5.
    #[tokio::test(start_paused = true)]
    async fn interval_rules() {
        assert_eq!(
            interval_after(vec![Some(85.0)]).await,
            Duration::from_secs(20)
        );
        assert_eq!(
            interval_after(vec![Some(50.0)]).await,
            Duration::from_secs(5)
        );
        assert_eq!(
            interval_after(vec![Some(85.0), Some(50.0)]).await,
            Duration::from_secs(20)
        );
        assert_eq!(
            interval_after(vec![Some(85.0), Some(1.0)]).await,
            Duration::from_secs(5)
        );
        assert_eq!(
            interval_after(vec![Some(80.0)]).await,
            Duration::from_secs(20),
            "80 is >="
        );
        assert_eq!(
            interval_after(vec![Some(85.0), None]).await,
            Duration::from_secs(20),
            "unavailable: unchanged"
        );
    }

    // The window is read as soon as the request completes: an iteration lasts the request
    // plus the sleep, not request + a separate 5 s sampling wait.
    #[tokio::test(start_paused = true)]
    async fn no_extra_wait_for_sampling() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_millis(200), FakeProber::ok()),
            (MS, FakeProber::ok()),
        ]);
        let peaks = Peaks::new(vec![Some(1.0), Some(1.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(6)).await;
        let c = p.calls();
        assert_eq!(
            c[2].0 - c[1].0,
            Duration::from_millis(200) + Duration::from_secs(5)
        );
    }

    // A timed-out request fails at the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_hung_request_fails_at_the_timeout() {
        let p = FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (Duration::from_secs(3600), FakeProber::fail()),
        ]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        run_for(&cfg(6), &p, &peaks, &st, Duration::from_secs(6)).await;
        let last = st.last_probe().unwrap();
        assert_eq!(last.latency_ms, 5000.0);
        assert_eq!(st.failure_count(), 1);
    }

    #[test]
    fn rearm_returns_to_the_initial_state() {
        let st = ViState::default();
        st.warmup_done.store(true, Ordering::Release);
        st.failure_count.store(4, Ordering::Release);
        st.set_abnormal("x");
        st.set_phase(Phase::Stopped);
        st.rearm();
        assert!(!st.abnormal() && !st.warmup_done());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.phase(), Phase::NotStarted);
        assert_eq!(st.abnormal_reason(), None);
    }

    /// Engine signals under paused time: the engine stalls from `stalled_from` on (requests
    /// running, no counter advancing), unless it is a long prefill (the prompt counter
    /// advances, so it is never stalled); `capacity` is what the V6 read returns.
    struct Signals {
        stalled_from: Option<Instant>,
        capacity: Mutex<VecDeque<CapacityWaiting>>,
        capacity_reads: Mutex<u32>,
    }

    impl Signals {
        fn stalled_from(at: Option<Instant>) -> Signals {
            Signals {
                stalled_from: at,
                capacity: Mutex::new(VecDeque::new()),
                capacity_reads: Mutex::new(0),
            }
        }
        fn capacity(v: Vec<CapacityWaiting>) -> Signals {
            Signals {
                stalled_from: None,
                capacity: Mutex::new(v.into()),
                capacity_reads: Mutex::new(0),
            }
        }
    }

    impl EngineSignals for Signals {
        fn stalled_for(&self) -> Option<Duration> {
            self.stalled_from
                .map(|t| Instant::now().saturating_duration_since(t))
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            *self.capacity_reads.lock().unwrap() += 1;
            self.capacity
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(CapacityWaiting::Unknown("script ended".into()))
        }
    }

    fn stall_cfg(max: i64, window: Duration) -> LoopConfig {
        LoopConfig {
            stall_window: Some(window),
            ..cfg(max)
        }
    }

    /// Warm-up, then `n` failed probes (timing out at 5 s) on a busy NPU (95 %), for at most
    /// an hour of paused time: (prober, state, whether the loop ended, i.e. went abnormal).
    async fn busy_run(
        cfg: &LoopConfig,
        n: usize,
        signals: &impl EngineSignals,
    ) -> (FakeProber, ViState, bool) {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..n).map(|_| (Duration::from_secs(10), FakeProber::fail())));
        let (p, peaks) = (FakeProber::new(script), Peaks::new(vec![Some(95.0); n]));
        let st = ViState::default();
        let ended = run_with(cfg, &p, &peaks, signals, &st, Duration::from_secs(3600)).await;
        (p, st, ended)
    }

    // Stall detection off (the reference): a busy NPU resets the count however long the
    // engine is stuck.
    #[tokio::test(start_paused = true)]
    async fn busy_failures_never_count_without_stall_detection() {
        let stalled = Signals::stalled_from(Some(Instant::now()));
        let (_, st, ended) = busy_run(&cfg(6), 50, &stalled).await;
        assert!(!ended);
        assert_eq!(
            st.outcomes(),
            (1, 50),
            "50 busy failures at 5 s + 20 s, no verdict"
        );
        assert!(!st.abnormal());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.last_probe().unwrap().accounting, Accounting::Reset);
    }

    // Stall detection on: busy failures reset until the engine has been stalled for the
    // window, then count; abnormal after max_failure_count counted probes.
    #[tokio::test(start_paused = true)]
    async fn stalled_busy_failures_count_after_the_stall_window() {
        let start = Instant::now();
        let stalled = Signals::stalled_from(Some(start));
        let window = Duration::from_secs(60);
        let (p, st, ended) = busy_run(&stall_cfg(3, window), 20, &stalled).await;
        assert!(ended && st.abnormal());
        // Probe k (1-based) ends at 1 ms + k·5 s + (k−1)·20 s: probes ending before 60 s of
        // stall reset (k = 1, 2: 5 s, 30 s), k = 3 ends at 55 s (reset), k = 4 at 80 s counts.
        assert_eq!(
            p.calls().len(),
            1 + 3 + 3,
            "3 resetting probes, then 3 counted"
        );
        let reason = st.abnormal_reason().unwrap();
        assert!(reason.contains("no token advanced"), "{reason}");
        assert_eq!(
            st.last_probe().unwrap().accounting,
            Accounting::IncrementedStalled
        );
        // Within stall_window + max_failure_count probes (each 5 s + 20 s busy interval), on
        // the paused clock.
        assert!(start.elapsed() <= window + 3 * Duration::from_secs(25) + Duration::from_secs(25));
    }

    /// Progress fed as the scraper would, one scrape per failed busy probe: one request
    /// running and both token counters flat, as vLLM shows a long prefill (it reports a
    /// prompt only when its first token comes out) and a stuck engine alike.
    #[derive(Default)]
    struct FlatCounters(Mutex<crate::qos::progress::Progress>);

    impl EngineSignals for FlatCounters {
        fn stalled_for(&self) -> Option<Duration> {
            let mut g = self.0.lock().unwrap();
            let m = crate::qos::engine_metrics::EngineMetrics {
                running: Some(1.0),
                prompt_tokens: Some(0.0),
                generation_tokens: Some(0.0),
                ..Default::default()
            };
            g.observe(Some(&m), Instant::now());
            g.stalled_for(Instant::now(), Duration::from_secs(60))
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
    }

    // A long prefill with nothing else decoding, on vLLM: the counters are flat, but chunked
    // prefill still serves some probes beside the prefill's chunks (here one in four; the
    // rest time out on the busy NPU). A served probe is evidence of life, so with stall
    // detection on the engine is never abnormal. The same counters with no probe served (a
    // stuck engine) are abnormal.
    #[tokio::test(start_paused = true)]
    async fn long_prefill_is_not_a_stall() {
        let cfg = stall_cfg(3, Duration::from_secs(60));
        let mut script = vec![(MS, FakeProber::ok())];
        for i in 0..40 {
            script.push(if i % 4 == 0 {
                (Duration::from_secs(2), FakeProber::ok())
            } else {
                (Duration::from_secs(10), FakeProber::fail())
            });
        }
        let (p, peaks) = (FakeProber::new(script), Peaks::new(vec![Some(95.0); 40]));
        let st = ViState::default();
        let signals = FlatCounters::default();
        let ended = run_with(&cfg, &p, &peaks, &signals, &st, Duration::from_secs(3600)).await;
        assert!(!ended && !st.abnormal(), "{:?}", st.abnormal_reason());
        assert!(st.failure_count() <= 1, "{}", st.failure_count());
        assert!(
            signals.stalled_for().unwrap() >= Duration::from_secs(600),
            "the counters alone say stalled"
        );
        let (_, st, ended) = busy_run(&cfg, 30, &FlatCounters::default()).await;
        assert!(ended && st.abnormal());
    }

    // Unknown progress (no scrape) never counts, even with stall detection on.
    #[tokio::test(start_paused = true)]
    async fn unknown_progress_never_counts() {
        let unknown = Signals::stalled_from(None);
        let (_, st, ended) = busy_run(&stall_cfg(3, Duration::from_secs(60)), 20, &unknown).await;
        assert!(!ended);
        assert_eq!(st.failure_count(), 0);
    }

    // V6 rule: an idle failure is skipped while requests wait for capacity or the figure is
    // unknown; counted at 0 and when the engine does not export the series. Off by default:
    // never read.
    #[tokio::test(start_paused = true)]
    async fn capacity_waiting_rule() {
        let mut script = vec![(MS, FakeProber::ok())];
        script.extend((0..4).map(|_| (MS, FakeProber::fail())));
        let p = FakeProber::new(script);
        let peaks = Peaks::new(vec![Some(0.0); 4]);
        let st = ViState::default();
        let signals = Signals::capacity(vec![
            CapacityWaiting::Waiting(2.0),
            CapacityWaiting::Unknown("scrape failed".into()),
            CapacityWaiting::Waiting(0.0),
            CapacityWaiting::NotExported,
        ]);
        let v6 = LoopConfig {
            skip_when_capacity_waiting: true,
            ..cfg(6)
        };
        run_with(&v6, &p, &peaks, &signals, &st, Duration::from_secs(30)).await;
        assert_eq!(*signals.capacity_reads.lock().unwrap(), 4);
        assert_eq!(
            st.failure_count(),
            2,
            "2 waiting, unknown: skipped; 0 waiting, series not exported (vLLM 0.18): counted"
        );
        let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::fail())]);
        let peaks = Peaks::new(vec![Some(0.0)]);
        let st = ViState::default();
        let signals = Signals::capacity(vec![CapacityWaiting::Waiting(2.0)]);
        run_with(&cfg(6), &p, &peaks, &signals, &st, Duration::from_secs(4)).await;
        assert_eq!(*signals.capacity_reads.lock().unwrap(), 0, "V5: not read");
        assert_eq!(st.failure_count(), 1);
    }
}
