//! The evidence bundle against a real vLLM: the fault plugin (`plugins/vllm-fault-inject`)
//! holds the Worker's model step, the agent turns `abnormal`, and the one bundle it writes
//! holds, in `py-spy.txt`, the real Worker's Python stack with the plugin's blocked frame
//! (`hold`, where the step waits) on top of vLLM's `execute_model`.
//!
//! Runs with `NPU_HEALTH_REAL_VLLM=1` and py-spy installed in the real-vLLM venv
//! (`target/real-vllm/venv/bin/pip install py-spy`); otherwise it says why it skipped. CI's
//! real-vLLM stage runs a named subset that leaves this out (two engine starts, about two
//! minutes): docs/real-vllm.md gives the command.
#![cfg(feature = "fake-driver")]

use crate::real_vllm::{Agent, lock};
use crate::support::load::Load;
use crate::support::real_vllm::{self, RealVllm};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The py-spy of the real-vLLM venv, if installed (`REAL_VLLM_HOME` as `scripts/real-vllm`
/// reads it).
fn venv_py_spy() -> Option<PathBuf> {
    let home = std::env::var_os("REAL_VLLM_HOME").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-vllm"),
        PathBuf::from,
    );
    let p = home.join("venv/bin/py-spy");
    p.is_file().then_some(p)
}

/// The finished bundles in `dir` (a bundle being written ends in `.partial`).
fn bundles(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir() && p.extension().is_none_or(|x| x != "partial"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The section of `py-spy.txt` for `pid` (from its `## py-spy dump --pid` line to the next).
fn section(stacks: &str, pid: u32) -> Option<String> {
    let head = format!("{pid} (");
    stacks
        .split("## py-spy dump --pid ")
        .find(|s| s.starts_with(&head))
        .map(str::to_owned)
}

/// Each part's size in bytes, and the total.
fn sizes(bundle: &Path) -> (Vec<(String, u64)>, u64) {
    let mut parts: Vec<(String, u64)> = std::fs::read_dir(bundle)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| {
            let len = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    parts.sort();
    let total = parts.iter().map(|(_, n)| n).sum();
    (parts, total)
}

// Both of the plugin's ways to hang: `block` (the Worker sleeps in `hold`, like a thread
// blocked in the driver) and `spin` (it burns a core in `spin` under `hold`: py-spy reads a
// process that is running flat out). A fresh engine for each, as the busy-but-stuck test does.
#[test]
fn a_hung_real_vllm_leaves_one_bundle_whose_py_spy_names_the_blocked_frame() {
    let name = "a_hung_real_vllm_leaves_one_bundle_whose_py_spy_names_the_blocked_frame";
    if !real_vllm::enabled(name) {
        return;
    }
    let Some(py_spy) = venv_py_spy() else {
        println!(
            "skipped {name}: py-spy is not installed in the real-vLLM venv (target/real-vllm/venv/bin/pip install py-spy)"
        );
        return;
    };
    let _one = lock();
    let started = Instant::now();
    for mode in ["block", "spin"] {
        one_hang(mode, &py_spy);
    }
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
}

/// One hang in `mode` on a fresh engine: the bundle's figures printed, its parts checked.
fn one_hang(mode: &str, py_spy: &Path) {
    // py-spy alone on the agent's PATH, the way a node would have it.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(py_spy, bin.path().join("py-spy")).unwrap();
    let mut path = bin.path().as_os_str().to_owned();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let evidence = tempfile::tempdir().unwrap();
    let v = RealVllm::up("bundle", &["--fault-plugin"]);
    let agent = Agent::start_env(
        &v,
        "agent",
        &format!("evidence_dir = {:?}", evidence.path()),
        "",
        &[("PATH", path)],
    );
    agent.wait_for("normal", Duration::from_secs(120));
    let load = Load::start(&v.url(), "tiny", 2, 200, Duration::from_millis(150));
    std::thread::sleep(Duration::from_secs(5));
    std::fs::write(v.stuck_file(), mode).unwrap();
    let stuck_at = Instant::now();
    agent.wait_for("abnormal", Duration::from_secs(120));
    let seen_abnormal = Instant::now();
    let bundle = loop {
        if let Some(b) = bundles(evidence.path()).pop() {
            break b;
        }
        assert!(
            seen_abnormal.elapsed() < Duration::from_secs(60),
            "{mode}: no bundle 60 s after abnormal; detail {}\nagent log:\n{}",
            agent.detail(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let to_bundle = seen_abnormal.elapsed();
    let count = bundles(evidence.path()).len();
    let _ = std::fs::remove_file(v.stuck_file());
    let _ = load.stop_seen();
    let read = |part: &str| std::fs::read_to_string(bundle.join(part)).unwrap_or_default();
    let (summary, stacks, procs) = (
        read("summary.json"),
        read("py-spy.txt"),
        read("processes.txt"),
    );
    let (parts, total) = sizes(&bundle);
    println!(
        "{mode}: abnormal {:.1} s after the stuck file; the bundle seen {:.1} s after the test saw abnormal; {total} bytes: {parts:?}",
        (seen_abnormal - stuck_at).as_secs_f64(),
        to_bundle.as_secs_f64()
    );
    println!("{mode} summary.json: {summary}");
    for l in agent
        .log()
        .lines()
        .filter(|l| l.contains("evidence bundle") || l.contains("abnormal") && !l.contains("GET"))
    {
        println!("{mode} agent log: {l}");
    }
    let worker = section(&stacks, v.worker_pid);
    println!(
        "{mode} the Worker's stack:\n{}",
        worker.as_deref().unwrap_or("(none)")
    );
    assert_eq!(count, 1, "{mode}: one bundle for one turn to abnormal");
    let s: Value = serde_json::from_str(&summary).expect("summary.json is JSON");
    assert_eq!(
        (s["status"].as_str(), s["trigger"].as_str()),
        (Some("abnormal"), Some("abnormal")),
        "{summary}"
    );
    assert!(
        procs.contains(&format!("\n{}\t", v.worker_pid)),
        "{mode}: the Worker in processes.txt:\n{procs}"
    );
    // The agent runs with RUST_LOG=info (and here RUST_BACKTRACE=1 if the test's shell has
    // it): neither py-spy's log nor its backtraces (both name `py_spy::`) go into the bundle.
    assert!(
        !stacks.contains("py_spy::"),
        "{mode}: py-spy's own log in py-spy.txt:\n{stacks}"
    );
    let worker = worker.unwrap_or_else(|| panic!("{mode}: no dump of the Worker:\n{stacks}"));
    // The frame where the step waits, called by the plugin's wrapper of vLLM's model step.
    assert!(
        worker.contains("hold (vllm_fault_inject/__init__.py:")
            && worker.contains("execute_model (vllm_fault_inject/__init__.py:"),
        "{mode}: the Worker's stack names the blocked frame:\n{worker}"
    );
}
