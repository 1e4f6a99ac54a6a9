//! Per-device and per-sampler state shared between the sampler threads and readers.
//!
//! Everything is an atomic written by the threads that own the driver and read by anyone
//! (HTTP handlers, the CLI) without locks; [`DeviceStatus::snapshot`] gives a plain copy.

use crate::driver::dcmi::{CubeCall, UtilType};
use crate::driver::{Backend, DeviceInfo};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// How a backend obtains a device's AI Cube figure. Its discriminant is its half of a
/// source's one-byte encoding (below 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter, strum::FromRepr)]
#[repr(u8)]
pub enum Method {
    /// Not decided yet: DCMI's first read is pending, or the `npu-smi` capability probe runs.
    Pending,
    /// `dcmi_get_device_multi_utilization_rate` (`aic_util`).
    Multi,
    /// `dcmi_get_device_utilization_rate` type 14.
    Single,
    /// A long-lived `npu-smi info watch -s u` child.
    Watch,
    /// No method: the device has no AI Cube figure.
    None,
    /// Read from a script (the scripted backend).
    Script,
}

impl Method {
    /// Its word in a source's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Pending => "pending",
            Method::Multi => "multi",
            Method::Single => "single",
            Method::Watch => "watch",
            Method::None => "none",
            Method::Script => "script",
        }
    }
}

/// Where a device's AI Cube figures come from now: a backend and its method. Stored in one
/// atomic byte (backend index × 16 + method index); printed under the names it always had
/// (`dcmi-multi`, `npu-smi`, …), and `<backend>-<method>` for any other pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    pub backend: Backend,
    pub method: Method,
}

impl Source {
    /// DCMI, method not yet known (first read pending).
    pub const DCMI_PROBING: Source = Source::of(Backend::Dcmi, Method::Pending);
    /// `dcmi_get_device_multi_utilization_rate` (`aic_util`).
    pub const DCMI_MULTI: Source = Source::of(Backend::Dcmi, Method::Multi);
    /// `dcmi_get_device_utilization_rate` type 14.
    pub const DCMI_SINGLE: Source = Source::of(Backend::Dcmi, Method::Single);
    /// Being handed to `npu-smi` (capability probe running).
    pub const NPU_SMI_PENDING: Source = Source::of(Backend::NpuSmi, Method::Pending);
    /// A long-lived `npu-smi info watch -s u` child.
    pub const NPU_SMI: Source = Source::of(Backend::NpuSmi, Method::Watch);
    /// No source: DCMI lacks AI Cube and `npu-smi` cannot provide it.
    pub const UNAVAILABLE: Source = Source::of(Backend::Unavailable, Method::None);

    /// The names the wire has always used for the sources of DCMI and `npu-smi`.
    const NAMED: [(Source, &'static str); 6] = [
        (Source::DCMI_PROBING, "dcmi-probing"),
        (Source::DCMI_MULTI, "dcmi-multi"),
        (Source::DCMI_SINGLE, "dcmi-single"),
        (Source::NPU_SMI_PENDING, "npu-smi-pending"),
        (Source::NPU_SMI, "npu-smi"),
        (Source::UNAVAILABLE, "unavailable"),
    ];

    /// `backend` reading through `method`.
    pub const fn of(backend: Backend, method: Method) -> Source {
        Source { backend, method }
    }

    fn from_u8(v: u8) -> Source {
        match (Backend::from_repr(v >> 4), Method::from_repr(v & 0x0F)) {
            (Some(b), Some(m)) => Source::of(b, m),
            _ => Source::UNAVAILABLE,
        }
    }

    fn to_u8(self) -> u8 {
        ((self.backend as u8) << 4) | self.method as u8
    }

    /// The name `/status/detail`, `devices --json` and the metrics' `source` label print.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match Source::NAMED.iter().find(|(s, _)| *s == self) {
            Some((_, n)) => std::borrow::Cow::Borrowed(n),
            None => format!("{}-{}", self.backend.as_str(), self.method.as_str()).into(),
        }
    }

    /// Source for a successful DCMI read through `call`.
    pub fn of_call(call: CubeCall) -> Source {
        match call {
            CubeCall::Multi => Source::DCMI_MULTI,
            CubeCall::Single => Source::DCMI_SINGLE,
        }
    }

    /// Whether the DCMI sampler thread reads this device's AI Cube.
    pub fn is_dcmi(self) -> bool {
        self.backend == Backend::Dcmi
    }

    /// The backend the figures come through.
    pub fn backend(self) -> Backend {
        self.backend
    }

    /// How the figure is obtained, for humans.
    pub fn method(self) -> &'static str {
        match (self.backend, self.method) {
            (Backend::Dcmi, Method::Pending) => "probing",
            (Backend::NpuSmi, Method::Pending) => "npu-smi pending",
            (_, Method::Multi) => "multi-utilization aic_util",
            (_, Method::Single) => "utilization type 14",
            (_, Method::Watch) => "npu-smi info watch -s u",
            (_, Method::Script) => "script",
            (_, Method::Pending) => "pending",
            (Backend::Unavailable, _) | (_, Method::None) => "none",
        }
    }

    /// Whether the source is decided (not probing or pending).
    pub fn settled(self) -> bool {
        self.method != Method::Pending
    }
}

impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Source, D::Error> {
        let name = String::deserialize(d)?;
        use strum::IntoEnumIterator;
        Backend::iter()
            .flat_map(|b| Method::iter().map(move |m| Source::of(b, m)))
            .find(|s| s.name() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown source {name:?}")))
    }
}

/// Why a device's AI Cube figures come from where they come from. Stored in an `AtomicU8` as
/// its discriminant; the conversion back and the tests' list are derived (`strum`), so a new
/// variant cannot be left out.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    strum::FromRepr,
    strum::EnumIter,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[repr(u8)]
pub enum SourceReason {
    /// The first DCMI read is pending.
    Probing,
    /// The multi-utilization call answered a non-zero field: the firmware has the
    /// sub-command, its figures are readings.
    MultiVerified,
    /// The multi-utilization call answered only zeros so far; each zero is checked against a
    /// single call (type 14, else type 2).
    MultiUnverified,
    /// As `MultiUnverified`, but no single call answers: its zeros are suspect.
    MultiUncorroborated,
    /// The multi-utilization call answers zeros while a single call reads non-zero; its
    /// figures are suspect until the disagreement ends or lasts a second.
    MultiDisputed,
    /// The multi-utilization call answered OK with an all-zero struct while a single call
    /// read non-zero, for a second: the firmware lacks the sub-command.
    MultiZeroed,
    /// The pre-release name answered a figure above 100: the library writes the early
    /// 4-byte struct.
    MultiPrereleaseLayout,
    /// The multi-utilization call answered -8255.
    MultiUnsupported,
    /// No multi-utilization symbol in the library.
    MultiMissing,
    /// Utilization type 14 answered -8255 or is missing.
    Type14Unsupported,
    /// Type 14 read 0 while `npu-smi` read non-zero, three rows in a row.
    Type14Zero,
    /// A DCMI call on the device blocked past the deadline.
    Hung,
    /// The library is not loaded (or did not enumerate the device).
    NoDcmi,
}

impl SourceReason {
    /// The reason's name in `/status/detail` and the metrics' `reason` label (serde's name,
    /// by the same rule).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The reason stored as `v`; only this module stores one, so an unknown value cannot
    /// occur, and would read as [`SourceReason::NoDcmi`].
    fn from_u8(v: u8) -> SourceReason {
        SourceReason::from_repr(v).unwrap_or(SourceReason::NoDcmi)
    }

    fn to_u8(self) -> u8 {
        self as u8
    }

    /// Whether a verdict is pending (two calls disagree; settled within a second or two).
    pub fn pending(self) -> bool {
        self == SourceReason::MultiDisputed
    }

    /// One sentence for humans; `figure` is the single call's reading behind
    /// `MultiZeroed`, or the bad figure behind `MultiPrereleaseLayout`.
    pub fn note(self, figure: u32, kind: UtilType) -> String {
        use SourceReason::*;
        match self {
            Probing => "first read pending".to_owned(),
            MultiVerified => "the multi-utilization call answered non-zero figures: the firmware has the sub-command".to_owned(),
            MultiUnverified => "the multi-utilization call has answered only zeros so far; each zero is checked against a single utilization call".to_owned(),
            MultiUncorroborated => "the multi-utilization call has answered only zeros so far and no single utilization call answers to check them: its zeros are suspect, not readings".to_owned(),
            MultiDisputed => "the multi-utilization call answers zeros while a single utilization call reads non-zero: figures are suspect while this lasts".to_owned(),
            MultiZeroed => format!(
                "the multi-utilization call answers OK with every field 0 while {} read {figure} %: the firmware lacks the sub-command",
                kind.describe()
            ),
            MultiPrereleaseLayout => format!(
                "the pre-release name dcmi_get_device_utilization_rate_v2 answered a figure of {figure}: the library writes the early 4-byte struct"
            ),
            MultiUnsupported => "the multi-utilization call answered -8255 (not supported)".to_owned(),
            MultiMissing => "libdcmi.so has no multi-utilization symbol".to_owned(),
            Type14Unsupported => "DCMI has no AI Cube call for the device (multi-utilization unusable, type 14 not supported)".to_owned(),
            Type14Zero => "type 14 read 0 while npu-smi read non-zero, three rows in a row".to_owned(),
            Hung => "a DCMI call on the device blocked past the deadline".to_owned(),
            NoDcmi => "libdcmi.so is not loaded or did not enumerate the device".to_owned(),
        }
    }
}

