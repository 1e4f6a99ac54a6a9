//! Per-device and per-sampler state shared between the sampler threads and readers.
//!
//! Everything is an atomic written by the threads that own the driver and read by anyone
//! (HTTP handlers, the CLI) without locks; [`DeviceStatus::snapshot`] gives a plain copy.

use super::source::{Source, SourceReason};
use crate::driver::dcmi::UtilType;
use crate::driver::{Backend, DeviceInfo};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// What a device's cross-check `npu-smi` watch says about its AI Cube right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opinion {
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
pub(crate) const COUNTED_CODES: [i32; 27] = [
    -8001, -8002, -8003, -8004, -8005, -8006, -8007, -8008, -8009, -8010, -8011, -8012, -8013,
    -8014, -8015, -8016, -8017, -8020, -8022, -8023, -8255, -99993, -99994, -99995, -99996, -99997,
    -99998,
];

/// Live state of one device.
#[derive(Debug)]
pub struct DeviceStatus {
    pub info: DeviceInfo,
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
    pub(crate) fn new(code: u32, text: Option<String>) -> FaultCode {
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
    /// Physical id (the device plugin's name for the NPU); `None` when the driver does not say.
    pub phy_id: Option<u32>,
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
    /// A device that starts on `source`, for `reason`.
    pub(crate) fn new(info: DeviceInfo, source: Source, reason: SourceReason) -> DeviceStatus {
        DeviceStatus {
            info,
            source: AtomicU8::new(source.to_u8()),
            reason: AtomicU8::new(reason as u8),
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
    pub(crate) fn record_faults(&self, ts_ns: u64, read: Result<Vec<FaultCode>, String>) {
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
    pub(crate) fn fresh_fault_codes(
        &self,
        now_ns: u64,
        max_age: std::time::Duration,
    ) -> Vec<FaultCode> {
        let f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = f.read_ns != 0
            && now_ns.saturating_sub(f.read_ns)
                <= u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        if fresh { f.codes.clone() } else { Vec::new() }
    }

    /// Whether a fault read was made (or found impossible) at least once.
    pub(crate) fn faults_attempted(&self) -> bool {
        let f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        f.read_ns != 0 || f.error.is_some()
    }

    /// The fault codes of the last successful read (empty: none, or never read).
    pub(crate) fn fault_codes(&self) -> Vec<FaultCode> {
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
    pub(crate) fn set_source(&self, s: Source) {
        self.source.store(s.to_u8(), Ordering::Release);
    }

    /// Moves from `from` to `to` only if the source is still `from`.
    pub(crate) fn replace_source(&self, from: Source, to: Source) -> bool {
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
        super::source::reason_from_u8(self.reason.load(Ordering::Acquire))
    }

    /// Sets the reason; `figure` and `kind` feed its note. True when it changed.
    pub(crate) fn set_reason(&self, reason: SourceReason, figure: u32, kind: UtilType) -> bool {
        self.reason_figure.store(figure, Ordering::Relaxed);
        self.reason_kind.store(
            match kind {
                UtilType::AiCube => 0,
                UtilType::AiCore => 1,
            },
            Ordering::Relaxed,
        );
        self.reason.swap(reason as u8, Ordering::AcqRel) != reason as u8
    }

    /// The driver reports the device does not exist.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Records whether the device is gone; true when that changed.
    pub(crate) fn set_gone(&self, gone: bool) -> bool {
        self.gone.swap(gone, Ordering::AcqRel) != gone
    }

    /// Records a raw type-14 answer (rc OK) at `ts_ns`.
    pub(crate) fn record_type14(&self, ts_ns: u64, raw: u32) {
        self.type14_raw.store(raw, Ordering::Relaxed);
        self.type14_ns.store(ts_ns.max(1), Ordering::Release);
    }

    /// The latest raw type-14 answer if it is at most `max_age` old at `now_ns`.
    pub(crate) fn type14_latest(&self, now_ns: u64, max_age: std::time::Duration) -> Option<u32> {
        let ts = self.type14_ns.load(Ordering::Acquire);
        (ts != 0 && now_ns.saturating_sub(ts) <= max_age.as_nanos() as u64)
            .then(|| self.type14_raw.load(Ordering::Relaxed))
    }

    /// Records a row of the device's cross-check `npu-smi` watch at `ts_ns`.
    pub(crate) fn record_npu_smi_opinion(&self, ts_ns: u64, value: u8) {
        self.npu_smi_opinion.store(value, Ordering::Relaxed);
        self.npu_smi_opinion_ns
            .store(ts_ns.max(1), Ordering::Release);
    }

    /// A cross-check watch was asked for at `ts_ns`: its first row is awaited.
    pub(crate) fn expect_npu_smi_opinion(&self, ts_ns: u64) {
        self.npu_smi_expected_ns
            .store(ts_ns.max(1), Ordering::Release);
    }

    /// Forgets the cross-check rows and any awaited one (its watch cannot run, stopped or
    /// took over).
    pub(crate) fn clear_npu_smi_opinion(&self) {
        self.npu_smi_expected_ns.store(0, Ordering::Release);
        self.npu_smi_opinion_ns.store(0, Ordering::Release);
    }

    /// What the cross-check `npu-smi` watch says at `now_ns`: its latest row if at most
    /// `max_age` old; `Pending` while its first row is awaited (for at most `max_age`).
    pub(crate) fn npu_smi_opinion(&self, now_ns: u64, max_age: std::time::Duration) -> Opinion {
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
    pub(crate) fn set_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// A DCMI call on this device blocked past the deadline (and has not succeeded since).
    pub fn is_hung(&self) -> bool {
        self.hung.load(Ordering::Acquire)
    }

    /// Marks the device hung (a DCMI call blocked past the deadline); returns true the first
    /// time, which also marks it stale. It stays stale until a valid reading (from npu-smi, or
    /// from DCMI again): the watchdog calls this on every check while the call stays blocked,
    /// and neither that nor a fallback answering NA may flip the flag back and forth.
    pub(crate) fn set_hung(&self) -> bool {
        let first = !self.hung.swap(true, Ordering::AcqRel);
        if first {
            self.stale.store(true, Ordering::Release);
        }
        first
    }

    /// A DCMI AI Cube read on the device succeeded again: it is no longer hung.
    pub(crate) fn clear_hung(&self) -> bool {
        self.hung.swap(false, Ordering::AcqRel)
    }

    /// Time of the last reading attempt answered by the source, ring clock (0 = never).
    pub(crate) fn last_seen_ns(&self) -> u64 {
        self.last_seen_ns.load(Ordering::Acquire)
    }

    /// Records a valid reading at `ts_ns`; returns the code of the failure run it ends (0 if
    /// reads were already succeeding), so callers log transitions, not every sample.
    pub(crate) fn record_value(&self, ts_ns: u64, value: u8) -> i32 {
        self.last_value.store(value, Ordering::Relaxed);
        self.last_valid_ns.store(ts_ns.max(1), Ordering::Release);
        self.last_seen_ns.store(ts_ns.max(1), Ordering::Release);
        self.stale.store(false, Ordering::Release);
        self.failing.swap(0, Ordering::AcqRel)
    }

    /// Records a failed reading at `ts_ns` with `code`; returns true when this starts a new
    /// failure run (first failure, or a different code).
    pub(crate) fn record_error(&self, ts_ns: u64, code: i32) -> bool {
        self.last_error.store(code, Ordering::Relaxed);
        self.errors.fetch_add(1, Ordering::Relaxed);
        let slot = COUNTED_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(COUNTED_CODES.len());
        self.errors_by_code[slot].fetch_add(1, Ordering::Relaxed);
        self.last_seen_ns.store(ts_ns.max(1), Ordering::Release);
        // A failed read is an answer, so the source is not silent; but a hung device's
        // fallback answering NA does not make its figures fresh.
        if !self.is_hung() {
            self.stale.store(false, Ordering::Release);
        }
        self.failing.swap(code, Ordering::AcqRel) != code
    }

    /// Failed reads per code (`None`: a code outside [`COUNTED_CODES`]); zero counts left out.
    pub(crate) fn errors_by_code(&self) -> Vec<(Option<i32>, u64)> {
        self.errors_by_code
            .iter()
            .enumerate()
            .map(|(i, c)| (COUNTED_CODES.get(i).copied(), c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Records HBM figures read at `ts_ns`.
    pub(crate) fn record_hbm(&self, ts_ns: u64, used_mb: u64, total_mb: u64) {
        self.hbm_used_mb.store(used_mb, Ordering::Relaxed);
        self.hbm_total_mb.store(total_mb, Ordering::Relaxed);
        self.telemetry_ns.store(ts_ns.max(1), Ordering::Release);
    }

    /// Records the health code read at `ts_ns`.
    pub(crate) fn record_health(&self, ts_ns: u64, health: u32) {
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
            phy_id: self.info.phy_id,
            backend: source.backend(),
            method: source.method(),
            source,
            source_reason: reason,
            source_note: super::source::note(
                reason,
                self.reason_figure.load(Ordering::Relaxed),
                kind,
            ),
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

    fn device() -> DeviceStatus {
        DeviceStatus::new(
            DeviceInfo {
                id: 0,
                card: 0,
                chip: Some(0),
                name: "910B3".to_owned(),
                phy_id: None,
            },
            Source::DCMI_PROBING,
            SourceReason::Probing,
        )
    }

    // The watchdog marks a hung device on every check while the call stays blocked; the
    // fallback's rows come in between. Stale must follow the readings, not that race.
    #[test]
    fn a_hung_device_stays_stale_until_a_valid_reading_and_only_then_fresh() {
        let d = device();
        assert!(d.set_hung());
        assert!(d.is_stale());
        d.record_error(1, crate::sampler::codes::NA);
        assert!(d.is_stale(), "npu-smi answering NA is no reading");
        assert!(!d.set_hung(), "still hung: not a new hang");
        d.record_value(2, 40);
        assert!(!d.is_stale(), "npu-smi serves it");
        assert!(!d.set_hung());
        assert!(
            !d.is_stale(),
            "the watchdog's next check does not undo the reading"
        );
        d.record_error(3, crate::sampler::codes::NA);
        assert!(
            !d.is_stale(),
            "an error answer from a serving source is not silence"
        );
        assert!(d.clear_hung());
        d.set_stale();
        d.record_error(4, crate::sampler::codes::NA);
        assert!(!d.is_stale(), "not hung: a failed read is an answer");
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
