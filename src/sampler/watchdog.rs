//! The watchdog thread: notices DCMI calls that hang, runs the `npu-smi` fallback, and marks
//! silent watch children stale.
//!
//! It never calls into DCMI and never blocks: the `npu-smi info watch -h` capability probe
//! (up to 5 s) runs on a helper thread started with the watchdog, and hand-overs wait for its
//! answer in a queue. A hung call is seen from the sampler's published call start; the device
//! is marked stale (readers see it), invalid samples are written for every device the stuck
//! thread cannot serve, and the hung device moves to an `npu-smi` watch child where the HDK
//! supports it. If the thread stays stuck for three deadlines, every DCMI device moves.
//!
//! A device that reads utilization type 14 gets a *cross-check* watch: its rows are not
//! stored as readings but vouch against type 14's zeros (the driver turns a bad type-14 figure
//! into 0), and when type 14 keeps reading 0 against busy rows the watch takes the device over.

use super::plausibility::NpuSmiCheck;
use super::source::{Source, SourceReason};
use super::status::DeviceStatus;
use super::watch_rows::{cross_check_row, row_of, store_row};
use super::{SamplerConfig, Shared};
use crate::driver::dcmi::UtilType;
use crate::driver::npu_smi::{self, Watch, WatchConfig, WatchSupport, WatchUpdate};
use crate::driver::{Backend, DriverConfig};
use crate::ring::Sample;
use crossbeam_channel::{Receiver, select};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Settings of the watchdog.
#[derive(Debug, Clone)]
pub(super) struct WatchdogConfig {
    /// How often it checks.
    pub interval: Duration,
    /// A call blocked longer than this marks its device stale.
    pub call_deadline: Duration,
    /// A watch child silent for longer than this marks its device stale.
    pub watch_stale_after: Duration,
    /// The backend whose thread publishes its calls (`SamplerStatus::enter_call`): a call
    /// that hangs stalls every device on this backend.
    pub caller: Backend,
}

impl WatchdogConfig {
    /// The settings for a watchdog of `caller`'s devices.
    pub(super) fn new(
        driver: &DriverConfig,
        cfg: &SamplerConfig,
        caller: Backend,
    ) -> WatchdogConfig {
        WatchdogConfig {
            interval: cfg.watchdog_interval,
            call_deadline: cfg.call_deadline,
            watch_stale_after: cfg
                .watch_stale_after
                .unwrap_or_else(|| Duration::from_secs(3 * u64::from(driver.watch_delay_s.max(1)))),
            caller,
        }
    }
}

/// The `npu-smi` watch children a watchdog may run: how, and whether the HDK supports them.
#[derive(Debug, Clone)]
pub(crate) struct Fallback {
    /// How watch children are run.
    pub watch: WatchConfig,
    /// Timeout of the capability probe.
    pub probe_timeout: Duration,
    /// The probe's answer when start-up already ran it; `None`: probed on a helper thread.
    pub support: Option<WatchSupport>,
}

impl Fallback {
    /// Watch children of `driver`'s `npu-smi`.
    pub(crate) fn new(driver: &DriverConfig, support: Option<WatchSupport>) -> Fallback {
        Fallback {
            watch: WatchConfig {
                npu_smi: driver.npu_smi.clone(),
                delay_s: driver.watch_delay_s,
                backoff_initial: Duration::from_millis(500),
                backoff_max: Duration::from_secs(30),
            },
            probe_timeout: npu_smi::probe::PROBE_TIMEOUT,
            support,
        }
    }
}

/// Whether a device waits for the fallback's decision (the capability probe runs).
pub(super) fn settling(dev: &DeviceStatus) -> bool {
    dev.source() == Source::NPU_SMI_PENDING
}

/// What a backend's thread asks of the watchdog's `npu-smi` fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchRequest {
    /// The backend has no AI Cube call for the device: serve it from `npu-smi`.
    HandOver(usize),
    /// The device reads type 14: run a cross-check watch for it.
    CrossCheck(usize),
    /// The device no longer reads type 14: stop its cross-check watch.
    EndCrossCheck(usize),
}

/// Why a device gets an `npu-smi` watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// Its backend has no AI Cube call for it (or it is the `npu-smi` backend's own).
    NoCube,
    /// Its DCMI calls hang.
    Hung,
    /// It reads type 14; the watch only vouches against type 14's zeros.
    CrossCheck,
}

/// A running watch child for a device.
struct Running {
    watch: Watch,
    /// Ring time it started.
    started: u64,
    /// Its rows are the device's readings (else they only cross-check type 14).
    serving: Arc<AtomicBool>,
}

enum Support {
    Probing(Receiver<WatchSupport>),
    Known(WatchSupport),
}

