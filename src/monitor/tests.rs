//! Tests of one engine's monitor: the verdict and `/health` bookkeeping, and the loops
//! wired to it under paused time (the rules themselves are table tests beside them).

use super::*;
use crate::config::file;
use crate::driver::Backend;
use crate::probe::MetricsSource;
use crate::probe::Prober;
use crate::probe::health::Fetch;
use crate::probe::health::HealthOutcome;
use crate::probe::health::{HealthTransport, Transport};
use crate::probe::outcome::{Accounting, ProbeFailure, ProbeResult};
use crate::qos::score::Level;
use evidence::health::health_task;
use evidence::qos::qos_task;
use evidence::virtual_inference::virtual_inference_task;
use inputs::{CapacityWaiting, EngineSignals, PeakSource, ScrapeSignals};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn spec(hc: &str) -> EngineSpec {
    let text = format!(
        "[[engine]]\npolicy = \"reference\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\nengine_env = {{}}\n[engine.timing]\nhealth_period = \"1s\"\n[engine.health_check_config]\n{hc}"
    );
    file::parse(&text, Path::new("/x/agent.toml"))
        .unwrap()
        .engines
        .remove(0)
}

fn outcome(o: &str) -> HealthOutcome {
    match o {
        "ok" => HealthOutcome::Healthy,
        "down" => HealthOutcome::Unhealthy {
            reason: "refused".into(),
            unreachable: true,
            timed_out: false,
            transport: Some(Transport::Refused),
        },
        "slow" => HealthOutcome::Unhealthy {
            reason: "timed out".into(),
            unreachable: false,
            timed_out: true,
            transport: None,
        },
        "503" => HealthOutcome::Unhealthy {
            reason: "/health answered HTTP 503".into(),
            unreachable: false,
            timed_out: false,
            transport: None,
        },
        _ => HealthOutcome::NeverConnected("refused".into()),
    }
}

// test_mgmt_endpoint_bootstrap.py: /status is initial before the engine answers.
#[test]
fn initial_until_health_answers_then_normal() {
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    assert_eq!(st.status(), Status::Initial);
    assert_eq!(Status::Initial.body(), r#"{"status":"initial"}"#);
    st.record_health(&outcome("never"), false);
    assert_eq!(st.status(), Status::Initial);
    assert!(
        !st.started.load(Ordering::Acquire),
        "initial does not start the loop"
    );
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.status(), Status::Normal);
    assert!(
        st.started.load(Ordering::Acquire),
        "the first healthy /status starts it"
    );
    st.record_health(&outcome("down"), true);
    assert_eq!(st.status(), Status::Abnormal, "connected then failed");
    assert!(st.reason().contains("refused"));
}

#[test]
fn gates_block_the_start_and_name_the_condition() {
    let st = Monitor::new(spec("enable_virtual_inference = false"), vec![0]);
    assert!(!st.decide_start(&[(0, Backend::Dcmi)]));
    assert_eq!(st.vi.phase(), Phase::Disabled);
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    assert!(!st.decide_start(&[(0, Backend::Unavailable)]));
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    assert!(st.decide_start(&[(0, Backend::Dcmi)]));
}

struct Scripted(Mutex<VecDeque<Fetch>>);
impl HealthTransport for Arc<Scripted> {
    async fn get(&self, _t: Duration) -> Fetch {
        self.0
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Fetch::Error(Transport::Other, "script over".into()))
    }
}

struct AlwaysFail;
impl Prober for AlwaysFail {
    async fn send(&self, _t: Duration) -> ProbeResult {
        ProbeResult::new(
            Err(ProbeFailure::Transport(
                Transport::Refused,
                "refused".into(),
            )),
            Duration::from_millis(1),
        )
    }
}

struct Idle;
impl PeakSource for Idle {
    fn peak(&self, _w: Duration) -> Option<f64> {
        Some(0.0)
    }
}

