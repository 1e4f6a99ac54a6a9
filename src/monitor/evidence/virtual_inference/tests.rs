//! Tests of virtual inference's loop under paused time: the reference's accounting and
//! cadence, and the agent policy's rules as the loop applies them.

use super::lines::{abnormal_words, count_words};
use super::pause::FAULT_POLL;
use super::*;
use crate::config::policy::RuleSet;
use crate::monitor::account::Rules;
use crate::monitor::evidence::driver_faults::{Checked, remember_answered, unanswered_worst};
use crate::monitor::inputs::NoSignals;
use crate::monitor::inputs::{CapacityWaiting, FreshMetrics};
use crate::probe::outcome::Accounting;
use crate::probe::outcome::{ProbeFailure, ProbeResult};
use crate::sampler::faults::NpuFault;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::time::Instant;

/// Scripted prober: each call takes `delay` of (paused) time and returns the next outcome.
struct FakeProber {
    script: Mutex<VecDeque<(Duration, Result<(), ProbeFailure>)>>,
    calls: Mutex<Vec<(Instant, Duration)>>,
}

impl FakeProber {
    fn new(script: Vec<(Duration, Result<(), ProbeFailure>)>) -> FakeProber {
        FakeProber {
            script: Mutex::new(script.into()),
            calls: Mutex::new(Vec::new()),
        }
    }
    fn ok() -> Result<(), ProbeFailure> {
        Ok(())
    }
    fn fail() -> Result<(), ProbeFailure> {
        Err(ProbeFailure::Timeout(Duration::from_secs(5)))
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
            return ProbeResult::new(Err(ProbeFailure::Timeout(timeout)), timeout);
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
        rules: Rules {
            npu_usage_threshold: 3.0,
            max_failure_count: max,
            stall_window: None,
            skip_when_capacity_waiting: false,
            agent: None,
        },
        shadow: None,
        timing: Timing::default(),
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
    peaks: &impl PeakSource,
    signals: &impl EngineSignals,
    st: &ViState,
    limit: Duration,
) -> bool {
    tokio::time::timeout(limit, run_virtual_inference(cfg, p, peaks, signals, st))
        .await
        .is_ok()
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
    assert_eq!(
        st.abnormal_rule(),
        None,
        "a failed warm-up is the reference's own"
    );
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
    assert_eq!(
        st.abnormal_rule(),
        None,
        "the reference's own count names no rule"
    );
    let (ok, failed) = st.outcomes();
    assert_eq!((ok, failed), (1, 6));
}

// No work if already abnormal before the loop.
#[tokio::test(start_paused = true)]
async fn no_work_if_already_abnormal() {
    let p = FakeProber::new(vec![]);
    let peaks = Peaks::new(vec![]);
    let st = ViState::default();
    st.set_warmup_done();
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

/// Engine signals under paused time: the engine stalls from `stalled_from` on (requests
/// running, no counter advancing), unless it is a long prefill (the prompt counter
/// advances, so it is never stalled); `capacity` is what the V6 read returns.
struct ScriptedSignals {
    stalled_from: Option<Instant>,
    capacity: Mutex<VecDeque<CapacityWaiting>>,
    capacity_reads: Mutex<u32>,
}

impl ScriptedSignals {
    fn stalled_from(at: Option<Instant>) -> ScriptedSignals {
        ScriptedSignals {
            stalled_from: at,
            capacity: Mutex::new(VecDeque::new()),
            capacity_reads: Mutex::new(0),
        }
    }
    fn capacity(v: Vec<CapacityWaiting>) -> ScriptedSignals {
        ScriptedSignals {
            stalled_from: None,
            capacity: Mutex::new(v.into()),
            capacity_reads: Mutex::new(0),
        }
    }
}

impl EngineSignals for ScriptedSignals {
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
    let mut c = cfg(max);
    c.rules.stall_window = Some(window);
    c
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
    let stalled = ScriptedSignals::stalled_from(Some(Instant::now()));
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
    let stalled = ScriptedSignals::stalled_from(Some(start));
    let window = Duration::from_secs(60);
    let (p, st, ended) = busy_run(&stall_cfg(3, window), 20, &stalled).await;
    assert!(ended && st.abnormal());
    assert_eq!(
        st.abnormal_rule(),
        Some(7),
        "stall detection, docs/policy.md rule 7"
    );
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
        let m = crate::probe::engine_metrics::EngineMetrics {
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
    let unknown = ScriptedSignals::stalled_from(None);
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
    let signals = ScriptedSignals::capacity(vec![
        CapacityWaiting::Waiting(2.0),
        CapacityWaiting::Unknown("scrape failed".into()),
        CapacityWaiting::Waiting(0.0),
        CapacityWaiting::NotExported,
    ]);
    let mut v6 = cfg(6);
    v6.rules.skip_when_capacity_waiting = true;
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
    let signals = ScriptedSignals::capacity(vec![CapacityWaiting::Waiting(2.0)]);
    run_with(&cfg(6), &p, &peaks, &signals, &st, Duration::from_secs(4)).await;
    assert_eq!(*signals.capacity_reads.lock().unwrap(), 0, "V5: not read");
    assert_eq!(st.failure_count(), 1);
}

/// The same peak over any window.
struct ConstPeak(f64);
impl PeakSource for ConstPeak {
    fn peak(&self, _: Duration) -> Option<f64> {
        Some(self.0)
    }
}

/// The agent policy's signals, fixed.
struct AgentSignals {
    health_failed: bool,
    fresh: crate::monitor::inputs::FreshMetrics,
}
impl EngineSignals for AgentSignals {
    fn stalled_for(&self) -> Option<Duration> {
        None
    }
    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        CapacityWaiting::NotExported
    }
    fn health_failed_since(&self, _: Instant) -> bool {
        self.health_failed
    }
    async fn fresh(&self) -> crate::monitor::inputs::FreshMetrics {
        self.fresh.clone()
    }
}

fn agent_signals(health_failed: bool, asleep: bool, tokens: f64) -> AgentSignals {
    AgentSignals {
        health_failed,
        fresh: crate::monitor::inputs::FreshMetrics {
            asleep: Some(asleep),
            tokens: Some(tokens),
            capacity: None,
        },
    }
}

/// The agent policy's loop on an idle NPU, for at most `limit`; true when it ended.
async fn run_agent(
    p: &FakeProber,
    signals: &impl EngineSignals,
    st: &ViState,
    limit: Duration,
) -> bool {
    run_with(&agent_cfg(), p, &ConstPeak(0.0), signals, st, limit).await
}

fn agent_cfg() -> LoopConfig {
    let mut c = cfg(6);
    c.rules.agent = Some(account::AgentRules {
        rules: (1..=12).fold(RuleSet::NONE, RuleSet::with),
        confirm_failures: 2,
        confirm_interval: Duration::from_secs(1),
        confirm_timeout: Duration::from_secs(2),
        progress_window: None,
        learned_timeout_floor: None,
    });
    c
}

/// The agent policy with issue 40's evidence at its defaults (rules 11 and 12).
fn evidence_cfg() -> LoopConfig {
    let mut c = agent_cfg();
    if let Some(a) = c.rules.agent.as_mut() {
        a.progress_window = Some(Duration::from_secs(8));
        a.learned_timeout_floor = Some(Duration::from_millis(500));
    }
    c
}

// Issue 42: under the agent policy the log says at which count a confirmed failure is
// abnormal, and the abnormal line says why it came before the reference's maximum; the
// reference keeps MindIE's wording.
#[test]
fn the_failure_count_lines_say_what_makes_the_engine_abnormal() {
    let (reference, agent) = (cfg(6).rules, agent_cfg().rules);
    assert_eq!(count_words(&reference, 1), "1/6");
    assert_eq!(
        count_words(&agent, 1),
        "1/6 (agent policy: abnormal at 2 when confirmed)"
    );
    let at = |count, accounting| account::Accounted {
        accounting,
        count,
        abnormal: Some(String::new()),
        why: Some("no sign of life for 8.0 s".to_owned()),
        stalled: None,
    };
    assert_eq!(
        abnormal_words(&reference, &at(6, Accounting::Incremented)),
        "Reach maximum failure count (6); status is abnormal"
    );
    assert_eq!(
        abnormal_words(&agent, &at(6, Accounting::Incremented)),
        "Reach maximum failure count (6); status is abnormal"
    );
    assert_eq!(
        abnormal_words(&agent, &at(2, Accounting::Incremented)),
        "Reach confirmed failure count (2, agent policy: confirm_failures); status is abnormal"
    );
    assert_eq!(
        abnormal_words(&agent, &at(1, Accounting::NoSignOfLife)),
        "Abnormal at failure count 1 (no sign of life for 8.0 s); status is abnormal"
    );
}

// Rule 12: an idle engine that answered in 20 ms is given 500 ms (the floor), not 5 s,
// before the loop counts the failure and re-probes; the request itself waits on to the
// request timeout, and so does the confirming re-probe, which is sent 1.5 s in: the hang
// is abnormal 5 s after the first failing probe was sent (8 s without the rule).
#[tokio::test(start_paused = true)]
async fn agent_policy_learns_the_probe_timeout_from_the_engines_answers() {
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
    script.extend((0..5).map(|_| (Duration::from_secs(600), FakeProber::ok())));
    let p = FakeProber::new(script);
    let st = ViState::default();
    let signals = agent_signals(false, false, 100.0);
    let ended = run_with(
        &evidence_cfg(),
        &p,
        &ConstPeak(0.0),
        &signals,
        &st,
        Duration::from_secs(3600),
    )
    .await;
    assert!(ended && st.abnormal());
    let calls = p.calls();
    assert_eq!(
        calls.len(),
        6,
        "warm-up, 3 answers, the failure, one re-probe"
    );
    assert!(
        calls[1..].iter().all(|c| c.1 == Duration::from_secs(5)),
        "every request may answer until the request timeout: {calls:?}"
    );
    assert_eq!(
        calls[5].0 - calls[4].0,
        Duration::from_millis(500 + 1000),
        "learned: the floor, then the confirming interval"
    );
    let last = st.last_probe().unwrap();
    assert_eq!(
        (last.failure_count, last.latency_ms),
        (2, 3500.0),
        "the re-probe waited until the first request's request timeout"
    );
    // A busy NPU keeps the request timeout: its answers are slow for a reason.
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (Duration::from_millis(20), FakeProber::ok()),
        (Duration::from_millis(20), FakeProber::ok()),
    ]);
    let st = ViState::default();
    run_with(
        &evidence_cfg(),
        &p,
        &ConstPeak(95.0),
        &signals,
        &st,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(p.calls()[2].1, Duration::from_secs(5));
}

/// Warm-up, three answers in 20 ms (the engine's fast past), then every answer after
/// `then` (`None`: never), on an idle NPU under the agent policy with issue 40's evidence,
/// for a minute: (abnormal, how long its detection took, the failure count at the end).
async fn after_a_fast_past(then: Option<Duration>) -> (bool, Option<Duration>, i64) {
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
    let then = then.unwrap_or(Duration::from_secs(600));
    script.extend((0..30).map(|_| (then, FakeProber::ok())));
    let p = FakeProber::new(script);
    let st = ViState::default();
    let signals = agent_signals(false, false, 100.0);
    let limit = Duration::from_secs(60);
    run_with(&evidence_cfg(), &p, &ConstPeak(0.0), &signals, &st, limit).await;
    let (_, n, took) = st.detection_histogram();
    let took = (n > 0).then(|| Duration::from_secs_f64(took));
    (st.abnormal(), took, st.failure_count())
}

// Issue 48, R2: an idle engine whose answers turn slow after a fast past. The learned
// timeout (500 ms) passes and the failure counts, but the request waits on to the request
// timeout and the confirming re-probe waits until then too: an answer within the request
// timeout is an answer, the count goes back to 0, and the slow pace widens the learned
// timeout. Only an engine that leaves a request unanswered for the whole request timeout
// is confirmed hung, 5 s after that request was sent. (Before: 2.1 s answers were
// confirmed a hang 3.5 s in, as the attack found; 1.5 s ones were not.)
#[tokio::test(start_paused = true)]
async fn a_slow_engine_that_still_answers_is_never_confirmed_hung() {
    let ms = |n| Some(Duration::from_millis(n));
    let rows: [(&str, Option<Duration>, bool, Option<Duration>); 6] = [
        ("1.5 s answers", ms(1500), false, None),
        ("2.1 s answers (the attack's least)", ms(2100), false, None),
        ("3 s answers (the attack's most)", ms(3000), false, None),
        (
            "4.9 s answers: within the request timeout",
            ms(4900),
            false,
            None,
        ),
        (
            "6 s answers: past the request timeout (a failure by the reference's measure too)",
            ms(6000),
            true,
            Some(Duration::from_secs(5)),
        ),
        (
            "no answer: a hang",
            None,
            true,
            Some(Duration::from_secs(5)),
        ),
    ];
    for (what, then, abnormal, took) in rows {
        let (was, detected, count) = after_a_fast_past(then).await;
        assert_eq!((was, detected), (abnormal, took), "{what}");
        if !abnormal {
            assert_eq!(count, 0, "{what}: the last answer reset the count");
        }
    }
}

// A late answer comes while the loop pauses before its re-probe: it ends the pause and
// is accounted as the answer it is (the count back to 0, the learned timeout widened to
// the request timeout), so no re-probe is sent for it.
#[tokio::test(start_paused = true)]
async fn a_late_answer_during_the_pause_resets_the_count_and_widens_the_timeout() {
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..3).map(|_| (Duration::from_millis(20), FakeProber::ok())));
    script.push((Duration::from_millis(1200), FakeProber::ok()));
    script.extend((0..3).map(|_| (Duration::from_millis(1200), FakeProber::ok())));
    let p = FakeProber::new(script);
    let st = ViState::default();
    let signals = agent_signals(false, false, 100.0);
    let limit = Duration::from_secs(30);
    run_with(&evidence_cfg(), &p, &ConstPeak(0.0), &signals, &st, limit).await;
    let calls = p.calls();
    assert!(calls.len() >= 6, "{calls:?}");
    assert_eq!(
        calls[5].0 - calls[4].0,
        Duration::from_millis(1200) + Duration::from_secs(5),
        "answered 1.2 s in (during the 1 s confirming pause that began at 0.5 s), then the regular interval: no re-probe"
    );
    assert!(!st.abnormal());
    let (ok, failed) = st.outcomes();
    assert!(
        failed == 1 && ok >= 5,
        "{ok} answers, {failed} missed timeout"
    );
    assert_eq!(
        calls[6].0 - calls[5].0,
        Duration::from_millis(1200) + Duration::from_secs(5),
        "the learned timeout now waits for the slow pace: no failure"
    );
}

