//! The device seam seen from a new backend: one written here, test-only, with only the
//! methods a backend must have (no pacing, no fault codes, no fallback, no watchdog), runs
//! through the same sampler, and one that finds nothing is named in the start-up error.
//! Neither needs a line in any other file of the sampler.

use super::{DeviceBackend, Reader, StartCtx, Thread, chain, discover};
use crate::driver::{Backend, BackendChoice, DeviceInfo, DriverConfig};
use crate::ring::Sample;
use crate::sampler::source::Method;
use crate::sampler::{Sampler, SamplerConfig, Shared, Source, SourceReason, StartError, Tried};
use std::time::Duration;

/// A backend that finds `ids` (or fails with `fails`) and writes a constant 33 % for each.
struct Minimal {
    ids: Vec<u32>,
    fails: Option<&'static str>,
}

impl DeviceBackend for Minimal {
    fn kind(&self) -> Backend {
        Backend::Scripted
    }

    fn discover(&mut self, _: &DriverConfig, _: &SamplerConfig) -> Result<Vec<DeviceInfo>, String> {
        if let Some(why) = self.fails {
            return Err(why.to_owned());
        }
        Ok(self
            .ids
            .iter()
            .map(|&id| DeviceInfo {
                id,
                card: id,
                chip: None,
                name: "minimal".to_owned(),
                phy_id: None,
            })
            .collect())
    }

    fn first_source(&self) -> Source {
        Source::of(Backend::Scripted, Method::Script)
    }

    fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
        let rings: Vec<usize> = ctx.served.iter().map(|&(ring, _)| ring).collect();
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let shared = ctx.shared.clone();
        let period = ctx.cfg.period;
        let handle = std::thread::Builder::new()
            .name("npu-minimal".to_owned())
            .spawn(move || {
                let _done = done_tx;
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(period)
                {
                    let now = shared.ring.now_ns();
                    for &ring in &rings {
                        shared.ring.push(Sample {
                            device: ring as u16,
                            ts_ns: now,
                            value: 33,
                            valid: true,
                        });
                        shared.devices[ring].record_value(now, 33);
                    }
                }
            })?;
        Ok(Box::new(MinimalReader(Thread {
            handle,
            stop: Some(stop_tx),
            done: done_rx,
            wait: Duration::from_secs(1),
            stuck: "the minimal backend's thread did not stop",
        })))
    }
}

/// Its reader: only the one method a reader must have.
struct MinimalReader(Thread);

impl Reader for MinimalReader {
    fn stop(self: Box<Self>, shared: &Shared) {
        self.0.stop(shared);
    }
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        period: Duration::from_millis(5),
        ..SamplerConfig::default()
    }
}

fn minimal(ids: &[u32]) -> Box<dyn DeviceBackend> {
    Box::new(Minimal {
        ids: ids.to_vec(),
        fails: None,
    })
}

// The defaults carry it: it settles without passes or fault reads, keeps the reason a
// backend gets by default, takes a period change it does not pace, starts no watchdog,
// serves windows, and stops.
#[test]
fn a_backend_with_only_the_required_methods_serves_through_the_sampler() {
    let mut sampler =
        Sampler::start_with(vec![minimal(&[2, 5])], &DriverConfig::default(), &cfg()).unwrap();
    assert!(sampler.wait_settled(Duration::from_secs(5)));
    sampler.set_period(Duration::from_millis(10)).unwrap();
    let shared = sampler.shared().clone();
    assert_eq!(shared.devices.len(), 2);
    assert_eq!(shared.devices[1].reason(), SourceReason::NoDcmi);
    assert_eq!(shared.devices[1].source().name(), "scripted-script");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while shared.devices[1]
        .snapshot(shared.ring.now_ns())
        .last_value
        .is_none()
    {
        assert!(std::time::Instant::now() < deadline, "no reading");
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = sampler.window(&[5], Duration::from_secs(1)).unwrap();
    assert_eq!(report.combined.peak, Some(33));
    assert!(sampler.require_cube_source().is_ok());
    assert_eq!(
        shared.sampler.last_watchdog_tick(),
        None,
        "no backend asked for a watchdog"
    );
    assert_eq!(shared.sampler.passes(), 0);
    sampler.shutdown();
}

// The start-up error lists every backend of the chain in order with its own reason,
// whatever the backend is, and one `--backend` leaves out as not tried.
#[test]
fn the_start_up_error_names_each_backend_tried_with_its_reason() {
    let failing = |why| {
        Box::new(Minimal {
            ids: Vec::new(),
            fails: Some(why),
        }) as Box<dyn DeviceBackend>
    };
    let driver = DriverConfig::default();
    let chain = vec![failing("no such bus"), minimal(&[])];
    let Err(StartError::NoBackend { tried }) =
        discover(chain, BackendChoice::Auto, &driver, &cfg())
    else {
        panic!("a backend was found");
    };
    assert_eq!(
        tried,
        [
            Tried::new(Backend::Scripted, "no such bus"),
            Tried::new(Backend::Scripted, "no NPU found"),
        ]
    );
    let e = StartError::NoBackend { tried };
    assert_eq!(
        e.to_string(),
        "no usable driver backend: scripted: no such bus; scripted: no NPU found"
    );
    let Err(e) = discover(vec![minimal(&[1])], BackendChoice::Dcmi, &driver, &cfg()) else {
        panic!("--backend dcmi tried the scripted backend");
    };
    assert_eq!(
        e.to_string(),
        "no usable driver backend: scripted: not tried (--backend dcmi)"
    );
}

// A backend found NPUs but none has a figure: the error names it with its devices' reason.
#[test]
fn no_cube_source_names_the_backend_that_found_the_npus() {
    struct Blind(Minimal);
    impl DeviceBackend for Blind {
        fn kind(&self) -> Backend {
            self.0.kind()
        }
        fn discover(
            &mut self,
            d: &DriverConfig,
            c: &SamplerConfig,
        ) -> Result<Vec<DeviceInfo>, String> {
            self.0.discover(d, c)
        }
        fn first_source(&self) -> Source {
            Source::UNAVAILABLE
        }
        fn start(self: Box<Self>, ctx: StartCtx<'_>) -> Result<Box<dyn Reader>, StartError> {
            let Blind(inner) = *self;
            Box::new(inner).start(ctx)
        }
    }
    let blind = Box::new(Blind(Minimal {
        ids: vec![0],
        fails: None,
    }));
    let sampler = Sampler::start_with(vec![blind], &DriverConfig::default(), &cfg()).unwrap();
    let e = sampler.require_cube_source().unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "no usable driver backend: scripted: no AI Cube source on any NPU: {}",
            crate::sampler::source::note(
                SourceReason::NoDcmi,
                0,
                crate::driver::dcmi::UtilType::AiCube
            )
        )
    );
    sampler.shutdown();
}

// The registered chain: DCMI (with the npu-smi fallback around it unless --backend dcmi)
// then npu-smi; every backend is in it whatever the choice, discovery skips the left out.
#[test]
fn the_chain_registers_every_backend_once() {
    for choice in [
        BackendChoice::Auto,
        BackendChoice::Dcmi,
        BackendChoice::NpuSmi,
    ] {
        let kinds: Vec<Backend> = chain(choice).iter().map(|b| b.kind()).collect();
        assert_eq!(kinds, [Backend::Dcmi, Backend::NpuSmi], "{choice:?}");
    }
}
