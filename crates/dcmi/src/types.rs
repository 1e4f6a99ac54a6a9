//! What the driver reports, as Rust types: the API generation, a chip, its HBM, its health,
//! and the AI Cube calls and utilization types the sampler chooses among. No `unsafe` here.

use super::DcmiError;
use super::sys;

/// API generation of the loaded driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `dcmi_*(card_id, device_id, …)`: 310P, 910, 910B, 910_93.
    V1,
    /// `dcmiv2_*(dev_id, …)`: 950.
    V2,
}

/// One NPU chip as enumerated by the driver (MCUs and CPUs are skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpuChip {
    /// Logic id: what `ASCEND_RT_VISIBLE_DEVICES` and the agent's `--devices` use.
    pub logic_id: u32,
    /// NPU id ("card") of the v1 API; equals the logic id on a 950.
    pub card: i32,
    /// Chip index on the card; 0 on a 950.
    pub chip: i32,
    /// Chip name from chip info, e.g. `910B3`.
    pub name: String,
    /// Physical id, which the Ascend device plugin names its devices by; `None` when the
    /// driver does not say (the call is missing or fails).
    pub phy_id: Option<u32>,
}

/// HBM figures of one chip, in MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hbm {
    pub used_mb: u64,
    pub total_mb: u64,
}

/// Which call produced an AI Cube reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubeCall {
    /// `dcmi_get_device_multi_utilization_rate` (or its pre-release name), field `aic_util`.
    Multi,
    /// `dcmi_get_device_utilization_rate` with input type 14.
    Single,
}

/// Which exported name answered the multi-utilization call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiSymbol {
    /// `dcmi_get_device_multi_utilization_rate` or `dcmiv2_get_device_multi_utilization_rate`.
    Released,
    /// `dcmi_get_device_utilization_rate_v2`, a name no released header declares; its first
    /// declaration had a 4-byte struct (see `sampler::plausibility`).
    PreRelease,
}

/// The figures of `dcmi_multi_utilization_info` as the driver wrote them. No range check
/// here: whether they are readings is the sampler's decision (`sampler::plausibility`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiUtil {
    /// `aic_util`: AI Cube, percent.
    pub aic: u32,
    /// `aiv_util`: AI Vector, percent.
    pub aiv: u32,
    /// `aicore_util`: AI Core, percent.
    pub aicore: u32,
    /// `npu_util`: the whole NPU, percent.
    pub npu: u32,
    /// Some `reserved` word is not zero.
    pub reserved_set: bool,
    /// The name that answered.
    pub symbol: MultiSymbol,
}

impl MultiUtil {
    /// Every byte of the struct is zero: what the driver copies out when the firmware lacks
    /// the sub-command, and also what an idle chip may read.
    pub fn all_zero(&self) -> bool {
        self.aic == 0 && self.aiv == 0 && self.aicore == 0 && self.npu == 0 && !self.reserved_set
    }

    /// The largest of the four figures.
    pub fn max_figure(&self) -> u32 {
        self.aic.max(self.aiv).max(self.aicore).max(self.npu)
    }
}

/// `input_type` of the single utilization call used by the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UtilType {
    /// 2: AI Core (documented on every chip).
    AiCore,
    /// 14: AI Cube.
    AiCube,
}

impl UtilType {
    pub(crate) fn code(self) -> i32 {
        match self {
            UtilType::AiCore => sys::DCMI_UTILIZATION_RATE_AICORE,
            UtilType::AiCube => sys::DCMI_UTILIZATION_RATE_AICUBE,
        }
    }

    /// How logs name it.
    pub fn describe(self) -> &'static str {
        match self {
            UtilType::AiCore => "utilization type 2 (AI Core)",
            UtilType::AiCube => "utilization type 14 (AI Cube)",
        }
    }
}

/// What `dcmi_get_device_health` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// 0 normal, 1 minor, 2 major, 3 critical alarm.
    Code(u8),
    /// `0xFFFFFFFF` (`DCMI_HEALTH_DEVICE_NOT_EXIST`): the device does not exist, answered with
    /// rc 0.
    DeviceGone,
}

/// `DCMI_HEALTH_DEVICE_NOT_EXIST` as the `unsigned int` the call writes (bindgen types the
/// macro as a wider integer).
pub(crate) const HEALTH_DEVICE_NOT_EXIST: u32 = sys::DCMI_HEALTH_DEVICE_NOT_EXIST as u32;

/// Maps the health word of `dcmi_get_device_health`.
pub(crate) fn health_of(value: u32) -> Result<Health, DcmiError> {
    match value {
        0..=3 => Ok(Health::Code(value as u8)),
        HEALTH_DEVICE_NOT_EXIST => Ok(Health::DeviceGone),
        _ => Err(DcmiError::OutOfRange {
            call: "dcmi_get_device_health",
            value: value.into(),
            limit: "0..=3 or 0xFFFFFFFF (device does not exist)",
        }),
    }
}

pub(crate) fn percent(call: &'static str, value: u32) -> Result<u8, DcmiError> {
    if value > 100 {
        return Err(DcmiError::OutOfRange {
            call,
            value: value.into(),
            limit: "0..=100 %",
        });
    }
    Ok(value as u8)
}

pub(crate) fn c_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_owned()
}
