//! The chaos suite (`npu-chaos`, a crate of its own: the agent does not compile it): experiments that inject faults into a
//! stack of real processes — the fake engine, the agent release binary on the fake driver, a
//! load generator, a Node Manager emulator — and check that benign faults never get a healthy
//! engine killed and real faults are always detected. See `docs/chaos.md`.
#![forbid(unsafe_code)]

pub mod agent;
pub mod compare;
pub mod experiment;
pub mod kubelet;
pub mod load;
mod peers;
pub mod polls;
pub mod priority;
mod procfs;
pub mod proxy;
pub mod pymotor;
pub mod real_engine;
pub mod report;
pub mod router;
pub mod run;
pub mod shadow;
pub mod stress;
pub mod svg;
pub mod systemd;
pub mod timescale;

use experiment::Experiment;
use run::{Cadence, EngineKind, Outcome, Policy, RunOptions};
use std::path::{Path, PathBuf};

/// The agent binary next to this one (cargo builds both into the same directory). Refused
/// unless it was built from the same sources as the agent library this runner links, with
/// the fakes: `cargo build -p npu-chaos` after a change to the agent rebuilds the library and
/// this binary, not the agent's, and `scripts/build-deb` (or any build without
/// `--features fake-driver`) writes an agent without the fakes. Both are told apart by what
/// `--version` says (build.rs hashes the sources), not by the files' times: a `cargo bench`
/// writes a newer library of the same sources, and that agent is current.
pub fn agent_exe() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    let agent = me.with_file_name("npu-health-agent");
    if !agent.is_file() {
        return Err(format!(
            "{} not found: build both with `cargo build --release --features fake-driver` (same profile)",
            agent.display()
        ));
    }
    let out = std::process::Command::new(&agent)
        .arg("--version")
        .output()
        .map_err(|e| format!("{} --version: {e}", agent.display()))?;
    let theirs = String::from_utf8_lossy(&out.stdout);
    current(&agent, theirs.trim(), npu_health_agent::VERSION)?;
    Ok(agent)
}

/// Whether `version` (the agent binary's `--version` line) is of the library `ours`: the same
/// sources and the fakes. `Err` says what differs and what to run.
fn current(agent: &Path, version: &str, ours: &str) -> Result<(), String> {
    let build = |v: &str| {
        v.split_once("source ")
            .map(|(_, rest)| rest.trim_end_matches(')').to_owned())
    };
    let rebuild = "rebuild it with `cargo build --release --features fake-driver` (the profile of this runner)";
    let (Some(theirs), Some(ours)) = (build(version), build(ours)) else {
        return Err(format!(
            "{} says {version:?}, not which sources it was built from: {rebuild}",
            agent.display()
        ));
    };
    let hash = |b: &str| b.split(',').next().unwrap_or_default().to_owned();
    if !theirs.ends_with("fake-driver") {
        return Err(format!(
            "{} was built without the fakes (scripts/build-deb, or a build without --features fake-driver): {rebuild}",
            agent.display()
        ));
    }
    if hash(&theirs) != hash(&ours) {
        return Err(format!(
            "{} was built from other sources ({}) than the agent library of this runner ({}): {rebuild}",
            agent.display(),
            hash(&theirs),
            hash(&ours)
        ));
    }
    Ok(())
}

/// The repository root: two levels above `scripts/real-vllm` (its default is relative, so
/// the current directory when that is relative).
fn repo_root(real_vllm_script: &Path) -> PathBuf {
    let abs = std::fs::canonicalize(real_vllm_script).unwrap_or_else(|_| real_vllm_script.into());
    abs.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// What [`run_all`] runs, and where.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    pub experiments: &'a [Experiment],
    pub policies: &'a [Policy],
    pub cadences: &'a [Cadence],
    /// Also a kubelet row per policy (the kubelet emulator acting, no Node Manager).
    pub kubelet: bool,
    /// Also a row per policy and router: the load through it, a draft engine behind it,
    /// Node Manager at its 1 s cadence.
    pub routers: &'a [router::RouterKind],
    pub time_scale: f64,
    pub out: &'a Path,
    pub engine: EngineKind,
    pub node_manager: run::NodeManagerKind,
    /// `scripts/real-vllm` (its repository also holds `scripts/pymotor`).
    pub real_vllm_script: &'a Path,
    /// `--agent-supervisor` (`None`: systemd for the agent's own faults when a private user
    /// manager can start, direct otherwise).
    pub agent_supervisor: Option<agent::Supervisor>,
}