/// Lets spawned tasks run up to `d` of paused time.
async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Starts `st`'s virtual inference loop with `prober`, an idle NPU and no engine
/// signals; returns the task and its cancellation.
fn spawn_idle_vi<P: Prober + Send + Sync + 'static>(
    st: &Arc<Monitor>,
    prober: P,
) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let cancel = CancellationToken::new();
    let vi = tokio::spawn(virtual_inference_task(
        st.clone(),
        prober,
        Idle,
        inputs::NoSignals,
        || vec![(0, Backend::Dcmi)],
        cancel.clone(),
    ));
    (vi, cancel)
}

/// An engine whose /health answers and whose warm-up fails: abnormal, with its virtual
/// inference loop (every probe fails, the NPU idle).
async fn abnormal_after_a_failed_warmup()
-> (Arc<Monitor>, tokio::task::JoinHandle<()>, CancellationToken) {
    let st = Arc::new(Monitor::new(
        spec("enable_virtual_inference = true"),
        vec![0],
    ));
    let (vi, cancel) = spawn_idle_vi(&st, AlwaysFail);
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.status(), Status::Normal);
    advance(Duration::from_secs(1)).await;
    assert!(st.vi.abnormal(), "the failed warm-up is abnormal");
    assert_eq!(st.status(), Status::Abnormal);
    (st, vi, cancel)
}

// Warm-up fails → abnormal; the engine restarts (/health down then up) → re-armed →
// initial state, and the next healthy /status starts a new warm-up.
#[tokio::test(start_paused = true)]
async fn abnormal_then_engine_restart_rearms() {
    let (st, vi, cancel) = abnormal_after_a_failed_warmup().await;
    // Without a restart, abnormal stays.
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.status(), Status::Abnormal);
    st.record_health(&outcome("down"), true);
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.rearms(), 1);
    assert!(!st.vi.abnormal());
    assert_eq!(st.vi.phase(), Phase::NotStarted);
    // The next /status starts a new warm-up (which fails again with this prober).
    assert_eq!(st.status(), Status::Normal);
    advance(Duration::from_secs(1)).await;
    assert!(st.vi.abnormal());
    let (_, failures) = st.vi.outcomes();
    assert_eq!(failures, 2, "two warm-ups");
    cancel.cancel();
    vi.await.unwrap();
    // Stopping keeps abnormal (reference: stop does not reset it).
    assert!(st.vi.abnormal());
    assert_eq!(st.status(), Status::Abnormal);
}

// Issue 11, defect 2: on a wedged engine already abnormal, a garbled /health answer (or
// the agent's own EMFILE) followed by a normal one is not a restart: only a refused
// connection is the "down" half. The class is named in /status/detail.
#[tokio::test(start_paused = true)]
async fn garbled_health_answer_is_not_an_engine_restart() {
    for class in crate::probe::outcome::NOT_DOWN {
        let (st, vi, cancel) = abnormal_after_a_failed_warmup().await;
        st.record_health(
            &HealthOutcome::Unhealthy {
                reason: format!("/health: {}", class.as_str()),
                unreachable: false,
                timed_out: false,
                transport: Some(class),
            },
            true,
        );
        assert_eq!(st.health_detail().last_transport_error, Some(class));
        st.record_health(&outcome("ok"), true);
        assert_eq!(st.rearms(), 0, "{class:?} is not a restart");
        assert_eq!(st.status(), Status::Abnormal, "{class:?}");
        assert_eq!(st.health_detail().last_transport_error, None);
        cancel.cancel();
        vi.await.unwrap();
    }
}

// The agent's own EMFILE says nothing about the engine: not unhealthy under the agent's
// policy; the reference policy counts it as MindIE would.
#[test]
fn the_agents_own_shortage_is_not_an_unhealthy_engine() {
    let local = HealthOutcome::Unhealthy {
        reason: "/health: local (Too many open files)".into(),
        unreachable: false,
        timed_out: false,
        transport: Some(Transport::Local),
    };
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    st.record_health(&outcome("ok"), true);
    st.record_health(&local, true);
    assert_eq!(st.health_detail().state, HealthState::AgentError);
    assert_eq!(st.status(), Status::Normal);
}

