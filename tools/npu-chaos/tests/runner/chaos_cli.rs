//! `npu-chaos` through its binary: the shipped experiment files validate, a bad file is
//! refused with a located error, and a run against real processes reports a detection and a
//! false kill — and fails on the false kill. The runs need the agent binary next to
//! `npu-chaos`, built with `fake-driver`: `cargo test --workspace --features fake-driver`
//! (what `scripts/test-all` runs) builds both.

use std::path::Path;
use std::process::Command;

fn chaos() -> Command {
    Command::new(env!("CARGO_BIN_EXE_npu-chaos"))
}

/// `npu-chaos check experiments/<file>`, which must pass: what it printed.
pub(crate) fn checked(file: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = chaos()
        .arg("check")
        .arg(format!("{root}/experiments/{file}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `npu-chaos run <args> --out <out_dir> <file>`: the exit code, and stdout then stderr (for
/// the failure messages).
fn run(args: &[&str], out_dir: &Path, file: &Path) -> (Option<i32>, String) {
    let out = chaos()
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(out_dir)
        .arg(file)
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// One experiment's outcome, `<out_dir>/<rel>` (`<policy>/<row>/<name>.json`); `output` is
/// the run's, for the message when the file is missing.
fn outcome(out_dir: &Path, rel: &str, output: &str) -> serde_json::Value {
    let p = out_dir.join(rel);
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}\n{output}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// The tests that start whole stacks run one at a time (a shared 2-core machine).
static STACKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_stack_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    STACKS.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn shipped_files_validate() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = chaos()
        .arg("check")
        .arg(format!("{root}/experiments/benign.yaml"))
        .arg(format!("{root}/experiments/faults.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // One line per experiment, each named: the files' own names, read here from the YAML
    // (not a count kept by hand).
    let mut names = Vec::new();
    for f in ["benign.yaml", "faults.yaml"] {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(format!("{root}/experiments/{f}")).unwrap(),
        )
        .unwrap();
        for e in doc["experiments"].as_sequence().expect("experiments") {
            names.push(e["name"].as_str().expect("a name").to_owned());
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), names.len(), "{text}");
    for (line, name) in lines.iter().zip(&names) {
        assert!(
            line.starts_with(&format!("{name}: ")),
            "{line} is not {name}'s"
        );
    }
    for name in [
        "prefill_delay",
        "decode_cpu_contention",
        "kv_cache_eviction",
        "npu_busy_stuck",
        "hot_reload_12s",
        "sleep_wake",
        "long_prefill",
        "burst_to_saturation",
        "slow_health_and_latency",
        "engine_restart",
        "degraded",
    ] {
        assert!(text.contains(name), "{name}: {text}");
    }
}

// The driver-fault experiments: each fault with and without a code, and the benign codes.
#[test]
fn the_driver_fault_file_validates() {
    let text = checked("driver-faults.yaml");
    for name in [
        "separate_npu_with_hang",
        "hang_alone",
        "aicore_exception_stuck_under_load",
        "stuck_under_load_alone",
        "sub_health_code_healthy_engine",
        "not_handle_code_under_load",
        "separate_npu_code_engine_answers",
        "separate_npu_code_under_load",
    ] {
        assert!(text.contains(name), "{name}: {text}");
    }
}

#[test]
fn a_bad_file_is_refused_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.yaml");
    std::fs::write(
        &f,
        "- name: a\n  target: engine\n  fault: engine_hang\n  duration: 10s\n  expect: healthy\n- name: b\n  target: engine\n  fault: meteor_strike\n  duration: 10s\n  expect: healthy\n",
    )
    .unwrap();
    let out = chaos().arg("run").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("#2 (b)") && err.contains("meteor_strike"),
        "{err}"
    );
}

// A crash expected to be detected is; the same crash in an experiment that expects a healthy
// engine is a false kill, and the run exits 1. Outputs: JSON with the timeline, the SVG
// chart, the summary.
#[test]
fn a_run_reports_detections_and_fails_on_a_false_kill() {
    let _serial = one_stack_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("mixed.yaml");
    std::fs::write(
        &f,
        r#"experiments:
  - name: crash_detected
    target: engine
    fault: engine_crash
    duration: 30s
    load: { streams: 2, rate: 1 }
    expect: { detect_within: 60s }
  - name: crash_but_expected_healthy
    target: engine
    fault: engine_crash
    duration: 10s
    load: { streams: 2, rate: 1 }
    expect: healthy
"#,
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    // A relative --out (as CI passes it) must work: the scenario names the NPU files.
    let out = chaos()
        .current_dir(dir.path())
        .args([
            "run",
            "--time-scale",
            "0.1",
            "--policy",
            "reference",
            "--nm-heartbeat",
            "3s",
            "--out",
            "out",
        ])
        .arg(&f)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let read = |name: &str| -> serde_json::Value {
        let p = out_dir.join("reference/3s").join(format!("{name}.json"));
        serde_json::from_str(
            &std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e}\n{stderr}", p.display())),
        )
        .unwrap()
    };
    // On a mismatch, the experiment's agent log says why (the temp dir is gone afterwards).
    let log = |name: &str| {
        std::fs::read_to_string(out_dir.join("reference/3s").join(name).join("agent.log"))
            .unwrap_or_default()
    };
    let detected = read("crash_detected");
    assert_eq!(
        detected["verdict"],
        "pass",
        "{detected}\nagent log:\n{}",
        log("crash_detected")
    );
    let after = detected["detected_after_ms"]
        .as_u64()
        .expect("a detection time");
    // Kill time (from the scheduled injection) = first injection + time to detect, each
    // rounded to the millisecond.
    let first = detected["first_injected_ms"].as_i64().expect("injected");
    let killed = detected["killed_at_ms"].as_i64().expect("killed");
    assert!((killed - (first + after as i64)).abs() <= 1, "{detected}");
    let timeline = detected["timeline"].as_array().unwrap();
    assert!(timeline.iter().any(|s| s["fault_active"] == true));
    assert!(
        timeline.iter().any(|s| s["status"] == "abnormal"),
        "the agent said abnormal before the kill"
    );
    let false_kill = read("crash_but_expected_healthy");
    assert_eq!(
        false_kill["verdict"],
        "false_kill",
        "{false_kill}\nagent log:\n{}",
        log("crash_but_expected_healthy")
    );
    assert!(out_dir.join("reference/3s/crash_detected.svg").is_file());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let p = &summary["policies"][0];
    assert_eq!(p["false_kills"], 1, "{summary}");
    assert_eq!(p["detected"], 1);
    assert_eq!(p["cadence"]["heartbeat_s"], 3);
    assert!(
        stdout.contains("| reference | 3s | 1 / 1 | 0 / 1 | 1 / 1 |"),
        "{stdout}"
    );
    // No process of the run is left.
    let stray = processes_mentioning(&out_dir.display().to_string());
    assert!(stray.is_empty(), "stray processes: {stray:?}");
}

// `--kubelet`: a row where the kubelet emulator acts. A crashed engine is restarted by it
// (the container exited: the kubelet's back-off, then a new process on the same port) and
// taken out of the load meanwhile; the row is in the summary with no Node Manager cadence.
#[test]
fn a_kubelet_row_restarts_a_crashed_engine() {
    let _serial = one_stack_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("crash.yaml");
    std::fs::write(
        &f,
        "- name: crash\n  target: engine\n  fault: engine_crash\n  duration: 30s\n  load: { streams: 2, rate: 1 }\n  expect: { detect_within: 60s }\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let (code, output) = run(
        &[
            "--time-scale",
            "0.1",
            "--policy",
            "agent",
            "--nm-heartbeat",
            "3s",
            "--kubelet",
        ],
        &out_dir,
        &f,
    );
    assert_eq!(code, Some(0), "{output}");
    let o = outcome(&out_dir, "agent/kubelet/crash.json", &output);
    assert_eq!(o["verdict"], "pass", "{o}");
    assert_eq!(o["integration"], "kubelet");
    assert!(o["cadence"].is_null());
    let k = &o["kubelet"];
    assert_eq!(k["expect"], "restart", "{k}");
    assert_eq!(
        (k["exit_restarts"].as_u64(), k["liveness_restarts"].as_u64()),
        (Some(1), Some(0)),
        "{k}"
    );
    assert_eq!(k["restart_after_ms"], o["detected_after_ms"], "{o}");
    assert!(
        out_dir
            .join("agent/kubelet/crash/engine-restart1.log")
            .is_file()
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let rows: Vec<&serde_json::Value> = summary["policies"].as_array().unwrap().iter().collect();
    assert_eq!(rows.len(), 2, "{summary}");
    assert_eq!(rows[1]["integration"], "kubelet");
    assert!(
        rows[1]["median_restart_s_unscaled"].as_f64().is_some(),
        "{summary}"
    );
    assert!(
        output.contains("| agent | kubelet | 0 / 0 | 0 / 0 | 1 / 1 |"),
        "{output}"
    );
    let stray = processes_mentioning(&out_dir.display().to_string());
    assert!(stray.is_empty(), "stray processes: {stray:?}");
}

// The agent's own restart, run directly (`--agent-supervisor direct`): the runner stops it
// (SIGTERM), starts a new process, records both pids and when the new one first answered
// `/status`, and measures what Node Manager's polls saw. Whether polls failed, and so the
// verdict, depends on the agent's continuity across restarts: not asserted here.
#[test]
fn an_agent_restart_is_done_and_measured() {
    let _serial = one_stack_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("agent.yaml");
    std::fs::write(
        &f,
        "- name: restart\n  target: agent\n  fault: agent_restart\n  duration: 10s\n  load: { streams: 2, rate: 1 }\n  expect: healthy\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let (code, output) = run(
        &[
            "--time-scale",
            "0.1",
            "--policy",
            "reference",
            "--nm-heartbeat",
            "1s",
            "--agent-supervisor",
            "direct",
        ],
        &out_dir,
        &f,
    );
    assert!(matches!(code, Some(0 | 1)), "{output}");
    let o = outcome(&out_dir, "reference/1s/restart.json", &output);
    assert_ne!(o["verdict"], "error", "{o}");
    assert_eq!(o["agent_supervisor"], "direct", "{o}");
    let ops = o["agent_ops"].as_array().expect("agent_ops");
    assert_eq!(ops.len(), 1, "{o}");
    let op = &ops[0];
    assert_eq!(op["fault"], "agent_restart");
    assert!(op["error"].is_null(), "{op}");
    let (old, new) = (op["old_pid"].as_u64(), op["new_pid"].as_u64());
    assert!(old.is_some() && new.is_some() && old != new, "{op}");
    let started = op["started_ms"].as_i64().unwrap();
    let running = op["new_running_ms"].as_i64().expect("the new agent ran");
    let answered = op["answered_ms"].as_i64().expect("the new agent answered");
    assert!(started <= running && running <= answered, "{op}");
    assert_eq!(
        op["old_exit"], "exit status: 0",
        "SIGTERM is a clean stop: {op}"
    );
    let polls = o["polls"].as_array().expect("polls");
    let nm = polls
        .iter()
        .find(|p| p["poller"] == "node_manager")
        .expect("Node Manager's figures");
    assert!(nm["polls"].as_u64().unwrap() > 0, "{nm}");
    assert!(nm["failed"].as_u64().is_some() && nm["longest_gap_ms"].as_u64().unwrap() > 0);
    // The runner's line, then the second agent's start, in the one log.
    let log = std::fs::read_to_string(out_dir.join("reference/1s/restart/agent.log")).unwrap();
    let marker = log
        .find("npu-chaos: agent_restart (direct)")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(log[marker..].contains("ready:"), "{log}");
    assert!(output.contains("| restart | agent_restart |"), "{output}");
    let stray = processes_mentioning(&out_dir.display().to_string());
    assert!(stray.is_empty(), "stray processes: {stray:?}");
}

/// Command lines of live processes that mention `marker` (zombies have none).
fn processes_mentioning(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker))
        .collect()
}

// Ctrl-C in the middle of an experiment: the run stops promptly, says so, and leaves no
// process behind.
#[test]
fn ctrl_c_tears_the_stack_down() {
    let _serial = one_stack_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("long.yaml");
    std::fs::write(
        &f,
        "- name: long\n  target: network\n  fault: network_latency_10ms\n  duration: 3600s\n  expect: healthy\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let marker = out_dir.display().to_string();
    let mut child = chaos()
        .args(["run", "--time-scale", "0.05", "--policy", "agent", "--out"])
        .arg(&out_dir)
        .arg(&f)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the agent and the engine of the experiment run (with npu-chaos itself, three
    // processes mention the run's directory).
    let start = std::time::Instant::now();
    while processes_mentioning(&marker).len() < 3 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the stack never came up"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !processes_mentioning(&marker).is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        processes_mentioning(&marker).is_empty(),
        "stray processes: {:?}",
        processes_mentioning(&marker)
    );
}

// `--router haproxy`: the load goes through a real HAProxy with a draft engine behind it. A
// degraded engine (the seed's `degrade`) is drained to the draft: the draft serves part of
// the load, no request fails, Node Manager kills nothing; the outcome and the summary name
// the router. Skips where HAProxy is not installed (`scripts/routers install`) but in CI.
#[test]
fn a_router_row_sends_the_load_to_the_draft_while_degraded() {
    if std::process::Command::new("haproxy")
        .arg("-v")
        .output()
        .is_err()
    {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "haproxy not installed in CI"
        );
        println!("skipped: haproxy not found (scripts/routers install)");
        return;
    }
    let _serial = one_stack_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("degraded.yaml");
    std::fs::write(
        &f,
        "- name: degraded\n  target: engine\n  fault: degraded_3000ms\n  duration: 60s\n  load: { streams: 4, rate: 2 }\n  expect: healthy\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let (code, output) = run(
        &[
            "--time-scale",
            "0.05",
            "--policy",
            "agent",
            "--router",
            "haproxy",
            "--no-nm-rows",
        ],
        &out_dir,
        &f,
    );
    assert_eq!(code, Some(0), "{output}");
    let o = outcome(&out_dir, "agent/haproxy/degraded.json", &output);
    assert_eq!(o["verdict"], "pass", "{o}");
    assert_eq!(o["router"], "haproxy");
    let load = &o["load"];
    assert!(load["by_draft"].as_u64().unwrap() > 0, "{load}");
    assert_eq!(load["failed"], 0, "{load}");
    assert!(load["first_token_p99_ms"].as_f64().is_some(), "{load}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let rows = summary["policies"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "only the router row: {summary}");
    assert_eq!(rows[0]["router"], "haproxy");
    assert!(
        output.contains("through haproxy: the draft served"),
        "{output}"
    );
    let stray = processes_mentioning(&out_dir.display().to_string());
    assert!(stray.is_empty(), "stray processes: {stray:?}");
}

#[test]
fn router_rows_are_refused_where_they_cannot_run() {
    for (args, says) in [
        (
            &["--router", "haproxy", "--engine", "vllm"][..],
            "--router runs on the fake engine",
        ),
        (&["--no-nm-rows"][..], "--no-nm-rows leaves no row"),
    ] {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let out = chaos()
            .arg("run")
            .args(args)
            .arg(format!("{root}/experiments/benign.yaml"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
