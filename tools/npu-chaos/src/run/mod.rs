//! One experiment, end to end, as real processes on loopback: the fake engine (the agent
//! binary's `fake-engine` command), a latency proxy in front of it, the agent release binary
//! on the fake `libdcmi.so` (real dlopen) reaching the engine through the proxy, the load
//! generator, and the Node Manager emulator polling the agent's `/status`. Every interval —
//! the agent's, the emulator's, the engine's speed, the fault's — is multiplied by
//! `time_scale`. Processes are killed and reaped when the experiment ends, however it ends
//! (they are `kill_on_drop`).
//!
//! Phases: start, warm-up (until virtual inference runs), baseline (10 s with load), the fault
//! for `duration` (guards evaluated at every sample), then observation: until detection or
//! `detect_within` for a fault, 30 s after the fault for a benign experiment, so that a late
//! kill is still seen.
//!
//! With `--engine vllm` the engine is a real vLLM ([`crate::real_engine`]): the agent's and
//! Node Manager's intervals are still scaled, the engine runs at its own speed, and a fault
//! that cannot be injected into it ends as `not_applicable`, never as a pass.

use crate::agent::Supervisor;
use crate::experiment::{Expect, Experiment};
use crate::load::LoadGen;
use crate::polls::PollFigures;
use crate::real_engine;
use fake_engine::node_manager::NmReport;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod config;
mod emulator;
mod inject;
mod observe;
mod options;
mod outcome;
mod processes;
mod repeat;
mod shadow_seen;
mod stack;

pub use options::{Cadence, EngineKind, Integration, NodeManagerKind, Policy, Row, RunOptions};
pub use outcome::{GuardEvent, KubeletOutcome, Outcome, Round, TimelinePoint, Verdict};
pub use repeat::judge_rounds;
pub(crate) use repeat::round_line;
pub use shadow_seen::{SeenDisagreement, ShadowSeen};

use crate::timescale::scaled;
use emulator::{kill_evidence, peer_report, start_node_manager, start_peer};
use observe::{KubeletLink, Observation, observe};
use processes::{WantedSupervisor, wanted_supervisor};
use stack::Stack;

/// The row's directory of the outputs: `1s`, `3s`, `1s-pymotor` or `kubelet`.
pub fn cadence_dir(opts: &RunOptions) -> String {
    match (opts.row, &opts.pymotor_nm) {
        (Row::NodeManager(c), Some(_)) => format!("{}-pymotor", c.label()),
        (row, _) => row.label(),
    }
}

/// Runs one experiment under one policy. Never panics on a broken stack: the outcome says
/// `error` with the reason.
pub async fn run(e: &Experiment, policy: Policy, opts: &RunOptions) -> Outcome {
    let mut out = fresh_outcome(e, policy, opts);
    if let Some(why) = not_applicable(e, policy, opts) {
        out.verdict = Verdict::NotApplicable;
        out.error = Some(why);
        return out;
    }
    let cancel = CancellationToken::new();
    let dir = opts
        .out_dir
        .join(policy.as_str())
        .join(cadence_dir(opts))
        .join(&e.name);
    let want = wanted_supervisor(opts.agent_supervisor, e.fault);
    out.agent_supervisor = want.supervisor;
    out.agent_supervisor_note = want.note.clone();
    let result = run_inner(e, policy, opts, &dir, &want, &cancel, &mut out).await;
    cancel.cancel();
    let (verdict, error) = verdict(e, policy, opts, &out, result);
    out.verdict = verdict;
    if error.is_some() {
        out.error = error;
    }
    out
}

/// The outcome of an experiment that has not run yet (verdict `error`, no figures).
fn fresh_outcome(e: &Experiment, policy: Policy, opts: &RunOptions) -> Outcome {
    Outcome {
        experiment: e.name.clone(),
        target: e.target,
        fault: e.fault.to_string(),
        policy,
        integration: opts.row.integration(),
        cadence: opts.row.cadence(),
        router: opts.row.router(),
        node_manager: if opts.pymotor_nm.is_some() {
            NodeManagerKind::Pymotor
        } else {
            NodeManagerKind::Emulator
        },
        expect: match e.expect {
            Expect::Healthy => "healthy".to_owned(),
            Expect::DetectWithin(d) => format!("detect_within {}", humantime::format_duration(d)),
        },
        verdict: Verdict::Error,
        detected_after_ms: None,
        abnormal_after_ms: None,
        killed_at_ms: None,
        escalated_at_ms: None,
        shadow: None,
        first_injected_ms: None,
        injected_ms: 0,
        guard_events: Vec::new(),
        load: Default::default(),
        load_after_abnormal: None,
        router_actions: Vec::new(),
        error: None,
        ran_again_after: None,
        kubelet: None,
        kill_evidence: Vec::new(),
        agent_supervisor: Supervisor::Direct,
        agent_supervisor_note: None,
        agent_ops: Vec::new(),
        polls: Vec::new(),
        timeline: Vec::new(),
        rounds: Vec::new(),
    }
}

