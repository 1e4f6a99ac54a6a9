//! The watchdog thread: notices DCMI calls that hang, runs the `npu-smi` fallback, and marks
//! silent watch children stale.
//!
//! It never calls into DCMI. A hung call is seen from the sampler's published call start; the
//! device is marked stale (readers see it), invalid samples are written for every device the
//! stuck thread cannot serve, and the hung device moves to an `npu-smi` watch child where the
//! HDK supports it. If the thread stays stuck for three deadlines, every DCMI device moves.

use super::Shared;
use super::status::Source;
use crate::driver::npu_smi::{self, Cube, Watch, WatchConfig, WatchSupport, WatchUpdate};
use crate::ring::Sample;
use crossbeam_channel::{Receiver, select};
use std::sync::Arc;
use std::time::Duration;

/// Pseudo error codes for readings that did not come from a DCMI return code.
pub mod codes {
    /// `npu-smi` printed `NA`.
    pub const NA: i32 = -99996;
    /// A figure above 100 % or unparseable.
    pub const BAD_VALUE: i32 = -99997;
    /// The `npu-smi` header has no AI Cube column.
    pub const NO_CUBE_COLUMN: i32 = -99995;
}

/// Settings of the watchdog.
#[derive(Debug, Clone)]
pub struct WatchdogConfig {
    /// How often it checks.
    pub interval: Duration,
    /// A DCMI call blocked longer than this marks its device stale.
    pub call_deadline: Duration,
    /// A watch child silent for longer than this marks its device stale.
    pub watch_stale_after: Duration,
    /// Whether devices may move to `npu-smi` (false with `--backend dcmi`).
    pub allow_npu_smi: bool,
    pub watch: WatchConfig,
    pub probe_timeout: Duration,
}

struct Fallback {
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    support: Option<WatchSupport>,
    watches: Vec<Option<(Watch, u64)>>,
    moved_all: bool,
}

/// Thread body. `npu_smi_devices` start on watch children right away.
pub fn run(
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    support: Option<WatchSupport>,
    npu_smi_devices: Vec<usize>,
    mut requests: Receiver<usize>,
    stop: Receiver<()>,
) {
    let n = shared.devices.len();
    let mut fb = Fallback {
        shared,
        cfg,
        support,
        watches: (0..n).map(|_| None).collect(),
        moved_all: false,
    };
    for idx in npu_smi_devices {
        fb.hand_over(idx);
    }
    let tick = crossbeam_channel::tick(fb.cfg.interval);
    loop {
        select! {
            recv(stop) -> _ => break,
            recv(requests) -> msg => match msg {
                Ok(idx) => fb.hand_over(idx),
                // No DCMI thread (or it ended): no more requests, keep watching.
                Err(_) => requests = crossbeam_channel::never(),
            },
            recv(tick) -> _ => fb.check(),
        }
    }
    for (w, _) in fb.watches.into_iter().flatten() {
        w.stop();
    }
}

impl Fallback {
    fn support(&mut self) -> &WatchSupport {
        let cfg = &self.cfg;
        self.support.get_or_insert_with(|| {
            if !cfg.allow_npu_smi {
                return WatchSupport::Unsupported(
                    "npu-smi fallback is disabled (--backend dcmi)".to_owned(),
                );
            }
            let s = npu_smi::probe::watch_support(&cfg.watch.npu_smi, cfg.probe_timeout);
            if let WatchSupport::Unsupported(w) = &s {
                tracing::warn!("{w}");
            }
            s
        })
    }