/// The log lines the code under test writes on this thread while the guard lives.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl Lines {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let w = self.clone();
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || w.clone())
                .with_ansi(false)
                .finish(),
        )
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Quiet from the instant it holds (for 5 s already then), with `running` requests by the
/// engine's count.
struct QuietWith(Instant, f64);
impl EngineSignals for QuietWith {
    fn stalled_for(&self) -> Option<Duration> {
        None
    }
    fn quiet_for(&self) -> Option<Duration> {
        let now = Instant::now();
        (now >= self.0).then(|| now - self.0 + Duration::from_secs(5))
    }
    fn requests_running(&self) -> Option<f64> {
        Some(self.1)
    }
    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        CapacityWaiting::NotExported
    }
}

// Issue 48: the line that says why a quiet engine woke the loop says "requests running"
// only when the engine counts some; one quiet with none running (its NPU busy, or the
// engine idle after a busy blip) says so.
#[tokio::test(start_paused = true)]
async fn the_quiet_line_says_requests_running_only_when_the_engine_counts_them() {
    for (running, npu, says, never) in [
        (
            0.0,
            95.0,
            "no request running by the engine's count but its NPU was busy, and no sign of life",
            "requests running",
        ),
        (
            2.0,
            95.0,
            "2 requests running, and no sign of life",
            "no request",
        ),
        (
            0.0,
            0.0,
            "(the NPU is idle now: the idle rules decide)",
            "requests running",
        ),
    ] {
        let lines = Lines::default();
        let _guard = lines.capture();
        let p = FakeProber::new(vec![(MS, FakeProber::ok()), (MS, FakeProber::ok())]);
        let signals = QuietWith(Instant::now() + Duration::from_secs(3), running);
        let st = ViState::default();
        let limit = Duration::from_secs(8);
        run_with(&evidence_cfg(), &p, &ConstPeak(npu), &signals, &st, limit).await;
        let text = lines.text();
        let line = text
            .lines()
            .find(|l| l.contains("probing now"))
            .unwrap_or_else(|| panic!("no wake line: {text}"));
        assert!(
            line.contains(says) && !line.contains(never),
            "{running} running: {line}"
        );
    }
}

