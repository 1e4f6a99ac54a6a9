//! Command line: flags, commands, and the mapping of errors to exit codes.
//!
//! Long because: the one list of commands with their flags and its dispatch, and the driver
//! flags' reordering; each command's own work is in its own file.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 bad usage or config, 3 no usable driver backend,
//! 4 `doctor`: virtual inference will not run for an engine.
//! Errors print as one line: the cause chain joined with ": ".

#[cfg(feature = "fake-driver")]
mod demo;
mod disagreements;
mod inspect;
mod service;
pub mod top;
mod values;

use crate::config::mindie::Role;
use crate::config::{AgentConfig, AgentSettings, SingleEngine, file};
use crate::driver::BackendChoice;
use crate::logging::LogFormat;
use crate::sampler::StartError;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit code for bad usage or configuration.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code when no driver backend can serve AI Cube figures.
pub(crate) const EXIT_NO_BACKEND: u8 = 3;
/// Exit code of `doctor` when a condition blocks virtual inference for an engine.
pub(crate) const EXIT_VIRTUAL_INFERENCE_BLOCKED: u8 = 4;

const DRIVER_FLAGS_NOTE: &str = "Driver flags (--dcmi-lib, --npu-smi, --backend, --dcmi-no-owner-check, --npu-smi-delay) go before the command: npu-health-agent [FLAGS] <COMMAND> (after it works too); see npu-health-agent --help.";

/// The driver flags, with whether each takes a value: the program's, listed once in
/// `--help`, and accepted after the command as well ([`driver_flags_first`]).
const DRIVER_FLAGS: [(&str, bool); 6] = [
    ("--dcmi-lib", true),
    ("--npu-smi", true),
    ("--backend", true),
    ("--dcmi-no-owner-check", false),
    ("--npu-smi-delay", true),
    ("--fake", false),
];

/// The command line with the driver flags found after the command moved before it, where
/// clap takes them: `sample --backend npu-smi --npu-smi X` reads as `--backend npu-smi
/// --npu-smi X sample`, as scripts and units written before the flags became the program's
/// have them. Nothing after a `--` moves, and a flag's value moves with it (`--npu-smi X` or
/// `--npu-smi=X`).
pub(crate) fn driver_flags_first(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let flag_of = |a: &std::ffi::OsString| {
        let a = a.to_str()?;
        DRIVER_FLAGS.iter().find_map(|(f, takes)| {
            if a == *f {
                Some(*takes)
            } else if *takes && a.strip_prefix(f).is_some_and(|r| r.starts_with('=')) {
                Some(false)
            } else {
                None
            }
        })
    };
    // The command: the first word that is neither a flag nor a flag's value.
    let mut command = None;
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_str().unwrap_or("");
        if !a.starts_with('-') {
            command = Some(i);
            break;
        }
        let takes_value =
            flag_of(&args[i]).unwrap_or(false) || a == "--log-format" || a == "--exit-with-parent";
        i += if takes_value { 2 } else { 1 };
    }
    let Some(command) = command else { return args };
    let (mut before, mut moved, mut rest) = (args[..command].to_vec(), Vec::new(), Vec::new());
    let mut tail = args[command..].iter();
    while let Some(a) = tail.next() {
        if a == "--" {
            rest.push(a.clone());
            rest.extend(tail.by_ref().cloned());
            break;
        }
        match flag_of(a) {
            Some(takes_value) => {
                moved.push(a.clone());
                if takes_value && let Some(v) = tail.next() {
                    moved.push(v.clone());
                }
            }
            None => rest.push(a.clone()),
        }
    }
    before.extend(moved);
    before.extend(rest);
    before
}

/// Health agent for LLM inference nodes on Huawei Ascend NPUs.
#[derive(Debug, Parser)]
#[command(name = "npu-health-agent", version = crate::VERSION, about)]
pub struct Cli {
    #[command(flatten)]
    pub driver: DriverArgs,
    /// Get SIGTERM when process PID, this process's parent, dies (even by SIGKILL): how
    /// `demo` starts its agent and fake engine. Refuses to start if PID is not the parent.
    #[arg(long, global = true, hide = true, value_name = "PID")]
    pub exit_with_parent: Option<u32>,
    #[command(subcommand)]
    pub command: Command,
}

