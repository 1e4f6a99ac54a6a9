//! Command line: flags, commands, and the mapping of errors to exit codes.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 bad usage or config, 3 no usable driver backend.
//! Errors print as one line: the cause chain joined with ": ".

use crate::driver::{BackendChoice, DriverConfig};
use crate::sampler::{DeviceSnapshot, Sampler, SamplerConfig, StartError};
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit code for bad usage or configuration.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when no driver backend can serve AI Cube figures.
pub const EXIT_NO_BACKEND: u8 = 3;
/// Longest `sample --window`.
const MAX_WINDOW: Duration = Duration::from_secs(600);

/// Health agent for LLM inference nodes on Huawei Ascend NPUs.
#[derive(Debug, Parser)]
#[command(name = "npu-health-agent", version = crate::VERSION, about)]
pub struct Cli {
    #[command(flatten)]
    pub driver: DriverArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the driver is; global to every command.
#[derive(Debug, Args)]
pub struct DriverArgs {
    /// Path of libdcmi.so (default: search LD_LIBRARY_PATH, /usr/local/dcmi,
    /// /usr/local/Ascend/driver/lib64/driver).
    #[arg(long, global = true, value_name = "PATH")]
    pub dcmi_lib: Option<PathBuf>,
    /// The npu-smi executable (a bare name is looked up in PATH).
    #[arg(long, global = true, value_name = "PATH")]
    pub npu_smi: Option<PathBuf>,
    /// Which sources of AI Cube figures may be used.
    #[arg(long, global = true, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Load libdcmi.so even if it or a parent directory is not root-owned or is writable by
    /// group/others (for tests; unsafe on production hosts).
    #[arg(long, global = true)]
    pub dcmi_no_owner_check: bool,
    /// Seconds between npu-smi watch passes (its -d), 1 to 100.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub npu_smi_delay: u32,
    /// Use the fake libdcmi.so and fake npu-smi built with this binary.
    #[cfg(feature = "fake-driver")]
    #[arg(long, global = true)]
    pub fake: bool,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the NPUs found, the backend serving each, and its capabilities.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Sample AI Cube usage for a window and print peak, mean and sample counts per device.
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
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 5s or 50ms: {e}"))
}

/// An error with the exit code it should produce.
#[derive(Debug)]
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        let error = e.into();
        let code = match error.downcast_ref::<StartError>() {
            Some(StartError::NoBackend { .. }) => EXIT_NO_BACKEND,
            Some(StartError::UnknownDevice { .. } | StartError::Invalid(_)) => EXIT_USAGE,
            _ => 1,
        };
        Failure { code, error }
    }
}

/// Parses the command line, runs the command, prints a one-line error on failure.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let chain: Vec<String> = f.error.chain().map(ToString::to_string).collect();
            eprintln!("npu-health-agent: {}", chain.join(": "));
            ExitCode::from(f.code)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

fn driver_config(args: &DriverArgs) -> Result<DriverConfig, Failure> {
    let mut cfg = DriverConfig {
        dcmi_lib: args.dcmi_lib.clone(),
        backend: args.backend,
        check_owner: !args.dcmi_no_owner_check,
        watch_delay_s: args.npu_smi_delay,
        ..DriverConfig::default()
    };
    if let Some(p) = &args.npu_smi {
        cfg.npu_smi = p.clone();
    }
    #[cfg(feature = "fake-driver")]
    if args.fake {
        crate::fake::apply(&mut cfg, args.dcmi_lib.is_some(), args.npu_smi.is_some()).map_err(
            |e| Failure {
                code: 1,
                error: anyhow::anyhow!(e),
            },
        )?;
    }
    Ok(cfg)
}

fn run(cli: Cli) -> Result<(), Failure> {
    let driver = driver_config(&cli.driver)?;
    match cli.command {
        Command::Devices { json } => devices(&driver, json),
        Command::Sample {
            window,
            period,
            devices,
            json,
        } => sample(&driver, window, period, devices, json),
    }
}