/// Why the experiment cannot run in this row (the engine or the policy cannot take the
/// fault), if so.
fn not_applicable(e: &Experiment, policy: Policy, opts: &RunOptions) -> Option<String> {
    if opts.engine == EngineKind::Vllm
        && let Some(why) = real_engine::not_applicable(e.fault).or_else(|| {
            (!e.driver_codes.is_empty()).then_some(
                "the runner writes no fault codes into a real engine's NPU files (the fake engine does)",
            )
        })
    {
        return Some(why.to_owned());
    }
    repeat::not_applicable(e, policy, opts).or_else(|| policy.not_applicable(opts, e.fault))
}

/// The verdict of a run that ended with `result`, and the error to report with it (`None`:
/// leave the outcome's as it is).
fn verdict(
    e: &Experiment,
    policy: Policy,
    opts: &RunOptions,
    out: &Outcome,
    result: Result<(), String>,
) -> (Verdict, Option<String>) {
    // A row whose agent policy is only observed is judged as the policy `/status` answers by.
    let policy = policy.in_force();
    let not_by_design = not_by_design(e, policy, opts);
    // A router row's Node Manager sees what the `1s` row's does: its known kills too.
    let nm_label = opts.row.cadence().map(|c| c.label());
    let known = e.known_false_kills.iter().any(|(p, row)| {
        (p == policy.as_str() || (p == "agent" && policy.is_agent()))
            && (*row == opts.row.label()
                || (opts.row.router().is_some() && Some(row) == nm_label.as_ref()))
    });
    match result {
        Err(err) => (Verdict::Error, Some(err)),
        Ok(()) if draft_without_cause(out) => (
            Verdict::DraftWithoutCause,
            Some(format!(
                "the draft answered {} requests, but the agent never told {} to take the main engine out",
                out.load.by_draft,
                out.router.map_or("the router", |r| r.as_str()),
            )),
        ),
        Ok(()) if let Some(why) = escalated_benign(e, out) => (Verdict::EscalatedBenign, Some(why)),
        Ok(()) if e.repeat > 1 => repeat::verdict(e, out, not_by_design),
        Ok(()) if opts.row == Row::Kubelet => (kubelet_verdict(e, out, known, not_by_design), None),
        Ok(()) => (node_manager_verdict(e, out, known, not_by_design), None),
    }
}

/// Whether a miss is the design of the policy or of Node Manager's cadence (the experiment
/// says which policies and cadences can detect it). Never for a peer: its design is its own
/// source's, and its miss is a miss.
fn not_by_design(e: &Experiment, policy: Policy, opts: &RunOptions) -> bool {
    policy.peer().is_none()
        && ((e.agent_policy_only && !policy.is_agent())
            || opts
                .row
                .cadence()
                .zip(e.max_nm_heartbeat_s)
                .is_some_and(|(c, h)| c.heartbeat_s > h))
}

/// Why a benign experiment fails for an escalation, if the agent escalated the engine as a
/// restart loop in it (a benign case must never look like one).
fn escalated_benign(e: &Experiment, out: &Outcome) -> Option<String> {
    let at = out.escalated_at_ms?;
    matches!(e.expect, Expect::Healthy).then(|| {
        format!(
            "the agent escalated the engine as a restart loop {:.1} s after the injection, in a benign experiment",
            at as f64 / 1000.0
        )
    })
}

/// The verdict of a Node Manager (or router) row's run that ended well.
fn node_manager_verdict(
    e: &Experiment,
    out: &Outcome,
    known: bool,
    not_by_design: bool,
) -> Verdict {
    // A kill before the fault was injected (or with no injection at all) is a false kill,
    // whatever the experiment expects.
    let killed_before_fault = out
        .killed_at_ms
        .is_some_and(|k| out.first_injected_ms.is_none_or(|f| k < f));
    match e.expect {
        _ if killed_before_fault => Verdict::FalseKill,
        Expect::Healthy if out.killed_at_ms.is_some() && known => Verdict::KnownFalseKill,
        Expect::Healthy if out.killed_at_ms.is_some() => Verdict::FalseKill,
        Expect::Healthy => Verdict::Pass,
        // A driver fault must be reported without killing the (healthy) engine.
        Expect::DetectWithin(_) if e.fault.is_driver_fault() && out.killed_at_ms.is_some() => {
            Verdict::FalseKill
        }
        Expect::DetectWithin(_) if out.detected_after_ms.is_some() => Verdict::Pass,
        Expect::DetectWithin(_) if not_by_design => Verdict::NotDetectableByDesign,
        Expect::DetectWithin(_) => Verdict::Missed,
    }
}

/// Whether a router row's draft answered requests though the agent never told the router
/// to take the main engine out.
fn draft_without_cause(out: &Outcome) -> bool {
    out.router.is_some()
        && out.load.by_draft > 0
        && !out
            .router_actions
            .iter()
            .any(crate::router::RouterAction::takes_main_out)
}

