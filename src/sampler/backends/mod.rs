//! The device backends: one file each, one line of selection ([`chain`]).
//!
//! A backend finds NPUs ([`DeviceBackend::discover`]) and then keeps reading the ones the
//! sampler selected ([`DeviceBackend::start`]): AI Cube figures into the ring, HBM, health
//! and fault codes into each [`DeviceStatus`](super::DeviceStatus). How it reads is its own
//! business: DCMI owns one OS thread that calls into the library; `npu-smi` runs long-lived
//! watch children (under the watchdog, which also serves a DCMI device whose calls hang)
//! and a fault-code thread. The sampler tries the backends `--backend` allows in order and
//! the first that finds NPUs serves them all; it holds the started [`Reader`], not a
//! backend-specific field per kind.
//!
//! A new backend (NVML, say) is a module here implementing [`DeviceBackend`], a line in
//! [`chain`], and its name in [`Backend`](crate::driver::Backend) (and, if its way of
//! reading is new, a [`Method`](super::source::Method)); [`scripted`] is one, in process,
//! for tests.

mod dcmi;
mod npu_smi;
pub mod scripted;

use super::dcmi_thread::{Control, ControlTx};
use super::watchdog::WatchRequest;
use super::{SamplerConfig, Shared, Source, StartError};
use crate::driver::npu_smi::WatchSupport;
use crate::driver::{Backend, BackendChoice, DeviceInfo, DriverConfig};
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// One way of finding and reading NPUs.
pub trait DeviceBackend: Send {
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
    /// Starts reading the selected devices.
    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Reader, StartError>;
}

/// What a backend's readers are started with.
pub struct StartCtx<'a> {
    pub shared: Arc<Shared>,
    /// `(ring index, index in what discover returned)` of every selected device.
    pub served: Vec<(usize, usize)>,
    pub driver: &'a DriverConfig,
    pub cfg: &'a SamplerConfig,
    /// Hands a device to `npu-smi` watch children (the watchdog), or asks for a cross-check.
    pub fallback: Sender<WatchRequest>,
}

/// The backends `choice` allows, in the order they are tried.
pub fn chain(choice: BackendChoice) -> Vec<Box<dyn DeviceBackend>> {
    let mut out: Vec<Box<dyn DeviceBackend>> = Vec::new();
    if choice != BackendChoice::NpuSmi {
        out.push(Box::<dcmi::Dcmi>::default());
    }
    if choice != BackendChoice::Dcmi {
        out.push(Box::<npu_smi::NpuSmi>::default());
    }
    out
}

/// The first backend of `chain` that finds NPUs, with them; else every backend's reason
/// (a backend not in the chain: "not tried").
pub fn discover(
    chain: Vec<Box<dyn DeviceBackend>>,
    choice: BackendChoice,
    driver: &DriverConfig,
    cfg: &SamplerConfig,
) -> Result<(Box<dyn DeviceBackend>, Vec<DeviceInfo>), StartError> {
    let not_tried = |b: &str| format!("not tried (--backend {b})");
    let mut failures: Vec<(Backend, String)> = Vec::new();
    let last = chain.len();
    for (k, mut b) in chain.into_iter().enumerate() {
        match b.discover(driver, cfg) {
            Ok(found) if !found.is_empty() => return Ok((b, found)),
            Ok(_) => failures.push((b.kind(), "no NPU found".to_owned())),
            Err(e) => {
                if k + 1 < last {
                    tracing::warn!("{} unavailable, trying the next backend: {e}", b.kind());
                }
                failures.push((b.kind(), e));
            }
        }
    }
    let reason = |kind: Backend| {
        failures
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, e)| e.clone())
    };
    Err(StartError::NoBackend {
        dcmi: reason(Backend::Dcmi).unwrap_or_else(|| match choice {
            BackendChoice::NpuSmi => not_tried("npu-smi"),
            _ => "not tried".to_owned(),
        }),
        npu_smi: reason(Backend::NpuSmi).unwrap_or_else(|| match choice {
            BackendChoice::Dcmi => not_tried("dcmi"),
            _ => "not tried".to_owned(),
        }),
    })
}

/// A started backend: what the sampler keeps of it.
pub struct Reader {
    pub kind: Backend,
    /// The DCMI thread's control (period, shutdown); `None` for a backend that paces
    /// nothing itself.
    control: Option<ControlTx>,
    threads: Vec<Thread>,
    /// Ring indices the watchdog serves from `npu-smi` watch children from the start.
    pub watch_now: Vec<usize>,
    /// The `npu-smi` capability probe's answer, when discovery ran it.
    pub watch_support: Option<WatchSupport>,
    /// Whether it reads its devices' fault codes.
    pub reads_faults: bool,
    /// Whether it runs sampling passes (`SamplerStatus::passes`).
    pub passes: bool,
}

/// A reader thread: stopped by dropping `stop` (or the control's shutdown), joined unless
/// it does not end within `wait` (a call stuck in the driver), then left behind.
struct Thread {
    handle: JoinHandle<()>,
    stop: Option<Sender<()>>,
    /// Disconnects when the thread ends.
    done: Receiver<()>,
    wait: Duration,
    /// What the warning says when it is left behind.
    stuck: &'static str,
}

impl Reader {
    /// Changes the sampling period, where the backend paces itself.
    pub fn set_period(&self, period: Duration) {
        if let Some(c) = &self.control {
            c.send(Control::Period(period));
        }
    }

    /// Stops every thread of the backend.
    pub fn stop(mut self, shared: &Shared) {
        if let Some(c) = self.control.take() {
            c.send(Control::Shutdown);
        }
        for t in self.threads.drain(..) {
            drop(t.stop);
            match t.done.recv_timeout(t.wait) {
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let device = shared
                        .sampler
                        .in_call()
                        .and_then(|(i, _, _)| shared.devices.get(i))
                        .map(|d| d.info.id);
                    tracing::warn!(device = ?device, "{}; leaving it behind", t.stuck);
                }
                _ => {
                    let _ = t.handle.join();
                }
            }
        }
    }
}
