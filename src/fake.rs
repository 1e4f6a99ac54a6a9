//! Fake-driver builds only: where the fakes are and how the binary doubles as `npu-smi`.
//!
//! `--fake` points the agent at the fake `libdcmi.so` that cargo built next to the binary
//! (`target/<profile>/deps/libfake_dcmi.so`), at the binary itself as `npu-smi`, and relaxes
//! the library ownership check (the build tree is not root-owned). Both fakes read the
//! scenario named by `FAKE_NPU_SCENARIO`, or an embedded default. See `docs/fake-driver.md`.

use crate::driver::DriverConfig;
use std::path::{Path, PathBuf};

/// File name of the fake library of a current driver.
pub const FAKE_LIB: &str = "libfake_dcmi.so";
/// File name of the fake library of an older driver (no AI Cube symbols).
pub const FAKE_LEGACY_LIB: &str = "libfake_dcmi_legacy.so";
/// File name of the fake library of a pre-release driver (old name of the multi call).
pub const FAKE_PRERELEASE_LIB: &str = "libfake_dcmi_prerelease.so";

/// Runs the fake `npu-smi` when the binary is invoked as `npu-smi …` or as `… info …`;
/// returns the exit status, or `None` to run the agent normally.
pub fn run_as_npu_smi() -> Option<u8> {
    let args: Vec<String> = std::env::args().collect();
    let called_as_npu_smi = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "npu-smi");
    if called_as_npu_smi || args.get(1).is_some_and(|a| a == "info") {
        let code = npu_fake::npu_smi::run(&args[1..]);
        return Some(code.clamp(0, 255) as u8);
    }
    None
}

/// The running binary, as it was found the first time. Asked again after the file was
/// replaced (a rebuild, an upgrade), the kernel answers `<path> (deleted)`, so every SIGHUP
/// reload would see a new `npu_smi` and log a change that is none.
fn exe() -> Result<PathBuf, String> {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(p) = EXE.get() {
        return Ok(p.clone());
    }
    let p = std::env::current_exe().map_err(|e| format!("cannot locate the agent binary: {e}"))?;
    Ok(EXE.get_or_init(|| p).clone())
}

/// Path of a fake library built next to the running binary (or test executable).
pub fn lib_path(name: &str) -> Result<PathBuf, String> {
    let exe = exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(name), dir.join("deps").join(name)];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| {
            format!(
                "{name} not found next to {} (build with --features fake-driver)",
                exe.display()
            )
        })
}

pub use fake_engine::launch::{command as engine_command, free_ports};

/// Points `driver` at the fakes (unless the caller gave explicit paths).
pub(crate) fn apply(
    driver: &mut DriverConfig,
    explicit_lib: bool,
    explicit_npu_smi: bool,
) -> Result<(), String> {
    if !explicit_lib {
        driver.dcmi_lib = Some(lib_path(FAKE_LIB)?);
    }
    if !explicit_npu_smi {
        driver.npu_smi = exe()?;
    }
    driver.check_owner = false;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_differ() {
        let ports: [u16; 8] = free_ports().unwrap();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
        assert!(!ports.contains(&0));
    }
}