/// An engine that goes quiet at `from` (its last scrape before then counted: the quiet
/// reads 5 s at once, as the first flat scrape shows it), and comes back to life at
/// `until`.
struct Quiet {
    from: Instant,
    until: Option<Instant>,
}
impl EngineSignals for Quiet {
    fn stalled_for(&self) -> Option<Duration> {
        self.quiet_for()
    }
    fn quiet_for(&self) -> Option<Duration> {
        let now = Instant::now();
        (now >= self.from && self.until.is_none_or(|u| now < u))
            .then(|| now - self.from + Duration::from_secs(5))
    }
    async fn waiting_for_capacity(&self) -> CapacityWaiting {
        CapacityWaiting::NotExported
    }
}

// Rule 11, busy but stuck: the loop sleeps the busy interval (20 s), the engine shows
// quiet 10 s in (since 5 s in); the loop probes at once with a timeout that reaches the 8 s window (3 s),
// and the failure is abnormal: no sign of life. 6 s after the quiet began, not ~50 s.
#[tokio::test(start_paused = true)]
async fn agent_policy_probes_a_quiet_engine_and_finds_no_sign_of_life() {
    let start = Instant::now();
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (Duration::from_millis(200), FakeProber::ok()),
        (Duration::from_secs(600), FakeProber::ok()),
    ]);
    let st = ViState::default();
    let signals = Quiet {
        from: start + Duration::from_secs(10),
        until: None,
    };
    let ended = run_with(
        &evidence_cfg(),
        &p,
        &ConstPeak(95.0),
        &signals,
        &st,
        Duration::from_secs(3600),
    )
    .await;
    assert!(ended && st.abnormal());
    assert_eq!(
        st.abnormal_rule(),
        Some(11),
        "no sign of life, docs/policy.md rule 11"
    );
    let calls = p.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    let waited = st.last_probe().unwrap().latency_ms;
    assert!(
        waited > 2900.0 && waited <= 3000.0,
        "to the window: 8 s - 5 s and the time since the quiet showed: {waited} ms"
    );
    let woke = calls[2].0 - start;
    assert!(
        woke >= Duration::from_secs(10) && woke < Duration::from_millis(10200),
        "probed within a pause poll of the quiet: {woke:?}"
    );
    let why = st.abnormal_reason().unwrap();
    assert!(why.contains("no sign of life for 8.0 s"), "{why}");
    assert_eq!(st.failure_count(), 1);
    // Off (progress_window = 0s): the busy interval runs its course, no abnormal.
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (Duration::from_millis(200), FakeProber::ok()),
        (Duration::from_secs(600), FakeProber::ok()),
    ]);
    let st = ViState::default();
    let signals = Quiet {
        from: Instant::now() + Duration::from_secs(3),
        until: None,
    };
    run_with(
        &agent_cfg(),
        &p,
        &ConstPeak(95.0),
        &signals,
        &st,
        Duration::from_secs(15),
    )
    .await;
    assert!(!st.abnormal());
    assert_eq!(p.calls().len(), 2, "no wake: the busy interval runs");
}

