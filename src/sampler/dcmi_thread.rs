//! The DCMI sampler thread: the one OS thread that calls into `libdcmi.so`.
//!
//! It opens the library, enumerates the NPUs, then reads every DCMI-served device's AI Cube
//! usage each period and writes the results to the ring; HBM and health less often. Before
//! every call it publishes which device it is calling and since when, so the watchdog can see
//! a call that hangs without this thread's help. What a pass reads of each device is
//! [`dcmi_reads`](super::dcmi_reads), and whether an answer is a reading is decided by
//! [`plausibility`](super::plausibility); this file opens, starts and paces the passes.

use super::Shared;
use super::dcmi_reads::{Ctx, LoopTiming, Slot, read_all_faults, read_cube, read_hbm_and_health};
use super::plausibility::CubeJudge;
use super::watchdog::WatchRequest;
use crate::driver::dcmi::{Api, CubeCall, Dcmi, LoadError, NpuChip};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages to the DCMI thread.
#[derive(Debug)]
pub(super) enum Control {
    /// Start sampling `chips` (ring device index, chip); devices DCMI cannot serve, and
    /// devices that need an `npu-smi` cross-check, are sent to the watchdog on `fallback`
    /// (`None`: no `npu-smi` fallback, such a device has no AI Cube source).
    Start {
        shared: Arc<Shared>,
        chips: Vec<(usize, NpuChip)>,
        fallback: Option<Sender<WatchRequest>>,
    },
    /// Change the sampling period (applies from the next pass).
    Period(Duration),
    Shutdown,
}

/// Sending side of the control channel: every message also unparks the thread.
#[derive(Debug)]
pub(super) struct ControlTx {
    tx: Sender<Control>,
    thread: std::thread::Thread,
}

impl ControlTx {
    /// Wraps the sender for the thread running [`run`].
    pub(super) fn new(tx: Sender<Control>, thread: std::thread::Thread) -> ControlTx {
        ControlTx { tx, thread }
    }

    /// Sends `msg` and wakes the thread.
    pub(super) fn send(&self, msg: Control) {
        let _ = self.tx.send(msg);
        self.thread.unpark();
    }
}

/// What the thread samples once started.
struct Started {
    shared: Arc<Shared>,
    slots: Vec<Slot>,
    fallback: Option<Sender<WatchRequest>>,
}

/// When the next reads are due.
struct Due {
    pass: Instant,
    hbm: Instant,
    faults: Instant,
    /// Whether the driver has a fault-code call (asked until it answers it has none).
    faults_readable: bool,
}

/// Thread body: open, report the chips on `init`, then sample until shut down.
pub(super) fn run(
    dcmi: Result<Dcmi, LoadError>,
    init: Sender<Result<(Api, Vec<NpuChip>), LoadError>>,
    ctl: Receiver<Control>,
    mut timing: LoopTiming,
) {
    let Some(dcmi) = open(dcmi, &init) else {
        return;
    };
    let Some(mut started) = wait_for_start(&ctl, &mut timing) else {
        return;
    };
    let now = Instant::now();
    let mut due = Due {
        pass: now,
        hbm: now,
        faults: now,
        faults_readable: true,
    };
    while let Some(lateness) = wait_for_pass(&ctl, &mut timing, &mut due.pass) {
        let shared = started.shared.clone();
        shared.sampler.record_lateness(lateness);
        let ctx = Ctx {
            dcmi: &dcmi,
            shared: &shared,
            fallback: started.fallback.as_ref(),
            timing: &timing,
        };
        pass(&ctx, &mut started.slots, &mut due);
        shared.sampler.pass_done(shared.ring.now_ns());
        let (next, overrun) = next_pass(due.pass, timing.period, Instant::now());
        due.pass = next;
        if overrun {
            shared.sampler.overrun();
        }
    }
}