/// Warm-up succeeds, the first periodic probe fails, everything after succeeds.
struct FailSecond(std::sync::atomic::AtomicU32);
impl Prober for FailSecond {
    async fn send(&self, _t: Duration) -> ProbeResult {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        ProbeResult::new(
            if n == 1 {
                Err(ProbeFailure::Timeout(Duration::from_secs(5)))
            } else {
                Ok(())
            },
            Duration::from_millis(1),
        )
    }
}

// Timeouts and HTTP errors after abnormal are not a restart: no re-arm.
#[tokio::test(start_paused = true)]
async fn slow_health_after_abnormal_does_not_rearm() {
    let st = Arc::new(Monitor::new(
        spec("enable_virtual_inference = true"),
        vec![0],
    ));
    let (vi, cancel) = spawn_idle_vi(&st, AlwaysFail);
    st.record_health(&outcome("ok"), true);
    st.status();
    advance(Duration::from_secs(1)).await;
    assert!(st.vi.abnormal());
    st.record_health(&outcome("slow"), true);
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.rearms(), 0);
    assert_eq!(st.status(), Status::Abnormal);
    cancel.cancel();
    vi.await.unwrap();
}

// A loop that went abnormal is still sleeping when the engine restarts: it must stop, and
// only the next /status starts a new warm-up.
#[tokio::test(start_paused = true)]
async fn a_rearm_stops_the_loop_still_sleeping_from_before() {
    let st = Arc::new(Monitor::new(
        spec("enable_virtual_inference = true\nmax_failure_count = 1"),
        vec![0],
    ));
    let prober = Arc::new(FailSecond(std::sync::atomic::AtomicU32::new(0)));
    struct Shared(Arc<FailSecond>);
    impl Prober for Shared {
        async fn send(&self, t: Duration) -> ProbeResult {
            self.0.send(t).await
        }
    }
    let (vi, cancel) = spawn_idle_vi(&st, Shared(prober.clone()));
    st.record_health(&outcome("ok"), true);
    st.status();
    advance(Duration::from_millis(100)).await;
    assert!(
        st.vi.abnormal(),
        "warm-up ok, then one idle failure with max 1"
    );
    assert_eq!(prober.0.load(Ordering::SeqCst), 2);
    // Restart while the loop sleeps its 5 s interval.
    st.record_health(&outcome("down"), true);
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.rearms(), 1);
    advance(Duration::from_secs(30)).await;
    assert_eq!(
        prober.0.load(Ordering::SeqCst),
        2,
        "the old loop sent nothing after the re-arm"
    );
    assert_eq!(st.vi.phase(), Phase::NotStarted);
    assert_eq!(st.status(), Status::Normal);
    advance(Duration::from_millis(100)).await;
    assert_eq!(
        prober.0.load(Ordering::SeqCst),
        4,
        "a new warm-up and its first probe"
    );
    assert_eq!(st.vi.phase(), Phase::Running);
    assert!(st.vi.warmup_done());
    cancel.cancel();
    vi.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn health_task_probes_periodically_and_stops_on_cancel() {
    let st = Arc::new(Monitor::new(
        spec("health_collector_timeout_retry_attempts = 1"),
        vec![0],
    ));
    let script = Arc::new(Scripted(Mutex::new(
        vec![
            Fetch::Error(Transport::Refused, "refused".into()),
            Fetch::Response {
                status: 200,
                body: "true".into(),
            },
            Fetch::Response {
                status: 200,
                body: "false".into(),
            },
        ]
        .into(),
    )));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(health_task(st.clone(), script, cancel.clone()));
    advance(Duration::from_millis(10)).await;
    assert_eq!(st.peek_status(), Status::Initial);
    advance(Duration::from_secs(1)).await;
    assert_eq!(st.peek_status(), Status::Normal);
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        st.peek_status(),
        Status::Abnormal,
        "body false after connecting"
    );
    assert_eq!(st.health_detail().probes, 3);
    cancel.cancel();
    task.await.unwrap();
}