impl Plan<'_> {
    /// The rows every experiment runs in: Node Manager at each cadence, then the kubelet and
    /// the routers asked for.
    fn rows(&self) -> Vec<run::Row> {
        let mut rows: Vec<run::Row> = self
            .cadences
            .iter()
            .map(|&c| run::Row::NodeManager(c))
            .collect();
        if self.kubelet {
            rows.push(run::Row::Kubelet);
        }
        rows.extend(self.routers.iter().map(|&r| run::Row::Router(r)));
        rows
    }
}

/// Runs every experiment under every policy and Node Manager cadence, one at a time (CPU
/// stress must not overlap another experiment), writing `<out>/<policy>/<cadence>/<name>.json`
/// and `.svg`, `summary.md` and `summary.json`. True when nothing failed (no false kill, no
/// missed detection, no error).
pub async fn run_all(plan: &Plan<'_>) -> Result<bool, String> {
    let outcomes = run_plan(plan, 1).await?;
    write_summary(plan, &outcomes)?;
    Ok(!report::failed(&outcomes))
}

/// Runs the plan `repeat` times over (each time into `<out>/repeat-<i>` when more than once)
/// and returns every outcome.
pub(crate) async fn run_plan(plan: &Plan<'_>, repeat: u32) -> Result<Vec<Outcome>, String> {
    let Plan {
        policies,
        time_scale,
        out,
        engine,
        node_manager,
        real_vllm_script,
        agent_supervisor,
        ..
    } = *plan;
    let rows = plan.rows();
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    // Absolute: the scenario names the NPU files, and the fake driver resolves relative names
    // against the scenario's own directory.
    let out = &std::fs::canonicalize(out).map_err(|e| format!("{}: {e}", out.display()))?;
    if engine == EngineKind::Vllm && !real_vllm_script.is_file() {
        return Err(format!(
            "{} not found: --engine vllm needs the project's scripts/real-vllm (--real-vllm PATH), after `scripts/real-vllm install`",
            real_vllm_script.display()
        ));
    }
    let opts = &mut RunOptions {
        agent_exe: agent_exe()?,
        time_scale,
        out_dir: out.to_owned(),
        engine,
        real_vllm_script: real_vllm_script.to_owned(),
        real: Default::default(),
        row: run::Row::NodeManager(run::Cadence::REFERENCE),
        pymotor: if policies.contains(&Policy::Mindie)
            && time_scale == 1.0
            && engine == EngineKind::Fake
        {
            Some(pymotor::Pymotor::find(&repo_root(real_vllm_script)).await?)
        } else {
            None
        },
        pymotor_nm: match node_manager {
            run::NodeManagerKind::Emulator => None,
            run::NodeManagerKind::Pymotor => {
                Some(pymotor::Pymotor::find(&repo_root(real_vllm_script)).await?)
            }
        },
        agent_supervisor,
        repo: repo_root(real_vllm_script),
    };
    let mut outcomes = Vec::new();
    let mut result = Ok(());
    for i in 1..=repeat {
        if repeat > 1 {
            eprintln!("npu-chaos: repetition {i} of {repeat}");
            opts.out_dir = out.join(format!("repeat-{i}"));
        }
        match run_each(plan.experiments, policies, &rows, opts).await {
            Ok(o) => outcomes.extend(o),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // The real engine is kept between experiments: stop it, however the run ended.
    if let Some(r) = opts.real.lock().await.take() {
        r.down().await;
    }
    result.map(|()| outcomes)
}

/// Prints the runner's summary and writes `summary.md` and `summary.json` into `<out>`.
pub(crate) fn write_summary(plan: &Plan<'_>, outcomes: &[Outcome]) -> Result<(), String> {
    let (policies, time_scale, out) = (plan.policies, plan.time_scale, plan.out);
    let rows = plan.rows();
    let md = report::markdown(outcomes, policies, &rows, time_scale);
    print!("{md}");
    std::fs::write(out.join("summary.md"), &md).map_err(|e| e.to_string())?;
    let summaries: Vec<report::PolicySummary> = policies
        .iter()
        .flat_map(|&p| rows.iter().map(move |&c| (p, c)))
        .map(|(p, c)| report::summarize(p, c, outcomes, time_scale))
        .collect();
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "time_scale": time_scale,
            "engine": plan.engine,
            "policies": summaries,
        }))
        .unwrap_or_default(),
    )
    .map_err(|e| e.to_string())
}

/// Runs the experiments one at a time, writing each one's timeline and chart.
/// Each policy with each row, in order; a peer only at the first Node Manager cadence: it
/// does not read the cadence, so a second would only repeat the first (docs/chaos.md, "The
/// peers").
fn pairs(policies: &[Policy], rows: &[run::Row]) -> Vec<(Policy, run::Row)> {
    let first = rows.iter().find_map(|r| match r {
        run::Row::NodeManager(c) => Some(*c),
        _ => None,
    });
    policies
        .iter()
        .flat_map(|&p| rows.iter().map(move |&r| (p, r)))
        .filter(|(p, r)| match r {
            run::Row::NodeManager(c) => p.peer().is_none() || Some(*c) == first,
            _ => true,
        })
        .collect()
}

