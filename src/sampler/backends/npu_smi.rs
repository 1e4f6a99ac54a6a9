//! `npu-smi`: the capability probe and `npu-smi info -m` find the NPUs; long-lived
//! `npu-smi info watch -s u` children read AI Cube (run by the watchdog, which also serves
//! a DCMI device whose calls hang), and a thread reads the fault codes
//! ([`npu_smi_faults`](super::super::npu_smi_faults)).

use super::{DeviceBackend, Reader, StartCtx, Thread, start_watchdog};
use crate::driver::npu_smi::{self, WatchSupport};
use crate::driver::{Backend, DeviceInfo, DriverConfig};
use crate::sampler::status::DeviceStatus;
use crate::sampler::watchdog::{self, Fallback};
use crate::sampler::{SamplerConfig, Shared, Source, StartError, npu_smi_faults};
use std::time::Duration;

/// The `npu-smi` backend; discovery keeps the capability probe's answer for the watchdog.
#[derive(Default)]
pub(super) struct NpuSmi {
    support: Option<WatchSupport>,
}

impl DeviceBackend for NpuSmi {
    fn kind(&self) -> Backend {
        Backend::NpuSmi
    }

    fn discover(
        &mut self,
        driver: &DriverConfig,
        _cfg: &SamplerConfig,
    ) -> Result<Vec<DeviceInfo>, String> {
        let support = npu_smi::probe::watch_support(&driver.npu_smi, npu_smi::probe::PROBE_TIMEOUT);
        let mapped = match &support {
            WatchSupport::Unsupported(w) => Err(w.clone()),
            WatchSupport::Supported => {
                npu_smi::enumerate(&driver.npu_smi, npu_smi::probe::PROBE_TIMEOUT)
                    .map_err(|e| e.to_string())
            }
        };
        self.support = Some(support);
        Ok(mapped?
            .into_iter()
            .map(|m| DeviceInfo {
                id: m.logic_id,
                card: m.npu,
                chip: m.chip,
                name: m.name,
                phy_id: m.phy_id,
            })
            .collect())
    }

    fn first_source(&self) -> Source {
        Source::NPU_SMI_PENDING
    }

    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
        let served: Vec<usize> = ctx.served.iter().map(|&(ring, _)| ring).collect();
        // Its devices start on watch children at once, with the probe discovery ran.
        let fallback = Fallback::new(ctx.driver, self.support);
        let watchdog = start_watchdog(
            &ctx,
            Backend::NpuSmi,
            Some(fallback),
            served.clone(),
            crossbeam_channel::never(),
        )?;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let (shared, tool, period) = (
            ctx.shared.clone(),
            ctx.driver.npu_smi.clone(),
            ctx.cfg.fault_period,
        );
        let handle = std::thread::Builder::new()
            .name("npu-smi-faults".to_owned())
            .spawn(move || npu_smi_faults::run(shared, tool, served, period, stop_rx, done_tx))?;
        Ok(Box::new(NpuSmiReader {
            threads: [
                watchdog,
                Thread {
                    handle,
                    stop: Some(stop_tx),
                    done: done_rx,
                    // At most one `npu-smi` run (its timeout) to wait for; a tool stuck in
                    // the driver past its kill is left behind, as a stuck DCMI thread is.
                    wait: npu_smi_faults::TIMEOUT + Duration::from_secs(1),
                    stuck: "the npu-smi fault reader is stuck in an npu-smi run",
                },
            ],
        }))
    }
}

/// The started `npu-smi` backend: the watchdog (with the watch children), then the fault
/// reader.
struct NpuSmiReader {
    threads: [Thread; 2],
}

impl Reader for NpuSmiReader {
    fn reads_faults(&self) -> bool {
        true
    }

    fn settling(&self, dev: &DeviceStatus) -> bool {
        watchdog::settling(dev)
    }

    fn stop(self: Box<Self>, shared: &Shared) {
        for t in self.threads {
            t.stop(shared);
        }
    }
}