/// The verdict of a kubelet run: a liveness restart of a healthy engine is a false kill; a
/// fault must bring the action the experiment expects, in time.
fn kubelet_verdict(e: &Experiment, out: &Outcome, known: bool, not_by_design: bool) -> Verdict {
    use crate::experiment::KubeletExpect;
    let Some(k) = &out.kubelet else {
        return Verdict::Error;
    };
    let restarted = k.liveness_restarts + k.exit_restarts > 0;
    let false_restart = match k.expect {
        KubeletExpect::Restart => k.restart_after_ms.is_none() && restarted,
        KubeletExpect::NotReady | KubeletExpect::NoRestart => k.liveness_restarts > 0,
    };
    if false_restart {
        return if known {
            Verdict::KnownFalseKill
        } else {
            Verdict::FalseKill
        };
    }
    match (k.expect, e.expect) {
        (KubeletExpect::NoRestart, Expect::Healthy) => Verdict::Pass,
        // A driver fault: the NPU flagged (the Node Manager rule), the engine not restarted.
        (KubeletExpect::NoRestart, Expect::DetectWithin(_)) if out.detected_after_ms.is_some() => {
            Verdict::Pass
        }
        (KubeletExpect::Restart | KubeletExpect::NotReady, _)
            if out.detected_after_ms.is_some() =>
        {
            Verdict::Pass
        }
        _ if not_by_design => Verdict::NotDetectableByDesign,
        _ => Verdict::Missed,
    }
}

async fn run_inner(
    e: &Experiment,
    policy: Policy,
    opts: &RunOptions,
    dir: &Path,
    want: &WantedSupervisor,
    cancel: &CancellationToken,
    out: &mut Outcome,
) -> Result<(), String> {
    let s = opts.time_scale;
    let sc = |d: Duration| scaled(d, s);
    // The warm-up timeout (180 s scaled) plus start-up.
    let limit = sc(Duration::from_secs(180)) + Duration::from_secs(10);
    let mut stack = Stack::start_ready(opts, dir, policy, want, cancel, limit).await?;
    out.agent_supervisor = stack.supervisor;
    out.agent_supervisor_note = stack.supervisor_note.clone();
    announce_supervisor(&stack, dir);
    let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel::<Instant>();
    let mut kill_tx = Some(kill_tx);
    let real_nm = match &opts.pymotor_nm {
        Some(p) => Some(start_pymotor(p, &stack, dir, kill_tx.take()).await?),
        None => None,
    };
    stack.start_router(opts).await?;
    let load = LoadGen::start(
        &stack.load_base(),
        opts.model(),
        &fit_load(&e.load, opts.engine),
        s,
        cancel.child_token(),
    );
    if stack.router.is_some() {
        load.count_answers_of(crate::router::DRAFT_MODEL);
    }
    if e.repeat > 1 {
        let result = repeat::Rounds::new(e, opts, &mut stack, &load, cancel)
            .run(out)
            .await;
        out.load = load.stats.snapshot();
        stop_stack(&mut stack).await;
        return result;
    }
    // The node has been up past Node Manager's grace period.
    // Sampled every (scaled) second, as Node Manager polls.
    let sample_every = scaled(Duration::from_secs(1), s).max(Duration::from_millis(20));
    let nm_cancel = cancel.child_token();
    // The emulator's clock starts about now: its kill time on the agent log's clock, its
    // polls on the run's (within the few milliseconds its thread takes to start).
    let nm_started = std::time::SystemTime::now();
    let nm_t0 = Instant::now();
    let probes = crate::kubelet::ProbeLog::default();
    // A peer's row: the peer's decider takes the kill channel, and no emulator runs.
    let peer_thread = start_peer(policy, opts, &stack, &load, &mut kill_tx, &nm_cancel)?;
    let (nm_thread, mut kubelet) = match opts.row {
        Row::NodeManager(_) | Row::Router(_) => {
            let thread = start_emulator(opts, &stack, kill_tx.take(), &nm_cancel)?;
            (thread, None)
        }
        Row::Kubelet => {
            let link = start_kubelet(e, s, &stack, &load, &probes, &nm_cancel);
            (None, Some(link))
        }
    };
    // The scheduled injection, after a 10 s baseline.
    let t0 = Instant::now() + sc(Duration::from_secs(10));
    let observation = Observation {
        e,
        stack: &mut stack,
        load: &load,
        kill_rx: &mut kill_rx,
        kubelet: kubelet.as_mut(),
        sample_every,
        s,
        t0,
    };
    let result = observe(observation, out).await;
    if let Some((r, _)) = &stack.real {
        r.save_log(&dir.join("vllm.log"));
    }
    nm_cancel.cancel();
    let nm_report = emulator_report(nm_thread, nm_started, dir, out).await;
    peer_report(peer_thread, dir, out).await;
    let pollers = Pollers {
        nm_report: nm_report.as_ref(),
        nm_t0,
        pymotor: real_nm.as_ref(),
        kubelet: (opts.row == Row::Kubelet).then_some(&probes),
    };
    out.polls.extend(pollers.figures(e, s, t0, out));
    if let Some(nm) = real_nm {
        nm.stop().await;
    }
    out.load = load.stats.snapshot();
    stop_stack(&mut stack).await;
    result
}

