//! The device backends: one file each, one line of registration ([`chain`]).
//!
//! A backend finds NPUs ([`DeviceBackend::discover`]) and then keeps reading the ones the
//! sampler selected ([`DeviceBackend::start`]): AI Cube figures into the ring, HBM, health
//! and fault codes into each [`DeviceStatus`]. How it reads is its own business: DCMI owns
//! one OS thread that calls into the library (and a watchdog for calls that hang); `npu-smi`
//! runs long-lived watch children under the watchdog and a fault-code thread. The sampler
//! tries the backends `--backend` allows in order and the first that finds NPUs serves them
//! all; it holds the started [`Reader`] and asks it through methods, never by kind.
//!
//! What only some backends can do (pace themselves, hand devices over to `npu-smi`, read
//! fault codes) is a default method of [`DeviceBackend`] or [`Reader`] that does nothing or
//! says "no", so a backend writes only what it has. The `npu-smi` fallback is itself a
//! backend ([`npu_smi_fallback`]) that wraps another.
//!
//! A new backend (NVML, say) is a file here implementing [`DeviceBackend`], a line in
//! [`chain`], and its name in [`Backend`]; [`scripted`] is one, in process, for tests.

mod dcmi;
mod npu_smi;
mod npu_smi_fallback;
#[cfg(test)]
mod scripted;
#[cfg(test)]
mod seam_tests;

use super::status::DeviceStatus;
use super::watchdog::Fallback;
use super::{SamplerConfig, Shared, Source, SourceReason, StartError, Tried};
use crate::driver::{Backend, BackendChoice, DeviceInfo, DriverConfig};
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// One way of finding and reading NPUs.
pub(crate) trait DeviceBackend: Send {
    /// Its name in reports and metrics.
    fn kind(&self) -> Backend;
    /// Finds the NPUs it can serve; `Err` says why it cannot (the next backend is tried).
    fn discover(
        &mut self,
        driver: &DriverConfig,
        cfg: &SamplerConfig,
    ) -> Result<Vec<DeviceInfo>, String>;
    /// The source a device it found starts on.
    fn first_source(&self) -> Source;
    /// Why a device it found is on [`DeviceBackend::first_source`]. Default: it is not on
    /// DCMI (the reason the wire has always given then).
    fn first_reason(&self) -> SourceReason {
        SourceReason::NoDcmi
    }
    /// Takes `npu-smi` watch children for the devices it cannot read or whose calls hang.
    /// Default: the backend never hands a device over, and the fallback goes unused.
    fn accept_fallback(&mut self, _fallback: Fallback) {}
    /// Starts reading the selected devices.
    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError>;
}

/// What a backend's readers are started with.
pub(crate) struct StartCtx<'a> {
    pub shared: Arc<Shared>,
    /// `(ring index, index in what discover returned)` of every selected device.
    pub served: Vec<(usize, usize)>,
    pub driver: &'a DriverConfig,
    pub cfg: &'a SamplerConfig,
}

/// A started backend: what the sampler keeps of it. Every method but [`Reader::stop`] has
/// a default for a backend without the capability.
pub(crate) trait Reader: Send {
    /// Changes the sampling period. Default: the backend paces nothing itself.
    fn set_period(&self, _period: Duration) {}
    /// Whether it reads its devices' fault codes (settling waits for the first read).
    fn reads_faults(&self) -> bool {
        false
    }
    /// Whether it counts sampling passes (`SamplerStatus::passes`; settling waits for one).
    fn runs_passes(&self) -> bool {
        false
    }
    /// Whether the device's source is still being decided (two calls disagree, a hand-over
    /// waits for the `npu-smi` probe). Default: a backend decides at once.
    fn settling(&self, _dev: &DeviceStatus) -> bool {
        false
    }
    /// Backends behind it that serve the devices it cannot (named when no device has an AI
    /// Cube source). Default: none.
    fn fallbacks(&self) -> Vec<Backend> {
        Vec::new()
    }
    /// Stops every thread of the backend.
    fn stop(self: Box<Self>, shared: &Shared);
}

/// Every registered backend, in the order `--backend auto` tries them; [`discover`] skips
/// those the choice leaves out. The DCMI backend has the `npu-smi` fallback around it unless
/// `--backend dcmi` forbids `npu-smi`.
pub(crate) fn chain(choice: BackendChoice) -> Vec<Box<dyn DeviceBackend>> {
    let npu_smi_allowed = allows(choice, Backend::NpuSmi);
    vec![
        npu_smi_fallback::around(Box::<dcmi::Dcmi>::default(), npu_smi_allowed),
        Box::<npu_smi::NpuSmi>::default(),
    ]
}

