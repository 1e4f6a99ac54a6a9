//! The DCMI sampler thread's liveness, for the watchdog, systemd's watchdog and the
//! metrics: completed passes, the call in progress (which device, since when), the period,
//! and how late each pass started.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

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
    pub(crate) fn describe(self) -> &'static str {
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
pub(super) const LATENESS_BUCKETS_US: [u64; 12] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000,
];

impl SamplerStatus {
    /// The thread is about to call into DCMI for `device`.
    pub(crate) fn enter_call(&self, device: usize, kind: CallKind, now_ns: u64) {
        self.call_device.store(device as u32, Ordering::Relaxed);
        self.call_telemetry
            .store(kind == CallKind::Telemetry, Ordering::Relaxed);
        self.call_started.store(now_ns + 1, Ordering::Release);
    }

    /// The call returned.
    pub(crate) fn leave_call(&self) {
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
    pub(crate) fn set_period(&self, period: std::time::Duration) {
        let ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
        self.period_ns.store(ns, Ordering::Relaxed);
    }

    /// The sampling period in force.
    pub(crate) fn period(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.period_ns.load(Ordering::Relaxed))
    }

    /// One pass over all devices completed at ring time `now_ns`.
    pub(crate) fn pass_done(&self, now_ns: u64) {
        self.last_pass.store(now_ns + 1, Ordering::Release);
        self.passes.fetch_add(1, Ordering::Release);
    }

    /// Ring time of the last completed pass.
    pub(crate) fn last_pass(&self) -> Option<u64> {
        self.last_pass.load(Ordering::Acquire).checked_sub(1)
    }

    /// The watchdog thread ran its periodic check at ring time `now_ns`.
    pub(crate) fn watchdog_ticked(&self, now_ns: u64) {
        self.watchdog_tick.store(now_ns + 1, Ordering::Release);
    }

    /// Ring time of the watchdog thread's last check.
    pub(crate) fn last_watchdog_tick(&self) -> Option<u64> {
        self.watchdog_tick.load(Ordering::Acquire).checked_sub(1)
    }

    /// Completed passes since start.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Acquire)
    }

    /// A pass started more than one period late.
    pub(crate) fn overrun(&self) {
        self.overruns.fetch_add(1, Ordering::Relaxed);
    }

    /// Late passes since start.
    pub(crate) fn overruns(&self) -> u64 {
        self.overruns.load(Ordering::Relaxed)
    }

    /// Records how late a pass started (its tick jitter).
    pub(crate) fn record_lateness(&self, late: std::time::Duration) {
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
    pub(crate) fn lateness_histogram(&self) -> (Vec<(f64, u64)>, u64, f64) {
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