/// Says how the agent runs when it is not simply a child of the runner.
fn announce_supervisor(stack: &Stack, dir: &Path) {
    if stack.supervisor == Supervisor::Systemd {
        eprintln!(
            "npu-chaos:   the agent runs as {} in a private systemd user manager (derived from {}: {})",
            crate::systemd::AGENT_UNIT,
            crate::systemd::SHIPPED_UNIT_PATH,
            dir.join("npu-health-agent.service").display()
        );
    }
    if let Some(note) = &stack.supervisor_note {
        eprintln!("npu-chaos:   {note}");
    }
}

/// MindIE's own heartbeat, sending its kill to `kill_tx`: started now, the experiment
/// begins after its 60 s grace.
async fn start_pymotor(
    p: &crate::pymotor::Pymotor,
    stack: &Stack,
    dir: &Path,
    kill_tx: Option<tokio::sync::oneshot::Sender<Instant>>,
) -> Result<crate::pymotor::NodeManager, String> {
    let mgmt_port = stack
        .mgmt
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or("no mgmt port")?;
    let mut nm =
        crate::pymotor::NodeManager::start(p, mgmt_port, stack.engine_port, dir, move |at| {
            if let Some(tx) = kill_tx {
                let _ = tx.send(at);
            }
        })?;
    eprintln!("npu-chaos:   PyMotor's Node Manager runs; waiting out its 60 s grace period ...");
    nm.wait_grace(Duration::from_secs(120)).await?;
    Ok(nm)
}

/// The Node Manager emulator's thread, polling the agent's `/status` (none when PyMotor's
/// Node Manager took the kill channel).
fn start_emulator(
    opts: &RunOptions,
    stack: &Stack,
    kill_tx: Option<tokio::sync::oneshot::Sender<Instant>>,
    cancel: &CancellationToken,
) -> Result<Option<std::thread::JoinHandle<NmReport>>, String> {
    let c = opts.row.cadence().unwrap_or(Cadence::PYMOTOR);
    let nm = c.nm_options(vec![format!("{}/status", stack.mgmt)], opts.time_scale);
    let Some(tx) = kill_tx else {
        return Ok(None);
    };
    start_node_manager(nm, cancel.clone(), tx)
        .map(Some)
        .map_err(|e| format!("starting the Node Manager emulator: {e}"))
}

/// The kubelet emulator probing the engine, and the runner's link to it.
fn start_kubelet(
    e: &Experiment,
    s: f64,
    stack: &Stack,
    load: &LoadGen,
    probes: &crate::kubelet::ProbeLog,
    cancel: &CancellationToken,
) -> KubeletLink {
    let k = crate::kubelet::Kubelet::manifest(
        s,
        format!("http://127.0.0.1:{}/health", stack.engine_port),
        &stack.mgmt,
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (gen_tx, gen_rx) = tokio::sync::watch::channel(0u64);
    let ready_load = load.clone();
    tokio::spawn(crate::kubelet::run(
        k.clone(),
        tx,
        gen_rx,
        move |r| ready_load.set_ready(r),
        probes.clone(),
        cancel.clone(),
    ));
    KubeletLink {
        actions: rx,
        generation: gen_tx,
        exit_backoff: k.exit_backoff,
        expect: e.kubelet,
        log: Vec::new(),
        exited_at: None,
        not_ready_since: None,
        not_ready_total: Duration::ZERO,
    }
}

/// The emulator's report once its thread ended, kept beside the experiment's logs, and the
/// evidence of its kill.
async fn emulator_report(
    thread: Option<std::thread::JoinHandle<NmReport>>,
    started: std::time::SystemTime,
    dir: &Path,
    out: &mut Outcome,
) -> Option<NmReport> {
    let report = match thread {
        Some(t) => tokio::task::spawn_blocking(move || t.join().ok())
            .await
            .ok()
            .flatten(),
        None => None,
    };
    if let Some(r) = &report {
        let path = dir.join("node-manager.json");
        if let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(r).unwrap_or_default()) {
            eprintln!("npu-chaos:   {}: {e}", path.display());
        }
    }
    if out.killed_at_ms.is_some() {
        out.kill_evidence = kill_evidence(
            report.as_ref(),
            started,
            &[dir.join("agent.log"), dir.join("agent-upgrade.log")],
        );
    }
    report
}

/// Whoever polled the agent or the engine during a run, with what they saw.
struct Pollers<'a> {
    nm_report: Option<&'a NmReport>,
    /// When the emulator's clock started (its polls' times count from it).
    nm_t0: Instant,
    pymotor: Option<&'a crate::pymotor::NodeManager>,
    /// The kubelet emulator's probes (a kubelet row only).
    kubelet: Option<&'a crate::kubelet::ProbeLog>,
}