/// Linux's parent-death signal (SIGTERM) for this process, if `parent` is its parent; it
/// is tied to the parent's thread that started this process.
fn exit_with_parent(parent: u32) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| format!("--exit-with-parent: prctl(PR_SET_PDEATHSIG): {e}"))?;
    let now = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32);
    if now != Some(parent) {
        return Err(format!(
            "--exit-with-parent {parent}: the parent is {now:?}, so {parent} is gone"
        ));
    }
    Ok(())
}

/// Where the driver is, and the log format: flags of the program, given before the command
/// (`npu-health-agent --dcmi-lib PATH run …`), so that they are listed once, in
/// `npu-health-agent --help`, not in every command's. In host mode these override `[agent]`.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// Path of libdcmi.so (default: search LD_LIBRARY_PATH, /usr/local/dcmi,
    /// /usr/local/Ascend/driver/lib64/driver).
    #[arg(long, value_name = "PATH")]
    pub dcmi_lib: Option<PathBuf>,
    /// The npu-smi executable (default `npu-smi`, looked up in PATH).
    #[arg(long, value_name = "PATH")]
    pub npu_smi: Option<PathBuf>,
    /// Which sources of AI Cube figures may be used [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Load libdcmi.so even if it or a parent directory is not root-owned or is writable by
    /// group/others (for tests; unsafe on production hosts).
    #[arg(long)]
    pub dcmi_no_owner_check: bool,
    /// Seconds between npu-smi watch passes (its -d), 1 to 100 [default: 1].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub npu_smi_delay: Option<u32>,
    /// Use the fake libdcmi.so and fake npu-smi built with this binary.
    #[cfg(feature = "fake-driver")]
    #[arg(long)]
    pub fake: bool,
    /// Log output: journald when systemd connected stderr to the journal, else text
    /// (`auto`); or force text, json or journald.
    /// (Global: also accepted after the command, where the Dockerfile and older units put it.)
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
}

/// `check-config`'s arguments: what to check, and as whom.
#[derive(Debug, Args, Clone)]
pub struct CheckConfigArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Check as the agent running as USER would (the unit's `User=`, `npu-health-agent` for
    /// the package): the state directory must be USER's, the token files readable by USER.
    /// Default: the user running this.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
}