fn devices(driver: &DriverConfig, json: bool) -> Result<(), Failure> {
    let sampler =
        Sampler::start(driver, &SamplerConfig::default()).context("starting the sampler")?;
    if !sampler.wait_settled(Duration::from_secs(10)) {
        tracing::warn!("some devices did not settle on a backend within 10s");
    }
    let usable = sampler.any_cube_source();
    let now = sampler.shared().ring.now_ns();
    let snaps: Vec<DeviceSnapshot> = sampler.devices().iter().map(|d| d.snapshot(now)).collect();
    sampler.shutdown();
    if json {
        let devices: Vec<serde_json::Value> = snaps
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).expect("snapshot serialises");
                v["capabilities"] = serde_json::json!({
                    "aicube": s.source.backend() != "none",
                    "hbm": s.hbm_total_mb.is_some(),
                    "health": s.health.is_some(),
                });
                v
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return no_source_is_fatal(usable);
    }
    println!(
        "{:<4} {:<5} {:<5} {:<14} {:<8} {:<28} {:<14} HEALTH",
        "ID", "CARD", "CHIP", "NAME", "BACKEND", "AI CUBE", "HBM MB"
    );
    for s in &snaps {
        let chip = s.chip.map_or_else(|| "-".to_owned(), |c| c.to_string());
        let hbm = match (s.hbm_used_mb, s.hbm_total_mb) {
            (Some(u), Some(t)) => format!("{u}/{t}"),
            _ => "n/a".to_owned(),
        };
        let health = match s.health {
            Some(0) => "ok".to_owned(),
            Some(1) => "minor alarm".to_owned(),
            Some(2) => "major alarm".to_owned(),
            Some(3) => "critical alarm".to_owned(),
            Some(h) => h.to_string(),
            None => "n/a".to_owned(),
        };
        let name = if s.name.is_empty() { "-" } else { &s.name };
        println!(
            "{:<4} {:<5} {:<5} {:<14} {:<8} {:<28} {:<14} {}",
            s.id, s.card, chip, name, s.backend, s.method, hbm, health
        );
    }
    no_source_is_fatal(usable)
}

/// Exit 3 when the NPUs were found but none has a source of AI Cube figures.
fn no_source_is_fatal(usable: bool) -> Result<(), Failure> {
    if usable {
        return Ok(());
    }
    Err(Failure::from(StartError::NoBackend {
        dcmi: "no AI Cube call (multi-utilization or type 14) on any device".to_owned(),
        npu_smi: "not usable (see the warnings above)".to_owned(),
    }))
}

fn sample(
    driver: &DriverConfig,
    window: Duration,
    period: Duration,
    ids: Option<Vec<u32>>,
    json: bool,
) -> Result<(), Failure> {
    if window.is_zero() || window > MAX_WINDOW {
        return Err(Failure {
            code: EXIT_USAGE,
            error: anyhow::anyhow!("--window {window:?} is outside 1ns..=10m"),
        });
    }
    let cfg = SamplerConfig {
        period,
        retention: window.max(Duration::from_secs(1)) + Duration::from_secs(1),
        devices: ids,
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(driver, &cfg).context("starting the sampler")?;
    sampler.wait_settled(Duration::from_secs(10));
    no_source_is_fatal(sampler.any_cube_source())?;
    std::thread::sleep(window);
    let ids: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
    let report = sampler.window(&ids, window)?;
    let backends: Vec<&'static str> = sampler
        .devices()
        .iter()
        .map(|d| d.source().backend())
        .collect();
    sampler.shutdown();
    if report.truncated {
        tracing::warn!("the ring did not hold the whole window; figures cover its newest part");
    }
    if json {
        let devices: Vec<serde_json::Value> = ids
            .iter()
            .zip(&report.devices)
            .zip(&backends)
            .map(|((id, st), backend)| {
                serde_json::json!({
                    "id": id,
                    "backend": backend,
                    "peak": st.peak,
                    "mean": st.mean.map(|m| (m * 100.0).round() / 100.0),
                    "valid": st.valid,
                    "invalid": st.invalid,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return Ok(());
    }
    println!(
        "{:<4} {:<8} {:>5} {:>7} {:>6} {:>8}",
        "ID", "BACKEND", "PEAK", "MEAN", "VALID", "INVALID"
    );
    for ((id, st), backend) in ids.iter().zip(&report.devices).zip(&backends) {
        let peak = st.peak.map_or_else(|| "n/a".to_owned(), |p| p.to_string());
        let mean = st
            .mean
            .map_or_else(|| "n/a".to_owned(), |m| format!("{m:.1}"));
        println!(
            "{:<4} {:<8} {:>5} {:>7} {:>6} {:>8}",
            id, backend, peak, mean, st.valid, st.invalid
        );
    }
    Ok(())
}