impl Pollers<'_> {
    /// What the pollers saw, from the first injection to the later of the fault's end and
    /// the last agent operation's end (times from `t0`, the scheduled injection).
    fn figures(&self, e: &Experiment, s: f64, t0: Instant, out: &Outcome) -> Vec<PollFigures> {
        use crate::polls::{Answer, figures};
        let from = out.first_injected_ms.unwrap_or(0);
        let to = out
            .agent_ops
            .iter()
            .filter_map(|o| o.answered_ms.or(o.new_running_ms))
            .fold(scaled(e.duration, s).as_millis() as i64, i64::max)
            .max(from);
        let offset = self.nm_t0.saturating_duration_since(t0).as_millis() as i64
            - t0.saturating_duration_since(self.nm_t0).as_millis() as i64;
        let at = |i: Instant| {
            if i >= t0 {
                (i - t0).as_millis() as i64
            } else {
                -((t0 - i).as_millis() as i64)
            }
        };
        let mut polls = Vec::new();
        if let Some(r) = self.nm_report {
            let answers: Vec<Answer> = r
                .polls
                .iter()
                .map(|p| Answer {
                    at_ms: p.at_ms as i64 + offset,
                    ok: p.error.is_none(),
                })
                .collect();
            polls.push(figures("node_manager", &answers, from, to));
        }
        if let Some(nm) = self.pymotor {
            let answers: Vec<Answer> = nm
                .heartbeats()
                .into_iter()
                .map(|(i, ok)| Answer { at_ms: at(i), ok })
                .collect();
            polls.push(figures("pymotor_heartbeats", &answers, from, to));
        }
        if let Some(probes) = self.kubelet {
            let records = probes.records();
            for (kind, name) in [
                (crate::kubelet::ProbeKind::Readiness, "kubelet_readyz"),
                (crate::kubelet::ProbeKind::Liveness, "kubelet_livez"),
            ] {
                let answers: Vec<Answer> = records
                    .iter()
                    .filter(|r| r.probe == kind)
                    .map(|r| Answer {
                        at_ms: at(r.at),
                        ok: r.ok,
                    })
                    .collect();
                polls.push(figures(name, &answers, from, to));
            }
        }
        polls
    }
}

/// Stops the engine and the agent before the stack is dropped. The fake engine is killed
/// and reaped here: dropping the stack only sends SIGKILL, and a run can end (and a test
/// look for stray processes) before the engine is gone — a CI run saw a kubelet-restarted
/// engine still listed. A unit is stopped with its private manager here, not at the
/// stack's drop.
async fn stop_stack(stack: &mut Stack) {
    if let Some(mut e) = stack.engine.take() {
        let _ = e.kill().await;
    }
    stack.agent.lock().await.stop().await;
}

/// The experiment's load as the engine can take it: a real engine's test model has a
/// 1024-token context, so prompts are cut to 128 words ("tok ", up to 2 tokens each) and
/// answers to 512 tokens.
fn fit_load(load: &crate::experiment::Load, engine: EngineKind) -> crate::experiment::Load {
    let mut l = load.clone();
    if engine == EngineKind::Vllm {
        l.prompt_tokens = l.prompt_tokens.min(128);
        l.max_tokens = l.max_tokens.min(512);
    }
    l
}

#[cfg(test)]
mod tests {
    use super::config::{REAL_ENGINE_HEALTH_TIMEOUT, agent_toml};
    use super::emulator::EVIDENCE_POLLS;
    use super::processes::port_was_taken;
    use super::*;
    use crate::experiment::Fault;
    use fake_engine::node_manager::NmReport;

