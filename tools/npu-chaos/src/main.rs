//! `npu-chaos`: runs experiment files against real processes (fake engine, agent on the fake
//! driver, load, Node Manager emulator) and reports false kills and detections. Thin: parse
//! flags, load the files, call the `npu_chaos` library. Exit 0 all good, 1 a false kill, a
//! missed detection or an experiment that could not run, 2 bad usage or a bad file.

use clap::{Parser, Subcommand};
use npu_chaos::{
    self as chaos,
    agent::Supervisor,
    experiment,
    run::{Cadence, EngineKind, NodeManagerKind, Policy},
};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "npu-chaos", version = npu_health_agent::VERSION, about = "Chaos experiments against the agent and fake engine (see docs/chaos.md)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every experiment of the files under each policy.
    Run(RunArgs),
    /// Run every experiment under every policy that makes kill decisions, at both Node
    /// Manager cadences, N times, and print one table, a row per policy, with intervals
    /// (docs/chaos.md, "The comparison").
    Compare(CompareArgs),
    /// Validate experiment files and print them.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Experiment files (YAML).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Multiplies every interval (agent, Node Manager, engine speed, faults).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Where timelines, charts, logs and the summary go.
    #[arg(long, default_value = "chaos-out")]
    out: PathBuf,
    /// Policies to run (default all three; mindie-3.0.0b2, MindIE's own engine server,
    /// runs at --time-scale 1 only and is reported not applicable otherwise).
    #[arg(long, value_enum)]
    policy: Vec<Policy>,
    /// Node Manager heartbeat intervals, comma-separated: every experiment runs under
    /// each (1s: PyMotor 3.0.0b2's, with its 2 s poll timeout; 3s: the reference's).
    /// [default: 1s,3s; with --node-manager pymotor: 1s, its only one]
    #[arg(long, value_delimiter = ',', value_parser = Cadence::parse)]
    nm_heartbeat: Vec<Cadence>,
    /// Who polls /status: the emulator, or MindIE PyMotor 3.0.0b2's own HeartbeatManager
    /// (`scripts/pymotor install` first; real time: --time-scale 1, faults after its 60 s
    /// grace period).
    #[arg(long, value_enum, default_value = "emulator")]
    node_manager: NodeManagerKind,
    /// Also run every experiment with the kubelet emulator acting instead of Node
    /// Manager (the example manifest's /readyz and /livez probes; fake engine and the
    /// emulator only): a row `kubelet` per policy.
    #[arg(long)]
    kubelet: bool,
    /// Also run every experiment with the load through this router, a draft engine
    /// behind it and Node Manager at 1s (fake engine and the emulator only; repeat for
    /// both): a row `haproxy` or `envoy` per policy. `scripts/routers install` first.
    #[arg(long, value_enum)]
    router: Vec<chaos::router::RouterKind>,
    /// Only the rows --kubelet and --router add: no row of Node Manager acting alone
    /// (the load straight to the engine).
    #[arg(long)]
    no_nm_rows: bool,
    /// Only the experiments with these names.
    #[arg(long)]
    only: Vec<String>,
    /// The engine: the fake engine, or a real vLLM started by scripts/real-vllm (faults
    /// it cannot take are reported not_applicable).
    #[arg(long, value_enum, default_value = "fake")]
    engine: EngineKind,
    /// scripts/real-vllm, for --engine vllm.
    #[arg(long, default_value = "scripts/real-vllm")]
    real_vllm: PathBuf,
    /// Who runs the agent: a child of the runner, or a unit (derived from the shipped
    /// one) of a private systemd user manager (root only). [default: systemd for the
    /// agent's own faults when such a manager can start, direct otherwise;
    /// agent_upgrade always runs two direct processes]
    #[arg(long, value_enum)]
    agent_supervisor: Option<Supervisor>,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// How many times every experiment runs in every row.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// The flags of `run`; `--policy` defaults to every policy that makes kill decisions.
    #[command(flatten)]
    run: RunArgs,
}

fn load(files: &[PathBuf]) -> Result<Vec<experiment::Experiment>, String> {
    let mut all = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        all.extend(experiment::parse(&text, &f.display().to_string())?);
    }
    Ok(all)
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Check { files } => check(&files),
        Cmd::Run(args) => run(args, None),
        Cmd::Compare(CompareArgs { repeat, mut run }) => {
            if run.policy.is_empty() {
                run.policy = Policy::compared();
            }
            self::run(run, Some(repeat))
        }
    }
}

