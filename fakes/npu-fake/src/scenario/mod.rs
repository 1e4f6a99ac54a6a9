//! The scenario file: what the fake driver and the fake `npu-smi` report, per device.
//!
//! One TOML file, named by `FAKE_NPU_SCENARIO`, drives both fakes so that the DCMI backend and
//! the `npu-smi` backend of the agent see the same figures. Programmes are functions of wall
//! clock time (Unix milliseconds), so two processes reading the same scenario agree without
//! sharing a start time. The format is documented in `docs/fake-driver.md`.

use serde::Deserialize;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

mod programme;
pub use programme::{Programme, Reading, file_reading};
use programme::{ProgrammeSpec, resolve};

/// Environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "FAKE_NPU_SCENARIO";

/// Scenario used when `FAKE_NPU_SCENARIO` is unset: two 910B cards, the first bursting.
/// The burst period (1.3 s) is not a multiple of `npu-smi`'s 1 s watch period, so the
/// fallback also sees the burst within a 5 s window instead of always reading the same phase.
pub const EMBEDDED_DEFAULT: &str = r#"
model = "910B"
cards = 2

[default]
aicube = { constant = 0 }

[[device]]
id = 0
aicube = { square = { high = 85, low = 5, width_ms = 400, period_ms = 1300 } }

[[device]]
id = 1
aicube = { constant = 12 }
"#;

/// Chip model; decides chips per card, the DCMI API generation and the `npu-smi` layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Model {
    /// Atlas A2: one NPU chip and one MCU per card, v1 API.
    #[serde(rename = "910B")]
    Ascend910B,
    /// Atlas A3: two NPU dies and one MCU per card, v1 API.
    #[serde(rename = "910_93")]
    Ascend910_93,
    /// Ascend 950: v2 API only (`dcmi_init` answers -8255), logical ids, no `ChipId` column.
    #[serde(rename = "950")]
    Ascend950,
}

impl Model {
    /// NPU chips per card (the MCU is not counted).
    pub fn chips_per_card(self) -> u32 {
        match self {
            Model::Ascend910_93 => 2,
            Model::Ascend910B | Model::Ascend950 => 1,
        }
    }

    /// Whether the card carries an MCU that enumeration must skip.
    pub fn has_mcu(self) -> bool {
        !matches!(self, Model::Ascend950)
    }

    /// Chip name reported by chip info and `npu-smi info -m`.
    pub fn chip_name(self) -> &'static str {
        match self {
            Model::Ascend910B => "910B3",
            Model::Ascend910_93 => "910_9391",
            Model::Ascend950 => "950PR",
        }
    }
}

/// How the multi-utilization call answers (`multi_util`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MultiUtilMode {
    /// The figures of the programme.
    Supported,
    /// -8255.
    Unsupported,
    /// OK with every field 0, whatever the NPU does: the real driver on a firmware without
    /// the sub-command (hicann/driver `dcmi_get_npu_device_utilization_rate_v2` lets the
    /// firmware's "not supported" through and copies out the zeroed struct).
    Zeroed,
}

/// `multi_util = true | false | "supported" | "unsupported" | "zeroed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum MultiUtilSpec {
    Flag(bool),
    Mode(MultiUtilMode),
}

impl MultiUtilSpec {
    fn mode(self) -> MultiUtilMode {
        match self {
            MultiUtilSpec::Flag(true) => MultiUtilMode::Supported,
            MultiUtilSpec::Flag(false) => MultiUtilMode::Unsupported,
            MultiUtilSpec::Mode(m) => m,
        }
    }
}

/// What the single utilization call does with a figure above 100 (`util_over_100`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Over100 {
    /// Writes 0 and answers OK, as the real driver does (hicann/driver
    /// `dcmi_get_npu_device_utilization_rate`, `DCMI_USAGE_MAX`).
    Zero,
    /// Passes the figure through (tests the agent's own range check).
    Pass,
}

