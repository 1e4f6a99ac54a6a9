//! QoS score, levels and stall detection end to end: the fake engine and the agent binary on
//! the fake driver as real processes, the engine's real `/metrics` scraped over HTTP, the
//! agent's `/qos`, `/status` and `/metrics` read over real sockets. Timing is compressed as
//! in `agent_e2e` (`support::stack::FAST_TIMING`: 500 ms requests, 2 s busy interval).
#![cfg(feature = "fake-driver")]

use crate::support::load::Load;
use crate::support::stack::Stack;
use npu_health_wire::Accounting;
use npu_health_wire::EngineQos;
use npu_health_wire::Level;
use npu_health_wire::Progress;
use std::time::{Duration, Instant};

/// QoS evaluated every 500 ms from scrapes every 500 ms (defaults: 5 s and 5 s).
const FAST_QOS: &str = "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\n";

fn engine_base(stack: &Stack) -> String {
    format!("http://127.0.0.1:{}", stack.engine_port)
}

/// Polls `/qos` and `/status` every 100 ms for `d`; returns the `/qos` objects and bodies.
fn watch(stack: &Stack, d: Duration) -> (Vec<EngineQos>, Vec<String>) {
    let end = Instant::now() + d;
    let (mut qos, mut status) = (Vec::new(), Vec::new());
    while Instant::now() < end {
        qos.push(stack.typed_qos());
        status.push(stack.get(&stack.status_url()).expect("/status").1);
        std::thread::sleep(Duration::from_millis(100));
    }
    (qos, status)
}