/// What a device's cross-check `npu-smi` watch says about its AI Cube right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opinion {
    /// No watch, or its rows are too old.
    None,
    /// The watch was asked for and its first row is awaited.
    Pending,
    /// Its latest row, percent.
    Row(u8),
}

const UNKNOWN: u64 = u64::MAX;

/// Error codes counted one by one (DCMI return codes, then the agent's pseudo codes); any
/// other code is counted as "other".
pub const COUNTED_CODES: [i32; 27] = [
    -8001, -8002, -8003, -8004, -8005, -8006, -8007, -8008, -8009, -8010, -8011, -8012, -8013,
    -8014, -8015, -8016, -8017, -8020, -8022, -8023, -8255, -99993, -99994, -99995, -99996, -99997,
    -99998,
];

/// Live state of one device.
#[derive(Debug)]
pub struct DeviceStatus {
    pub info: DeviceInfo,
    /// Whether the library enumerated this device (HBM and health readable through DCMI).
    pub dcmi_known: bool,
    source: AtomicU8,
    reason: AtomicU8,
    /// The figure behind the reason (see [`SourceReason::note`]).
    reason_figure: AtomicU32,
    /// The single call behind `MultiZeroed`: 0 type 14, 1 type 2.
    reason_kind: AtomicU8,
    /// The driver reports the device does not exist (health `0xFFFFFFFF`).
    gone: AtomicBool,
    /// Latest raw type-14 answer (OK) and its ring time (0 = none).
    type14_raw: AtomicU32,
    type14_ns: AtomicU64,
    /// Latest row of the device's cross-check `npu-smi` watch and its ring time (0 = none).
    npu_smi_opinion: AtomicU8,
    npu_smi_opinion_ns: AtomicU64,
    /// Ring time a cross-check watch was asked for (0 = none expected).
    npu_smi_expected_ns: AtomicU64,
    stale: AtomicBool,
    hung: AtomicBool,
    last_seen_ns: AtomicU64,
    last_valid_ns: AtomicU64,
    last_value: AtomicU8,
    last_error: AtomicI32,
    /// Code of the current failure run, 0 while reads succeed (for transition logs).
    failing: AtomicI32,
    errors: AtomicU64,
    /// Per code of [`COUNTED_CODES`], then "other".
    errors_by_code: [AtomicU64; COUNTED_CODES.len() + 1],
    hbm_used_mb: AtomicU64,
    hbm_total_mb: AtomicU64,
    health: AtomicU64,
    /// Ring time of the last successful HBM/health read (0 = never).
    telemetry_ns: AtomicU64,
    /// The driver's fault codes at the last fault read (written by the DCMI thread about
    /// once a second, read by reports; never held across a driver call).
    faults: std::sync::Mutex<Faults>,
}

/// One fault code the driver reports on a device, with its text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FaultCode {
    pub code: u32,
    /// `0x80E01801`, as MindCluster's table and `npu-smi` write it (without `0x` there).
    pub hex: String,
    /// The driver's text (`dcmi_get_device_errorcode_string`); `None` if it has none.
    pub text: Option<String>,
}

impl FaultCode {
    /// `code` with its `text`.
    pub fn new(code: u32, text: Option<String>) -> FaultCode {
        FaultCode {
            code,
            hex: format!("0x{code:08X}"),
            text,
        }
    }
}

/// The last fault read of a device.
#[derive(Debug, Clone, Default)]
struct Faults {
    codes: Vec<FaultCode>,
    /// Ring time of the last successful read (0 = never).
    read_ns: u64,
    /// Why the last read failed; `None` after a success.
    error: Option<String>,
}

/// Milliseconds from ring time `at_ns` to `now_ns`; `None` for 0 (never).
fn age_ms(now_ns: u64, at_ns: u64) -> Option<u64> {
    (at_ns != 0).then(|| now_ns.saturating_sub(at_ns) / 1_000_000)
}