async fn run_each(
    experiments: &[Experiment],
    policies: &[Policy],
    rows: &[run::Row],
    opts: &mut RunOptions,
) -> Result<Vec<Outcome>, String> {
    let (out, time_scale) = (opts.out_dir.clone(), opts.time_scale);
    let mut outcomes: Vec<Outcome> = Vec::new();
    for e in experiments {
        for (p, c) in pairs(policies, rows) {
            opts.row = c;
            eprintln!(
                "npu-chaos: {} ({}) under the {} policy, {} ...",
                e.name,
                e.fault,
                p.as_str(),
                match c {
                    run::Row::NodeManager(c) => format!("Node Manager heartbeat {}", c.label()),
                    run::Row::Kubelet => "the kubelet acting".to_owned(),
                    run::Row::Router(r) =>
                        format!("the load through {}, Node Manager heartbeat 1s", r.as_str()),
                }
            );
            let mut o = tokio::select! {
                o = run::run(e, p, opts) => o,
                _ = interrupted() => {
                    // Dropping the experiment kills its processes.
                    return Err("interrupted".to_owned());
                }
            };
            // A real vLLM that died by itself says nothing about the agent: the experiment
            // runs once more on a fresh engine, and the outcome says so.
            if let Some(first) = o.real_engine_died() {
                eprintln!("npu-chaos:   {first}; running the experiment once more");
                o = tokio::select! {
                    o = run::run(e, p, opts) => o,
                    _ = interrupted() => return Err("interrupted".to_owned()),
                };
                o.ran_again_after = Some(first);
            }
            eprintln!(
                "npu-chaos:   {:?}{}",
                o.verdict,
                o.detected_after_ms
                    .map(|t| format!(", detected after {:.1} s (scaled)", t as f64 / 1000.0))
                    .unwrap_or_default()
            );
            if o.verdict == run::Verdict::FalseKill {
                for line in &o.kill_evidence {
                    eprintln!("npu-chaos:     {line}");
                }
            }
            let path = out
                .join(p.as_str())
                .join(run::cadence_dir(opts))
                .join(format!("{}.json", e.name));
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            std::fs::write(&path, serde_json::to_string_pretty(&o).unwrap_or_default())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let chart = path.with_extension("svg");
            std::fs::write(&chart, svg::chart(&o, time_scale))
                .map_err(|e| format!("{}: {e}", chart.display()))?;
            outcomes.push(o);
        }
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::{current, pairs};
    use crate::run::{Cadence, Policy, Row};
    use std::path::Path;

    #[test]
    fn a_peer_runs_at_the_first_node_manager_cadence_only() {
        let rows = [
            Row::NodeManager(Cadence::PYMOTOR),
            Row::NodeManager(Cadence::REFERENCE),
            Row::Kubelet,
        ];
        let got = pairs(&[Policy::Agent, Policy::K8sLiveness], &rows);
        assert_eq!(
            got,
            [
                (Policy::Agent, rows[0]),
                (Policy::Agent, rows[1]),
                (Policy::Agent, rows[2]),
                (Policy::K8sLiveness, rows[0]),
                // A kubelet row is the peer's to refuse (not applicable), with its reason.
                (Policy::K8sLiveness, rows[2]),
            ]
        );
    }

    const OURS: &str = "0.1.0 (git 7d4e77def2bb, source 00aa11bb22cc33dd, fake-driver)";

    #[test]
    fn the_agent_must_be_of_the_same_sources_with_the_fakes() {
        let a = Path::new("target/release/npu-health-agent");
        // Another commit of the same sources (a `cargo bench` library) is current.
        assert_eq!(
            current(
                a,
                "npu-health-agent 0.1.0 (git 000000000000, source 00aa11bb22cc33dd, fake-driver)",
                OURS
            ),
            Ok(())
        );
        let e = current(
            a,
            "npu-health-agent 0.1.0 (git 7d4e77def2bb, source 00aa11bb22cc33dd)",
            OURS,
        )
        .unwrap_err();
        assert!(e.contains("without the fakes"), "{e}");
        let e = current(
            a,
            "npu-health-agent 0.1.0 (git 7d4e77def2bb, source ffff11bb22cc33dd, fake-driver)",
            OURS,
        )
        .unwrap_err();
        assert!(e.contains("other sources (ffff11bb22cc33dd)"), "{e}");
        let e = current(a, "npu-health-agent 0.1.0 (git 7d4e77def2bb)", OURS).unwrap_err();
        assert!(e.contains("not which sources"), "{e}");
    }
}