/// Whether `--backend choice` lets `kind` be tried: `auto` tries every backend, a named
/// choice only its own.
fn allows(choice: BackendChoice, kind: Backend) -> bool {
    match choice {
        BackendChoice::Auto => true,
        BackendChoice::Dcmi => kind == Backend::Dcmi,
        BackendChoice::NpuSmi => kind == Backend::NpuSmi,
    }
}

/// `--backend`'s word for `choice`.
fn choice_name(choice: BackendChoice) -> &'static str {
    match choice {
        BackendChoice::Auto => "auto",
        BackendChoice::Dcmi => "dcmi",
        BackendChoice::NpuSmi => "npu-smi",
    }
}

/// The first backend of `chain` that `choice` allows and that finds NPUs, with them and
/// what was tried before it; else every backend with the reason it was not used.
pub(crate) fn discover(
    chain: Vec<Box<dyn DeviceBackend>>,
    choice: BackendChoice,
    driver: &DriverConfig,
    cfg: &SamplerConfig,
) -> Result<Discovered, StartError> {
    let not_tried = |b: &dyn DeviceBackend| {
        let error = format!("not tried (--backend {})", choice_name(choice));
        Tried::new(b.kind(), error)
    };
    let mut tried: Vec<Tried> = Vec::new();
    let last_allowed = chain.iter().rposition(|b| allows(choice, b.kind()));
    let mut chain = chain.into_iter().enumerate();
    while let Some((k, mut b)) = chain.next() {
        if !allows(choice, b.kind()) {
            tried.push(not_tried(b.as_ref()));
            continue;
        }
        match b.discover(driver, cfg) {
            Ok(found) if !found.is_empty() => {
                let left_out = chain
                    .filter(|(_, b)| !allows(choice, b.kind()))
                    .map(|(_, b)| not_tried(b.as_ref()))
                    .collect();
                return Ok(Discovered {
                    backend: b,
                    found,
                    tried,
                    left_out,
                });
            }
            Ok(_) => tried.push(Tried::new(b.kind(), "no NPU found")),
            Err(e) => {
                if Some(k) != last_allowed {
                    tracing::warn!("{} unavailable, trying the next backend: {e}", b.kind());
                }
                tried.push(Tried::new(b.kind(), e));
            }
        }
    }
    Err(StartError::NoBackend { tried })
}

/// The backend that found NPUs.
pub(crate) struct Discovered {
    pub backend: Box<dyn DeviceBackend>,
    pub found: Vec<DeviceInfo>,
    /// The backends tried before it, and why they were not used.
    pub tried: Vec<Tried>,
    /// The backends after it that `--backend` leaves out.
    pub left_out: Vec<Tried>,
}

/// A reader thread: stopped by dropping `stop` (or a message of its backend's own), joined
/// unless it does not end within `wait` (a call stuck in the driver), then left behind.
pub(crate) struct Thread {
    pub handle: JoinHandle<()>,
    pub stop: Option<Sender<()>>,
    /// Disconnects when the thread ends.
    pub done: Receiver<()>,
    pub wait: Duration,
    /// What the warning says when it is left behind.
    pub stuck: &'static str,
}

impl Thread {
    /// Stops the thread and waits for it up to its `wait`.
    pub(crate) fn stop(self, shared: &Shared) {
        drop(self.stop);
        match self.done.recv_timeout(self.wait) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                let device = shared
                    .sampler
                    .in_call()
                    .and_then(|(i, _, _)| shared.devices.get(i))
                    .map(|d| d.info.id);
                tracing::warn!(device = ?device, "{}; leaving it behind", self.stuck);
            }
            _ => {
                let _ = self.handle.join();
            }
        }
    }
}

/// Starts the watchdog for the devices of `shared`: it notices calls of `caller`'s thread
/// that hang and, with a `fallback`, runs `npu-smi` watch children for the devices handed
/// to it on `requests` (and for `watch_now` at once).
pub(crate) fn start_watchdog(
    ctx: &StartCtx<'_>,
    caller: Backend,
    fallback: Option<Fallback>,
    watch_now: Vec<usize>,
    requests: Receiver<super::watchdog::WatchRequest>,
) -> Result<Thread, StartError> {
    let cfg = super::watchdog::WatchdogConfig::new(ctx.driver, ctx.cfg, caller);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
    let shared = ctx.shared.clone();
    let handle = std::thread::Builder::new()
        .name("npu-watchdog".to_owned())
        .spawn(move || {
            let _done = done_tx;
            super::watchdog::run(shared, cfg, fallback, watch_now, requests, stop_rx)
        })?;
    Ok(Thread {
        handle,
        stop: Some(stop_tx),
        done: done_rx,
        // Stopping kills every watch child and awaits them against one 3 s deadline.
        wait: Duration::from_secs(5),
        stuck: "the watchdog thread did not stop (an npu-smi watch child is not reaped)",
    })
}