/// Scripted `/metrics`: the same answer every time, settable.
#[derive(Clone)]
struct ScriptedMetrics(Arc<Mutex<Result<crate::probe::engine_metrics::EngineMetrics, String>>>);
impl MetricsSource for ScriptedMetrics {
    async fn scrape(
        &self,
        _t: Duration,
    ) -> Result<crate::probe::engine_metrics::EngineMetrics, String> {
        self.0.lock().unwrap().clone()
    }
}

fn stuck_metrics(kv: f64) -> crate::probe::engine_metrics::EngineMetrics {
    crate::probe::engine_metrics::EngineMetrics {
        running: Some(4.0),
        prompt_tokens: Some(100.0),
        generation_tokens: Some(10.0),
        kv_cache_usage: Some(kv),
        ..Default::default()
    }
}

fn qos_spec(eviction: bool) -> EngineSpec {
    let mut s = spec("enable_virtual_inference = true");
    s.qos.eviction = eviction;
    s.rejudged()
}

// The QoS task scrapes and evaluates on its periods; a stuck engine (no progress, KV
// full, failed probe) goes to evict after 3 evaluations below 0.3. /status follows only
// with qos.eviction on.
#[tokio::test(start_paused = true)]
async fn held_evict_answers_abnormal_only_with_qos_eviction() {
    for eviction in [false, true] {
        let st = Arc::new(Monitor::new(qos_spec(eviction), vec![0]));
        st.record_health(&outcome("ok"), true);
        // A failed periodic probe is the latency input.
        st.vi.record(
            &ProbeResult::new(
                Err(ProbeFailure::Timeout(Duration::from_secs(5))),
                Duration::from_secs(5),
            ),
            false,
            Some(95.0),
            Accounting::Reset,
        );
        let metrics = ScriptedMetrics(Arc::new(Mutex::new(Ok(stuck_metrics(1.0)))));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(qos_task(st.clone(), metrics.clone(), Idle, cancel.clone()));
        // Scrapes at 0 s, 5 s, …; evaluations at 5 s, 10 s, 15 s, … (score 0: latency 0,
        // memory 0, progress 0 from the second scrape on).
        advance(Duration::from_millis(10_100)).await;
        assert_eq!(st.qos.level(), Level::Degrade, "2 evaluations below 0.3");
        assert_eq!(st.peek_status(), Status::Normal);
        advance(Duration::from_secs(5)).await;
        assert_eq!(st.qos.level(), Level::Evict);
        assert_eq!(st.qos_evicts(), eviction);
        let want = if eviction {
            Status::Abnormal
        } else {
            Status::Normal
        };
        assert_eq!(st.status(), want, "eviction {eviction}");
        if eviction {
            assert!(
                st.reason().contains("QoS level is evict"),
                "{}",
                st.reason()
            );
        }
        // Recovery: tokens advance again, KV frees up; the level climbs back and /status
        // with it.
        *metrics.0.lock().unwrap() = Ok(crate::probe::engine_metrics::EngineMetrics {
            generation_tokens: Some(1e6),
            ..stuck_metrics(0.2)
        });
        st.vi.record(
            &ProbeResult::new(Ok(()), Duration::from_millis(100)),
            false,
            Some(95.0),
            Accounting::Reset,
        );
        advance(Duration::from_secs(5)).await;
        assert_eq!(st.qos.level(), Level::Normal);
        assert_eq!(st.status(), Status::Normal);
        cancel.cancel();
        task.await.unwrap();
    }
}