// A long prefill with chunked prefill off, within the window: one flat step. The quiet
// wakes the loop once; the probe waits for the step and is answered: never abnormal, and
// no second wake within the window.
#[tokio::test(start_paused = true)]
async fn a_quiet_step_that_ends_within_the_window_is_not_abnormal() {
    let start = Instant::now();
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (Duration::from_millis(200), FakeProber::ok()),
        (Duration::from_millis(2500), FakeProber::ok()),
        (Duration::from_millis(200), FakeProber::ok()),
    ]);
    let st = ViState::default();
    let signals = Quiet {
        from: start + Duration::from_secs(3),
        until: Some(start + Duration::from_secs(7)),
    };
    run_with(
        &evidence_cfg(),
        &p,
        &ConstPeak(95.0),
        &signals,
        &st,
        Duration::from_secs(30),
    )
    .await;
    assert!(!st.abnormal());
    let calls = p.calls();
    assert!(calls.len() >= 3, "{calls:?}");
    assert!(
        calls.len() == 3 || calls[3].0 - start >= Duration::from_secs(20),
        "one wake, then the busy interval: {calls:?}"
    );
}

/// Warm-up, then probes that never answer, on an idle NPU.
fn hung() -> FakeProber {
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..10).map(|_| (Duration::from_secs(600), FakeProber::ok())));
    FakeProber::new(script)
}

