//! Driver binding: where AI Cube figures come from.
//!
//! Two backends, tried in this order per device: `libdcmi.so` loaded at run time
//! ([`dcmi`], the crate `crates/dcmi`: multi-utilization `aic_util`, then utilization type
//! 14), and long-lived
//! `npu-smi info watch -s u` children ([`npu_smi`]). This layer only talks to the driver; the
//! sampler decides when to call it and the ring stores what it returns.

pub use dcmi;
pub(crate) mod fault_levels;
pub mod npu_smi;

use std::ffi::OsString;
use std::path::PathBuf;

pub use crate::config::BackendChoice;

/// Which backend a device's figures come through (`--backend` chooses among them). Its
/// discriminant is its half of a source's one-byte encoding (`sampler::source::Source`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    strum::EnumIter,
    strum::FromRepr,
)]
#[repr(u8)]
pub enum Backend {
    /// `libdcmi.so`.
    #[serde(rename = "dcmi")]
    Dcmi,
    /// `npu-smi` children.
    #[serde(rename = "npu-smi")]
    NpuSmi,
    /// None: the device has no source of AI Cube figures.
    #[serde(rename = "none")]
    Unavailable,
    /// In-process scripted NPUs (`sampler::backends::scripted`): tests, never chosen by
    /// `--backend`.
    #[serde(rename = "scripted")]
    Scripted,
}

impl Backend {
    /// The name the CLI, the metrics and `/status/detail` print: `dcmi`, `npu-smi`, `none`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Backend::Dcmi => "dcmi",
            Backend::NpuSmi => "npu-smi",
            Backend::Unavailable => "none",
            Backend::Scripted => "scripted",
        }
    }

    /// Whether AI Cube figures come through it.
    pub(crate) const fn reads_cube(self) -> bool {
        !matches!(self, Backend::Unavailable)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the driver pieces are and how far to trust them.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// `--dcmi-lib`; `None` searches `LD_LIBRARY_PATH` and the install directories.
    pub dcmi_lib: Option<PathBuf>,
    /// `--npu-smi`; a bare name is looked up in `PATH`.
    pub npu_smi: PathBuf,
    pub backend: BackendChoice,
    /// Ownership check of the library path (see [`dcmi::discovery`]).
    pub check_owner: bool,
    /// `LD_LIBRARY_PATH` as seen at start.
    pub ld_library_path: Option<OsString>,
    /// Driver install directories searched after `LD_LIBRARY_PATH`.
    pub standard_dirs: Vec<PathBuf>,
    /// `-d` of the watch children, seconds.
    pub watch_delay_s: u32,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            dcmi_lib: None,
            npu_smi: PathBuf::from("npu-smi"),
            backend: BackendChoice::Auto,
            check_owner: true,
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH"),
            standard_dirs: dcmi::discovery::STANDARD_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            watch_delay_s: 1,
        }
    }
}

/// Device description shared by every layer above the driver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Logic id (what `--devices` and `ASCEND_RT_VISIBLE_DEVICES` name).
    pub id: u32,
    /// NPU id ("card") as `npu-smi -i` takes it.
    pub card: u32,
    /// Chip on the card; `None` on a 950 (no `-c`).
    pub chip: Option<u32>,
    /// Chip name, e.g. `910B3`.
    pub name: String,
    /// Physical id, as the Ascend device plugin names the NPU (`Ascend910-<phy>`); `None`
    /// when the driver does not say (see docs/driver.md).
    pub phy_id: Option<u32>,
}

impl DeviceInfo {
    /// Target of a watch child for this device.
    pub(crate) fn watch_target(&self) -> npu_smi::WatchTarget {
        npu_smi::WatchTarget {
            npu: self.card,
            chip: self.chip,
        }
    }
}