// A failed scrape is unknown: no score from missing inputs, no level change.
#[tokio::test(start_paused = true)]
async fn failed_scrapes_are_unknown_not_bad() {
    let st = Arc::new(Monitor::new(qos_spec(true), vec![0]));
    st.record_health(&outcome("ok"), true);
    let metrics = ScriptedMetrics(Arc::new(Mutex::new(Err("connection refused".into()))));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(qos_task(st.clone(), metrics, Idle, cancel.clone()));
    advance(Duration::from_secs(60)).await;
    assert_eq!(st.qos.score(), None);
    assert_eq!(st.qos.level(), Level::Normal);
    assert_eq!(st.status(), Status::Normal);
    let r = st.qos.report(&st.spec.qos);
    assert!(r.scrape_failures >= 10, "{r:?}");
    assert!(
        r.components[1].input.contains("connection refused"),
        "{r:?}"
    );
    cancel.cancel();
    task.await.unwrap();
}

// The V6 rule reads /metrics at the moment of the failure: the capacity figure when the
// scrape works, "not exported" when the scrape has no such series (vLLM 0.18), unknown
// when the scrape fails or the value is not a number.
#[tokio::test(start_paused = true)]
async fn signals_read_capacity_now_and_progress_from_the_qos_scrapes() {
    let st = Arc::new(Monitor::new(qos_spec(false), vec![0]));
    let metrics = ScriptedMetrics(Arc::new(Mutex::new(Ok(
        crate::probe::engine_metrics::EngineMetrics {
            waiting_for_capacity: Some(2.0),
            ..stuck_metrics(0.5)
        },
    ))));
    let signals = ScrapeSignals {
        state: st.clone(),
        metrics: metrics.clone(),
    };
    assert_eq!(
        signals.waiting_for_capacity().await,
        CapacityWaiting::Waiting(2.0)
    );
    *metrics.0.lock().unwrap() = Ok(stuck_metrics(0.5));
    assert_eq!(
        signals.waiting_for_capacity().await,
        CapacityWaiting::NotExported,
        "series absent"
    );
    *metrics.0.lock().unwrap() = Ok(crate::probe::engine_metrics::parse(
        "vllm:num_requests_waiting_by_reason{reason=\"capacity\"} NaN\n",
    ));
    assert!(matches!(
        signals.waiting_for_capacity().await,
        CapacityWaiting::Unknown(why) if why.contains("not a number")
    ));
    *metrics.0.lock().unwrap() = Err("refused".into());
    assert_eq!(
        signals.waiting_for_capacity().await,
        CapacityWaiting::Unknown("refused".into()),
        "scrape failed"
    );
    // The agent policy's fresh read carries the same figure from its one scrape.
    *metrics.0.lock().unwrap() = Ok(crate::probe::engine_metrics::EngineMetrics {
        waiting_for_capacity: Some(3.0),
        ..stuck_metrics(0.5)
    });
    let fresh = signals.fresh().await;
    assert_eq!(fresh.capacity, Some(CapacityWaiting::Waiting(3.0)));
    assert_eq!(fresh.tokens, Some(110.0));
    *metrics.0.lock().unwrap() = Err("refused".into());
    assert_eq!(
        signals.fresh().await.capacity,
        Some(CapacityWaiting::Unknown("refused".into()))
    );
    // Progress comes from the QoS task's scrapes.
    assert_eq!(signals.stalled_for(), None);
    st.qos.record_scrape(Ok(stuck_metrics(0.5)));
    advance(Duration::from_secs(5)).await;
    st.qos.record_scrape(Ok(stuck_metrics(0.5)));
    assert_eq!(signals.stalled_for(), Some(Duration::from_secs(5)));
}