// Idle hang under the agent policy: the first failure (5 s timeout) is re-probed after
// 1 s with a 2 s timeout; idle throughout and no token advancing, it confirms.
#[tokio::test(start_paused = true)]
async fn agent_policy_confirms_an_idle_hang_with_one_quick_reprobe() {
    let p = hung();
    let st = ViState::default();
    let signals = agent_signals(false, false, 100.0);
    let start = Instant::now();
    let ended = run_agent(&p, &signals, &st, Duration::from_secs(3600)).await;
    assert!(ended && st.abnormal());
    assert_eq!(
        st.abnormal_rule(),
        Some(5),
        "fast confirmation, docs/policy.md rule 5"
    );
    let calls = p.calls();
    assert_eq!(calls.len(), 3, "warm-up, the failure, one re-probe");
    assert_eq!(calls[1].1, Duration::from_secs(5));
    assert_eq!(
        calls[2].1,
        Duration::from_secs(5),
        "sent to wait up to the request timeout"
    );
    assert_eq!(
        st.last_probe().unwrap().latency_ms,
        2000.0,
        "the confirming timeout: the first request had its whole 5 s"
    );
    assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(5 + 1));
    assert_eq!(st.failure_count(), 2);
    assert!(
        st.abnormal_reason().unwrap().contains("confirmed"),
        "{:?}",
        st.abnormal_reason()
    );
    // 1 ms warm-up, 5 s, 1 s, 2 s, then the last sleep (1 s) before the loop sees it.
    assert_eq!(start.elapsed(), Duration::from_secs(9) + MS);
    // The reference, same engine: six failures 10 s apart.
    let p = hung();
    let st = ViState::default();
    let start = Instant::now();
    assert!(
        run_with(
            &cfg(6),
            &p,
            &ConstPeak(0.0),
            &signals,
            &st,
            Duration::from_secs(3600)
        )
        .await
    );
    assert_eq!(p.calls().len(), 7);
    assert_eq!(start.elapsed(), Duration::from_secs(60) + MS);
}

// Tokens advancing between the failures: counted, not confirmed; the reference's six
// still apply.
#[tokio::test(start_paused = true)]
async fn agent_policy_does_not_confirm_while_tokens_advance() {
    struct Advancing(Mutex<f64>);
    impl EngineSignals for Advancing {
        fn stalled_for(&self) -> Option<Duration> {
            None
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            CapacityWaiting::NotExported
        }
        async fn fresh(&self) -> crate::monitor::inputs::FreshMetrics {
            let mut t = self.0.lock().unwrap();
            *t += 10.0;
            crate::monitor::inputs::FreshMetrics {
                asleep: Some(false),
                tokens: Some(*t),
                capacity: None,
            }
        }
    }
    let p = hung();
    let st = ViState::default();
    let ended = run_agent(
        &p,
        &Advancing(Mutex::new(0.0)),
        &st,
        Duration::from_secs(3600),
    )
    .await;
    assert!(ended && st.abnormal());
    assert_eq!(p.calls().len(), 7, "six failures: never confirmed");
    assert!(!st.abnormal_reason().unwrap().contains("confirmed"));
}

// The agent policy with the V6 rule on: a failed probe on an idle NPU needs both the
// agent's evidence and the capacity figure, and takes both from one read of the engine
// (the separate capacity read is not made). The figure read is the one applied: 2
// requests waiting skip the failure.
#[tokio::test(start_paused = true)]
async fn agent_policy_with_the_v6_rule_reads_the_engine_once_per_failure() {
    struct OneRead {
        fresh: Mutex<u32>,
        capacity: Mutex<u32>,
    }
    impl EngineSignals for OneRead {
        fn stalled_for(&self) -> Option<Duration> {
            None
        }
        async fn waiting_for_capacity(&self) -> CapacityWaiting {
            *self.capacity.lock().unwrap() += 1;
            CapacityWaiting::NotExported
        }
        async fn fresh(&self) -> FreshMetrics {
            *self.fresh.lock().unwrap() += 1;
            FreshMetrics {
                asleep: Some(false),
                tokens: Some(1.0),
                capacity: Some(CapacityWaiting::Waiting(2.0)),
            }
        }
    }
    let mut c = agent_cfg();
    c.rules.skip_when_capacity_waiting = true;
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..3).map(|_| (MS, FakeProber::fail())));
    let p = FakeProber::new(script);
    let st = ViState::default();
    let signals = OneRead {
        fresh: Mutex::new(0),
        capacity: Mutex::new(0),
    };
    run_with(
        &c,
        &p,
        &ConstPeak(0.0),
        &signals,
        &st,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(*signals.fresh.lock().unwrap(), 3, "one read per failure");
    assert_eq!(*signals.capacity.lock().unwrap(), 0, "no second read");
    assert_eq!(st.failure_count(), 0, "requests wait for capacity: skipped");
}

// Hot reload and sleep under the agent policy: failures beside a failing /health, or
// while the engine is asleep, are not counted at all.
#[tokio::test(start_paused = true)]
async fn agent_policy_does_not_count_beside_a_failing_health_or_asleep() {
    for (health_failed, asleep) in [(true, false), (false, true)] {
        let p = hung();
        let st = ViState::default();
        let signals = agent_signals(health_failed, asleep, 1.0);
        let ended = run_agent(&p, &signals, &st, Duration::from_secs(100)).await;
        assert!(
            !ended && !st.abnormal(),
            "health {health_failed} asleep {asleep}"
        );
        assert_eq!(st.failure_count(), 0);
        let want = if health_failed {
            Accounting::UnchangedHealthFailing
        } else {
            Accounting::UnchangedAsleep
        };
        assert_eq!(st.last_probe().unwrap().accounting, want);
        assert!(
            p.calls()
                .iter()
                .skip(1)
                .all(|c| c.1 == Duration::from_secs(5))
        );
    }
}

