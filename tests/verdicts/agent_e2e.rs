//! End to end with real processes and sockets: the fake engine, the agent binary on the fake
//! driver (dlopen'd), and a Node Manager emulator with the reference's heartbeat rules (poll
//! `/status` every 1 s with a 5 s timeout, heartbeat every 3 s, 5 consecutive abnormal →
//! kill), all intervals divided by ten. The agent's timing is compressed the same way
//! (`support::stack::FAST_TIMING`).
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{Launch, Stack};
use fake_engine::node_manager::{self, NmOptions, NmReport, NmStatus};
use npu_health_wire::Accounting;
use npu_health_wire::Phase;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const SCALE: f64 = 0.1;

/// Runs the emulator against the stack for at most `limit`; kills the engine if it decides to.
async fn node_manager(stack: &mut Stack, limit: Duration) -> NmReport {
    let mut opts = NmOptions::reference(vec![stack.status_url()], SCALE);
    // The reference's 120 s grace period, shortened: the stack is already up.
    opts.grace_period = Duration::from_millis(500);
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let timer = tokio::spawn(async move {
        tokio::time::sleep(limit).await;
        stop.cancel();
    });
    let (kill_tx, kill_rx) = std::sync::mpsc::channel();
    let report = node_manager::run(opts, cancel, move || {
        let _ = kill_tx.send(());
    })
    .await;
    timer.abort();
    if kill_rx.try_recv().is_ok() {
        stack.kill_engine();
    }
    report
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// (a) A healthy idle engine is never abnormal.
#[test]
fn healthy_idle_engine_is_never_abnormal() {
    let mut stack = Stack::start("max_failure_count = 3");
    let report = runtime().block_on(node_manager(&mut stack, Duration::from_secs(6)));
    assert_eq!(report.killed_at_ms, None, "{report:?}");
    assert_eq!(report.max_consecutive_abnormal, 0);
    assert!(report.heartbeats >= 15, "{} heartbeats", report.heartbeats);
    assert!(
        report.polls.iter().all(|p| p.detected == NmStatus::Normal),
        "{:?}",
        report.polls.iter().find(|p| p.detected != NmStatus::Normal)
    );
    let d = stack.typed_detail();
    assert_eq!(d.virtual_inference.phase, Phase::Running, "{d:?}");
    let last = d
        .virtual_inference
        .last_probe
        .as_ref()
        .expect("a probe ran");
    assert_eq!(last.outcome, "success", "{d:?}");
    // The virtual request is the reference's: `<16-digit µs>_virtual`, the plain body.
    let s = stack.engine_stats();
    let id = s["last_request_id"].as_str().unwrap();
    let (digits, suffix) = id.split_once('_').unwrap();
    assert_eq!(suffix, "virtual");
    assert_eq!(digits.len(), 16, "{id}");
    assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{id}");
    assert_eq!(
        s["last_body"],
        serde_json::json!({"model": "m", "prompt": "1", "max_tokens": 1})
    );
    assert_eq!(s["last_content_type"], "application/json");
    assert!(s["virtual_completions"].as_u64().unwrap() >= 5, "{s}");
}

// (b) An engine hung with the NPU idle: abnormal after max_failure_count probes, and Node
// Manager kills it after 5 heartbeats.
#[test]
fn hung_engine_with_idle_npu_is_detected_and_killed() {
    let mut stack = Stack::start("max_failure_count = 3");
    stack.faults(r#"{"hang": true}"#);
    let report = runtime().block_on(node_manager(&mut stack, Duration::from_secs(20)));
    let killed = report
        .killed_at_ms
        .unwrap_or_else(|| panic!("not killed: {report:?}\n{}", stack.agent_log()));
    assert!(report.max_consecutive_abnormal >= 5);
    let vi = stack.typed_detail().virtual_inference;
    assert!(vi.abnormal, "{vi:?}");
    assert_eq!(vi.failure_count, 3);
    assert_eq!(vi.phase, Phase::Stopped);
    // The verdict's reason, not the top-level one: the emulator has killed the engine by
    // now, so a /health probe after the kill may already say it is gone (seen once under load).
    assert!(
        vi.abnormal_reason
            .as_deref()
            .unwrap_or_default()
            .contains("consecutive virtual requests failed"),
        "{vi:?}"
    );
    // The engine stayed "healthy" on /health all along: only virtual inference caught it.
    assert!(
        report
            .polls
            .iter()
            .filter(|p| p.detected == NmStatus::Abnormal)
            .all(|p| p.error.is_none())
    );
    eprintln!("killed {killed} ms after the hang was injected");
    // The emulator's kill reached the engine: it no longer answers.
    let health = format!("http://127.0.0.1:{}/health", stack.engine_port);
    assert!(
        stack.get(&health).is_none(),
        "the engine still answers after the kill"
    );
    // Metrics tell the same story.
    let (_, m) = stack
        .get(&format!("http://127.0.0.1:{}/metrics", stack.mgmt_port))
        .unwrap();
    let value = |prefix: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{prefix} missing from\n{m}"))
    };
    assert_eq!(
        value("npu_health_agent_counted_failures{engine=\"e2e\"}"),
        3.0
    );
    // The old name, for one release, untyped (a gauge named `_count` fails promtool's lint).
    assert_eq!(value("npu_health_agent_failure_count{engine=\"e2e\"}"), 3.0);
    assert!(
        m.contains("# TYPE npu_health_agent_failure_count untyped\n"),
        "{m}"
    );
    // One detection, from the first failed probe's start: three 500 ms timeouts at least.
    assert_eq!(
        value("npu_health_agent_detection_seconds_count{engine=\"e2e\"}"),
        1.0
    );
    let took = value("npu_health_agent_detection_seconds_sum{engine=\"e2e\"}");
    assert!(took >= 1.5, "detection took {took} s");
    assert!(
        value("npu_health_agent_virtual_probes_total{engine=\"e2e\",outcome=\"failure\"}") >= 3.0
    );
    assert!(
        value("npu_health_agent_virtual_probes_total{engine=\"e2e\",outcome=\"success\"}") >= 1.0
    );
    assert_eq!(
        value("npu_health_agent_status{engine=\"e2e\",status=\"abnormal\"}"),
        1.0
    );
    assert!(value("npu_health_agent_virtual_probe_duration_seconds_count{engine=\"e2e\"}") >= 4.0);
    // The three failed probes timed out at 500 ms: all three are above the 0.25 s bucket.
    let count = value("npu_health_agent_virtual_probe_duration_seconds_count{engine=\"e2e\"}");
    let fast =
        value("npu_health_agent_virtual_probe_duration_seconds_bucket{engine=\"e2e\",le=\"0.25\"}");
    assert!(count - fast >= 3.0, "count {count}, at most 0.25 s: {fast}");
    assert_eq!(
        value("npu_health_agent_chip_cube_utilization{id=\"0\""),
        0.0
    );
    assert_eq!(value("npu_health_agent_device_stale{id=\"0\""), 0.0);
}

// (c) A busy engine whose probes fail is never abnormal: a failure while the NPU is busy
// resets the count (reference rule 3).
#[test]
fn busy_engine_with_failing_probes_is_never_abnormal() {
    let mut stack = Stack::start("max_failure_count = 3");
    stack.faults(r#"{"http_5xx": true, "npu_usage": 60}"#);
    let report = runtime().block_on(node_manager(&mut stack, Duration::from_secs(6)));
    assert_eq!(report.killed_at_ms, None, "{report:?}");
    assert_eq!(report.max_consecutive_abnormal, 0);
    let vi = stack.typed_detail().virtual_inference;
    assert!(!vi.abnormal, "{vi:?}");
    assert_eq!(vi.failure_count, 0);
    let last = vi.last_probe.as_ref().expect("a probe ran");
    assert_eq!(
        last.outcome, "failed: the engine answered HTTP 500 Internal Server Error",
        "{vi:?}"
    );
    assert_eq!(last.accounting, Accounting::Reset);
    assert!(last.peak.unwrap_or_default() >= 60.0, "{vi:?}");
}

// (d) /health slow under load: /status answers from the snapshot, so Node Manager's polls
// never time out (the reference probes /health inside /status and would time out here).
#[test]
fn slow_health_does_not_slow_status() {
    let mut stack = Stack::start(
        "max_failure_count = 3\nhealth_collector_timeout = 5\nhealth_collector_timeout_retry_attempts = 1",
    );
    stack.faults(r#"{"slow_health_ms": 3000}"#);
    // Load: streaming requests keep the engine (and the fake NPU) busy throughout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = format!("http://127.0.0.1:{}/v1/completions", stack.engine_port);
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, url) = (stop.clone(), url.clone());
            std::thread::spawn(move || {
                let mut done = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = r#"{"model": "m", "prompt": "a long prompt", "max_tokens": 100, "stream": true}"#;
                    if support::stack::http("POST", &url, Some(body)).is_some_and(|(c, b)| c == 200 && b.contains("[DONE]")) {
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let report = runtime().block_on(node_manager(&mut stack, Duration::from_secs(8)));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let streams: u32 = load.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(streams >= 4, "the load ran: {streams} streams completed");
    let window = stack.typed_detail().window;
    assert!(
        window.peak.unwrap_or(0) >= 60,
        "the NPU was busy: {window:?}"
    );
    assert_eq!(report.failed_polls(), 0, "{report:?}");
    assert_eq!(report.killed_at_ms, None);
    let stats = stack.engine_stats();
    assert!(
        stats["health"].as_u64().unwrap() >= 2,
        "/health was really probed: {stats}"
    );
    assert!(report.polls.iter().all(|p| p.detected == NmStatus::Normal));
    // The emulator's timeout is 500 ms; every poll answered within it.
    let slowest = report
        .polls
        .iter()
        .map(|p| p.latency_ms)
        .fold(0.0, f64::max);
    assert!(slowest < 500.0, "slowest /status {slowest} ms");
}

// /status says `initial` until the engine's /health answers, then `normal` (the agent starts
// before the engine, as when a model is still loading).
#[test]
fn status_is_initial_until_the_engine_answers() {
    let stack = support::stack::Stack::start_ordered("max_failure_count = 3", false);
    assert_eq!(
        stack.get(&stack.status_url()).unwrap(),
        (200, r#"{"status":"normal"}"#.to_owned())
    );
    let log = stack.agent_log();
    assert!(log.find("/health answers").is_some(), "{log}");
}

// After abnormal, the agent re-arms when the engine restarts (/health down, then up), and a
// new warm-up and periodic probes run against the restarted engine.
#[test]
fn engine_restart_rearms_virtual_inference() {
    let stack = Stack::start("max_failure_count = 2");
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", Duration::from_secs(20));
    // Still hung but /health answers: abnormal stays (no restart seen), over several
    // /health probes.
    let before = stack.typed_detail().health.probes;
    stack.wait_until_typed("5 more /health probes", Duration::from_secs(20), |d| {
        d.health.probes >= before + 5
    });
    assert_eq!(
        stack.get(&stack.status_url()).unwrap().1,
        r#"{"status":"abnormal"}"#
    );
    assert_eq!(stack.typed_detail().virtual_inference.rearms, 0);
    // "Restart": the listener goes away (the agent sees the refusal) and comes back healthy.
    stack.faults(r#"{"listening": false}"#);
    stack.wait_until_typed("/health refused", Duration::from_secs(20), |d| {
        d.health.last_transport_error == Some(npu_health_wire::Transport::Refused)
    });
    let restarted_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    stack.faults(r#"{"listening": true, "hang": false}"#);
    stack.wait_for_status("normal", Duration::from_secs(20));
    assert_eq!(stack.typed_detail().virtual_inference.rearms, 1);
    // A new warm-up ran, then a periodic probe succeeded after the restart.
    let vi = stack
        .wait_until_typed(
            "a periodic probe succeeded after the restart",
            Duration::from_secs(20),
            |d| {
                d.virtual_inference
                    .last_probe
                    .as_ref()
                    .is_some_and(|p| !p.warmup && p.success && p.at_unix_ms > restarted_ms)
            },
        )
        .virtual_inference;
    assert!(vi.warmup_done, "{vi:?}");
    assert!(!vi.abnormal);
    assert_eq!(vi.phase, Phase::Running);
    assert!(stack.agent_log().contains("re-armed"));
}

// A failure with the AI Cube figures unavailable is not counted: the fake driver reads NA,
// so the window holds no valid sample. More failed probes run than max_failure_count, and
// each is left uncounted.
#[test]
fn unavailable_usage_does_not_count_failures() {
    let stack = Stack::start("max_failure_count = 2");
    stack.faults(r#"{"hang": true, "npu_na": true}"#);
    let mut failed = std::collections::BTreeSet::new();
    stack.wait_until_typed(
        "3 failed probes with usage unavailable",
        Duration::from_secs(30),
        |d| {
            let vi = &d.virtual_inference;
            assert!(!vi.abnormal, "{vi:?}");
            assert_eq!(vi.failure_count, 0, "{vi:?}");
            if let Some(p) = vi.last_probe.as_ref().filter(|p| !p.success && !p.warmup) {
                assert_eq!(p.accounting, Accounting::Unchanged, "{vi:?}");
                assert_eq!(p.peak, None, "{vi:?}");
                failed.insert(p.at_unix_ms);
            }
            failed.len() >= 3
        },
    );
    let window = stack.typed_detail().window;
    assert_eq!(window.peak, None, "{window:?}");
    assert_eq!(
        stack.get(&stack.status_url()).unwrap().1,
        r#"{"status":"normal"}"#
    );
}

/// A process listening at `at` (the fake engine's binary, which answers nothing of the
/// agent's there), killed when dropped: a local user's process on the engine's port.
struct Neighbour(std::process::Child);

impl Neighbour {
    fn listen(at: &str, control: &str) -> Neighbour {
        let child = std::process::Command::new(support::agent())
            .args([
                "fake-engine",
                "--model",
                "m",
                "--listen",
                at,
                "--control",
                control,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a neighbour");
        let addr: std::net::SocketAddr = at.parse().unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < end, "{at} never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Neighbour(child)
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(sig: &str, pid: u32) -> bool {
    std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success()
}

// A stopped engine process (SIGSTOP) answers nothing: under the agent policy the
// stopped-process rule makes it abnormal and says which process, instead of waiting out
// /health's grace (15 s); the health state is still within that grace when it does.
// Issue 48, R1: processes listening on the engine's port at 127.0.0.2 and [::1] before the
// engine restarted were watched instead of it (the first holder of the port), and their
// SIGSTOP made the healthy engine abnormal. The agent watches the engine's own socket.
#[test]
fn a_stopped_engine_process_is_abnormal_naming_it_and_a_stopped_neighbour_on_its_port_is_not() {
    let mut stack = Stack::start_launch(Launch {
        policy: "agent",
        engine_extra: "[engine.agent_policy]\nstopped_process_grace = \"500ms\"\n",
        ..Launch::default()
    });
    let port = stack.engine_port;
    let [c1, c2] = support::stack::free_ports();
    let mut neighbours = vec![Neighbour::listen(
        &format!("127.0.0.2:{port}"),
        &format!("127.0.0.2:{c1}"),
    )];
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        neighbours.push(Neighbour::listen(
            &format!("[::1]:{port}"),
            &format!("[::1]:{c2}"),
        ));
    }
    // The engine restarts: its process is looked up again, the neighbours listening already.
    stack.kill_engine();
    stack.start_engine();
    let pid = stack.engine.as_ref().expect("engine").id();
    let watched = format!("pid {pid}:");
    stack.wait_until(
        "the new engine process watched",
        Duration::from_secs(30),
        |d| {
            d["conditions"].as_array().into_iter().flatten().any(|c| {
                c["name"] == "engine_processes"
                    && c["value"].as_str().is_some_and(|v| v.starts_with(&watched))
            })
        },
    );
    stack.wait_for_status("normal", Duration::from_secs(30));
    for n in &neighbours {
        assert!(signal("-STOP", n.0.id()));
    }
    // Four process periods, each past the 500 ms grace if a neighbour were watched.
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < end {
        let (_, body) = stack.get(&stack.status_url()).expect("/status answers");
        assert_eq!(body, r#"{"status":"normal"}"#, "{}", stack.agent_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(signal("-STOP", pid));
    stack.wait_for_status("abnormal", Duration::from_secs(30));
    let detail = stack.detail();
    let reason = detail["reason"].as_str().unwrap_or_default().to_owned();
    let _ = signal("-CONT", pid);
    assert!(
        reason.contains(&format!("process {pid} is stopped")),
        "{reason}\n{}",
        stack.agent_log()
    );
    assert!(
        stack
            .agent_log()
            .contains("is stopped (SIGSTOP or a debugger)"),
        "{}",
        stack.agent_log()
    );
}
