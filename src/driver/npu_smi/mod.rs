//! The `npu-smi` fallback: capability probe, device mapping, and long-lived watch children.
//! Used when `libdcmi.so` is missing or lacks the AI Cube calls, and for devices whose DCMI
//! calls hang.

pub mod parse;
pub mod probe;
pub mod watch;

pub use parse::{Cube, MappedChip};
pub use probe::WatchSupport;
pub use watch::{Watch, WatchConfig, WatchTarget, WatchUpdate};

use std::path::Path;
use std::time::Duration;

/// Lists NPU chips with `npu-smi info -m` (MCUs skipped).
pub fn enumerate(npu_smi: &Path, timeout: Duration) -> Result<Vec<MappedChip>, String> {
    let out = probe::run(npu_smi, &["info", "-m"], timeout)
        .map_err(|e| format!("npu-smi info -m: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "npu-smi info -m exited with {}: {}",
            out.status,
            out.text.trim()
        ));
    }
    parse::parse_mapping(&out.text)
}