fn levels(qos: &[EngineQos]) -> Vec<Level> {
    qos.iter().map(|q| q.state.level).collect()
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

// Load with high but healthy latency: time to first token over the budget, tokens flowing,
// KV cache far from full. The score falls to `throttle` and never below, also once the load
// stops and the engine is idle with the slow probe still the latest; /status stays normal
// throughout.
#[test]
fn high_latency_under_load_is_throttle_at_worst() {
    let stack = Stack::start_with(
        "max_failure_count = 3",
        &format!("{FAST_QOS}ttft_budget = \"250ms\"\n"),
        "",
    );
    // Every completion (the virtual probe included) waits 300 ms before it is scheduled.
    stack.faults(r#"{"latency_ms": 300}"#);
    // 16 clients of 2 s streams (400 tokens × 5 ms), spread over one cycle: requests are
    // always running and tokens always advancing.
    let load = Load::start(
        &engine_base(&stack),
        "m",
        16,
        400,
        Duration::from_millis(150),
    );
    let (mut qos, mut status) = watch(&stack, Duration::from_secs(8));
    let streams = load.stop();
    assert!(streams >= 16, "the load ran: {streams} streams");
    let (idle_qos, idle_status) = watch(&stack, Duration::from_secs(2));
    assert!(
        idle_qos.iter().any(|q| q.state.progress == Progress::Idle),
        "the engine went idle: {:?}",
        idle_qos
            .iter()
            .map(|q| q.state.progress)
            .collect::<Vec<_>>()
    );
    qos.extend(idle_qos);
    status.extend(idle_status);
    let seen = levels(&qos);
    let log = stack.agent_log();
    assert!(
        seen.iter().all(|l| *l <= Level::Throttle),
        "levels {seen:?}\nlast /qos {:?}\n{log}",
        qos.last().unwrap()
    );
    assert!(
        seen.contains(&Level::Throttle),
        "the latency was high enough to matter: levels {seen:?}\n{:?}",
        qos.last().unwrap()
    );
    assert!(
        !log.contains("-> degrade") && !log.contains("-> evict"),
        "{log}"
    );
    assert!(log.contains("QoS level normal -> throttle"), "{log}");
    assert!(
        status.iter().all(|s| s == r#"{"status":"normal"}"#),
        "{status:?}"
    );
    // The inputs were what the test meant: slow first token, tokens advancing.
    assert!(
        qos.iter().any(|q| q
            .state
            .components
            .first()
            .is_some_and(|c| c.name == "latency" && c.score == Some(0.0))),
        "a probe over the budget was scored"
    );
    assert!(
        qos.iter().any(|q| q.state.progress == Progress::Advancing),
        "{:?}",
        qos.iter().map(|q| q.state.progress).collect::<Vec<_>>()
    );
    let vi = stack.typed_detail().virtual_inference;
    let ttft = vi.last_probe.as_ref().and_then(|p| p.ttft_ms);
    assert!(ttft.unwrap_or(0.0) > 250.0, "{vi:?}");
    assert_eq!(vi.failure_count, 0);
}

// KV cache at 95 % with HBM at 92 % on an otherwise healthy engine: memory pressure shows,
// but the engine is not below `throttle` (HBM near full is normal: vLLM preallocates the
// KV cache, so it is shown and not scored). The probe streams 8 tokens here, so the latency
// component also carries the time per output token.
#[test]
fn full_kv_cache_and_hbm_on_a_healthy_engine_is_not_below_throttle() {
    let stack = Stack::start_with(
        "max_failure_count = 3",
        &format!("{FAST_QOS}probe_max_tokens = 8\n"),
        "hbm_total_mb = 65536\nhbm_used_mb = 60293",
    );
    stack.faults(r#"{"kv_cache_usage": 0.95}"#);
    let load = Load::start(
        &engine_base(&stack),
        "m",
        2,
        100,
        Duration::from_millis(100),
    );
    let (qos, status) = watch(&stack, Duration::from_secs(4));
    load.stop();
    let seen = levels(&qos);
    assert!(
        seen.iter().all(|l| *l <= Level::Throttle),
        "levels {seen:?}\n{:?}",
        qos.last().unwrap()
    );
    assert!(
        status.iter().all(|s| s == r#"{"status":"normal"}"#),
        "{status:?}"
    );
    let q = stack.typed_qos();
    let score = q.state.score.expect("a score");
    assert!(score >= 0.5, "{q:?}");
    let memory = &q.state.components[1];
    assert_eq!(memory.name, "memory");
    assert_eq!(
        memory.score,
        Some(0.5),
        "95 % KV cache is half the headroom: {q:?}"
    );
    assert!(memory.input.contains("KV-cache usage 95.0 %"), "{q:?}");
    // HBM is read from the driver and shown, not scored.
    let ratio = q.device.hbm_ratio.expect("HBM ratio");
    assert!((ratio - 0.92).abs() < 0.005, "{q:?}");
    assert_eq!(q.device.hbm_used_mb, Some(2 * 60293));
    assert!(!q.device.scored);
    // The streamed probe: 8 tokens, time to first token and per output token measured.
    let s = stack.engine_stats();
    assert_eq!(s["last_body"]["max_tokens"], 8, "{s}");
    assert_eq!(s["last_body"]["stream"], true, "{s}");
    let d = stack.typed_detail();
    let probe = d
        .virtual_inference
        .last_probe
        .as_ref()
        .expect("a probe ran");
    assert!(probe.success, "{probe:?}");
    assert!(probe.ttft_ms.unwrap_or(0.0) > 0.0, "{probe:?}");
    let tpot = probe.tpot_ms.expect("time per output token");
    // Arrival times are measured; events read together share a time, so only its presence
    // and sign are checked here.
    assert!(tpot >= 0.0, "{tpot} ms per output token");
    assert!(
        q.state.components[0].input.contains("ms per output token"),
        "{q:?}"
    );
    // /status/detail carries the same object, and the gauges are exported.
    assert_eq!(d.qos.state.level, q.state.level);
    let m = stack.metrics();
    let health = metric(&m, "inference_node_health{model=\"m\",engine=\"e2e\"}")
        .unwrap_or_else(|| panic!("inference_node_health missing\n{m}"));
    assert!((0.5..=1.0).contains(&health), "{health}");
    let level = q.state.level.as_str();
    assert_eq!(
        metric(
            &m,
            &format!("npu_health_agent_qos_level{{engine=\"e2e\",level=\"{level}\"}}")
        ),
        Some(1.0),
        "{m}"
    );
}

/// Cycle of a failing probe on a busy NPU: request timeout + busy interval (FAST_TIMING).
const BUSY_CYCLE: Duration = Duration::from_millis(2500);
const STALL_WINDOW: Duration = Duration::from_secs(2);
const MAX_FAILURES: u64 = 3;

/// Makes the engine busy but stuck: AI Cube at 95 %, four requests running, no token.
fn wedge(stack: &Stack) -> (Vec<std::net::TcpStream>, u64, Instant) {
    stack.faults(r#"{"npu_busy_stuck": true}"#);
    let held = stack.hold_requests(4, r#"{"model": "m", "prompt": "stuck", "max_tokens": 100}"#);
    let probes = stack.engine_stats()["virtual_completions"]
        .as_u64()
        .unwrap();
    (held, probes, Instant::now())
}

// A busy-but-stuck engine with stall detection on: once it has made no progress for
// stall_window, each failed probe counts, and /status is abnormal after max_failure_count of
// them.
#[test]
fn busy_but_stuck_engine_is_abnormal_with_stall_detection() {
    let stack = Stack::start_with(
        &format!("max_failure_count = {MAX_FAILURES}"),
        &format!("{FAST_QOS}stall_detection = true\nstall_window = \"2s\"\n"),
        "",
    );
    let (_held, probes_before, t0) = wedge(&stack);
    stack.wait_for_status("abnormal", Duration::from_secs(60));
    let elapsed = t0.elapsed();
    let probes = stack.engine_stats()["virtual_completions"]
        .as_u64()
        .unwrap()
        - probes_before;
    let vi = stack.typed_detail().virtual_inference;
    eprintln!("abnormal {elapsed:?} after the wedge, {probes} probes");
    assert_eq!(vi.failure_count, MAX_FAILURES as i64, "{vi:?}");
    let last = vi.last_probe.as_ref().expect("a probe ran");
    assert_eq!(last.accounting, Accounting::IncrementedStalled, "{vi:?}");
    assert!(last.peak.unwrap_or_default() >= 90.0, "{vi:?}");
    assert!(
        vi.abnormal_reason
            .as_deref()
            .unwrap_or_default()
            .contains("no token advanced"),
        "{vi:?}"
    );
    // Within stall_window + max_failure_count probes: probes are at least BUSY_CYCLE apart,
    // so at most ceil(window / cycle) of them fall inside the window (+1 in flight at the
    // wedge). Counted, not timed, so a slow machine cannot fail it.
    let in_window = STALL_WINDOW.as_millis().div_ceil(BUSY_CYCLE.as_millis()) as u64;
    assert!(
        probes <= in_window + 1 + MAX_FAILURES,
        "{probes} probes before abnormal\n{}",
        stack.agent_log()
    );
    let q = stack.typed_qos().state;
    assert_eq!(q.progress, Progress::Stalled, "{q:?}");
    assert!(
        q.stalled_for_s.unwrap_or_default() >= STALL_WINDOW.as_secs_f64(),
        "{q:?}"
    );
    assert!(stack.agent_log().contains("stall detection"));
}

// The same engine with stall detection off (the reference): busy failures reset the count
// and the engine is never reported, however long it stays stuck.
#[test]
fn busy_but_stuck_engine_is_never_abnormal_without_stall_detection() {
    let stack = Stack::start_with(&format!("max_failure_count = {MAX_FAILURES}"), FAST_QOS, "");
    let (_held, probes_before, _) = wedge(&stack);
    // Long enough for the stall-detection run above to be abnormal twice over.
    let budget = STALL_WINDOW + BUSY_CYCLE * (MAX_FAILURES as u32 + 2);
    let (_, status) = watch(&stack, budget);
    assert!(
        status.iter().all(|s| s == r#"{"status":"normal"}"#),
        "{status:?}"
    );
    let probes = stack.engine_stats()["virtual_completions"]
        .as_u64()
        .unwrap()
        - probes_before;
    assert!(probes > MAX_FAILURES, "enough failing probes ran: {probes}");
    let vi = stack.typed_detail().virtual_inference;
    assert_eq!(vi.failure_count, 0, "{vi:?}");
    let last = vi.last_probe.as_ref().expect("a probe ran");
    assert_eq!(last.accounting, Accounting::Reset, "{vi:?}");
    assert!(!last.success, "{vi:?}");
    // The stall is seen (and scored), it just does not count without the option.
    let q = stack.typed_qos();
    assert_eq!(q.state.progress, Progress::Stalled, "{q:?}");
    assert!(!q.stall_detection.enabled);
}