/// What the pre-release name `dcmi_get_device_utilization_rate_v2` writes
/// (`prerelease_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PrereleaseLayout {
    /// The 48-byte `dcmi_multi_utilization_info` (MindCluster's declaration from 2026-02-14).
    #[serde(rename = "48-byte")]
    Full,
    /// The first declaration (MindCluster `83a5b2ea`, 2026-02-11): four `unsigned char`
    /// (`aic_avg_util`, `aiv_avg_util`, `aicore_util`, `npu_util`), 4 bytes written.
    #[serde(rename = "4-byte")]
    Early,
}

/// Device settings; every field optional so `[default]` and `[[device]]` can be layered.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Logic id the override applies to (ignored in `[default]`).
    pub id: Option<u32>,
    /// Physical id (`dcmi_get_device_phyid_from_logicid`, the `Chip Phy-ID` of `npu-smi
    /// info -m`); default: the logic id. Only in `[[device]]`.
    pub phy_id: Option<u32>,
    pub aicube: Option<ProgrammeSpec>,
    pub hbm_total_mb: Option<u64>,
    pub hbm_used_mb: Option<u64>,
    pub health: Option<u32>,
    /// How `dcmi_get_device_multi_utilization_rate` answers (`true`/`"supported"`,
    /// `false`/`"unsupported"`: -8255, `"zeroed"`: OK with every field 0).
    pub multi_util: Option<MultiUtilSpec>,
    /// `dcmi_get_device_utilization_rate(…, 14, …)` supported (else -8255).
    pub util_type14: Option<bool>,
    /// The programme utilization type 14 reads in the agent's process (default: `aicube`,
    /// which the multi call and the fake `npu-smi` read).
    pub type14: Option<ProgrammeSpec>,
    /// What the single call does with a figure above 100: `"zero"` (default, the real
    /// driver) or `"pass"`.
    pub util_over_100: Option<Over100>,
    /// Every DCMI AI Cube read of this device blocks this long before answering (the fake
    /// npu-smi is not affected).
    pub hang_ms: Option<u64>,
    /// Reads before the hang starts (per process).
    pub hang_after_calls: Option<u64>,
    /// How many reads hang (default: every read from `hang_after_calls` on).
    pub hang_count: Option<u64>,
    /// `dcmi_get_device_hbm_info` answers this return code.
    pub hbm_error: Option<i32>,
    /// `dcmi_get_device_health` answers this return code.
    pub health_error: Option<i32>,
    /// The chip's current fault codes (`dcmi_get_device_errorcode_v2`); a `file` programme's
    /// `errors=` word replaces them while it is there.
    pub error_codes: Option<Vec<u32>>,
    /// `dcmi_get_device_errorcode_v2` answers this return code (the real driver answers
    /// -8005 for a chip whose fault read is not supported, not -8255).
    pub error_codes_error: Option<i32>,
}

/// `[npu_smi]` table: how the fake `npu-smi` behaves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpuSmiSpec {
    /// `supported`, `unsupported` (help lacks `u - AI Cube Usage`, `-s u` rejected) or
    /// `not_ready` (every command prints `error: driver not ready` and exits 1).
    #[serde(default = "NpuSmiSpec::default_help")]
    pub watch: WatchSupport,
    /// Time between watch passes; default is the `-d` argument in seconds.
    pub watch_period_ms: Option<u64>,
    /// The watch exits with status 1 after this many passes (tests restarts).
    pub watch_exit_after: Option<u64>,
    /// Write each data row in two pieces with a pause between (tests partial lines).
    #[serde(default)]
    pub split_rows: bool,
    /// `info watch -h` sleeps this long before answering (tests the probe timeout).
    #[serde(default)]
    pub help_delay_ms: u64,
}

impl NpuSmiSpec {
    fn default_help() -> WatchSupport {
        WatchSupport::Supported
    }
}

impl Default for NpuSmiSpec {
    fn default() -> Self {
        NpuSmiSpec {
            watch: WatchSupport::Supported,
            watch_period_ms: None,
            watch_exit_after: None,
            split_rows: false,
            help_delay_ms: 0,
        }
    }
}