// Agent policy: a busy NPU that falls idle during the busy interval is probed once it has
// been idle a whole window, with the confirming timeout; the reference sleeps it out.
// A degraded engine (every answer 3 s late, within the 5 s request timeout) whose load
// ends: its busy NPU falls idle, and the quick probe must not time out for the engine's
// known pace. Its timeout is twice the last successful answer (6 s, capped at the 5 s
// request timeout), not the 2 s confirming timeout; so the engine is never abnormal.
#[tokio::test(start_paused = true)]
async fn agent_policy_quick_probes_wait_for_a_slow_engines_known_pace() {
    struct Drop(Instant);
    impl PeakSource for Drop {
        fn peak(&self, _: Duration) -> Option<f64> {
            Some(if Instant::now() < self.0 { 95.0 } else { 0.0 })
        }
    }
    let slow = Duration::from_secs(3);
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (slow, FakeProber::ok()),
        (slow, FakeProber::ok()),
        (slow, FakeProber::ok()),
        (slow, FakeProber::ok()),
    ]);
    let st = ViState::default();
    let start = Instant::now();
    let peaks = Drop(start + Duration::from_secs(4));
    run_with(
        &agent_cfg(),
        &p,
        &peaks,
        &NoSignals,
        &st,
        Duration::from_secs(60),
    )
    .await;
    let calls = p.calls();
    assert!(calls.len() >= 4, "{calls:?}");
    assert_eq!(
        calls[2].1,
        Duration::from_secs(5),
        "twice 3 s, capped at the request timeout"
    );
    assert!(!st.abnormal() && st.failure_count() == 0);
    let agent = account::AgentRules {
        rules: (1..=12).fold(RuleSet::NONE, RuleSet::with),
        confirm_failures: 2,
        confirm_interval: Duration::from_secs(1),
        confirm_timeout: Duration::from_secs(2),
        progress_window: None,
        learned_timeout_floor: None,
    };
    let t = Timing::default();
    for (last_ok, want) in [
        (None, 2000),
        (Some(20), 2000),
        (Some(1500), 3000),
        (Some(3000), 5000),
    ] {
        assert_eq!(
            account::confirm_timeout(&agent, &t, last_ok.map(Duration::from_millis)),
            Duration::from_millis(want),
            "{last_ok:?}"
        );
    }
}

// The busy cadence is a state, not read back from the sleep: with `interval` configured
// equal to `high_load_interval` (10 s) and a 2 s window, an NPU that never was busy is
// probed every 10 s. Read from the sleep, the regular cadence looked busy, and every
// pause ended "the NPU fell idle" after 2 s: a probe every ~2 s.
#[tokio::test(start_paused = true)]
async fn equal_intervals_do_not_make_an_idle_npu_look_busy() {
    let mut c = agent_cfg();
    c.timing.interval = Duration::from_secs(10);
    c.timing.high_load_interval = Duration::from_secs(10);
    c.timing.window = Duration::from_secs(2);
    let mut script = vec![(MS, FakeProber::ok())];
    script.extend((0..100).map(|_| (MS, FakeProber::ok())));
    let p = FakeProber::new(script);
    let st = ViState::default();
    run_with(
        &c,
        &p,
        &ConstPeak(0.0),
        &NoSignals,
        &st,
        Duration::from_secs(60),
    )
    .await;
    let periodic = p.calls().len() - 1;
    assert!(
        (5..=7).contains(&periodic),
        "{periodic} periodic probes in 60 s at a 10 s cadence"
    );
}

