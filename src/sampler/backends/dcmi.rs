//! `libdcmi.so`, dlopen'd: one OS thread finds, opens and enumerates the library, then owns
//! every call into it ([`dcmi_thread`](super::super::dcmi_thread)); a watchdog sees its
//! calls that hang and, with the `npu-smi` fallback, runs watch children for the devices
//! DCMI cannot read.

use super::{DeviceBackend, Reader, StartCtx, Thread, start_watchdog};
use crate::driver::dcmi::{Api, Dcmi as Library, LoadError, NpuChip, discovery};
use crate::driver::{Backend, DeviceInfo, DriverConfig};
use crate::sampler::dcmi_reads;
use crate::sampler::dcmi_thread::{self, Control, ControlTx};
use crate::sampler::status::DeviceStatus;
use crate::sampler::watchdog::{self, Fallback};
use crate::sampler::{SamplerConfig, Shared, Source, SourceReason, StartError, priority};
use crossbeam_channel::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

/// The DCMI backend: after discovery, its thread waiting for the devices to sample.
#[derive(Default)]
pub(super) struct Dcmi {
    running: Option<Started>,
    /// `npu-smi` watch children for the devices DCMI cannot read ([`super::npu_smi_fallback`]).
    fallback: Option<Fallback>,
}

/// The DCMI thread, once it enumerated the chips.
struct Started {
    handle: JoinHandle<()>,
    ctl: ControlTx,
    done: Receiver<()>,
    chips: Vec<NpuChip>,
}

impl DeviceBackend for Dcmi {
    fn kind(&self) -> Backend {
        Backend::Dcmi
    }

    fn discover(
        &mut self,
        driver: &DriverConfig,
        cfg: &SamplerConfig,
    ) -> Result<Vec<DeviceInfo>, String> {
        let (handle, ctl, done, (api, chips)) =
            start_thread(driver, cfg).map_err(|e| e.to_string())?;
        let infos = chips
            .iter()
            .map(|c| DeviceInfo {
                id: c.logic_id,
                card: c.card as u32,
                chip: (api == Api::V1).then_some(c.chip as u32),
                name: c.name.clone(),
                phy_id: c.phy_id,
            })
            .collect();
        self.running = Some(Started {
            handle,
            ctl,
            done,
            chips,
        });
        Ok(infos)
    }

    fn first_source(&self) -> Source {
        Source::DCMI_PROBING
    }

    fn first_reason(&self) -> SourceReason {
        SourceReason::Probing
    }

    fn accept_fallback(&mut self, fallback: Fallback) {
        self.fallback = Some(fallback);
    }

    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
        let Some(s) = self.running else {
            return Err(StartError::Invalid(
                "the DCMI backend was started before it discovered".to_owned(),
            ));
        };
        let chips: Vec<(usize, NpuChip)> = ctx
            .served
            .iter()
            .filter_map(|&(ring, found)| s.chips.get(found).map(|c| (ring, c.clone())))
            .collect();
        // The thread's hand-overs go to the watchdog; without a fallback nothing is sent.
        let (requests_tx, requests_rx) = crossbeam_channel::unbounded();
        let has_fallback = self.fallback.is_some();
        let watchdog = start_watchdog(&ctx, Backend::Dcmi, self.fallback, Vec::new(), requests_rx)?;
        s.ctl.send(Control::Start {
            shared: ctx.shared.clone(),
            chips,
            fallback: has_fallback.then_some(requests_tx),
        });
        Ok(Box::new(DcmiReader {
            ctl: s.ctl,
            watchdog,
            thread: Thread {
                handle: s.handle,
                stop: None,
                done: s.done,
                wait: Duration::from_secs(2),
                stuck: "DCMI thread is stuck in a driver call",
            },
            has_fallback,
        }))
    }
}

/// The started DCMI backend.
struct DcmiReader {
    /// The thread's control (period, shutdown).
    ctl: ControlTx,
    watchdog: Thread,
    thread: Thread,
    has_fallback: bool,
}

impl Reader for DcmiReader {
    fn set_period(&self, period: Duration) {
        self.ctl.send(Control::Period(period));
    }

    fn reads_faults(&self) -> bool {
        true
    }

    fn runs_passes(&self) -> bool {
        true
    }

    fn settling(&self, dev: &DeviceStatus) -> bool {
        // Two calls disagree (a second or two), or a hand-over awaits the npu-smi probe.
        (dcmi_reads::on_dcmi(dev.source()) && dev.reason().pending()) || watchdog::settling(dev)
    }

    fn fallbacks(&self) -> Vec<Backend> {
        if self.has_fallback {
            vec![Backend::NpuSmi]
        } else {
            Vec::new()
        }
    }

    fn stop(self: Box<Self>, shared: &Shared) {
        // The watchdog first: it kills and reaps the watch children.
        self.watchdog.stop(shared);
        self.ctl.send(Control::Shutdown);
        self.thread.stop(shared);
    }
}

type Side = (JoinHandle<()>, ControlTx, Receiver<()>, (Api, Vec<NpuChip>));

/// Spawns the DCMI thread, which finds, opens and enumerates the library; returns once it
/// reported the chips (or an error, or `init_timeout` passed).
fn start_thread(driver: &DriverConfig, cfg: &SamplerConfig) -> Result<Side, LoadError> {
    let path = discovery::find(&discovery::Search {
        explicit: driver.dcmi_lib.as_deref(),
        ld_library_path: driver.ld_library_path.as_deref(),
        standard_dirs: &driver.standard_dirs,
        check_owner: driver.check_owner,
    })?;
    let (init_tx, init_rx) = crossbeam_channel::bounded(1);
    let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
    let timing = dcmi_reads::LoopTiming {
        period: cfg.period,
        hbm_period: cfg.hbm_period,
        fault_period: cfg.fault_period,
        call_deadline: cfg.call_deadline,
        recheck: cfg.plausibility_recheck,
        // Rows come every `-d` seconds; one missed row is tolerated.
        npu_smi_opinion_max_age: Duration::from_secs(2 * u64::from(driver.watch_delay_s.max(1)))
            + Duration::from_millis(500),
    };
    let realtime = cfg.realtime;
    let thread_path = path.clone();
    let handle = std::thread::Builder::new()
        .name("npu-sampler".to_owned())
        .spawn(move || {
            let _done = done_tx;
            if realtime {
                match priority::make_current_thread_realtime() {
                    Ok(()) => tracing::debug!("sampler thread runs under SCHED_FIFO"),
                    Err(e) => tracing::info!("sampler thread stays at normal priority (SCHED_FIFO refused: {e}); its ticks can be late while the CPU is saturated"),
                }
            }
            let dcmi = Library::open(&thread_path);
            dcmi_thread::run(dcmi, init_tx, ctl_rx, timing);
        })
        .map_err(|e| LoadError::Thread(e.to_string()))?;
    match init_rx.recv_timeout(cfg.init_timeout) {
        Ok(Ok(chips)) => {
            let ctl = ControlTx::new(ctl_tx, handle.thread().clone());
            Ok((handle, ctl, done_rx, chips))
        }
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => Err(LoadError::InitTimeout {
            path,
            timeout: cfg.init_timeout,
        }),
    }
}