/// What to monitor: `--config agent.toml`, or MindIE's engine-server flags for one engine.
#[derive(Debug, Args, Clone)]
pub struct ConfigArgs {
    /// Host mode: the agent's TOML config with [agent] and [[engine]] tables.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config_path", "role", "host", "port", "mgmt_port", "dp_rank", "devices", "env_config_path", "stall_detection", "stall_window", "skip_when_capacity_waiting", "qos_eviction", "qos_probe_max_tokens"])]
    pub config: Option<PathBuf>,
    /// Single-engine mode: MindIE's user_config.json.
    #[arg(long, value_name = "FILE")]
    pub config_path: Option<PathBuf>,
    /// Engine role (the user_config.json section read).
    #[arg(long, value_parser = values::role())]
    pub role: Option<Role>,
    /// Address of the engine's inference surface; the mgmt listener binds it too.
    #[arg(long)]
    pub host: Option<String>,
    /// Inference port (`/health`, `/v1/completions`).
    #[arg(long)]
    pub port: Option<u16>,
    /// Port of `/status`.
    #[arg(long)]
    pub mgmt_port: Option<u16>,
    /// Data-parallel rank; only rank 0 probes.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=65535))]
    pub dp_rank: u32,
    /// The engine's NPUs (logic ids); default ASCEND_RT_VISIBLE_DEVICES, else all.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub devices: Option<Vec<u32>>,
    /// MindIE's env.json, for the engine's ASCEND_GLOBAL_LOG_LEVEL and visible devices.
    #[arg(long, value_name = "FILE")]
    pub env_config_path: Option<PathBuf>,
    /// Sampling period [default: 50ms].
    #[arg(long, value_parser = parse_duration)]
    pub sample_period: Option<Duration>,
    /// Admin listener for /metrics of all engines and /healthz (single-engine mode).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// HAProxy's agent-check listener (single-engine mode; docs/degradation.md).
    #[arg(long, value_name = "ADDR")]
    pub haproxy_agent_listen: Option<SocketAddr>,
    /// Count a failed probe on a busy NPU once the engine made no progress for
    /// --stall-window (single-engine mode; host mode: [engine.qos]).
    #[arg(long)]
    pub stall_detection: bool,
    /// Stall detection window [default: 30s; 60s under --policy reference].
    #[arg(long, value_parser = parse_duration, requires = "stall_detection")]
    pub stall_window: Option<Duration>,
    /// MindIE V6 rule: do not count an idle failure while requests wait for capacity.
    #[arg(long)]
    pub skip_when_capacity_waiting: bool,
    /// A held QoS `evict` level answers `abnormal` on /status.
    #[arg(long)]
    pub qos_eviction: bool,
    /// Detection policy (single-engine mode; host mode: `policy` in [agent] or [[engine]]):
    /// `reference` is MindIE V5 exactly, `agent` adds the grace, fast confirmation, stall
    /// detection and QoS eviction (docs/policy.md) [default: agent].
    #[arg(long, value_parser = values::policy(), conflicts_with = "config")]
    pub policy: Option<crate::config::policy::Policy>,
    /// max_tokens of the virtual probe; above 1 it streams and measures time per token.
    #[arg(long, value_name = "N")]
    pub qos_probe_max_tokens: Option<u32>,
    /// Where the agent keeps its state across restarts and listens for a successor to
    /// take over (over `[agent] state_dir`; default systemd's RUNTIME_DIRECTORY).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `run`: what to monitor, and how this agent hands over to the next.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// After handing over to a new agent (started with the same state directory): exit 0,
    /// or stop everything and wait for SIGTERM (Kubernetes, where an exit would restart
    /// the container).
    #[arg(long, value_enum, default_value_t = crate::agent::AfterHandover::Exit)]
    pub after_handover: crate::agent::AfterHandover,
    /// How long to wait for a port another process holds (one that cannot hand over, such
    /// as an agent before 0.2, during the first rolling update) [default: 0s, fail at once].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub wait_for_ports: Option<Duration>,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: sample the NPUs, probe the engine(s), serve /status.
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    Run(RunArgs),
    /// Validate the configuration and print it with defaults filled in.
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    CheckConfig(CheckConfigArgs),
    /// Print, per engine, each condition virtual inference needs and whether it will run
    /// (exit 4 when it will not run for an engine).
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    Doctor {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the NPUs found, the backend serving each, and its capabilities.
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Sample AI Cube usage for a window and print peak, mean and sample counts per device.
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    Sample {
        /// Length of the window.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        window: Duration,
        /// Sampling period.
        #[arg(long, default_value = "50ms", value_parser = parse_duration)]
        period: Duration,
        /// Logic ids of the NPUs to sample (default: all).
        #[arg(long, value_delimiter = ',', value_name = "IDS")]
        devices: Option<Vec<u32>>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Watch a running agent: engines and a live AI Cube sparkline per NPU (`q` quits).
    Top(top::TopArgs),
    /// Print when the policy in force and the shadow said abnormal, from the state file.
    Disagreements(disagreements::DisagreementsArgs),
    /// Start a fake engine and the agent on the fake driver; show /status (fake-driver builds).
    #[cfg(feature = "fake-driver")]
    #[command(after_help = DRIVER_FLAGS_NOTE)]
    Demo(demo::DemoArgs),
    /// Run the fake inference engine (fake-driver builds; used by tests and the demo).
    #[cfg(feature = "fake-driver")]
    #[command(hide = true)]
    FakeEngine(demo::FakeEngineArgs),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 5s or 50ms: {e}"))
}

/// An error with the exit code it should produce.
#[derive(Debug)]
pub struct CliError {
    code: u8,
    error: anyhow::Error,
}

impl CliError {
    /// A usage or configuration error (exit 2).
    fn usage(error: impl Into<anyhow::Error>) -> CliError {
        CliError {
            code: EXIT_USAGE,
            error: error.into(),
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    fn from(e: E) -> CliError {
        let error = e.into();
        let code = match error.downcast_ref::<StartError>() {
            Some(StartError::NoBackend { .. }) => EXIT_NO_BACKEND,
            Some(StartError::UnknownDevice { .. } | StartError::Invalid(_)) => EXIT_USAGE,
            _ => match error.downcast_ref::<crate::agent::AgentError>() {
                Some(crate::agent::AgentError::Config(_)) => EXIT_USAGE,
                Some(crate::agent::AgentError::Sampler(StartError::NoBackend { .. })) => {
                    EXIT_NO_BACKEND
                }
                Some(crate::agent::AgentError::Sampler(_)) => EXIT_USAGE,
                _ if error.downcast_ref::<crate::config::ConfigError>().is_some() => EXIT_USAGE,
                _ => 1,
            },
        };
        CliError { code, error }
    }
}

/// Parses the command line, runs the command, prints a one-line error on failure.
pub fn main() -> ExitCode {
    // Before anything else: a signal during start-up is remembered, not fatal.
    crate::service::signals::install_early();
    let cli = Cli::parse_from(driver_flags_first(std::env::args_os().collect()));
    if let Some(parent) = cli.exit_with_parent
        && let Err(e) = exit_with_parent(parent)
    {
        eprintln!("npu-health-agent: {e}");
        return ExitCode::FAILURE;
    }
    if matches!(cli.command, Command::Run(_)) {
        // Still one thread: the only time the environment may be changed.
        crate::continuity::sockets::capture_systemd();
    }
    let service = matches!(cli.command, Command::Run(_)) || is_demo(&cli.command);
    if !service {
        crate::service::signals::default_actions();
    }
    let default = if service { "info" } else { "warn" };
    crate::logging::set_global(crate::logging::init(cli.driver.log_format, default));
    let result = run(cli);
    if let Some(l) = crate::logging::global() {
        l.flush();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let chain: Vec<String> = f.error.chain().map(ToString::to_string).collect();
            // Under journald or with JSON logs, why the agent stopped is an error-priority
            // log line (journalctl -p err finds it); in text mode the plain line suffices.
            match crate::logging::global() {
                Some(l) if l.structured() => {
                    tracing::error!(exit_code = f.code, "{}", chain.join(": "));
                    l.flush();
                }
                _ => eprintln!("npu-health-agent: {}", chain.join(": ")),
            }
            ExitCode::from(f.code)
        }
    }
}

#[cfg(feature = "fake-driver")]
fn is_demo(c: &Command) -> bool {
    matches!(c, Command::Demo(_) | Command::FakeEngine(_))
}

#[cfg(not(feature = "fake-driver"))]
fn is_demo(_: &Command) -> bool {
    false
}

/// Applies the global driver flags (and `--fake`) over `agent`.
fn apply_driver_args(args: &DriverArgs, agent: &mut AgentSettings) -> Result<(), CliError> {
    if let Some(p) = &args.dcmi_lib {
        agent.dcmi_lib = Some(p.clone());
    }
    if let Some(p) = &args.npu_smi {
        agent.npu_smi = p.clone();
    }
    if let Some(b) = args.backend {
        agent.backend = b;
    }
    if args.dcmi_no_owner_check {
        agent.dcmi_no_owner_check = true;
    }
    if let Some(d) = args.npu_smi_delay {
        agent.npu_smi_delay = d;
    }
    #[cfg(feature = "fake-driver")]
    if args.fake {
        let mut driver = crate::agent::driver_config(agent);
        crate::fake::apply(&mut driver, args.dcmi_lib.is_some(), args.npu_smi.is_some()).map_err(
            |e| CliError {
                code: 1,
                error: anyhow::anyhow!(e),
            },
        )?;
        agent.dcmi_lib = driver.dcmi_lib;
        agent.npu_smi = driver.npu_smi;
        agent.dcmi_no_owner_check = true;
    }
    Ok(())
}

impl ConfigArgs {
    /// The QoS settings of single-engine mode.
    fn qos_flags(&self) -> Result<crate::qos::QosConfig, CliError> {
        let d = crate::qos::QosConfig::default();
        let q = crate::qos::QosConfig {
            stall_detection: self.stall_detection,
            stall_window: self.stall_window.unwrap_or(d.stall_window),
            skip_when_capacity_waiting: self.skip_when_capacity_waiting,
            eviction: self.qos_eviction,
            probe_max_tokens: self.qos_probe_max_tokens.unwrap_or(d.probe_max_tokens),
            ..d
        };
        q.validate().map_err(|(k, m)| {
            let flag = match k.as_str() {
                "probe_max_tokens" => "--qos-probe-max-tokens",
                "stall_window" => "--stall-window",
                other => other,
            };
            CliError::usage(anyhow::anyhow!("{flag}: {m}"))
        })?;
        Ok(q)
    }

    /// Loads the configuration from either mode, applies the flags and checks the result
    /// (each table checks itself in `config`, and [`AgentConfig::validate_across`] the
    /// whole; what needs the host is checked by `check-config` and `run` after this).
    pub fn load(&self, driver: &DriverArgs) -> Result<AgentConfig, CliError> {
        let mut cfg = match (&self.config, &self.config_path) {
            (Some(path), _) => file::load(path).map_err(CliError::usage)?,
            (None, Some(config_path)) => {
                let missing: Vec<&str> = [
                    ("--role", self.role.is_none()),
                    ("--host", self.host.is_none()),
                    ("--port", self.port.is_none()),
                    ("--mgmt-port", self.mgmt_port.is_none()),
                ]
                .into_iter()
                .filter_map(|(f, m)| m.then_some(f))
                .collect();
                if !missing.is_empty() {
                    return Err(CliError::usage(anyhow::anyhow!(
                        "single-engine mode (--config-path) also needs {}",
                        missing.join(", ")
                    )));
                }
                let flags = SingleEngine {
                    config_path: config_path.clone(),
                    role: self.role.unwrap_or(Role::Union),
                    host: self.host.clone().unwrap_or_default(),
                    port: self.port.unwrap_or_default(),
                    mgmt_port: self.mgmt_port.unwrap_or_default(),
                    dp_rank: self.dp_rank,
                    devices: self.devices.clone(),
                    env_config_path: self.env_config_path.clone(),
                    qos: self.qos_flags()?,
                    qos_set: self
                        .stall_window
                        .map(|_| vec!["stall_window".to_owned()])
                        .unwrap_or_default(),
                };
                let agent = AgentSettings {
                    policy: self.policy.unwrap_or_default(),
                    ..AgentSettings::default()
                };
                AgentConfig::single(&flags, agent).map_err(CliError::usage)?
            }
            (None, None) => {
                return Err(CliError::usage(anyhow::anyhow!(
                    "nothing to monitor: give --config agent.toml, or --config-path user_config.json with --role, --host, --port and --mgmt-port"
                )));
            }
        };
        if let Some(p) = self.sample_period {
            crate::config::agent::bounds::SAMPLE_PERIOD
                .check("--sample-period", p)
                .map_err(|(k, m)| CliError::usage(anyhow::anyhow!("{k}: {m}")))?;
            cfg.agent.sample_period = p;
        }
        if let Some(a) = self.admin_listen {
            cfg.agent.admin_listen = Some(a);
        }
        if let Some(a) = self.haproxy_agent_listen {
            cfg.agent.haproxy_agent_listen = Some(a);
        }
        if let Some(d) = &self.state_dir {
            crate::config::agent::check_state_dir(d)
                .map_err(|m| CliError::usage(anyhow::anyhow!("--state-dir: {m}")))?;
            cfg.agent.state_dir = Some(d.clone());
        }
        cfg.validate_across().map_err(CliError::usage)?;
        apply_driver_args(driver, &mut cfg.agent)?;
        Ok(cfg)
    }
}

fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name("npu-agent-rt")
        .enable_all()
        .build()
        .map_err(|e| CliError::from(anyhow::anyhow!("cannot start the async runtime: {e}")))
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run(r) => {
            let opts = crate::agent::RunOptions {
                after_handover: r.after_handover,
                wait_for_ports: r.wait_for_ports.unwrap_or_default(),
            };
            let c = r.config;
            let cfg = c.load(&cli.driver)?;
            if let Some(l) = crate::logging::global() {
                l.apply_config_level(cfg.agent.log_level.as_deref(), "info")
                    .map_err(|e| CliError::usage(anyhow::anyhow!(e)))?;
            }
            // SIGHUP re-reads the same sources with the same flags.
            let driver = cli.driver;
            let reload: crate::agent::Reloader = Box::new(move || {
                c.load(&driver).map_err(|f| {
                    let chain: Vec<String> = f.error.chain().map(ToString::to_string).collect();
                    chain.join(": ")
                })
            });
            runtime(cfg.agent.worker_threads)?.block_on(crate::agent::run(cfg, reload, opts))?;
            Ok(())
        }
        Command::CheckConfig(c) => {
            service::check_config(&c.config.load(&cli.driver)?, c.user.as_deref())
        }
        Command::Doctor { config, json } => {
            let cfg = config.load(&cli.driver)?;
            runtime(cfg.agent.worker_threads)?.block_on(service::doctor(cfg, json))
        }
        Command::Devices { json } => {
            let mut agent = AgentSettings::default();
            apply_driver_args(&cli.driver, &mut agent)?;
            inspect::devices(&crate::agent::driver_config(&agent), json)
        }
        Command::Sample {
            window,
            period,
            devices,
            json,
        } => {
            let mut agent = AgentSettings::default();
            apply_driver_args(&cli.driver, &mut agent)?;
            inspect::sample(
                &crate::agent::driver_config(&agent),
                window,
                period,
                devices,
                json,
            )
        }
        Command::Top(args) => Ok(runtime(2)?.block_on(top::run(args))?),
        Command::Disagreements(args) => disagreements::run(&args).map_err(CliError::usage),
        #[cfg(feature = "fake-driver")]
        Command::Demo(args) => runtime(2)?.block_on(demo::demo(args)),
        #[cfg(feature = "fake-driver")]
        Command::FakeEngine(args) => runtime(2)?.block_on(demo::fake_engine(args)),
    }
}

#[cfg(test)]
mod help_tests;
#[cfg(test)]
mod tests {
    use super::*;