/// A plain copy of [`DeviceStatus`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceSnapshot {
    pub id: u32,
    pub card: u32,
    pub chip: Option<u32>,
    pub name: String,
    pub backend: Backend,
    pub method: &'static str,
    pub source: Source,
    /// Why the figures come from `source`.
    pub source_reason: SourceReason,
    /// The same, for humans.
    pub source_note: String,
    /// The driver reports the device does not exist (health `0xFFFFFFFF`): its windows are
    /// unavailable, and `health` and the HBM figures are `None` (not the last ones read).
    pub device_gone: bool,
    /// No fresh reading: a hung call or a silent watch child.
    pub stale: bool,
    /// A DCMI call on this device blocked past the deadline.
    pub hung: bool,
    /// Last valid AI Cube reading, percent.
    pub last_value: Option<u8>,
    /// Age of the last valid reading, milliseconds.
    pub last_valid_age_ms: Option<u64>,
    /// Code of the last failed read (DCMI code, or a pseudo code: -99997 bad figure, -99994
    /// suspect figure, -99993 device gone).
    pub last_error: Option<i32>,
    pub errors: u64,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    /// 0 normal, 1 minor, 2 major, 3 critical alarm (`None` when unknown or gone).
    pub health: Option<u32>,
    /// Age of the HBM/health figures, milliseconds (they stop updating once a DCMI call on
    /// the device hung, so that the stuck call is not repeated).
    pub telemetry_age_ms: Option<u64>,
    /// The driver's current fault codes (empty: none, or never read: see `faults_age_ms`).
    pub faults: Vec<FaultCode>,
    /// Age of the fault codes, milliseconds; `None` if never read.
    pub faults_age_ms: Option<u64>,
    /// Why the last fault read failed.
    pub faults_error: Option<String>,
}

impl DeviceStatus {
    /// A device that starts on `source`.
    pub fn new(info: DeviceInfo, dcmi_known: bool, source: Source) -> DeviceStatus {
        let reason = if source.is_dcmi() {
            SourceReason::Probing
        } else {
            SourceReason::NoDcmi
        };
        DeviceStatus {
            info,
            dcmi_known,
            source: AtomicU8::new(source.to_u8()),
            reason: AtomicU8::new(reason.to_u8()),
            reason_figure: AtomicU32::new(0),
            reason_kind: AtomicU8::new(0),
            gone: AtomicBool::new(false),
            type14_raw: AtomicU32::new(0),
            type14_ns: AtomicU64::new(0),
            npu_smi_opinion: AtomicU8::new(0),
            npu_smi_opinion_ns: AtomicU64::new(0),
            npu_smi_expected_ns: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            hung: AtomicBool::new(false),
            last_seen_ns: AtomicU64::new(0),
            last_valid_ns: AtomicU64::new(0),
            last_value: AtomicU8::new(0),
            last_error: AtomicI32::new(0),
            failing: AtomicI32::new(0),
            errors: AtomicU64::new(0),
            errors_by_code: Default::default(),
            hbm_used_mb: AtomicU64::new(UNKNOWN),
            hbm_total_mb: AtomicU64::new(UNKNOWN),
            health: AtomicU64::new(UNKNOWN),
            telemetry_ns: AtomicU64::new(0),
            faults: std::sync::Mutex::new(Faults::default()),
        }
    }

    /// Records a fault read: the codes, or why it failed (the codes of the last success
    /// stand, with their age).
    pub fn record_faults(&self, ts_ns: u64, read: Result<Vec<FaultCode>, String>) {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        match read {
            Ok(codes) => {
                f.codes = codes;
                f.read_ns = ts_ns.max(1);
                f.error = None;
            }
            Err(e) => f.error = Some(e),
        }
    }

    /// The fault codes of the last successful read if it is at most `max_age` old at
    /// `now_ns` (ring time); empty otherwise: codes the reader could not refresh (a hung
    /// call, a failing tool) are shown with their age, never acted on.
    pub fn fresh_fault_codes(&self, now_ns: u64, max_age: std::time::Duration) -> Vec<FaultCode> {
        let f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = f.read_ns != 0
            && now_ns.saturating_sub(f.read_ns)
                <= u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        if fresh { f.codes.clone() } else { Vec::new() }
    }

    /// Whether a fault read was made (or found impossible) at least once.
    pub fn faults_attempted(&self) -> bool {
        let f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        f.read_ns != 0 || f.error.is_some()
    }

    /// The fault codes of the last successful read (empty: none, or never read).
    pub fn fault_codes(&self) -> Vec<FaultCode> {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .codes
            .clone()
    }

    /// Where AI Cube figures come from now.
    pub fn source(&self) -> Source {
        Source::from_u8(self.source.load(Ordering::Acquire))
    }

    /// Sets the source unconditionally.
    pub fn set_source(&self, s: Source) {
        self.source.store(s.to_u8(), Ordering::Release);
    }