// A /health that times out while the engine demonstrably serves (a periodic virtual
// request succeeded recently, or tokens advance) is slow, not abnormal; without that
// evidence, or for an HTTP error, it is abnormal as in the reference.
#[tokio::test(start_paused = true)]
async fn slow_health_is_excused_only_while_the_engine_serves() {
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    st.record_health(&outcome("ok"), true);
    st.record_health(&outcome("slow"), true);
    assert_eq!(
        st.status(),
        Status::Abnormal,
        "no evidence yet: the reference's verdict"
    );
    st.record_health(&outcome("ok"), true);
    st.vi.record(
        &ProbeResult::new(Ok(()), Duration::from_millis(100)),
        false,
        Some(90.0),
        Accounting::Reset,
    );
    st.record_health(&outcome("slow"), true);
    assert_eq!(st.status(), Status::Normal);
    let h = st.health_detail();
    assert_eq!((h.state, h.excused_timeouts), (HealthState::Slow, 1));
    assert!(h.last_error.unwrap().contains("virtual request succeeded"));
    st.record_health(&outcome("503"), true);
    assert_eq!(st.status(), Status::Abnormal, "only timeouts are excused");
    st.record_health(&outcome("ok"), true);
    // The evidence goes stale after two busy intervals (40 s).
    advance(Duration::from_secs(41)).await;
    st.record_health(&outcome("slow"), true);
    assert_eq!(st.status(), Status::Abnormal);
    // An excused timeout after the engine was down is not a restart: no re-arm.
    st.vi.set_abnormal("test");
    st.record_health(&outcome("down"), true);
    st.vi.record(
        &ProbeResult::new(Ok(()), Duration::from_millis(100)),
        false,
        Some(90.0),
        Accounting::Reset,
    );
    st.record_health(&outcome("slow"), true);
    assert_eq!(st.rearms(), 0, "an excused timeout does not re-arm");
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.rearms(), 1, "a real answer does");
    advance(Duration::from_secs(41)).await;
    // Tokens advancing are evidence too.
    st.record_health(&outcome("ok"), true);
    st.qos.record_scrape(Ok(stuck_metrics(0.5)));
    st.qos
        .record_scrape(Ok(crate::probe::engine_metrics::EngineMetrics {
            generation_tokens: Some(11.0),
            ..stuck_metrics(0.5)
        }));
    st.record_health(&outcome("slow"), true);
    assert_eq!(st.status(), Status::Normal);
    assert!(
        st.health_detail()
            .last_error
            .unwrap()
            .contains("token counters")
    );
}

// --- A state saved by one agent process and taken back by the next (`saved`) ----------------

/// An engine that went abnormal the reference's way: healthy, started, six counted failures.
fn hung_monitor() -> Monitor {
    let st = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    st.record_health(&outcome("ok"), true);
    assert_eq!(st.status(), Status::Normal);
    st.vi.set_warmup_done();
    st.vi.set_phase(Phase::Running);
    st.vi.apply(&account::Accounted {
        accounting: Accounting::Incremented,
        count: 6,
        abnormal: Some("6 counted failures".into()),
        why: None,
        stalled: None,
    });
    assert_eq!(st.status(), Status::Abnormal);
    st
}

// Issue 24: a restart forgot a hung engine and answered `normal` for the warm-up's 180 s.
#[test]
fn a_restored_hung_engine_is_abnormal_from_its_first_answer() {
    let old = hung_monitor();
    let saved = old.saved();
    let new = Monitor::new(old.spec.clone(), vec![0]);
    new.restore(&saved, saved::Carry::ALL);
    assert_eq!(new.peek_status(), Status::Abnormal);
    assert_eq!(new.status(), Status::Abnormal);
    assert_eq!(
        new.vi.phase(),
        Phase::Stopped,
        "the loop does not run again"
    );
    assert_eq!(new.vi.failure_count(), 6);
    assert!(
        new.reason().contains("6 counted failures"),
        "{}",
        new.reason()
    );
    // The engine then restarts (down, then up): re-armed as before.
    new.record_health(&outcome("down"), true);
    new.record_health(&outcome("ok"), true);
    assert_eq!(new.status(), Status::Normal);
    assert_eq!(new.rearms(), 1);
}

