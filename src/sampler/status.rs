//! Per-device and per-sampler state shared between the sampler threads and readers.
//!
//! Everything is an atomic written by the threads that own the driver and read by anyone
//! (HTTP handlers, the CLI) without locks; [`DeviceStatus::snapshot`] gives a plain copy.

use crate::driver::DeviceInfo;
use crate::driver::dcmi::CubeCall;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// Where a device's AI Cube figures come from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// DCMI, method not yet known (first read pending).
    DcmiProbing,
    /// `dcmi_get_device_multi_utilization_rate` (`aic_util`).
    DcmiMulti,
    /// `dcmi_get_device_utilization_rate` type 14.
    DcmiSingle,
    /// Being handed to `npu-smi` (capability probe running).
    NpuSmiPending,
    /// A long-lived `npu-smi info watch -s u` child.
    NpuSmi,
    /// No source: DCMI lacks AI Cube and `npu-smi` cannot provide it.
    Unavailable,
}

impl Source {
    fn from_u8(v: u8) -> Source {
        match v {
            0 => Source::DcmiProbing,
            1 => Source::DcmiMulti,
            2 => Source::DcmiSingle,
            3 => Source::NpuSmiPending,
            4 => Source::NpuSmi,
            _ => Source::Unavailable,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Source::DcmiProbing => 0,
            Source::DcmiMulti => 1,
            Source::DcmiSingle => 2,
            Source::NpuSmiPending => 3,
            Source::NpuSmi => 4,
            Source::Unavailable => 5,
        }
    }

    /// Source for a successful DCMI read through `call`.
    pub fn of_call(call: CubeCall) -> Source {
        match call {
            CubeCall::Multi => Source::DcmiMulti,
            CubeCall::Single => Source::DcmiSingle,
        }
    }

    /// Whether the DCMI sampler thread reads this device's AI Cube.
    pub fn is_dcmi(self) -> bool {
        matches!(
            self,
            Source::DcmiProbing | Source::DcmiMulti | Source::DcmiSingle
        )
    }

    /// Backend name as printed by the CLI: `dcmi`, `npu-smi` or `none`.
    pub fn backend(self) -> &'static str {
        match self {
            Source::DcmiProbing | Source::DcmiMulti | Source::DcmiSingle => "dcmi",
            Source::NpuSmiPending | Source::NpuSmi => "npu-smi",
            Source::Unavailable => "none",
        }
    }

    /// How the figure is obtained, for humans.
    pub fn method(self) -> &'static str {
        match self {
            Source::DcmiProbing => "probing",
            Source::DcmiMulti => "multi-utilization aic_util",
            Source::DcmiSingle => "utilization type 14",
            Source::NpuSmiPending => "npu-smi pending",
            Source::NpuSmi => "npu-smi info watch -s u",
            Source::Unavailable => "none",
        }
    }

    /// Whether the source is decided (not probing or pending).
    pub fn settled(self) -> bool {
        !matches!(self, Source::DcmiProbing | Source::NpuSmiPending)
    }
}

const UNKNOWN: u64 = u64::MAX;

/// Error codes counted one by one (DCMI return codes, then the agent's pseudo codes); any
/// other code is counted as "other".
pub const COUNTED_CODES: [i32; 25] = [
    -8001, -8002, -8003, -8004, -8005, -8006, -8007, -8008, -8009, -8010, -8011, -8012, -8013,
    -8014, -8015, -8016, -8017, -8020, -8022, -8023, -8255, -99995, -99996, -99997, -99998,
];

/// Live state of one device.
#[derive(Debug)]
pub struct DeviceStatus {
    pub info: DeviceInfo,
    /// Whether the library enumerated this device (HBM and health readable through DCMI).
    pub dcmi_known: bool,
    source: AtomicU8,
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
}

/// A plain copy of [`DeviceStatus`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceSnapshot {
    pub id: u32,
    pub card: u32,
    pub chip: Option<u32>,
    pub name: String,
    pub backend: &'static str,
    pub method: &'static str,
    pub source: Source,
    /// No fresh reading: a hung call or a silent watch child.
    pub stale: bool,
    /// A DCMI call on this device blocked past the deadline.
    pub hung: bool,
    /// Last valid AI Cube reading, percent.
    pub last_value: Option<u8>,
    /// Age of the last valid reading, milliseconds.
    pub last_valid_age_ms: Option<u64>,
    /// Code of the last failed read (DCMI code, or -99997 for a bad figure).
    pub last_error: Option<i32>,
    pub errors: u64,
    pub hbm_used_mb: Option<u64>,
    pub hbm_total_mb: Option<u64>,
    /// 0 normal, 1 minor, 2 major, 3 critical alarm.
    pub health: Option<u32>,
    /// Age of the HBM/health figures, milliseconds (they stop updating once a DCMI call on
    /// the device hung, so that the stuck call is not repeated).
    pub telemetry_age_ms: Option<u64>,
}

impl DeviceStatus {
    /// A device that starts on `source`.
    pub fn new(info: DeviceInfo, dcmi_known: bool, source: Source) -> DeviceStatus {
        DeviceStatus {
            info,
            dcmi_known,
            source: AtomicU8::new(source.to_u8()),
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
        }
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
        let known = |v: u64| (v != UNKNOWN).then_some(v);
        let last_valid = self.last_valid_ns.load(Ordering::Acquire);
        let err = self.last_error.load(Ordering::Relaxed);
        DeviceSnapshot {
            id: self.info.id,
            card: self.info.card,
            chip: self.info.chip,
            name: self.info.name.clone(),
            backend: source.backend(),
            method: source.method(),
            source,
            stale: self.is_stale(),
            hung: self.is_hung(),
            last_value: (last_valid != 0).then(|| self.last_value.load(Ordering::Relaxed)),
            last_valid_age_ms: (last_valid != 0)
                .then(|| now_ns.saturating_sub(last_valid) / 1_000_000),
            last_error: (err != 0).then_some(err),
            errors: self.errors.load(Ordering::Relaxed),
            hbm_used_mb: known(self.hbm_used_mb.load(Ordering::Relaxed)),
            hbm_total_mb: known(self.hbm_total_mb.load(Ordering::Relaxed)),
            health: known(self.health.load(Ordering::Relaxed)).map(|h| h as u32),
            telemetry_age_ms: match self.telemetry_ns.load(Ordering::Acquire) {
                0 => None,
                t => Some(now_ns.saturating_sub(t) / 1_000_000),
            },
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