    /// Moves from `from` to `to` only if the source is still `from`.
    pub fn replace_source(&self, from: Source, to: Source) -> bool {
        self.source
            .compare_exchange(
                from.to_u8(),
                to.to_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Why the figures come from the current source.
    pub fn reason(&self) -> SourceReason {
        SourceReason::from_u8(self.reason.load(Ordering::Acquire))
    }

    /// Sets the reason; `figure` and `kind` feed its note. True when it changed.
    pub fn set_reason(&self, reason: SourceReason, figure: u32, kind: UtilType) -> bool {
        self.reason_figure.store(figure, Ordering::Relaxed);
        self.reason_kind.store(
            match kind {
                UtilType::AiCube => 0,
                UtilType::AiCore => 1,
            },
            Ordering::Relaxed,
        );
        self.reason.swap(reason.to_u8(), Ordering::AcqRel) != reason.to_u8()
    }

    /// The driver reports the device does not exist.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Records whether the device is gone; true when that changed.
    pub fn set_gone(&self, gone: bool) -> bool {
        self.gone.swap(gone, Ordering::AcqRel) != gone
    }

    /// Records a raw type-14 answer (rc OK) at `ts_ns`.
    pub fn record_type14(&self, ts_ns: u64, raw: u32) {
        self.type14_raw.store(raw, Ordering::Relaxed);
        self.type14_ns.store(ts_ns.max(1), Ordering::Release);
    }

    /// The latest raw type-14 answer if it is at most `max_age` old at `now_ns`.
    pub fn type14_latest(&self, now_ns: u64, max_age: std::time::Duration) -> Option<u32> {
        let ts = self.type14_ns.load(Ordering::Acquire);
        (ts != 0 && now_ns.saturating_sub(ts) <= max_age.as_nanos() as u64)
            .then(|| self.type14_raw.load(Ordering::Relaxed))
    }

    /// Records a row of the device's cross-check `npu-smi` watch at `ts_ns`.
    pub fn record_npu_smi_opinion(&self, ts_ns: u64, value: u8) {
        self.npu_smi_opinion.store(value, Ordering::Relaxed);
        self.npu_smi_opinion_ns
            .store(ts_ns.max(1), Ordering::Release);
    }

    /// A cross-check watch was asked for at `ts_ns`: its first row is awaited.
    pub fn expect_npu_smi_opinion(&self, ts_ns: u64) {
        self.npu_smi_expected_ns
            .store(ts_ns.max(1), Ordering::Release);
    }

    /// Forgets the cross-check rows and any awaited one (its watch cannot run, stopped or
    /// took over).
    pub fn clear_npu_smi_opinion(&self) {
        self.npu_smi_expected_ns.store(0, Ordering::Release);
        self.npu_smi_opinion_ns.store(0, Ordering::Release);
    }

    /// What the cross-check `npu-smi` watch says at `now_ns`: its latest row if at most
    /// `max_age` old; `Pending` while its first row is awaited (for at most `max_age`).
    pub fn npu_smi_opinion(&self, now_ns: u64, max_age: std::time::Duration) -> Opinion {
        let max = max_age.as_nanos() as u64;
        let ts = self.npu_smi_opinion_ns.load(Ordering::Acquire);
        if ts != 0 && now_ns.saturating_sub(ts) <= max {
            return Opinion::Row(self.npu_smi_opinion.load(Ordering::Relaxed));
        }
        let asked = self.npu_smi_expected_ns.load(Ordering::Acquire);
        if ts == 0 && asked != 0 && now_ns.saturating_sub(asked) <= max {
            return Opinion::Pending;
        }
        Opinion::None
    }

    /// No fresh reading (a hung call, a silent watch child).
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// Marks the device stale until its next reading.
    pub fn set_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// A DCMI call on this device blocked past the deadline (and has not succeeded since).
    pub fn is_hung(&self) -> bool {
        self.hung.load(Ordering::Acquire)
    }

    /// Marks the device hung (a DCMI call blocked past the deadline); returns true the first time.
    pub fn set_hung(&self) -> bool {
        self.stale.store(true, Ordering::Release);
        !self.hung.swap(true, Ordering::AcqRel)
    }

    /// A DCMI AI Cube read on the device succeeded again: it is no longer hung.
    pub fn clear_hung(&self) -> bool {
        self.hung.swap(false, Ordering::AcqRel)
    }

    /// Time of the last reading attempt answered by the source, ring clock (0 = never).
    pub fn last_seen_ns(&self) -> u64 {
        self.last_seen_ns.load(Ordering::Acquire)
    }

    /// Records a valid reading at `ts_ns`; returns the code of the failure run it ends (0 if
    /// reads were already succeeding), so callers log transitions, not every sample.
    pub fn record_value(&self, ts_ns: u64, value: u8) -> i32 {
        self.last_value.store(value, Ordering::Relaxed);
        self.last_valid_ns.store(ts_ns.max(1), Ordering::Release);
        self.last_seen_ns.store(ts_ns.max(1), Ordering::Release);
        self.stale.store(false, Ordering::Release);
        self.failing.swap(0, Ordering::AcqRel)
    }

    /// Records a failed reading at `ts_ns` with `code`; returns true when this starts a new
    /// failure run (first failure, or a different code).
    pub fn record_error(&self, ts_ns: u64, code: i32) -> bool {
        self.last_error.store(code, Ordering::Relaxed);
        self.errors.fetch_add(1, Ordering::Relaxed);
        let slot = COUNTED_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(COUNTED_CODES.len());
        self.errors_by_code[slot].fetch_add(1, Ordering::Relaxed);
        self.last_seen_ns.store(ts_ns.max(1), Ordering::Release);
        self.stale.store(false, Ordering::Release);
        self.failing.swap(code, Ordering::AcqRel) != code
    }

    /// Failed reads per code (`None`: a code outside [`COUNTED_CODES`]); zero counts left out.
    pub fn errors_by_code(&self) -> Vec<(Option<i32>, u64)> {
        self.errors_by_code
            .iter()
            .enumerate()
            .map(|(i, c)| (COUNTED_CODES.get(i).copied(), c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Records HBM figures read at `ts_ns`.
    pub fn record_hbm(&self, ts_ns: u64, used_mb: u64, total_mb: u64) {
        self.hbm_used_mb.store(used_mb, Ordering::Relaxed);
        self.hbm_total_mb.store(total_mb, Ordering::Relaxed);
        self.telemetry_ns.store(ts_ns.max(1), Ordering::Release);
    }

    /// Records the health code read at `ts_ns`.
    pub fn record_health(&self, ts_ns: u64, health: u32) {
        self.health.store(u64::from(health), Ordering::Relaxed);
        self.telemetry_ns.store(ts_ns.max(1), Ordering::Release);
    }

    /// A consistent-enough copy for reports (fields are read one by one).
    pub fn snapshot(&self, now_ns: u64) -> DeviceSnapshot {
        let source = self.source();
        let faults = self
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let known = |v: u64| (v != UNKNOWN).then_some(v);
        let last_valid = self.last_valid_ns.load(Ordering::Acquire);
        let err = self.last_error.load(Ordering::Relaxed);
        let reason = self.reason();
        let kind = match self.reason_kind.load(Ordering::Relaxed) {
            1 => UtilType::AiCore,
            _ => UtilType::AiCube,
        };
        let gone = self.is_gone();
        DeviceSnapshot {
            id: self.info.id,
            card: self.info.card,
            chip: self.info.chip,
            name: self.info.name.clone(),
            backend: source.backend(),
            method: source.method(),
            source,
            source_reason: reason,
            source_note: reason.note(self.reason_figure.load(Ordering::Relaxed), kind),
            device_gone: gone,
            stale: self.is_stale(),
            hung: self.is_hung(),
            last_value: (last_valid != 0).then(|| self.last_value.load(Ordering::Relaxed)),
            last_valid_age_ms: (last_valid != 0)
                .then(|| now_ns.saturating_sub(last_valid) / 1_000_000),
            last_error: (err != 0).then_some(err),
            errors: self.errors.load(Ordering::Relaxed),
            hbm_used_mb: known(self.hbm_used_mb.load(Ordering::Relaxed)).filter(|_| !gone),
            hbm_total_mb: known(self.hbm_total_mb.load(Ordering::Relaxed)).filter(|_| !gone),
            health: known(self.health.load(Ordering::Relaxed))
                .filter(|_| !gone)
                .map(|h| h as u32),
            telemetry_age_ms: age_ms(now_ns, self.telemetry_ns.load(Ordering::Acquire)),
            faults: faults.codes,
            faults_age_ms: age_ms(now_ns, faults.read_ns),
            faults_error: faults.error,
        }
    }
}

/// Which DCMI call the sampler thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// An AI Cube read.
    Cube,
    /// HBM and health reads.
    Telemetry,
}

impl CallKind {
    /// The kind of call, for logs.
    pub fn describe(self) -> &'static str {
        match self {
            CallKind::Cube => "AI Cube read",
            CallKind::Telemetry => "HBM/health read",
        }
    }
}

/// Liveness of the DCMI sampler thread, for the watchdog and (later) systemd.
#[derive(Debug, Default)]
pub struct SamplerStatus {
    /// Completed sampling passes.
    passes: AtomicU64,
    /// Ring time a DCMI call started, plus one; 0 when no call is in progress.
    call_started: AtomicU64,
    /// Device index of the call in progress.
    call_device: AtomicU32,
    /// Whether the call in progress is a telemetry read.
    call_telemetry: AtomicBool,
    /// Current sampling period in nanoseconds (changes on reload).
    period_ns: AtomicU64,
    /// Ring time of the last completed pass, plus one; 0 before the first.
    last_pass: AtomicU64,
    /// Ring time of the watchdog thread's last check, plus one; 0 before the first.
    watchdog_tick: AtomicU64,
    /// Passes that started later than one period after they were due.
    overruns: AtomicU64,
    /// How late each pass started, per bucket of [`LATENESS_BUCKETS_US`] (+Inf last).
    lateness: [AtomicU64; LATENESS_BUCKETS_US.len() + 1],
    lateness_sum_ns: AtomicU64,
}

/// Upper bounds (µs) of the pass-lateness histogram.
pub const LATENESS_BUCKETS_US: [u64; 12] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000,
];

impl SamplerStatus {
    /// The thread is about to call into DCMI for `device`.
    pub fn enter_call(&self, device: usize, kind: CallKind, now_ns: u64) {
        self.call_device.store(device as u32, Ordering::Relaxed);
        self.call_telemetry
            .store(kind == CallKind::Telemetry, Ordering::Relaxed);
        self.call_started.store(now_ns + 1, Ordering::Release);
    }

    /// The call returned.
    pub fn leave_call(&self) {
        self.call_started.store(0, Ordering::Release);
    }

    /// The call in progress: (device index, kind, start time on the ring clock).
    pub fn in_call(&self) -> Option<(usize, CallKind, u64)> {
        let started = self.call_started.load(Ordering::Acquire);
        (started != 0).then(|| {
            let kind = if self.call_telemetry.load(Ordering::Relaxed) {
                CallKind::Telemetry
            } else {
                CallKind::Cube
            };
            (
                self.call_device.load(Ordering::Relaxed) as usize,
                kind,
                started - 1,
            )
        })
    }

    /// Records the sampling period in force.
    pub fn set_period(&self, period: std::time::Duration) {
        let ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
        self.period_ns.store(ns, Ordering::Relaxed);
    }

    /// The sampling period in force.
    pub fn period(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.period_ns.load(Ordering::Relaxed))
    }

    /// One pass over all devices completed at ring time `now_ns`.
    pub fn pass_done(&self, now_ns: u64) {
        self.last_pass.store(now_ns + 1, Ordering::Release);
        self.passes.fetch_add(1, Ordering::Release);
    }

    /// Ring time of the last completed pass.
    pub fn last_pass(&self) -> Option<u64> {
        self.last_pass.load(Ordering::Acquire).checked_sub(1)
    }

    /// The watchdog thread ran its periodic check at ring time `now_ns`.
    pub fn watchdog_ticked(&self, now_ns: u64) {
        self.watchdog_tick.store(now_ns + 1, Ordering::Release);
    }

    /// Ring time of the watchdog thread's last check.
    pub fn last_watchdog_tick(&self) -> Option<u64> {
        self.watchdog_tick.load(Ordering::Acquire).checked_sub(1)
    }

    /// Completed passes since start.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Acquire)
    }

