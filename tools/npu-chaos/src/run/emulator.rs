//! The Node Manager emulator's side of an experiment: started on its own thread at real-time
//! priority, and, after a kill, the evidence of why (its last polls, the agent's warnings).
//! In a peer's row the peer's decider takes its place (`crate::peers`), and its report.

use super::options::{Policy, RunOptions};
use super::outcome::Outcome;
use super::stack::Stack;
use crate::load::LoadGen;
use fake_engine::node_manager::{self, NmOptions, NmReport};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Runs the Node Manager emulator on its own thread and runtime, at real-time priority when
/// permitted: it stands for a process on another machine, so it must not be starved by the
/// CPU stress of this one. Sends the kill time.
pub(super) fn start_node_manager(
    nm: NmOptions,
    cancel: CancellationToken,
    kill_tx: tokio::sync::oneshot::Sender<Instant>,
) -> std::io::Result<std::thread::JoinHandle<NmReport>> {
    std::thread::Builder::new()
        .name("node-manager".to_owned())
        .spawn(move || {
            let _ = npu_health_agent::sampler::priority::make_current_thread_realtime();
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return NmReport::default();
            };
            rt.block_on(node_manager::run(nm, cancel, move || {
                let _ = kill_tx.send(Instant::now());
            }))
        })
}

/// A peer's decider on its own thread, holding the kill channel (none but in a peer's row).
/// Its cadence is its own: the row's Node Manager cadence changes nothing for it.
pub(super) fn start_peer(
    policy: Policy,
    opts: &RunOptions,
    stack: &Stack,
    load: &LoadGen,
    kill_tx: &mut Option<tokio::sync::oneshot::Sender<Instant>>,
    cancel: &CancellationToken,
) -> Result<Option<std::thread::JoinHandle<crate::peers::PeerReport>>, String> {
    let (Some(peer), Some(tx)) = (policy.peer(), kill_tx.take_if(|_| policy.peer().is_some()))
    else {
        return Ok(None);
    };
    let targets = crate::peers::Targets {
        base: stack.load_base(),
        model: opts.model().to_owned(),
        load: Some(load.stats.clone()),
    };
    crate::peers::start(peer, targets, opts.time_scale, cancel.clone(), tx)
        .map(Some)
        .map_err(|e| format!("starting the {} peer: {e}", policy.as_str()))
}

/// The peer's report once its thread ended, kept beside the experiment's logs as
/// `peer.json`; a kill's evidence is its calls up to the decision.
pub(super) async fn peer_report(
    thread: Option<std::thread::JoinHandle<crate::peers::PeerReport>>,
    dir: &Path,
    out: &mut Outcome,
) {
    let Some(t) = thread else { return };
    let Some(r) = tokio::task::spawn_blocking(move || t.join().ok())
        .await
        .ok()
        .flatten()
    else {
        return;
    };
    let path = dir.join("peer.json");
    if let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(&r).unwrap_or_default()) {
        eprintln!("npu-chaos:   {}: {e}", path.display());
    }
    if out.killed_at_ms.is_some() {
        out.kill_evidence = crate::peers::kill_evidence(&r);
    }
}

/// Polls before the kill that [`kill_evidence`] quotes: the emulator's 5 heartbeats span at
/// most 5 polls at the 1 s cadence and 15 at 3 s.
pub(super) const EVIDENCE_POLLS: usize = 16;
/// The agent's last warnings [`kill_evidence`] quotes.
pub(super) const EVIDENCE_WARNINGS: usize = 6;

/// Why Node Manager killed: the emulator's last polls before its decision (seconds before
/// the kill on its clock, what it read, the error, the answer time), then the agent's last
/// WARN and ERROR lines from `agent_log` up to the kill (the emulator started at
/// `nm_started`; with no emulator report, the last ones). Empty pieces are left out; never
/// fails.
pub(super) fn kill_evidence(
    nm: Option<&NmReport>,
    nm_started: std::time::SystemTime,
    agent_logs: &[PathBuf],
) -> Vec<String> {
    let mut lines = Vec::new();
    // What the agent logged after the kill is about a dead engine: left out (half a second
    // of slack for the two clocks).
    let until = nm
        .and_then(|r| r.killed_at_ms)
        .map(|k| nm_started + Duration::from_millis(k + 500));
    if let Some(r) = nm
        && let Some(kill) = r.killed_at_ms
    {
        let before: Vec<_> = r.polls.iter().filter(|p| p.at_ms <= kill).collect();
        let from = before.len().saturating_sub(EVIDENCE_POLLS);
        for p in &before[from..] {
            let read = serde_json::to_value(p.detected)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            lines.push(format!(
                "poll {:+.2} s: {read}{} ({:.0} ms)",
                -((kill - p.at_ms) as f64) / 1000.0,
                p.error
                    .as_deref()
                    .map(|e| format!(", {e}"))
                    .unwrap_or_default(),
                p.latency_ms
            ));
        }
    }
    // Every agent's log (an upgrade's second agent logs apart), in time order.
    let text: Vec<String> = agent_logs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let mut all: Vec<&str> = text.iter().flat_map(|t| t.lines()).collect();
    all.sort_by_cached_key(|l| {
        l.split_whitespace()
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    });
    let warnings: Vec<String> = all
        .into_iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| {
            let at = l
                .split_whitespace()
                .next()
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
            match (until, at) {
                (Some(until), Some(at)) => at <= until,
                _ => true,
            }
        })
        .map(str::to_owned)
        .collect();
    let from = warnings.len().saturating_sub(EVIDENCE_WARNINGS);
    lines.extend(warnings[from..].iter().map(|w| format!("agent: {w}")));
    lines
}