/// Whether the fake HDK supports `npu-smi info watch -s u`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchSupport {
    Supported,
    Unsupported,
    NotReady,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    #[serde(default = "default_model")]
    model: Model,
    #[serde(default = "default_cards")]
    cards: u32,
    #[serde(default = "default_refresh")]
    refresh_ms: u64,
    #[serde(default)]
    npu_smi: NpuSmiSpec,
    #[serde(default = "default_prerelease")]
    prerelease_layout: PrereleaseLayout,
    #[serde(default)]
    default: DeviceSpec,
    #[serde(default)]
    device: Vec<DeviceSpec>,
}

fn default_model() -> Model {
    Model::Ascend910B
}
fn default_cards() -> u32 {
    1
}
fn default_refresh() -> u64 {
    100
}
fn default_prerelease() -> PrereleaseLayout {
    PrereleaseLayout::Full
}

/// One fake NPU chip with every setting resolved.
#[derive(Debug, Clone)]
pub struct Device {
    pub logic_id: u32,
    pub phy_id: u32,
    pub card: u32,
    pub chip: u32,
    pub aicube: Programme,
    pub hbm_total_mb: u64,
    pub hbm_used_mb: u64,
    pub health: u32,
    pub multi_util: MultiUtilMode,
    pub util_type14: bool,
    /// Programme of utilization type 14 when it differs from `aicube`.
    pub type14: Option<Programme>,
    pub util_over_100: Over100,
    pub hang_ms: u64,
    pub hang_after_calls: u64,
    pub hang_count: Option<u64>,
    pub hbm_error: Option<i32>,
    pub health_error: Option<i32>,
    pub error_codes: Vec<u32>,
    pub error_codes_error: Option<i32>,
}

/// A loaded scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub model: Model,
    pub cards: u32,
    pub refresh_ms: u64,
    pub npu_smi: NpuSmiSpec,
    /// What the pre-release multi-utilization name writes.
    pub prerelease_layout: PrereleaseLayout,
    pub devices: Vec<Device>,
}

impl Scenario {
    /// Loads the scenario named by `FAKE_NPU_SCENARIO`, or the embedded default.
    pub fn from_env() -> Result<Scenario, String> {
        match std::env::var_os(SCENARIO_ENV) {
            Some(path) if !path.is_empty() => Scenario::load(Path::new(&path)),
            _ => Scenario::parse(EMBEDDED_DEFAULT, Path::new(".")),
        }
    }