struct Watchdog {
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    /// How watch children run; `None`: no fallback, a hung device only goes stale.
    watch: Option<WatchConfig>,
    support: Support,
    /// Hand-overs waiting for the probe.
    queued: Vec<(usize, Reason)>,
    watches: Vec<Option<Running>>,
    moved_all: bool,
}

/// Thread body. `watch_now` start on watch children right away (with a `fallback`).
pub(super) fn run(
    shared: Arc<Shared>,
    cfg: WatchdogConfig,
    fallback: Option<Fallback>,
    watch_now: Vec<usize>,
    mut requests: Receiver<WatchRequest>,
    stop: Receiver<()>,
) {
    let n = shared.devices.len();
    let (watch, support) = match fallback {
        Some(f) => {
            let support = match f.support {
                Some(s) => Support::Known(s),
                None => Support::Probing(start_probe(&f.watch.npu_smi, f.probe_timeout)),
            };
            (Some(f.watch), support)
        }
        None => (
            None,
            Support::Known(WatchSupport::Unsupported(NO_FALLBACK.to_owned())),
        ),
    };
    let mut fb = Watchdog {
        shared,
        cfg,
        watch,
        support,
        queued: Vec::new(),
        watches: (0..n).map(|_| None).collect(),
        moved_all: false,
    };
    for idx in watch_now {
        fb.hand_over(idx, Reason::NoCube);
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
                Ok(WatchRequest::HandOver(idx)) => fb.hand_over(idx, Reason::NoCube),
                Ok(WatchRequest::CrossCheck(idx)) => fb.hand_over(idx, Reason::CrossCheck),
                Ok(WatchRequest::EndCrossCheck(idx)) => fb.end_cross_check(idx),
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
    Watch::stop_all(fb.watches.into_iter().flatten().map(|r| r.watch).collect());
}

/// Why a watchdog without a fallback moves no device.
pub(super) const NO_FALLBACK: &str = "the npu-smi fallback is disabled (--backend dcmi)";

/// Runs `npu-smi info watch -h` on a helper thread; the answer arrives on the channel.
fn start_probe(npu_smi: &Path, timeout: Duration) -> Receiver<WatchSupport> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let npu_smi = npu_smi.to_owned();
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

impl Watchdog {
    /// Whether `source` is on the backend whose calls this watchdog watches.
    fn on_caller(&self, source: Source) -> bool {
        source.backend == self.cfg.caller
    }

    /// Moves device `idx` to a watch child if the HDK supports it, or (`CrossCheck`) starts
    /// a cross-check watch for it; queued until the probe has answered.
    fn hand_over(&mut self, idx: usize, reason: Reason) {
        let support = match &self.support {
            Support::Probing(_) => {
                self.queued.push((idx, reason));
                return;
            }
            Support::Known(s) => s.clone(),
        };
        if self.watches[idx].is_some() {
            self.take_over(idx, reason);
        } else if let WatchSupport::Unsupported(why) = support {
            self.without_watch(idx, reason, &why);
        } else if self.ready_for_watch(idx, reason) {
            self.start_watch(idx, reason);
        }
    }

    /// A cross-check watch already runs for `idx`: it takes the device over (unless the
    /// request is another cross-check, or the device left the watched backend meanwhile).
    fn take_over(&self, idx: usize, reason: Reason) {
        let Some(running) = &self.watches[idx] else {
            return;
        };
        let dev = &self.shared.devices[idx];
        if reason == Reason::CrossCheck
            || running.serving.load(Ordering::Acquire)
            || !(reason == Reason::NoCube || self.on_caller(dev.source()))
        {
            return;
        }
        if reason == Reason::Hung {
            dev.set_reason(SourceReason::Hung, 0, UtilType::AiCube);
        }
        running.serving.store(true, Ordering::Release);
        dev.clear_npu_smi_opinion();
        dev.set_source(Source::NPU_SMI);
        tracing::info!(
            device = dev.info.id,
            "AI Cube now read from npu-smi info watch -s u"
        );
    }

    /// No watch child can run (`why`): a device without another source has none.
    fn without_watch(&self, idx: usize, reason: Reason, why: &str) {
        let dev = &self.shared.devices[idx];
        if reason == Reason::NoCube
            && dev.replace_source(Source::NPU_SMI_PENDING, Source::UNAVAILABLE)
        {
            tracing::warn!(
                device = dev.info.id,
                "no AI Cube source for this device: {why}"
            );
        }
        if reason == Reason::CrossCheck {
            dev.clear_npu_smi_opinion();
            tracing::info!(
                device = dev.info.id,
                "no npu-smi cross-check of type 14's zeros: {why}"
            );
        }
    }

    /// Whether the device still wants the watch `reason` asks for (a hung device still on
    /// the watched backend is marked pending here).
    fn ready_for_watch(&self, idx: usize, reason: Reason) -> bool {
        let dev = &self.shared.devices[idx];
        let before = dev.source();
        match reason {
            Reason::Hung => {
                if !(self.on_caller(before) && dev.replace_source(before, Source::NPU_SMI_PENDING))
                {
                    return false;
                }
                dev.set_reason(SourceReason::Hung, 0, UtilType::AiCube);
                true
            }
            // The device may have left type 14 while the probe ran.
            Reason::CrossCheck if before != Source::DCMI_SINGLE => {
                dev.clear_npu_smi_opinion();
                false
            }
            Reason::CrossCheck | Reason::NoCube => true,
        }
    }

    /// Starts the watch child of `idx`: serving its readings, or (`CrossCheck`) vouching
    /// against type 14's zeros.
    fn start_watch(&mut self, idx: usize, reason: Reason) {
        let Some(config) = self.watch.clone() else {
            return;
        };
        let serving = Arc::new(AtomicBool::new(reason != Reason::CrossCheck));
        let on_update = self.on_update(idx, serving.clone());
        let dev = &self.shared.devices[idx];
        let id = dev.info.id;
        match Watch::start(
            config,
            dev.info.watch_target(),
            format!("npu-smi-{id}"),
            on_update,
        ) {
            Ok(watch) => {
                let now = self.shared.ring.now_ns();
                self.watches[idx] = Some(Running {
                    watch,
                    started: now,
                    serving,
                });
                if reason == Reason::CrossCheck {
                    tracing::info!(
                        device = id,
                        "npu-smi info watch -s u cross-checks type 14's zeros"
                    );
                } else {
                    dev.set_source(Source::NPU_SMI);
                    tracing::info!(device = id, "AI Cube now read from npu-smi info watch -s u");
                }
            }
            Err(e) => {
                if reason == Reason::CrossCheck {
                    dev.clear_npu_smi_opinion();
                }
                tracing::warn!(device = id, "cannot start the npu-smi watch thread: {e}")
            }
        }
    }

    /// Stops the cross-check watch of `idx` (the device reads the multi call again).
    fn end_cross_check(&mut self, idx: usize) {
        self.queued
            .retain(|(i, r)| !(*i == idx && *r == Reason::CrossCheck));
        let serving = self.watches[idx]
            .as_ref()
            .is_some_and(|r| r.serving.load(Ordering::Acquire));
        if !serving && let Some(r) = self.watches[idx].take() {
            r.watch.stop();
            self.shared.devices[idx].clear_npu_smi_opinion();
        }
    }

    /// The watch callback of device `idx`: readings while `serving`, else cross-check rows.
    fn on_update(
        &self,
        idx: usize,
        serving: Arc<AtomicBool>,
    ) -> impl FnMut(WatchUpdate) + Send + 'static {
        let shared = self.shared.clone();
        let id = shared.devices[idx].info.id;
        let mut last_message = String::new();
        let mut check = NpuSmiCheck::default();
        move |u: WatchUpdate| {
            let ts = shared.ring.now_ns();
            if !serving.load(Ordering::Acquire)
                && !cross_check_row(&shared, idx, &serving, &mut check, &u, ts)
            {
                return;
            }
            match row_of(&u, shared.devices[idx].is_gone()) {
                Some(row) => store_row(&shared, idx, ts, row),
                None => log_event(id, u, &mut last_message),
            }
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
            let Some(running) = &self.watches[idx] else {
                continue;
            };
            if dev.source() != Source::NPU_SMI {
                continue;
            }
            let last = dev.last_seen_ns().max(running.started);
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
            if self.on_caller(d.source()) {
                d.set_stale();
                self.push_invalid(i, now);
            }
        }
        if blocked_ns > 3 * self.cfg.call_deadline.as_nanos() as u64
            && !self.moved_all
            && self.watch.is_some()
        {
            self.moved_all = true;
            tracing::warn!("the DCMI thread is stuck; moving every DCMI device to npu-smi");
            for i in 0..self.shared.devices.len() {
                if self.on_caller(self.shared.devices[i].source()) {
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

/// Logs an event of device `id`'s watch child; a message is logged when it changes.
fn log_event(id: u32, u: WatchUpdate, last_message: &mut String) {
    match u {
        WatchUpdate::Message(m) => {
            if m != *last_message {
                tracing::warn!(device = id, "npu-smi watch: {m}");
                *last_message = m;
            }
        }
        WatchUpdate::SpawnFailed(e) => tracing::warn!(device = id, "{e}"),
        WatchUpdate::Exited {
            status,
            rows,
            retry_in,
        } => {
            let status = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
            tracing::warn!(
                device = id,
                rows,
                "npu-smi watch exited ({status}); restarting in {retry_in:?}"
            );
        }
        WatchUpdate::Reading(_) | WatchUpdate::NoCubeColumn => {}
    }
}