    /// A pass started more than one period late.
    pub fn overrun(&self) {
        self.overruns.fetch_add(1, Ordering::Relaxed);
    }

    /// Late passes since start.
    pub fn overruns(&self) -> u64 {
        self.overruns.load(Ordering::Relaxed)
    }

    /// Records how late a pass started (its tick jitter).
    pub fn record_lateness(&self, late: std::time::Duration) {
        let us = late.as_micros() as u64;
        let i = LATENESS_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENESS_BUCKETS_US.len());
        self.lateness[i].fetch_add(1, Ordering::Relaxed);
        self.lateness_sum_ns
            .fetch_add(late.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Lateness histogram: per-bucket counts in seconds (+Inf last), count, sum in seconds.
    pub fn lateness_histogram(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let buckets: Vec<(f64, u64)> = LATENESS_BUCKETS_US
            .iter()
            .map(|us| *us as f64 / 1e6)
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.lateness)
            .map(|(le, c)| (le, c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|b| b.1).sum();
        (
            buckets,
            count,
            self.lateness_sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Codes are evidence while their read is fresh; a failed read keeps them shown (with
    // their age) and they stop counting once older than the limit.
    #[test]
    fn fault_codes_count_only_while_fresh() {
        let d = device();
        let s = 1_000_000_000u64;
        let limit = Duration::from_secs(15);
        assert!(d.fresh_fault_codes(s, limit).is_empty(), "never read");
        d.record_faults(s, Ok(vec![FaultCode::new(0x80E1_8402, None)]));
        assert_eq!(d.fresh_fault_codes(2 * s, limit).len(), 1);
        d.record_faults(10 * s, Err("timed out".into()));
        assert_eq!(
            d.fresh_fault_codes(16 * s, limit).len(),
            1,
            "15 s old: still fresh"
        );
        assert!(d.fresh_fault_codes(17 * s, limit).is_empty(), "16 s old");
        assert_eq!(d.fault_codes().len(), 1, "still shown");
        assert!(d.faults_attempted());
    }

    // Every source round-trips through its byte and its name, the names are those the
    // wire always had, and (backend, method) says where the figure comes from.
    #[test]
    fn sources_are_a_backend_and_a_method_and_keep_their_names() {
        use strum::IntoEnumIterator;
        let mut names = std::collections::BTreeSet::new();
        for b in Backend::iter() {
            for m in Method::iter() {
                let src = Source::of(b, m);
                assert_eq!(Source::from_u8(src.to_u8()), src, "{src:?}");
                let name = src.name().into_owned();
                let json = serde_json::to_string(&src).unwrap();
                assert_eq!(json, format!("\"{name}\""));
                assert_eq!(serde_json::from_str::<Source>(&json).unwrap(), src);
                assert!(names.insert(name.clone()), "{name} twice");
            }
        }
        for (src, name) in Source::NAMED {
            assert_eq!(src.name(), name, "the wire's names stay");
        }
        assert_eq!(
            Source::of(Backend::Scripted, Method::Script).name(),
            "scripted-script"
        );
        assert_eq!(Source::from_u8(0xFF), Source::UNAVAILABLE);
        assert!(serde_json::from_str::<Source>("\"dcmi-magic\"").is_err());
        assert_eq!(Source::DCMI_MULTI.backend, Backend::Dcmi);
        assert_eq!(Source::NPU_SMI.method, Method::Watch);
        assert!(Source::DCMI_SINGLE.is_dcmi() && !Source::NPU_SMI.is_dcmi());
        assert!(!Source::NPU_SMI_PENDING.settled() && Source::UNAVAILABLE.settled());
        assert_eq!(Source::DCMI_SINGLE.method(), "utilization type 14");
    }

    fn device() -> DeviceStatus {
        DeviceStatus::new(
            DeviceInfo {
                id: 0,
                card: 0,
                chip: Some(0),
                name: "910B3".to_owned(),
            },
            true,
            Source::DCMI_PROBING,
        )
    }

    #[test]
    fn every_reason_survives_its_atomic() {
        use strum::IntoEnumIterator;
        let all: Vec<SourceReason> = SourceReason::iter().collect();
        assert!(all.contains(&SourceReason::NoDcmi), "{all:?}");
        for r in all {
            assert_eq!(SourceReason::from_u8(r.to_u8()), r);
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "one name");
            assert!(!r.note(40, UtilType::AiCube).is_empty());
        }
    }

    #[test]
    fn a_gone_device_shows_no_health_or_hbm_and_reports_the_change_once() {
        let d = device();
        d.record_health(1, 0);
        d.record_hbm(1, 3072, 65536);
        assert!(d.set_gone(true));
        assert!(!d.set_gone(true), "no change, no second log line");
        let s = d.snapshot(2);
        assert!(s.device_gone);
        assert_eq!(
            (s.health, s.hbm_used_mb, s.hbm_total_mb),
            (None, None, None)
        );
        assert!(d.set_gone(false));
        assert_eq!(d.snapshot(3).health, Some(0));
    }

    #[test]
    fn the_npu_smi_opinion_is_awaited_for_a_while_then_ages_out() {
        let d = device();
        let max = Duration::from_millis(100);
        const MS: u64 = 1_000_000;
        assert_eq!(d.npu_smi_opinion(0, max), Opinion::None);
        d.expect_npu_smi_opinion(10 * MS);
        assert_eq!(d.npu_smi_opinion(50 * MS, max), Opinion::Pending);
        assert_eq!(
            d.npu_smi_opinion(200 * MS, max),
            Opinion::None,
            "never came"
        );
        d.record_npu_smi_opinion(210 * MS, 45);
        assert_eq!(d.npu_smi_opinion(250 * MS, max), Opinion::Row(45));
        assert_eq!(d.npu_smi_opinion(400 * MS, max), Opinion::None, "too old");
        d.clear_npu_smi_opinion();
        assert_eq!(d.npu_smi_opinion(250 * MS, max), Opinion::None);
    }
}