    /// Loads a scenario file; relative paths inside it are relative to its directory.
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Scenario::parse(&text, base).map_err(|e| format!("scenario {}: {e}", path.display()))
    }

    /// Parses scenario text.
    pub fn parse(text: &str, base: &Path) -> Result<Scenario, String> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.cards > 64 {
            return Err(format!("cards must be in 0..=64, got {}", file.cards));
        }
        if file.refresh_ms == 0 {
            return Err("refresh_ms must be at least 1".to_owned());
        }
        let chips = file.model.chips_per_card();
        let count = file.cards * chips;
        for over in &file.device {
            match over.id {
                None => return Err("every [[device]] needs an id".to_owned()),
                Some(id) if id >= count => {
                    return Err(format!(
                        "[[device]] id {id} does not exist ({count} devices)"
                    ));
                }
                Some(_) => {}
            }
        }
        let mut devices = Vec::with_capacity(count as usize);
        for logic_id in 0..count {
            let over = file.device.iter().find(|d| d.id == Some(logic_id));
            let pick = |f: fn(&DeviceSpec) -> Option<u64>, dflt: u64| {
                over.and_then(f)
                    .or_else(|| f(&file.default))
                    .unwrap_or(dflt)
            };
            let pick_bool = |f: fn(&DeviceSpec) -> Option<bool>| {
                over.and_then(f)
                    .or_else(|| f(&file.default))
                    .unwrap_or(true)
            };
            let spec = over
                .and_then(|d| d.aicube.clone())
                .or_else(|| file.default.aicube.clone())
                .unwrap_or(ProgrammeSpec::Constant(0));
            let type14 = over
                .and_then(|d| d.type14.clone())
                .or_else(|| file.default.type14.clone())
                .map(|p| resolve(p, base))
                .transpose()?;
            devices.push(Device {
                logic_id,
                phy_id: over.and_then(|d| d.phy_id).unwrap_or(logic_id),
                card: logic_id / chips,
                chip: logic_id % chips,
                aicube: resolve(spec, base)?,
                hbm_total_mb: pick(|d| d.hbm_total_mb, 65536),
                hbm_used_mb: pick(|d| d.hbm_used_mb, 3072),
                health: pick(|d| d.health.map(u64::from), 0) as u32,
                multi_util: over
                    .and_then(|d| d.multi_util)
                    .or(file.default.multi_util)
                    .map_or(MultiUtilMode::Supported, MultiUtilSpec::mode),
                util_type14: pick_bool(|d| d.util_type14),
                type14,
                util_over_100: over
                    .and_then(|d| d.util_over_100)
                    .or(file.default.util_over_100)
                    .unwrap_or(Over100::Zero),
                hang_ms: pick(|d| d.hang_ms, 0),
                hang_after_calls: pick(|d| d.hang_after_calls, 0),
                hang_count: over.and_then(|d| d.hang_count).or(file.default.hang_count),
                hbm_error: over.and_then(|d| d.hbm_error).or(file.default.hbm_error),
                health_error: over
                    .and_then(|d| d.health_error)
                    .or(file.default.health_error),
                error_codes: over
                    .and_then(|d| d.error_codes.clone())
                    .or_else(|| file.default.error_codes.clone())
                    .unwrap_or_default(),
                error_codes_error: over
                    .and_then(|d| d.error_codes_error)
                    .or(file.default.error_codes_error),
            });
        }
        if file.default.phy_id.is_some() {
            return Err("phy_id belongs in a [[device]], not [default]".to_owned());
        }
        for (i, d) in devices.iter().enumerate() {
            if let Some(other) = devices[..i].iter().find(|o| o.phy_id == d.phy_id) {
                return Err(format!(
                    "devices {} and {} have the same phy_id {}",
                    other.logic_id, d.logic_id, d.phy_id
                ));
            }
        }
        Ok(Scenario {
            model: file.model,
            cards: file.cards,
            refresh_ms: file.refresh_ms,
            npu_smi: file.npu_smi,
            prerelease_layout: file.prerelease_layout,
            devices,
        })
    }

    /// The device on `card`/`chip` (v1 addressing).
    pub fn device(&self, card: i32, chip: i32) -> Option<&Device> {
        let chips = self.model.chips_per_card() as i32;
        if card < 0 || chip < 0 || card >= self.cards as i32 || chip >= chips {
            return None;
        }
        self.devices.get((card * chips + chip) as usize)
    }

    /// The device with logic id `id` (v2 addressing).
    pub fn device_by_logic(&self, id: i32) -> Option<&Device> {
        usize::try_from(id).ok().and_then(|i| self.devices.get(i))
    }

    /// AI Cube reading of `dev` at Unix time `t_ms`, quantised to the driver refresh.
    pub fn aicube_at(&self, dev: &Device, t_ms: u64) -> Reading {
        dev.aicube.at(t_ms - t_ms % self.refresh_ms)
    }

    /// What utilization type 14 reads for `dev` at `t_ms` (its own programme if set).
    pub fn type14_at(&self, dev: &Device, t_ms: u64) -> Reading {
        dev.type14
            .as_ref()
            .unwrap_or(&dev.aicube)
            .at(t_ms - t_ms % self.refresh_ms)
    }

    /// The fault codes of `dev`: a `file` programme's `errors=` word, else `error_codes`.
    pub fn error_codes_of(&self, dev: &Device) -> Vec<u32> {
        dev.aicube
            .file_error_codes()
            .unwrap_or_else(|| dev.error_codes.clone())
    }

    /// The health word of `dev`: a `file` programme's `health=` word, else `health`.
    pub fn health_of(&self, dev: &Device) -> u32 {
        dev.aicube.file_health().unwrap_or(dev.health)
    }
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::programme::{Ramp, Square, parse_trace};
    use super::*;

    #[test]
    fn embedded_default_parses() {
        let s = Scenario::parse(EMBEDDED_DEFAULT, Path::new(".")).unwrap();
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.devices[1].aicube, Programme::Constant(12));
    }

    #[test]
    fn square_wave_has_its_width() {
        let p = Programme::Square(Square {
            high: 90,
            low: 0,
            width_ms: 100,
            period_ms: 1000,
            phase_ms: 0,
        });
        let highs = (0..1000).filter(|t| p.at(*t) == Reading::Value(90)).count();
        assert_eq!(highs, 100);
        assert_eq!(p.at(1050), Reading::Value(90));
        assert_eq!(p.at(1150), Reading::Value(0));
    }

    #[test]
    fn ramp_rises_over_its_period_and_restarts() {
        let p = Programme::Ramp(Ramp {
            from: 10,
            to: 90,
            period_ms: 1000,
        });
        assert_eq!(p.at(0), Reading::Value(10));
        assert_eq!(p.at(500), Reading::Value(50));
        assert_eq!(p.at(999), Reading::Value(90));
        assert_eq!(p.at(1000), Reading::Value(10));
    }

    #[test]
    fn trace_steps_and_repeats() {
        let points = parse_trace("0,0\n100,90\n200,NA\n").unwrap();
        let p = Programme::Trace {
            points,
            period_ms: 300,
        };
        assert_eq!(p.at(50), Reading::Value(0));
        assert_eq!(p.at(150), Reading::Value(90));
        assert_eq!(p.at(250), Reading::Na);
        assert_eq!(p.at(450), Reading::Value(90));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Scenario::parse("modle = \"910B\"", Path::new(".")).unwrap_err();
        assert!(err.contains("modle"), "{err}");
    }

    #[test]
    fn overrides_layer_on_defaults() {
        let s = Scenario::parse(
            "model = \"910_93\"\ncards = 2\n[default]\nhealth = 1\n[[device]]\nid = 3\nhealth = 2\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(s.devices.len(), 4);
        assert_eq!(s.devices[0].health, 1);
        assert_eq!(s.devices[3].health, 2);
        assert_eq!((s.devices[3].card, s.devices[3].chip), (1, 1));
    }

    #[test]
    fn phy_ids_default_to_the_logic_id_and_must_differ() {
        let s = Scenario::parse(
            "cards = 3\n[[device]]\nid = 0\nphy_id = 4\n[[device]]\nid = 2\nphy_id = 0\n",
            Path::new("."),
        )
        .unwrap();
        let phy: Vec<u32> = s.devices.iter().map(|d| d.phy_id).collect();
        assert_eq!(phy, [4, 1, 0]);
        let err = Scenario::parse(
            "cards = 2\n[[device]]\nid = 0\nphy_id = 1\n",
            Path::new("."),
        )
        .unwrap_err();
        assert!(
            err.contains("devices 0 and 1 have the same phy_id 1"),
            "{err}"
        );
        let err = Scenario::parse("[default]\nphy_id = 1\n", Path::new(".")).unwrap_err();
        assert!(err.contains("not [default]"), "{err}");
    }

    #[test]
    fn multi_util_takes_a_flag_or_a_mode_and_health_takes_hex() {
        let s = Scenario::parse(
            "cards = 4\nprerelease_layout = \"4-byte\"\n[[device]]\nid = 0\nmulti_util = false\n[[device]]\nid = 1\nmulti_util = \"zeroed\"\nhealth = 0xFFFFFFFF\n[[device]]\nid = 2\ntype14 = { constant = 150 }\nutil_over_100 = \"pass\"\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(s.devices[0].multi_util, MultiUtilMode::Unsupported);
        assert_eq!(s.devices[1].multi_util, MultiUtilMode::Zeroed);
        assert_eq!(s.devices[1].health, u32::MAX);
        assert_eq!(s.devices[3].multi_util, MultiUtilMode::Supported);
        assert_eq!(s.devices[2].type14, Some(Programme::Constant(150)));
        assert_eq!(s.devices[2].util_over_100, Over100::Pass);
        assert_eq!(s.devices[0].util_over_100, Over100::Zero);
        assert_eq!(s.type14_at(&s.devices[2], 0), Reading::Value(150));
        assert_eq!(s.type14_at(&s.devices[0], 0), Reading::Value(0));
        assert_eq!(s.prerelease_layout, PrereleaseLayout::Early);
        assert!(Scenario::parse("multi_util = \"sometimes\"", Path::new(".")).is_err());
    }

    // Fault codes: per device in the scenario, or over time in a `file` programme.
    #[test]
    fn fault_codes_come_from_the_scenario_or_the_file_over_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("npu1"), "40 errors=0x80E01801,80C98002\n").unwrap();
        let s = Scenario::parse(
            "cards = 2\n[default]\nerror_codes = [0x40F84E00]\n[[device]]\nid = 0\nerror_codes_error = -8005\n[[device]]\nid = 1\naicube = { file = \"npu1\" }\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(s.devices[0].error_codes_error, Some(-8005));
        assert_eq!(
            s.error_codes_of(&s.devices[0]),
            [0x40F8_4E00],
            "from [default]"
        );
        assert_eq!(s.error_codes_of(&s.devices[1]), [0x80E0_1801, 0x80C9_8002]);
        std::fs::write(dir.path().join("npu1"), "40 errors=\n").unwrap();
        assert!(s.error_codes_of(&s.devices[1]).is_empty(), "cleared");
        std::fs::write(dir.path().join("npu1"), "40\n").unwrap();
        assert_eq!(
            s.error_codes_of(&s.devices[1]),
            [0x40F8_4E00],
            "no word: the scenario's"
        );
        std::fs::write(dir.path().join("npu1"), "40 errors=0xZZ\n").unwrap();
        assert_eq!(
            s.error_codes_of(&s.devices[1]),
            [0x40F8_4E00],
            "a bad word is ignored"
        );
    }

    // The file protocol the fake engine writes for the chaos suite.
    #[test]
    fn file_readings() {
        assert_eq!(file_reading("42\n"), Reading::Value(42));
        assert_eq!(file_reading("NA"), Reading::Na);
        assert_eq!(
            file_reading("error:-8005 hbm_used_mb=1"),
            Reading::Error(-8005)
        );
        assert_eq!(file_reading("hang"), Reading::Hang);
        assert_eq!(file_reading(""), Reading::Na);
        assert_eq!(file_reading("error:x"), Reading::Na);
        let dir = std::env::temp_dir().join(format!("npu-fake-file-{}", std::process::id()));
        std::fs::write(&dir, "0 hbm_used_mb=65000\n").unwrap();
        let p = Programme::File(dir.clone());
        assert_eq!(p.at(0), Reading::Value(0));
        assert_eq!(p.file_hbm_used_mb(), Some(65000));
        assert_eq!(p.file_health(), None);
        assert_eq!(Programme::Constant(1).file_hbm_used_mb(), None);
        std::fs::write(&dir, "0 health=0xFFFFFFFF hbm_used_mb=1\n").unwrap();
        assert_eq!(p.file_health(), Some(u32::MAX));
        std::fs::write(&dir, "0 health=2\n").unwrap();
        assert_eq!(p.file_health(), Some(2));
        assert_eq!(p.file_multi_util(), None);
        std::fs::write(&dir, "40 multi_util=zeroed\n").unwrap();
        assert_eq!(p.file_multi_util(), Some(MultiUtilMode::Zeroed));
        let _ = std::fs::remove_file(dir);
    }
}