// A crashed engine whose agent restarts reads `abnormal`, not `initial`: `/health` answered
// before.
#[test]
fn a_restored_engine_that_answered_before_is_abnormal_when_down() {
    let old = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    old.record_health(&outcome("ok"), true);
    old.record_health(&outcome("down"), true);
    assert_eq!(old.peek_status(), Status::Abnormal);
    let new = Monitor::new(old.spec.clone(), vec![0]);
    new.restore(&old.saved(), saved::Carry::ALL);
    assert_eq!(new.peek_status(), Status::Abnormal);
    assert!(new.health_detail().has_connected);
}

// A count in progress resumes without a new warm-up; a warm loop resumes at once.
#[tokio::test(start_paused = true)]
async fn a_count_in_progress_resumes_and_the_loop_starts_without_a_warm_up() {
    let old = Monitor::new(spec("enable_virtual_inference = true"), vec![0]);
    old.record_health(&outcome("ok"), true);
    old.status();
    old.vi.set_warmup_done();
    old.vi.set_phase(Phase::Running);
    old.vi.apply(&account::Accounted {
        accounting: Accounting::Incremented,
        count: 4,
        abnormal: None,
        why: None,
        stalled: None,
    });
    let new = Arc::new(Monitor::new(old.spec.clone(), vec![0]));
    new.restore(&old.saved(), saved::Carry::ALL);
    assert_eq!(new.vi.failure_count(), 4);
    assert_eq!(new.peek_status(), Status::Normal);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(virtual_inference_task(
        new.clone(),
        AlwaysFail,
        Idle,
        inputs::NoSignals,
        || vec![(0, Backend::Dcmi)],
        cancel.clone(),
    ));
    // No /status is needed: the restored latch starts it. Two failures reach six.
    advance(Duration::from_secs(12)).await;
    assert_eq!(new.peek_status(), Status::Abnormal);
    let last = new.vi.last_probe().unwrap();
    assert!(!last.warmup, "no warm-up was sent again");
    assert_eq!(
        new.vi.outcomes(),
        (0, 2),
        "exactly the two remaining failures"
    );
    cancel.cancel();
    let _ = task.await;
}

// A reload that changes the QoS table resets only the QoS part; `forget` (another engine
// process) clears virtual inference and the level, and waits for a `/status` to start again.
#[test]
fn carry_and_forget_reset_only_what_they_say() {
    let old = hung_monitor();
    let new = Monitor::new(old.spec.clone(), vec![0]);
    new.restore(
        &old.saved(),
        saved::Carry {
            qos: false,
            ..saved::Carry::ALL
        },
    );
    assert_eq!(new.peek_status(), Status::Abnormal);
    let new = Monitor::new(old.spec.clone(), vec![0]);
    new.restore(
        &old.saved(),
        saved::Carry {
            virtual_inference: false,
            ..saved::Carry::ALL
        },
    );
    assert_eq!(
        new.peek_status(),
        Status::Normal,
        "virtual inference starts over"
    );
    assert_eq!(new.vi.phase(), Phase::NotStarted);
    let new = Monitor::new(old.spec.clone(), vec![0]);
    new.restore(&old.saved(), saved::Carry::ALL);
    new.forget("another process");
    assert_eq!(new.peek_status(), Status::Normal);
    assert!(!new.started.load(Ordering::Acquire));
    assert!(!new.vi.warmup_done());
}

