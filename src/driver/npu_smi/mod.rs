//! The `npu-smi` fallback: capability probe, device mapping, and long-lived watch children.
//! Used when `libdcmi.so` is missing or lacks the AI Cube calls, and for devices whose DCMI
//! calls hang.

pub mod parse;
pub(crate) mod probe;
pub(crate) mod watch;

pub use parse::{Cube, MappedChip};
pub(crate) use probe::WatchSupport;
pub use watch::{Watch, WatchConfig, WatchTarget, WatchUpdate};

use std::path::Path;
use std::time::Duration;

/// Errors of the `npu-smi` layer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NpuSmiError {
    #[error("npu-smi {command}: {source}")]
    Run {
        command: &'static str,
        source: probe::RunError,
    },
    #[error("npu-smi {command} exited with {status}: {output}")]
    Exit {
        command: &'static str,
        status: std::process::ExitStatus,
        /// The tool's output, quoted and cut at `logging::QUOTE_MAX` bytes.
        output: String,
    },
    #[error("npu-smi info -m: {0}")]
    Mapping(#[from] parse::MappingError),
    #[error("npu-smi info -t health: {0}")]
    Health(#[from] parse::HealthError),
}

/// A chip's health word and fault codes, from `npu-smi info -t health -i <card> [-c <chip>]`
/// (no `-c` on a 950, whose `-i` names the chip).
pub(crate) fn health(
    npu_smi: &Path,
    card: u32,
    chip: Option<u32>,
    timeout: Duration,
) -> Result<parse::ChipHealth, NpuSmiError> {
    let command = "info -t health";
    let card = card.to_string();
    let chip = chip.map(|c| c.to_string());
    let mut args = vec!["info", "-t", "health", "-i", card.as_str()];
    if let Some(c) = &chip {
        args.extend(["-c", c.as_str()]);
    }
    let text = run_ok(npu_smi, command, &args, timeout)?;
    Ok(parse::parse_health(&text)?)
}

/// Lists NPU chips with `npu-smi info -m` (MCUs skipped).
pub(crate) fn enumerate(npu_smi: &Path, timeout: Duration) -> Result<Vec<MappedChip>, NpuSmiError> {
    let text = run_ok(npu_smi, "info -m", &["info", "-m"], timeout)?;
    Ok(parse::parse_mapping(&text)?)
}

/// Runs `npu-smi args…` (`command` names it in errors); its output when it exits 0.
fn run_ok(
    npu_smi: &Path,
    command: &'static str,
    args: &[&str],
    timeout: Duration,
) -> Result<String, NpuSmiError> {
    let out = probe::run(npu_smi, args, timeout)
        .map_err(|source| NpuSmiError::Run { command, source })?;
    if !out.status.success() {
        return Err(NpuSmiError::Exit {
            command,
            status: out.status,
            output: crate::logging::quote(out.text.trim()),
        });
    }
    Ok(out.text)
}