#[tokio::test(start_paused = true)]
async fn agent_policy_probes_when_a_busy_npu_falls_idle() {
    /// 95 % until `idle_from`, then 0.
    struct Drop(Instant);
    impl PeakSource for Drop {
        fn peak(&self, _: Duration) -> Option<f64> {
            Some(if Instant::now() < self.0 { 95.0 } else { 0.0 })
        }
    }
    // The engine answers twice, then (under the agent policy) no more: the probe when the
    // NPU falls idle counts a failure after its quick timeout, and the re-probe follows.
    let hung = (Duration::from_secs(600), FakeProber::ok());
    for agent in [true, false] {
        let mut script = vec![(MS, FakeProber::ok()), (MS, FakeProber::ok())];
        script.extend(if agent {
            [hung.clone(), hung.clone()]
        } else {
            [(MS, FakeProber::ok()), (MS, FakeProber::ok())]
        });
        let p = FakeProber::new(script);
        let st = ViState::default();
        let c = if agent { agent_cfg() } else { cfg(6) };
        let start = Instant::now();
        let peaks = Drop(start + Duration::from_secs(3));
        run_with(&c, &p, &peaks, &NoSignals, &st, Duration::from_secs(30)).await;
        let calls = p.calls();
        let gap = calls[2].0 - calls[1].0;
        if agent {
            // Busy at the first probe: the 20 s interval, cut once a whole 5 s window of
            // it was idle (the NPU idle from 3 s, checked every 0.5 s).
            assert!(
                gap >= Duration::from_secs(5) && gap < Duration::from_secs(6),
                "{gap:?}"
            );
            assert_eq!(
                calls[3].0 - calls[2].0,
                Duration::from_secs(2 + 1),
                "the confirming timeout, then the confirming interval"
            );
        } else {
            assert_eq!(gap, Duration::from_secs(20) + MS);
        }
        assert_eq!(
            calls[2].1,
            Duration::from_secs(5),
            "answers count until 5 s"
        );
    }
    // Rule 12: the engine answered in 1 ms, so the probe when the NPU falls idle counts
    // its failure after the learned 500 ms (the floor), not the quick 2 s.
    let p = FakeProber::new(vec![
        (MS, FakeProber::ok()),
        (MS, FakeProber::ok()),
        hung.clone(),
        hung,
    ]);
    let st = ViState::default();
    let peaks = Drop(Instant::now() + Duration::from_secs(3));
    let c = evidence_cfg();
    run_with(&c, &p, &peaks, &NoSignals, &st, Duration::from_secs(30)).await;
    let calls = p.calls();
    assert_eq!(calls[3].0 - calls[2].0, Duration::from_millis(500 + 1000));
}
// The faults a request was answered beside: a probe checks those present before and
// after it; a success remembers them, a failure does not; a cleared fault is forgotten.
#[test]
fn answered_faults_table() {
    use crate::driver::fault_levels::FaultLevel;
    let f = |npu: u32, level: FaultLevel| NpuFault {
        npu,
        code: 0x80C9_8001,
        hex: "0x80C98001".into(),
        text: None,
        level,
    };
    let key = |npu: u32| (npu, 0x80C9_8001u32);
    let set = |npus: &[u32]| -> Checked { npus.iter().map(|n| key(*n)).collect() };
    let serious_level = FaultLevel::RestartNPU;
    /// (what, answered before, faults before the probe, faults after, failed) →
    /// (checked, answered after)
    type Row = (
        &'static str,
        Checked,
        Checked,
        Vec<NpuFault>,
        bool,
        Checked,
        Checked,
    );
    let rows: Vec<Row> = vec![
        (
            "a success beside a standing fault remembers it",
            set(&[]),
            set(&[1]),
            vec![f(1, serious_level)],
            false,
            set(&[1]),
            set(&[1]),
        ),
        (
            "a failure does not",
            set(&[]),
            set(&[1]),
            vec![f(1, serious_level)],
            true,
            set(&[1]),
            set(&[]),
        ),
        (
            "a fault that appeared during the probe was not checked",
            set(&[]),
            set(&[]),
            vec![f(1, serious_level)],
            false,
            set(&[]),
            set(&[]),
        ),
        (
            "a cleared fault is forgotten",
            set(&[1, 2]),
            set(&[1, 2]),
            vec![f(2, serious_level)],
            true,
            set(&[2]),
            set(&[2]),
        ),
        (
            "below the confirming level nothing is checked",
            set(&[]),
            set(&[]),
            vec![f(1, FaultLevel::SubHealthFault)],
            false,
            set(&[]),
            set(&[]),
        ),
    ];
    for (what, mut answered, before, after, failed, checked, answered_after) in rows {
        assert_eq!(
            remember_answered(&mut answered, &before, &after, failed),
            checked,
            "{what}"
        );
        assert_eq!(answered, answered_after, "{what}");
    }
    // A remembered fault no longer explains a failure; another one does.
    let faults = [f(1, FaultLevel::SeparateNPU), f(2, serious_level)];
    assert_eq!(
        unanswered_worst(&faults, &set(&[1])).map(|f| f.npu),
        Some(2)
    );
    assert_eq!(unanswered_worst(&faults, &set(&[])).map(|f| f.npu), Some(1));
    assert_eq!(unanswered_worst(&faults, &set(&[1, 2])), None);
}

/// A busy NPU (95 %) whose driver reports `fault` (at `level`) from `from` on.
struct FaultAt {
    from: Instant,
    level: crate::driver::fault_levels::FaultLevel,
}
impl PeakSource for FaultAt {
    fn peak(&self, _: Duration) -> Option<f64> {
        Some(95.0)
    }
    fn faults(&self) -> Vec<NpuFault> {
        if Instant::now() < self.from {
            return Vec::new();
        }
        vec![NpuFault {
            npu: 3,
            code: 0x80C9_8001,
            hex: "0x80C98001".into(),
            text: Some("AI Core reset failed".into()),
            level: self.level,
        }]
    }
}

// Under load (the 20 s busy interval), a driver fault at RestartBusiness or worse makes
// the loop probe at once with the confirming timeout; the engine hangs, so the failure
// is abnormal at once, naming the fault. The reference sleeps on.
#[tokio::test(start_paused = true)]
async fn agent_policy_confirms_a_driver_fault_with_an_immediate_probe() {
    use crate::driver::fault_levels::FaultLevel;
    let hung_after_first = || {
        FakeProber::new(vec![
            (MS, FakeProber::ok()),
            (MS, FakeProber::ok()),
            (Duration::from_secs(600), FakeProber::ok()),
            (Duration::from_secs(600), FakeProber::ok()),
        ])
    };
    let p = hung_after_first();
    let st = ViState::default();
    let start = Instant::now();
    let peaks = FaultAt {
        from: start + Duration::from_secs(7),
        level: FaultLevel::RestartNPU,
    };
    let ended = run_with(
        &agent_cfg(),
        &p,
        &peaks,
        &NoSignals,
        &st,
        Duration::from_secs(60),
    )
    .await;
    assert!(ended && st.abnormal());
    let calls = p.calls();
    assert_eq!(
        calls.len(),
        3,
        "warm-up, a busy success, the confirming probe"
    );
    let woke = calls[2].0 - start;
    assert!(
        woke >= Duration::from_secs(7) && woke <= Duration::from_secs(7) + FAULT_POLL,
        "probed {woke:?} after the start, the fault came at 7 s"
    );
    assert_eq!(
        st.last_probe().unwrap().latency_ms,
        2000.0,
        "the confirming timeout"
    );
    assert_eq!(st.failure_count(), 1);
    assert_eq!(st.last_probe().unwrap().accounting, Accounting::DriverFault);
    assert_eq!(
        st.abnormal_rule(),
        Some(8),
        "the driver's fault, docs/policy.md rule 8"
    );
    let why = st.abnormal_reason().unwrap();
    assert!(
        why.contains("NPU 3 reports 0x80C98001 (AI Core reset failed), level RestartNPU"),
        "{why}"
    );
    // The reference: no wake; the busy failure resets.
    let p = hung_after_first();
    let st = ViState::default();
    let start = Instant::now();
    let peaks = FaultAt {
        from: start + Duration::from_secs(7),
        level: FaultLevel::SeparateNPU,
    };
    assert!(
        !run_with(
            &cfg(6),
            &p,
            &peaks,
            &NoSignals,
            &st,
            Duration::from_secs(60)
        )
        .await
    );
    let calls = p.calls();
    assert_eq!(calls[2].0 - calls[1].0, Duration::from_secs(20) + MS);
    assert!(!st.abnormal());
}