// The stopped-process rule over samples (agent policy): a process seen stopped with the same
// CPU ticks for the grace is `abnormal`; one that ran in between (its ticks moved) starts its
// stop again; the reference policy never applies it.
#[tokio::test(start_paused = true)]
async fn a_process_stopped_all_along_is_abnormal_after_the_grace() {
    use crate::probe::process::{Lookup, ProcState};
    let mut agent = spec("");
    agent.policy.value = crate::config::policy::Policy::Agent;
    let m = Monitor::new(agent.rejudged(), vec![0]);
    m.record_health(&outcome("ok"), true);
    let found = |ticks: u64, state: ProcState| Lookup::Found {
        pid: 10,
        states: vec![(10, ProcState::Live('S'), 1), (11, state, ticks)],
    };
    let at = |secs: u64| tokio::time::Instant::now() + Duration::from_secs(secs);
    m.record_process(&found(5, ProcState::Stopped), tokio::time::Instant::now());
    tokio::time::advance(Duration::from_secs(1)).await;
    m.record_process(&found(5, ProcState::Stopped), at(0));
    assert_eq!(m.peek_status(), Status::Normal, "1 s: within the grace");
    tokio::time::advance(Duration::from_secs(1)).await;
    m.record_process(&found(5, ProcState::Stopped), at(0));
    assert_eq!(m.peek_status(), Status::Abnormal, "2 s stopped");
    assert!(
        m.reason().contains("process 11 is stopped"),
        "{}",
        m.reason()
    );
    // It ran between two samples (SIGCONT then SIGSTOP): its stop starts again.
    m.record_process(&found(6, ProcState::Stopped), at(0));
    assert_eq!(m.peek_status(), Status::Normal);
    m.record_process(&found(6, ProcState::Live('R')), at(0));
    assert_eq!(m.stopped_for(), None);
    // The reference policy has no such rule.
    let reference = Monitor::new(spec(""), vec![0]);
    reference.record_health(&outcome("ok"), true);
    reference.record_process(&found(5, ProcState::Stopped), at(0));
    tokio::time::advance(Duration::from_secs(60)).await;
    reference.record_process(&found(5, ProcState::Stopped), at(0));
    assert_eq!(reference.peek_status(), Status::Normal);
}

// Whether the engine's processes are in sight is a condition an operator can read: silent
// rule or not. It never blocks virtual inference.
#[tokio::test(start_paused = true)]
async fn the_engine_processes_in_sight_or_why_not_is_a_condition() {
    use crate::probe::process::{Lookup, ProcState};
    let m = Monitor::new(spec(""), vec![0]);
    let sight = |m: &Monitor| {
        m.conditions()
            .into_iter()
            .find(|c| c.name == "engine_processes")
    };
    assert!(sight(&m).is_none(), "nothing looked yet");
    m.record_process(
        &Lookup::NotFound("no process in sight holds port 8000".to_owned()),
        tokio::time::Instant::now(),
    );
    let c = sight(&m).unwrap();
    assert_eq!(c.ok, Some(true), "informational");
    assert!(
        c.value
            .contains("not in sight: no process in sight holds port 8000")
    );
    assert!(c.note.contains("PID namespace"), "{}", c.note);
    m.record_process(
        &Lookup::Found {
            pid: 10,
            states: vec![(10, ProcState::Live('S'), 1), (11, ProcState::Live('R'), 3)],
        },
        tokio::time::Instant::now(),
    );
    let c = sight(&m).unwrap();
    assert_eq!(c.value, "pid 10: 2 process(es) in sight");
    assert!(c.note.is_empty());
}

// Issue 48: a `/health` failure within the grace reads the cause last, as every reason does,
// and names /health once.
#[test]
fn a_health_failure_within_the_grace_ends_with_its_cause() {
    let mut agent = spec("enable_virtual_inference = true");
    agent.policy.value = crate::config::policy::Policy::Agent;
    let st = Monitor::new(agent.rejudged(), vec![0]);
    st.record_health(&outcome("ok"), true);
    let cause = crate::probe::outcome::ProbeFailure::Status(503).to_string();
    st.record_health(
        &HealthOutcome::Unhealthy {
            reason: cause.clone(),
            unreachable: false,
            timed_out: false,
            transport: None,
        },
        true,
    );
    assert_eq!(st.status(), Status::Normal, "within the grace");
    let why = st.reason();
    assert!(
        why.starts_with("/health fails for ") && why.ends_with(&format!("): {cause}")),
        "{why}"
    );
    assert_eq!(why.matches("/health").count(), 1, "{why}");
}
