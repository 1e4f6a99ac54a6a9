//! Scripted NPUs, in process: the third implementation of [`DeviceBackend`], for tests.
//! Never in [`chain`](super::chain); a test hands it to `Sampler::start_with`. It reads
//! nothing: every period it writes each NPU's scripted AI Cube figure into the ring, and
//! its HBM, health and fault codes into the device's status, through the same sampler,
//! shared state and reports as the real backends.

use super::{DeviceBackend, Reader, StartCtx, Thread};
use crate::driver::{Backend, DeviceInfo, DriverConfig};
use crate::ring::Sample;
use crate::sampler::source::Method;
use crate::sampler::status::FaultCode;
use crate::sampler::{SamplerConfig, Shared, Source, StartError};
use std::time::Duration;

/// One scripted NPU.
#[derive(Debug, Clone)]
pub(super) struct ScriptedNpu {
    pub info: DeviceInfo,
    /// AI Cube percent, every period.
    pub cube: u8,
    /// HBM used and total, MB.
    pub hbm_mb: (u64, u64),
    pub health: u32,
    pub faults: Vec<u32>,
}

/// The scripted backend.
#[derive(Debug, Clone)]
pub(super) struct Scripted {
    pub npus: Vec<ScriptedNpu>,
}

impl DeviceBackend for Scripted {
    fn kind(&self) -> Backend {
        Backend::Scripted
    }

    fn discover(&mut self, _: &DriverConfig, _: &SamplerConfig) -> Result<Vec<DeviceInfo>, String> {
        Ok(self.npus.iter().map(|n| n.info.clone()).collect())
    }

    fn first_source(&self) -> Source {
        Source::of(Backend::Scripted, Method::Script)
    }

    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
        let served: Vec<(usize, ScriptedNpu)> = ctx
            .served
            .iter()
            .filter_map(|&(ring, found)| self.npus.get(found).map(|n| (ring, n.clone())))
            .collect();
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let shared = ctx.shared.clone();
        let period = ctx.cfg.period;
        let handle = std::thread::Builder::new()
            .name("npu-scripted".to_owned())
            .spawn(move || {
                let _done = done_tx;
                loop {
                    let now = shared.ring.now_ns();
                    for (ring, npu) in &served {
                        let d = &shared.devices[*ring];
                        shared.ring.push(Sample {
                            device: *ring as u16,
                            ts_ns: now,
                            value: npu.cube,
                            valid: true,
                        });
                        d.record_value(now, npu.cube);
                        d.record_hbm(now, npu.hbm_mb.0, npu.hbm_mb.1);
                        d.record_health(now, npu.health);
                        d.record_faults(
                            now,
                            Ok(npu
                                .faults
                                .iter()
                                .map(|c| FaultCode::new(*c, None))
                                .collect()),
                        );
                    }
                    shared.sampler.pass_done(now);
                    match stop_rx.recv_timeout(period) {
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })?;
        Ok(Box::new(ScriptedReader {
            thread: Thread {
                handle,
                stop: Some(stop_tx),
                done: done_rx,
                wait: Duration::from_secs(1),
                stuck: "the scripted backend's thread did not stop",
            },
        }))
    }
}

/// The started scripted backend: its one thread.
struct ScriptedReader {
    thread: Thread,
}

impl Reader for ScriptedReader {
    fn reads_faults(&self) -> bool {
        true
    }

    fn runs_passes(&self) -> bool {
        true
    }

    fn stop(self: Box<Self>, shared: &Shared) {
        self.thread.stop(shared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::fault_levels::FaultLevel;
    use crate::sampler::Sampler;

    // A third backend through the same sampler: discovery, selection, the ring, the status
    // the reports read, the fault levels, settling and shutdown, with no other file of the
    // sampler knowing it.
    #[test]
    fn a_scripted_backend_serves_through_the_same_sampler() {
        let npu = |id: u32, cube: u8, faults: Vec<u32>| ScriptedNpu {
            info: DeviceInfo {
                id,
                card: id,
                chip: Some(0),
                name: "scripted".to_owned(),
                phy_id: Some(id),
            },
            cube,
            hbm_mb: (1024, 65536),
            health: 0,
            faults,
        };
        let backend = Scripted {
            npus: vec![npu(4, 40, vec![]), npu(7, 70, vec![0x80E1_8402])],
        };
        let cfg = SamplerConfig {
            period: Duration::from_millis(5),
            devices: Some(vec![7]),
            ..SamplerConfig::default()
        };
        let sampler =
            Sampler::start_with(vec![Box::new(backend)], &DriverConfig::default(), &cfg).unwrap();
        assert!(sampler.wait_settled(Duration::from_secs(5)));
        assert_eq!(sampler.devices().len(), 1, "the selection");
        let now = sampler.shared().ring.now_ns();
        let snap = sampler.devices()[0].snapshot(now);
        assert_eq!(
            (snap.id, snap.backend, snap.last_value),
            (7, Backend::Scripted, Some(70))
        );
        assert_eq!(snap.source.name(), "scripted-script");
        assert_eq!(snap.hbm_used_mb, Some(1024));
        let report = sampler.window(&[7], Duration::from_secs(1)).unwrap();
        assert_eq!(report.combined.peak, Some(70));
        let faults = sampler.shared().evidence_faults_of(0);
        assert_eq!(faults[0].level, FaultLevel::SeparateNPU);
        sampler.shutdown();
    }
}