    fn moved(line: &str) -> String {
        let args = line.split(' ').map(std::ffi::OsString::from).collect();
        driver_flags_first(args)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    // Issue 42: the driver flags after the command read as before it; values move with
    // their flag; before the command, after `--`, and other flags stay where they are.
    #[test]
    fn driver_flags_after_the_command_move_before_it() {
        let rows = [
            (
                "a sample --backend npu-smi --npu-smi /x/npu-smi --window 2s",
                "a --backend npu-smi --npu-smi /x/npu-smi sample --window 2s",
            ),
            (
                "a run --config c.toml --dcmi-lib=/lib/libdcmi.so --dcmi-no-owner-check",
                "a --dcmi-lib=/lib/libdcmi.so --dcmi-no-owner-check run --config c.toml",
            ),
            (
                "a --dcmi-lib /lib/x.so --log-format json run --npu-smi-delay 2",
                "a --dcmi-lib /lib/x.so --log-format json --npu-smi-delay 2 run",
            ),
            (
                "a --npu-smi /bin/n devices --json",
                "a --npu-smi /bin/n devices --json",
            ),
            ("a demo -- --npu-smi x", "a demo -- --npu-smi x"),
            ("a --help", "a --help"),
        ];
        for (given, want) in rows {
            assert_eq!(moved(given), want, "{given}");
        }
        // And clap takes both forms the same.
        let parse = |line: &str| {
            let args = line.split(' ').map(std::ffi::OsString::from).collect();
            Cli::try_parse_from(driver_flags_first(args)).map(|c| {
                (
                    c.driver.npu_smi.clone(),
                    c.driver.backend.map(|b| format!("{b:?}")),
                )
            })
        };
        let before = parse("a --backend npu-smi --npu-smi /x sample").unwrap();
        let after = parse("a sample --backend npu-smi --npu-smi /x").unwrap();
        assert_eq!(before, after);
        assert_eq!(before.0.as_deref(), Some(std::path::Path::new("/x")));
    }
}
