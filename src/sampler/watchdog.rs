//! The watchdog thread: notices DCMI calls that hang, runs the `npu-smi` fallback, and marks
//! silent watch children stale.
//!
//! It never calls into DCMI and never blocks: the `npu-smi info watch -h` capability probe
//! (up to 5 s) runs on a helper thread started with the watchdog, and hand-overs wait for its
//! answer in a queue. A hung call is seen from the sampler's published call start; the device
//! is marked stale (readers see it), invalid samples are written for every device the stuck
//! thread cannot serve, and the hung device moves to an `npu-smi` watch child where the HDK
//! supports it. If the thread stays stuck for three deadlines, every DCMI device moves.

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
    /// How watch children are run.
    pub watch: WatchConfig,
    /// Timeout of the capability probe.
    pub probe_timeout: Duration,
}

/// Why a device is handed to `npu-smi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// DCMI has no AI Cube call for it (or DCMI is not loaded at all).
    NoDcmiCube,
    /// Its DCMI calls hang.
    Hung,
}

enum Support {
    Probing(Receiver<WatchSupport>),
    Known(WatchSupport),
}

struct Fallback {
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    support: Support,
    /// Hand-overs waiting for the probe.
    queued: Vec<(usize, Reason)>,
    watches: Vec<Option<(Watch, u64)>>,
    moved_all: bool,
}

/// Thread body. `npu_smi_devices` start on watch children right away; `support` is the
/// probe result when start-up already ran it.
pub fn run(
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    support: Option<WatchSupport>,
    npu_smi_devices: Vec<usize>,
    mut requests: Receiver<usize>,
    stop: Receiver<()>,
) {
    let n = shared.devices.len();
    let support = match support {
        Some(s) => Support::Known(s),
        None if !cfg.allow_npu_smi => Support::Known(WatchSupport::Unsupported(
            "the npu-smi fallback is disabled (--backend dcmi)".to_owned(),
        )),
        None => Support::Probing(start_probe(&cfg)),
    };
    let mut fb = Fallback {
        shared,
        cfg,
        support,
        queued: Vec::new(),
        watches: (0..n).map(|_| None).collect(),
        moved_all: false,
    };
    for idx in npu_smi_devices {
        fb.hand_over(idx, Reason::NoDcmiCube);
    }
    let tick = crossbeam_channel::tick(fb.cfg.interval);
    fb.shared.sampler.watchdog_ticked(fb.shared.ring.now_ns());
    loop {
        let probe = match &fb.support {
            Support::Probing(rx) => rx.clone(),
            Support::Known(_) => crossbeam_channel::never(),
        };
        select! {
            recv(stop) -> _ => break,
            recv(requests) -> msg => match msg {
                Ok(idx) => fb.hand_over(idx, Reason::NoDcmiCube),
                // No DCMI thread (or it ended): no more requests, keep watching.
                Err(_) => requests = crossbeam_channel::never(),
            },
            recv(probe) -> result => {
                let result = result.unwrap_or_else(|_| {
                    WatchSupport::Unsupported("the npu-smi capability probe thread died".to_owned())
                });
                fb.support = Support::Known(result);
                for (idx, reason) in std::mem::take(&mut fb.queued) {
                    fb.hand_over(idx, reason);
                }
            },
            recv(tick) -> _ => {
                fb.check();
                fb.shared.sampler.watchdog_ticked(fb.shared.ring.now_ns());
            }
        }
    }
    Watch::stop_all(fb.watches.into_iter().flatten().map(|(w, _)| w).collect());
}

/// Runs `npu-smi info watch -h` on a helper thread; the answer arrives on the channel.
fn start_probe(cfg: &WatchdogConfig) -> Receiver<WatchSupport> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let npu_smi = cfg.watch.npu_smi.clone();
    let timeout = cfg.probe_timeout;
    let spawned = std::thread::Builder::new()
        .name("npu-smi-probe".to_owned())
        .spawn(move || {
            let _ = tx.send(npu_smi::probe::watch_support(&npu_smi, timeout));
        });
    if let Err(e) = spawned {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let _ = tx.send(WatchSupport::Unsupported(format!(
            "cannot start the npu-smi probe thread: {e}"
        )));
        return rx;
    }
    rx
}

impl Fallback {
    /// Moves device `idx` to a watch child if the HDK supports it (queued until the probe
    /// has answered).
    fn hand_over(&mut self, idx: usize, reason: Reason) {
        if self.watches[idx].is_some() {
            return;
        }
        let support = match &self.support {
            Support::Probing(_) => {
                self.queued.push((idx, reason));
                return;
            }
            Support::Known(s) => s.clone(),
        };
        let dev = &self.shared.devices[idx];
        let before = dev.source();
        if let WatchSupport::Unsupported(why) = support {
            if reason == Reason::NoDcmiCube
                && dev.replace_source(Source::NpuSmiPending, Source::Unavailable)
            {
                tracing::warn!(
                    device = dev.info.id,
                    "no AI Cube source for this device: {why}"
                );
            }
            return;
        }
        match reason {
            Reason::Hung
                if !(before.is_dcmi() && dev.replace_source(before, Source::NpuSmiPending)) =>
            {
                return;
            }
            _ => {}
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
        if let Some((idx, kind, started)) = self.shared.sampler.in_call() {
            let blocked = now.saturating_sub(started);
            if blocked > deadline {
                self.on_hang(idx, kind.describe(), blocked, now);
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

    fn on_hang(&mut self, idx: usize, call: &str, blocked_ns: u64, now: u64) {
        let dev = &self.shared.devices[idx];
        if dev.set_hung() {
            tracing::warn!(
                device = dev.info.id,
                "DCMI {call} blocked for {:?} (deadline {:?}); device marked stale",
                Duration::from_nanos(blocked_ns),
                self.cfg.call_deadline
            );
            self.hand_over(idx, Reason::Hung);
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
                    self.hand_over(i, Reason::Hung);
                }
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