    /// Moves device `idx` to a watch child if the HDK supports it.
    fn hand_over(&mut self, idx: usize) {
        if self.watches[idx].is_some() {
            return;
        }
        let support = self.support().clone();
        let dev = &self.shared.devices[idx];
        let before = dev.source();
        if let WatchSupport::Unsupported(why) = support {
            if before == Source::NpuSmiPending {
                dev.set_source(Source::Unavailable);
                tracing::warn!(
                    device = dev.info.id,
                    "no AI Cube source for this device: {why}"
                );
            }
            return;
        }
        let shared = self.shared.clone();
        let target = dev.info.watch_target();
        let id = dev.info.id;
        let mut last_message = String::new();
        let on_update = move |u: WatchUpdate| {
            let dev = &shared.devices[idx];
            let ts = shared.ring.now_ns();
            let push = |value: u8, valid: bool| {
                shared.ring.push(Sample {
                    device: idx as u16,
                    ts_ns: ts,
                    value,
                    valid,
                })
            };
            match u {
                WatchUpdate::Reading(Cube::Percent(v)) => {
                    push(v, true);
                    dev.record_value(ts, v);
                }
                WatchUpdate::Reading(Cube::Na) => {
                    push(0, false);
                    if dev.record_error(ts, codes::NA) {
                        tracing::warn!(device = id, "npu-smi reports NA for AI Cube");
                    }
                }
                WatchUpdate::Reading(Cube::OutOfRange) => {
                    push(0, false);
                    if dev.record_error(ts, codes::BAD_VALUE) {
                        tracing::warn!(
                            device = id,
                            "npu-smi reports an AI Cube figure above 100 %; ignored"
                        );
                    }
                }
                WatchUpdate::NoCubeColumn => {
                    push(0, false);
                    if dev.record_error(ts, codes::NO_CUBE_COLUMN) {
                        tracing::warn!(
                            device = id,
                            "npu-smi watch output has no AI Cube column; rows ignored"
                        );
                    }
                }
                WatchUpdate::Message(m) => {
                    if m != last_message {
                        tracing::warn!(device = id, "npu-smi watch: {m}");
                        last_message = m;
                    }
                }
                WatchUpdate::SpawnFailed(e) => tracing::warn!(device = id, "{e}"),
                WatchUpdate::Exited {
                    status,
                    rows,
                    retry_in,
                } => {
                    let status =
                        status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
                    tracing::warn!(
                        device = id,
                        rows,
                        "npu-smi watch exited ({status}); restarting in {retry_in:?}"
                    );
                }
            }
        };
        match Watch::start(
            self.cfg.watch.clone(),
            target,
            format!("npu-smi-{id}"),
            on_update,
        ) {
            Ok(w) => {
                let now = self.shared.ring.now_ns();
                self.watches[idx] = Some((w, now));
                dev.set_source(Source::NpuSmi);
                tracing::info!(device = id, "AI Cube now read from npu-smi info watch -s u");
            }
            Err(e) => tracing::warn!(device = id, "cannot start the npu-smi watch thread: {e}"),
        }
    }

    fn check(&mut self) {
        let now = self.shared.ring.now_ns();
        let deadline = self.cfg.call_deadline.as_nanos() as u64;
        if let Some((idx, started)) = self.shared.sampler.in_call() {
            let blocked = now.saturating_sub(started);
            if blocked > deadline {
                self.on_hang(idx, blocked, now);
            }
        }
        let stale_after = self.cfg.watch_stale_after.as_nanos() as u64;
        for (idx, dev) in self.shared.devices.iter().enumerate() {
            let Some((_, started)) = &self.watches[idx] else {
                continue;
            };
            if dev.source() != Source::NpuSmi {
                continue;
            }
            let last = dev.last_seen_ns().max(*started);
            if now.saturating_sub(last) > stale_after {
                if !dev.is_stale() {
                    tracing::warn!(
                        device = dev.info.id,
                        "no npu-smi reading for {:?}; device is stale",
                        self.cfg.watch_stale_after
                    );
                }
                dev.set_stale();
                self.push_invalid(idx, now);
            }
        }
    }

    fn on_hang(&mut self, idx: usize, blocked_ns: u64, now: u64) {
        let dev = &self.shared.devices[idx];
        if dev.set_hung() {
            tracing::warn!(
                device = dev.info.id,
                "DCMI call blocked for {:?} (deadline {:?}); device marked stale",
                Duration::from_nanos(blocked_ns),
                self.cfg.call_deadline
            );
            if self.cfg.allow_npu_smi {
                self.move_from_dcmi(idx);
            }
        }
        // The stuck thread serves no DCMI device until the call returns.
        for i in 0..self.shared.devices.len() {
            let d = &self.shared.devices[i];
            if d.source().is_dcmi() {
                d.set_stale();
                self.push_invalid(i, now);
            }
        }
        if blocked_ns > 3 * self.cfg.call_deadline.as_nanos() as u64
            && !self.moved_all
            && self.cfg.allow_npu_smi
        {
            self.moved_all = true;
            tracing::warn!("the DCMI thread is stuck; moving every DCMI device to npu-smi");
            for i in 0..self.shared.devices.len() {
                if self.shared.devices[i].source().is_dcmi() {
                    self.move_from_dcmi(i);
                }
            }
        }
    }

    fn move_from_dcmi(&mut self, idx: usize) {
        if let WatchSupport::Supported = self.support() {
            let dev = &self.shared.devices[idx];
            let before = dev.source();
            if before.is_dcmi() && dev.replace_source(before, Source::NpuSmiPending) {
                self.hand_over(idx);
            }
        }
    }

    fn push_invalid(&self, idx: usize, now: u64) {
        self.shared.ring.push(Sample {
            device: idx as u16,
            ts_ns: now,
            value: 0,
            valid: false,
        });
    }
}