/// `check`: every experiment of the files, one line each.
fn check(files: &[PathBuf]) -> ExitCode {
    match load(files) {
        Ok(es) => {
            for e in es {
                println!("{}", describe(&e));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("npu-chaos: {e}");
            ExitCode::from(2)
        }
    }
}

fn describe(e: &experiment::Experiment) -> String {
    format!(
        "{}: {} on {:?} for {}{}, expect {:?}{}",
        e.name,
        e.fault,
        e.target,
        humantime::format_duration(e.duration),
        if e.repeat > 1 {
            format!(", {} times (killed and restarted between)", e.repeat)
        } else {
            String::new()
        },
        e.expect,
        if e.guards.is_empty() {
            String::new()
        } else {
            format!(
                ", guards: {}",
                e.guards
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    )
}

/// `run` (and `compare`, with its repetitions): the flags checked against each other, then
/// every experiment in every row.
fn run(args: RunArgs, compare: Option<u32>) -> ExitCode {
    let (es, nm_heartbeat, policies) = match checked(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("npu-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("npu-chaos: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let plan = chaos::Plan {
        experiments: &es,
        policies: &policies,
        cadences: &nm_heartbeat,
        kubelet: args.kubelet,
        routers: &args.router,
        time_scale: args.time_scale,
        out: &args.out,
        engine: args.engine,
        node_manager: args.node_manager,
        real_vllm_script: &args.real_vllm,
        agent_supervisor: args.agent_supervisor,
    };
    let result = match compare {
        None => rt.block_on(chaos::run_all(&plan)),
        Some(repeat) => rt.block_on(chaos::compare::run(&plan, repeat)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("npu-chaos: {e}");
            ExitCode::from(1)
        }
    }
}

/// The experiments to run, the Node Manager heartbeats and the policies; a usage error
/// where flags contradict each other (or a bad file).
#[allow(clippy::type_complexity)]
fn checked(
    args: &RunArgs,
) -> Result<(Vec<experiment::Experiment>, Vec<Cadence>, Vec<Policy>), String> {
    let RunArgs {
        files,
        time_scale,
        policy,
        nm_heartbeat,
        node_manager,
        kubelet,
        router,
        no_nm_rows,
        only,
        engine,
        ..
    } = args;
    let (time_scale, kubelet, no_nm_rows) = (*time_scale, *kubelet, *no_nm_rows);
    if !(time_scale.is_finite() && time_scale > 0.0 && time_scale <= 10.0) {
        return Err("--time-scale must be in (0, 10]".to_owned());
    }
    let mut es = load(files)?;
    if !only.is_empty() {
        if let Some(missing) = only.iter().find(|n| !es.iter().any(|e| &e.name == *n)) {
            return Err(format!("--only {missing}: no such experiment"));
        }
        es.retain(|e| only.contains(&e.name));
    }
    let pymotor = *node_manager == NodeManagerKind::Pymotor;
    if pymotor && time_scale != 1.0 {
        return Err("--node-manager pymotor runs in real time: give --time-scale 1".to_owned());
    }
    let nm_heartbeat = match (nm_heartbeat.is_empty(), pymotor) {
        (true, false) => vec![Cadence::PYMOTOR, Cadence::REFERENCE],
        (true, true) => vec![Cadence::PYMOTOR],
        (false, true) if nm_heartbeat.iter().any(|c| *c != Cadence::PYMOTOR) => {
            return Err(
                "--node-manager pymotor: PyMotor 3.0.0b2's heartbeat is 1s (--nm-heartbeat 1s)"
                    .to_owned(),
            );
        }
        (false, _) => nm_heartbeat.clone(),
    };
    if kubelet && (pymotor || *engine != EngineKind::Fake) {
        return Err("--kubelet runs on the fake engine with the Node Manager emulator (it restarts the fake engine)".to_owned());
    }
    if !router.is_empty() && (pymotor || *engine != EngineKind::Fake) {
        return Err("--router runs on the fake engine with the Node Manager emulator (the draft is a fake engine)".to_owned());
    }
    if no_nm_rows && !kubelet && router.is_empty() {
        return Err("--no-nm-rows leaves no row: add --kubelet or --router".to_owned());
    }
    let nm_heartbeat = if no_nm_rows { Vec::new() } else { nm_heartbeat };
    let policies = if policy.is_empty() {
        vec![Policy::Reference, Policy::Agent, Policy::Mindie]
    } else {
        policy.clone()
    };
    Ok((es, nm_heartbeat, policies))
}