// A confirming probe that succeeds leaves the engine normal, and the same fault does not
// wake the loop again; a SubHealthFault never wakes it.
#[tokio::test(start_paused = true)]
async fn a_driver_fault_on_an_engine_that_answers_is_published_only() {
    use crate::driver::fault_levels::FaultLevel;
    for (level, wakes) in [
        (FaultLevel::SeparateNPU, true),
        (FaultLevel::SubHealthFault, false),
        (FaultLevel::RestartRequest, false),
    ] {
        // The fourth periodic probe fails (a timeout under load) with the fault still
        // reported: once a request was answered beside it, the fault no longer explains
        // a failure, and a busy failure resets as without it.
        let mut script: Vec<_> = (0..4).map(|_| (MS, FakeProber::ok())).collect();
        script.push((Duration::from_secs(600), FakeProber::ok()));
        script.push((MS, FakeProber::ok()));
        let p = FakeProber::new(script);
        let st = ViState::default();
        let start = Instant::now();
        let peaks = FaultAt {
            from: start + Duration::from_secs(3),
            level,
        };
        run_with(
            &agent_cfg(),
            &p,
            &peaks,
            &NoSignals,
            &st,
            Duration::from_secs(100),
        )
        .await;
        let at: Vec<Duration> = p.calls().iter().map(|c| c.0 - start).collect();
        assert!(!st.abnormal(), "{level}: {:?}", st.abnormal_reason());
        assert!(
            at.len() >= 6,
            "{level}: the failed probe and one after it: {at:?}"
        );
        assert_eq!(st.failure_count(), 0, "{level}");
        if wakes {
            assert!(
                at[2] >= Duration::from_secs(3) && at[2] <= Duration::from_secs(3) + FAULT_POLL,
                "{level}: {at:?}"
            );
            assert_eq!(
                at[3] - at[2],
                Duration::from_secs(20) + MS,
                "{level}: no second wake for the same fault"
            );
        } else {
            assert_eq!(
                at[2] - at[1],
                Duration::from_secs(20) + MS,
                "{level}: {at:?}"
            );
        }
    }
}

/// The reference in force (six failures) with the agent policy's rules as the shadow, on a
/// hung engine and an idle NPU: the state, the prober's calls, and how long the loop ran.
async fn shadowed_run(signals: &AgentSignals) -> (ViState, FakeProber, Duration) {
    let mut c = cfg(6);
    c.shadow = agent_cfg().rules.into();
    let p = hung();
    let st = ViState::default();
    let start = Instant::now();
    let ended = run_with(
        &c,
        &p,
        &ConstPeak(0.0),
        signals,
        &st,
        Duration::from_secs(3600),
    )
    .await;
    assert!(ended && st.abnormal(), "the reference's six");
    (st, p, start.elapsed())
}

// Issue 50: the reference in force with the agent policy's rules as the shadow. The shadow
// counts the same probes: it is abnormal by rule 5 at the second failure, while the
// reference goes on to its six, and its probes keep the reference's pace (no re-probe).
#[tokio::test(start_paused = true)]
async fn the_shadow_counts_the_probes_of_the_policy_in_force_and_decides_nothing() {
    let (st, p, took) = shadowed_run(&agent_signals(false, false, 100.0)).await;
    assert_eq!(st.abnormal_rule(), None, "the reference's own count");
    assert_eq!(p.calls().len(), 7, "warm-up and six probes, none quicker");
    assert_eq!(took, Duration::from_secs(60) + MS, "the reference's pace");
    let shadow = st.shadow();
    let (why, rule) = shadow.abnormal.expect("the shadow said abnormal");
    assert_eq!(rule, Some(5), "fast confirmation");
    assert_eq!(shadow.count, 2, "frozen where it turned abnormal");
    assert!(why.contains("confirmed"), "{why}");
}

// The shadow's count keeps a failure out as its own rules say: with `/health` failing beside
// every probe, rule 3 holds the shadow's count at zero while the reference counts.
#[tokio::test(start_paused = true)]
async fn the_shadow_names_the_rule_that_kept_a_failure_out_of_its_count() {
    let (st, _, _) = shadowed_run(&agent_signals(true, false, 100.0)).await;
    let shadow = st.shadow();
    assert_eq!(
        (shadow.count, shadow.abnormal, shadow.held_by),
        (0, None, Some(3))
    );
}