    // `--nm-heartbeat`: whole seconds; 1 s carries 3.0.0b2's 2 s poll timeout, 3 s the
    // reference's 5 s; the emulator gets the intervals scaled and the timeout as it is.
    #[test]
    fn cadences_parse_and_carry_their_poll_timeout() {
        let one = Cadence::parse("1s").unwrap();
        assert_eq!(one, Cadence::PYMOTOR);
        assert_eq!(one.poll_timeout(), Duration::from_secs(2));
        assert_eq!(
            Cadence::parse(" 3s").unwrap().poll_timeout(),
            Duration::from_secs(5)
        );
        for bad in ["0s", "1500ms", "61s", "soon"] {
            assert!(Cadence::parse(bad).is_err(), "{bad}");
        }
        let nm = one.nm_options(vec!["u".into()], 0.1);
        assert_eq!(nm.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(nm.poll_timeout, Duration::from_secs(2), "not scaled");
        assert_eq!((nm.threshold, nm.grace_period), (5, Duration::ZERO));
    }

    // A router row whose draft served is judged by what the agent told the router: only an
    // answer that takes the main engine out justifies the draft's answers.
    #[test]
    fn a_draft_serving_needs_the_agents_word() {
        use crate::router::{RouterAction, RouterKind};
        let mut out = Outcome {
            router: Some(RouterKind::Haproxy),
            ..crate::report::tests::outcome("burst", "healthy", Verdict::Pass, None)
        };
        assert!(!draft_without_cause(&out), "the draft did not serve");
        out.load.by_draft = 3;
        assert!(draft_without_cause(&out));
        let told = |to: &str| RouterAction {
            t_ms: 100,
            router: "haproxy",
            from: "ready".into(),
            to: to.into(),
            level: "throttle".into(),
        };
        out.router_actions.push(told("queue"));
        assert!(
            draft_without_cause(&out),
            "queue keeps new requests on main"
        );
        out.router_actions.push(told("drain"));
        assert!(!draft_without_cause(&out));
        out.router = None;
        out.router_actions.clear();
        assert!(!draft_without_cause(&out), "no router, no draft");
    }

    // The agent's config per policy: `agent` names the policy and writes only the scaled
    // durations of its preset; `reference` turns the opt-in rules off.
    #[test]
    fn agent_configs_per_policy_parse() {
        for (policy, s) in [(Policy::Agent, 0.1), (Policy::Reference, 1.0)] {
            let text = agent_toml(8000, 8001, 2, policy, s, EngineKind::Fake, "m");
            let cfg = npu_health_agent::config::file::parse(&text, Path::new("agent.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let e = &cfg.engines[0];
            assert_eq!(e.policy.value.as_str(), policy.as_str());
            assert_eq!(e.qos.stall_detection, policy == Policy::Agent);
            assert_eq!(e.qos.eviction, policy == Policy::Agent);
            if policy == Policy::Agent {
                assert_eq!(e.qos.stall_window, Duration::from_secs(3));
                assert_eq!(
                    e.agent_policy.health_failure_grace,
                    Duration::from_millis(1500)
                );
            }
        }
    }

    // A kill explains itself: the emulator's polls up to its decision, and the agent's
    // warnings up to it (what it logged about the dead engine afterwards is left out).
    #[test]
    fn kill_evidence_quotes_the_polls_and_warnings_before_the_kill() {
        use fake_engine::node_manager::{NmStatus, Poll};
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let start = humantime::parse_rfc3339("2026-12-02T12:00:00Z").unwrap();
        std::fs::write(
            &log,
            "2026-12-02T12:00:01.000000Z  INFO fine engine=chaos\n\
             2026-12-02T12:00:02.000000Z  WARN /health fails: timed out engine=chaos\n\
             2026-12-02T12:00:09.000000Z  WARN after the kill engine=chaos\n",
        )
        .unwrap();
        let poll = |at_ms, detected, error: Option<&str>| Poll {
            at_ms,
            endpoint: 0,
            detected,
            kept: detected,
            error: error.map(str::to_owned),
            latency_ms: 2.0,
        };
        let mut polls: Vec<Poll> = (0..20)
            .map(|i| poll(i * 100, NmStatus::Normal, None))
            .collect();
        polls.push(poll(2_100, NmStatus::Abnormal, Some("timeout")));
        polls.push(poll(5_000, NmStatus::Abnormal, None));
        let report = NmReport {
            polls,
            killed_at_ms: Some(3_000),
            max_consecutive_abnormal: 5,
            heartbeats: 30,
        };
        let lines = kill_evidence(Some(&report), start, std::slice::from_ref(&log));
        let polls: Vec<&String> = lines.iter().filter(|l| l.starts_with("poll ")).collect();
        assert_eq!(polls.len(), EVIDENCE_POLLS, "{lines:#?}");
        assert_eq!(
            polls.last().unwrap().as_str(),
            "poll -0.90 s: abnormal, timeout (2 ms)"
        );
        let agent: Vec<&String> = lines.iter().filter(|l| l.starts_with("agent: ")).collect();
        assert_eq!(agent.len(), 1, "{lines:#?}");
        assert!(agent[0].contains("/health fails"), "{lines:#?}");
        // No report (PyMotor's Node Manager): the agent's last warnings, all of them here.
        let lines = kill_evidence(None, start, &[log.clone(), dir.path().join("none.log")]);
        assert_eq!(lines.len(), 2, "{lines:#?}");
    }

    // With a real engine the `/health` timeout bounds the engine's own answer time and is not
    // scaled; with the fake engine (scaled too) it is.
    #[test]
    fn the_health_timeout_is_scaled_with_the_fake_engine_only() {
        for (engine, want) in [
            (EngineKind::Fake, Duration::from_secs(1)),
            (EngineKind::Vllm, REAL_ENGINE_HEALTH_TIMEOUT),
        ] {
            let text = agent_toml(8000, 8001, 2, Policy::Reference, 0.2, engine, "m");
            let cfg = npu_health_agent::config::file::parse(&text, Path::new("agent.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            let t = &cfg.engines[0].timing;
            assert_eq!(t.health_timeout, Some(want), "{engine:?}");
            // Everything else stays scaled either way.
            assert_eq!(t.request_timeout, Duration::from_secs(1), "{engine:?}");
        }
    }

    /// An engine-hang experiment on the kubelet row, expecting `expect` and `kubelet`.
    fn kubelet_experiment(expect: Expect, kubelet: crate::experiment::KubeletExpect) -> Experiment {
        Experiment {
            name: "x".into(),
            target: crate::experiment::Target::Engine,
            fault: Fault::EngineHang,
            duration: Duration::from_secs(10),
            load: Default::default(),
            guards: Vec::new(),
            expect,
            agent_policy_only: false,
            max_nm_heartbeat_s: None,
            known_false_kills: Vec::new(),
            kubelet,
            driver_codes: Vec::new(),
            repeat: 1,
        }
    }

    /// A kubelet row's outcome: the restarts seen (by liveness, after an exit), when the
    /// restart came and when the fault was detected.
    fn kubelet_outcome(
        k: crate::experiment::KubeletExpect,
        live: u32,
        exit: u32,
        restart: Option<u64>,
        detected: Option<u64>,
    ) -> Outcome {
        Outcome {
            experiment: "x".into(),
            target: crate::experiment::Target::Engine,
            fault: "engine_hang".into(),
            policy: Policy::Agent,
            integration: Integration::Kubelet,
            cadence: None,
            router: None,
            node_manager: NodeManagerKind::Emulator,
            expect: String::new(),
            verdict: Verdict::Error,
            detected_after_ms: detected,
            abnormal_after_ms: None,
            killed_at_ms: None,
            escalated_at_ms: None,
            shadow: None,
            first_injected_ms: Some(0),
            injected_ms: 0,
            guard_events: Vec::new(),
            load: Default::default(),
            load_after_abnormal: None,
            router_actions: Vec::new(),
            error: None,
            ran_again_after: None,
            kubelet: Some(KubeletOutcome {
                expect: k,
                actions: Vec::new(),
                liveness_restarts: live,
                exit_restarts: exit,
                not_ready_after_ms: None,
                restart_after_ms: restart,
                not_ready_ms: 0,
            }),
            kill_evidence: Vec::new(),
            agent_supervisor: crate::agent::Supervisor::Direct,
            agent_supervisor_note: None,
            agent_ops: Vec::new(),
            polls: Vec::new(),
            timeline: Vec::new(),
            rounds: Vec::new(),
        }
    }

    // The kubelet row's verdicts: a liveness restart of a healthy engine (or one that only
    // had to leave the load) is a false kill; a fault needs its action, in time.
    #[test]
    fn kubelet_verdicts() {
        use crate::experiment::KubeletExpect as K;
        let fault = Expect::DetectWithin(Duration::from_secs(60));
        let rows = [
            (
                "benign, no restart",
                kubelet_experiment(Expect::Healthy, K::NoRestart),
                kubelet_outcome(K::NoRestart, 0, 0, None, None),
                false,
                Verdict::Pass,
            ),
            (
                "benign, restarted",
                kubelet_experiment(Expect::Healthy, K::NoRestart),
                kubelet_outcome(K::NoRestart, 1, 0, Some(5), None),
                false,
                Verdict::FalseKill,
            ),
            (
                "benign, restarted, known",
                kubelet_experiment(Expect::Healthy, K::NoRestart),
                kubelet_outcome(K::NoRestart, 1, 0, Some(5), None),
                true,
                Verdict::KnownFalseKill,
            ),
            (
                "hang restarted",
                kubelet_experiment(fault, K::Restart),
                kubelet_outcome(K::Restart, 1, 0, Some(5), Some(5)),
                false,
                Verdict::Pass,
            ),
            (
                "crash restarted after exit",
                kubelet_experiment(fault, K::Restart),
                kubelet_outcome(K::Restart, 0, 1, Some(5), Some(5)),
                false,
                Verdict::Pass,
            ),
            (
                "hang not restarted",
                kubelet_experiment(fault, K::Restart),
                kubelet_outcome(K::Restart, 0, 0, None, None),
                false,
                Verdict::Missed,
            ),
            (
                "restarted before the fault",
                kubelet_experiment(fault, K::Restart),
                kubelet_outcome(K::Restart, 1, 0, None, None),
                false,
                Verdict::FalseKill,
            ),
            (
                "own restart, taken out",
                kubelet_experiment(fault, K::NotReady),
                kubelet_outcome(K::NotReady, 0, 0, None, Some(1)),
                false,
                Verdict::Pass,
            ),
            (
                "own restart, restarted too",
                kubelet_experiment(fault, K::NotReady),
                kubelet_outcome(K::NotReady, 1, 0, Some(3), Some(1)),
                false,
                Verdict::FalseKill,
            ),
        ];
        for (name, e, o, known, want) in rows {
            assert_eq!(kubelet_verdict(&e, &o, known, false), want, "{name}");
        }
        let e = kubelet_experiment(fault, K::Restart);
        let o = kubelet_outcome(K::Restart, 0, 0, None, None);
        assert_eq!(
            kubelet_verdict(&e, &o, false, true),
            Verdict::NotDetectableByDesign
        );
    }

    // A Node Manager row's verdicts: a kill before the injection is false whatever the
    // experiment expects, a driver fault's kill too; a fault needs its detection.
    #[test]
    fn node_manager_verdicts() {
        let exp = |fault: Fault, expect: Expect| Experiment {
            name: "x".into(),
            target: crate::experiment::Target::Engine,
            fault,
            duration: Duration::from_secs(10),
            load: Default::default(),
            guards: Vec::new(),
            expect,
            agent_policy_only: false,
            max_nm_heartbeat_s: None,
            known_false_kills: Vec::new(),
            kubelet: crate::experiment::KubeletExpect::Restart,
            driver_codes: Vec::new(),
            repeat: 1,
        };
        let out = |killed: Option<i64>, first: Option<i64>, detected: Option<u64>| Outcome {
            killed_at_ms: killed,
            first_injected_ms: first,
            detected_after_ms: detected,
            ..crate::report::tests::outcome("x", "", Verdict::Error, None)
        };
        let fault = Expect::DetectWithin(Duration::from_secs(5));
        let hang = exp(Fault::EngineHang, fault);
        let benign = exp(Fault::EngineHang, Expect::Healthy);
        let rows = [
            (
                "benign, no kill",
                &benign,
                out(None, Some(0), None),
                false,
                Verdict::Pass,
            ),
            (
                "benign, killed",
                &benign,
                out(Some(5), Some(0), None),
                false,
                Verdict::FalseKill,
            ),
            (
                "benign, killed, known",
                &benign,
                out(Some(5), Some(0), None),
                true,
                Verdict::KnownFalseKill,
            ),
            (
                "killed before the fault",
                &hang,
                out(Some(5), Some(10), Some(1)),
                true,
                Verdict::FalseKill,
            ),
            (
                "killed, never injected",
                &hang,
                out(Some(5), None, None),
                false,
                Verdict::FalseKill,
            ),
            (
                "detected",
                &hang,
                out(Some(5), Some(0), Some(5)),
                false,
                Verdict::Pass,
            ),
            (
                "missed",
                &hang,
                out(None, Some(0), None),
                false,
                Verdict::Missed,
            ),
            (
                "driver fault killed",
                &exp(Fault::DriverError, fault),
                out(Some(5), Some(0), Some(1)),
                false,
                Verdict::FalseKill,
            ),
        ];
        for (name, e, o, known, want) in rows {
            assert_eq!(node_manager_verdict(e, &o, known, false), want, "{name}");
        }
        assert_eq!(
            node_manager_verdict(&hang, &out(None, Some(0), None), false, true),
            Verdict::NotDetectableByDesign
        );
    }

    // An experiment only the agent policy can detect is "not detectable by design" for
    // `reference`; a peer's miss of it is a miss.
    #[test]
    fn a_peers_miss_is_never_by_design() {
        let mut e = kubelet_experiment(
            Expect::DetectWithin(Duration::from_secs(5)),
            crate::experiment::KubeletExpect::Restart,
        );
        e.agent_policy_only = true;
        let opts = RunOptions {
            agent_exe: Default::default(),
            time_scale: 0.05,
            out_dir: Default::default(),
            engine: EngineKind::Fake,
            real_vllm_script: Default::default(),
            real: Default::default(),
            row: Row::NodeManager(Cadence::PYMOTOR),
            pymotor_nm: None,
            pymotor: None,
            agent_supervisor: None,
            repo: Default::default(),
        };
        assert!(not_by_design(&e, Policy::Reference, &opts));
        assert!(!not_by_design(&e, Policy::Agent, &opts));
        assert!(!not_by_design(&e, Policy::K8sLiveness, &opts));
        e.agent_policy_only = false;
        e.max_nm_heartbeat_s = Some(0);
        assert!(
            not_by_design(&e, Policy::Reference, &opts),
            "the cadence's design"
        );
        assert!(!not_by_design(&e, Policy::TokenHeartbeat, &opts));
    }

    // Issue 50: a benign experiment fails when the agent escalated the engine as a restart
    // loop in it; a fault experiment may escalate (repeated_hang must).
    #[test]
    fn a_benign_experiment_that_escalated_fails_and_a_fault_may_escalate() {
        let exp =
            |expect: Expect| kubelet_experiment(expect, crate::experiment::KubeletExpect::Restart);
        let out = |escalated: Option<i64>| Outcome {
            escalated_at_ms: escalated,
            ..crate::report::tests::outcome("x", "", Verdict::Pass, None)
        };
        let benign = exp(Expect::Healthy);
        let fault = exp(Expect::DetectWithin(Duration::from_secs(5)));
        assert_eq!(escalated_benign(&benign, &out(None)), None);
        let why = escalated_benign(&benign, &out(Some(2500))).unwrap();
        assert!(why.contains("restart loop 2.5 s after"), "{why}");
        assert_eq!(escalated_benign(&fault, &out(Some(2500))), None);
        let mut o = out(Some(2500));
        o.verdict = Verdict::EscalatedBenign;
        assert!(crate::report::failed(&[o]), "the run fails");
    }

    #[test]
    fn a_bind_failure_in_a_log_is_seen_as_a_taken_port() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!port_was_taken(dir.path()), "no logs yet");
        std::fs::write(dir.path().join("agent.log"), "INFO started\n").unwrap();
        assert!(!port_was_taken(dir.path()));
        // The text a process prints for the real error (as `fake-engine` does).
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = std::net::TcpListener::bind(held.local_addr().unwrap()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        std::fs::write(
            dir.path().join("engine.log"),
            format!("npu-health-agent: fake engine: {err}\n"),
        )
        .unwrap();
        assert!(port_was_taken(dir.path()));
    }
}
