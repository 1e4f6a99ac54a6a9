//! `/qos` of one engine, and `qos` in its `/status/detail`: the score and level with their
//! components, forward progress, the stall-detection settings and the device signals.

use crate::Level;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Rounded to 3 decimals, as scores are shown.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn ser_rounded<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    v.map(round3).serialize(s)
}

/// `/qos` of one engine, and `qos` in its detail: the score and level ([`QosReport`], its
/// fields at this level), with the engine's name and device signals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineQos {
    pub engine: String,
    pub model: Option<String>,
    #[serde(flatten)]
    pub state: QosReport,
    /// A held `evict` makes `/status` answer `abnormal` right now.
    pub evicting: bool,
    pub stall_detection: StallDetection,
    pub device: QosDevice,
}

/// The stall-detection settings `/qos` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallDetection {
    pub enabled: bool,
    pub window_s: f64,
    pub skip_when_capacity_waiting: bool,
}

/// The device signals `/qos` shows (not scored: see `docs/qos.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosDevice {
    pub window_s: f64,
    pub ai_cube_peak: Option<u8>,
    pub ai_cube_mean: Option<f64>,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    pub hbm_ratio: Option<f64>,
    pub scored: bool,
}

/// One component of the score, for `/qos`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Component {
    pub name: Cow<'static, str>,
    pub weight: f64,
    /// `null` when the input is missing (the other weights then carry the score).
    #[serde(serialize_with = "ser_rounded")]
    pub score: Option<f64>,
    /// The input, in words.
    pub input: String,
    /// Age of the input, milliseconds.
    pub age_ms: Option<u64>,
    /// The engine's metric names the input was read from, as found in the last scrape
    /// (vLLM's name of that release, or SGLang's); empty for the probe.
    pub series: Vec<Cow<'static, str>>,
}

/// The score and level of one engine as `/qos` shows them ([`EngineQos`] adds the engine's
/// name, the device signals and the settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosReport {
    pub enabled: bool,
    /// Rounded to 3 decimals; `null` before the first evaluation or with no input.
    pub score: Option<f64>,
    pub level: Level,
    pub level_since_unix_ms: u64,
    pub consecutive_below_evict: u32,
    pub evaluations: u64,
    pub components: Vec<Component>,
    pub progress: Progress,
    pub stalled_for_s: Option<f64>,
    /// How long no sign of life moved with requests running (docs/policy.md, rule 11).
    #[serde(default)]
    pub quiet_for_s: Option<f64>,
    pub scrapes: u64,
    pub scrape_failures: u64,
    pub eviction_answers_abnormal: bool,
    /// Requests running when the level left `normal`: HAProxy's cap at `queue`; `null` at
    /// `normal`.
    #[serde(default)]
    pub admission_cap: Option<u32>,
    /// Why the level is one band lower than the score's (a `SubHealthFault` on the engine's
    /// NPU, agent policy); `null` when it is not.
    #[serde(default)]
    pub lowered_by: Option<String>,
}

/// What the last scrapes say about forward progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    /// Not enough data (no scrape yet, counters missing or reset, or too old).
    Unknown,
    /// Nothing running.
    Idle,
    /// Requests running and tokens advancing.
    Advancing,
    /// Requests running and no token advanced since the previous scrape.
    Stalled,
}