/// Enumerates the opened library and reports the chips (or why not) on `init`; `None`
/// when there is nothing to sample.
fn open(
    dcmi: Result<Dcmi, LoadError>,
    init: &Sender<Result<(Api, Vec<NpuChip>), LoadError>>,
) -> Option<Dcmi> {
    let opened = dcmi.and_then(|d| match d.chips() {
        Ok(c) if c.is_empty() => Err(LoadError::NoNpu {
            path: d.path().to_owned(),
        }),
        Ok(c) => Ok((d, c)),
        Err(source) => Err(LoadError::Enumerate {
            path: d.path().to_owned(),
            source,
        }),
    });
    match opened {
        Ok((d, chips)) => init.send(Ok((d.api(), chips))).is_ok().then_some(d),
        Err(e) => {
            let _ = init.send(Err(e));
            None
        }
    }
}

/// Waits for the devices to sample; `None` on shutdown.
fn wait_for_start(ctl: &Receiver<Control>, timing: &mut LoopTiming) -> Option<Started> {
    loop {
        match ctl.recv() {
            Ok(Control::Start {
                shared,
                chips,
                fallback,
            }) => {
                let slots = chips
                    .into_iter()
                    .map(|(idx, chip)| Slot {
                        idx,
                        chip,
                        call: CubeCall::Multi,
                        judge: CubeJudge::new(timing.recheck),
                        cross_check: false,
                        fault_texts: HashMap::new(),
                    })
                    .collect();
                return Some(Started {
                    shared,
                    slots,
                    fallback,
                });
            }
            Ok(Control::Period(p)) => timing.period = p,
            Ok(Control::Shutdown) | Err(_) => return None,
        }
    }
}

/// Sleeps until the pass due at `next` (a period change makes it due now) and returns how
/// late it starts; `None` on shutdown.
fn wait_for_pass(
    ctl: &Receiver<Control>,
    timing: &mut LoopTiming,
    next: &mut Instant,
) -> Option<Duration> {
    // park_timeout rather than a blocking channel receive: channel receives spin and yield
    // before they park, which costs more CPU per pass than reading 16 devices. Senders
    // unpark the thread (see `ControlTx`).
    loop {
        loop {
            match ctl.try_recv() {
                Ok(Control::Period(p)) => {
                    timing.period = p;
                    *next = Instant::now();
                }
                Ok(Control::Start { .. }) => {}
                Ok(Control::Shutdown) | Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => break,
            }
        }
        let now = Instant::now();
        if now >= *next {
            return Some(now - *next);
        }
        std::thread::park_timeout(*next - now);
    }
}

/// When the pass after the one due at `due` is, seen at `now`: one period on, or a whole
/// period from now when that is already past (an overrun: `true`).
fn next_pass(due: Instant, period: Duration, now: Instant) -> (Instant, bool) {
    let next = due + period;
    if next < now {
        (now + period, true)
    } else {
        (next, false)
    }
}

/// One pass: health and HBM and the fault codes when due, then every device's AI Cube.
fn pass(ctx: &Ctx<'_>, slots: &mut [Slot], due: &mut Due) {
    let (dcmi, shared, timing) = (ctx.dcmi, ctx.shared, ctx.timing);
    // Health first, so that a device the driver reports gone is not read as present.
    let now = Instant::now();
    if now >= due.hbm {
        for slot in slots.iter() {
            read_hbm_and_health(dcmi, shared, slot.idx, &slot.chip);
        }
        due.hbm = now + timing.hbm_period;
    }
    if due.faults_readable && now >= due.faults {
        due.faults_readable = read_all_faults(dcmi, shared, slots);
        due.faults = now + timing.fault_period;
    }
    // One clock read per call: the time an answer arrived is the next call's start.
    let mut clock = shared.ring.now_ns();
    for slot in slots.iter_mut() {
        clock = read_cube(ctx, slot, clock);
    }
}

#[cfg(test)]
mod tests {
    use super::next_pass;
    use std::time::{Duration, Instant};

    // The next pass is one period after the one due, or a whole period from now when the
    // pass ran past it (an overrun: the missed passes are skipped, not run back to back).
    #[test]
    fn the_next_pass_is_one_period_on_unless_the_pass_overran() {
        let t0 = Instant::now();
        let p = Duration::from_millis(50);
        assert_eq!(
            next_pass(t0, p, t0 + Duration::from_millis(10)),
            (t0 + p, false)
        );
        assert_eq!(next_pass(t0, p, t0 + p), (t0 + p, false), "exactly on time");
        let late = t0 + Duration::from_millis(120);
        assert_eq!(next_pass(t0, p, late), (late + p, true));
    }
}
