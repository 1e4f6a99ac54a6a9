//! The DCMI sampler thread: the one OS thread that calls into `libdcmi.so`.
//!
//! It opens the library, enumerates the NPUs, then reads every DCMI-served device's AI Cube
//! usage each period and writes the results to the ring; HBM and health less often. Before
//! every call it publishes which device it is calling and since when, so the watchdog can see
//! a call that hangs without this thread's help.

use super::Shared;
use super::status::{CallKind, Source};
use crate::driver::dcmi::{Api, CubeCall, Dcmi, DcmiError, LoadError, NpuChip};
use crate::ring::Sample;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages to the DCMI thread.
#[derive(Debug)]
pub enum Control {
    /// Start sampling `chips` (ring device index, chip); devices DCMI cannot serve are sent
    /// to `fallback`.
    Start {
        shared: Arc<Shared>,
        chips: Vec<(usize, NpuChip)>,
        fallback: Sender<usize>,
    },
    /// Change the sampling period (applies from the next pass).
    Period(Duration),
    Shutdown,
}

/// Sending side of the control channel: every message also unparks the thread.
#[derive(Debug)]
pub struct ControlTx {
    tx: Sender<Control>,
    thread: std::thread::Thread,
}

impl ControlTx {
    /// Wraps the sender for the thread running [`run`].
    pub fn new(tx: Sender<Control>, thread: std::thread::Thread) -> ControlTx {
        ControlTx { tx, thread }
    }

    /// Sends `msg` and wakes the thread.
    pub fn send(&self, msg: Control) {
        let _ = self.tx.send(msg);
        self.thread.unpark();
    }
}

/// Timing of the loop.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Time between passes.
    pub period: Duration,
    /// Time between HBM/health reads.
    pub hbm_period: Duration,
    /// Answers slower than this are discarded (the watchdog uses the same deadline).
    pub call_deadline: Duration,
}

/// Thread body: open, report the chips on `init`, then sample until shut down.
pub fn run(
    dcmi: Result<Dcmi, LoadError>,
    init: Sender<Result<(Api, Vec<NpuChip>), LoadError>>,
    ctl: Receiver<Control>,
    mut timing: Timing,
) {
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
    let dcmi = match opened {
        Ok((d, chips)) => {
            if init.send(Ok((d.api(), chips))).is_err() {
                return;
            }
            d
        }
        Err(e) => {
            let _ = init.send(Err(e));
            return;
        }
    };
    let (shared, chips, fallback) = loop {
        match ctl.recv() {
            Ok(Control::Start {
                shared,
                chips,
                fallback,
            }) => break (shared, chips, fallback),
            Ok(Control::Period(p)) => timing.period = p,
            Ok(Control::Shutdown) | Err(_) => return,
        }
    };
    let mut calls: Vec<CubeCall> = chips.iter().map(|_| CubeCall::Multi).collect();
    let mut next = Instant::now();
    let mut next_hbm = next;
    loop {
        // Sleep until the next pass with park_timeout rather than a blocking channel receive:
        // channel receives spin and yield before they park, which costs more CPU per pass
        // than reading 16 devices. Senders unpark the thread (see `ControlTx`).
        let lateness = loop {
            loop {
                match ctl.try_recv() {
                    Ok(Control::Period(p)) => {
                        timing.period = p;
                        next = Instant::now();
                    }
                    Ok(Control::Start { .. }) => {}
                    Ok(Control::Shutdown) | Err(TryRecvError::Disconnected) => return,
                    Err(TryRecvError::Empty) => break,
                }
            }
            let now = Instant::now();
            if now >= next {
                break now - next;
            }
            std::thread::park_timeout(next - now);
        };
        shared.sampler.record_lateness(lateness);
        // One clock read per call: the time an answer arrived is the next call's start.
        let mut clock = shared.ring.now_ns();
        for (slot, (idx, chip)) in chips.iter().enumerate() {
            clock = read_cube(
                &dcmi,
                &shared,
                *idx,
                chip,
                &mut calls[slot],
                &fallback,
                timing.call_deadline,
                clock,
            );
        }
        let now = Instant::now();
        if now >= next_hbm {
            for (idx, chip) in &chips {
                read_hbm_and_health(&dcmi, &shared, *idx, chip);
            }
            next_hbm = now + timing.hbm_period;
        }
        shared.sampler.pass_done(shared.ring.now_ns());
        next += timing.period;
        let now = Instant::now();
        if next < now {
            shared.sampler.overrun();
            next = now + timing.period;
        }
    }
}

/// One AI Cube read with the fallback chain: multi → single type 14 → hand to npu-smi.
/// `now` is the ring time before the call; returns the ring time after it.
#[allow(clippy::too_many_arguments)]
fn read_cube(
    dcmi: &Dcmi,
    shared: &Shared,
    idx: usize,
    chip: &NpuChip,
    call: &mut CubeCall,
    fallback: &Sender<usize>,
    deadline: Duration,
    mut now: u64,
) -> u64 {
    let dev = &shared.devices[idx];
    loop {
        let before = dev.source();
        if !before.is_dcmi() {
            return now;
        }
        let started = now;
        shared.sampler.enter_call(idx, CallKind::Cube, started);
        let result = dcmi.aicube(chip, *call);
        shared.sampler.leave_call();
        // Stamped when the answer arrived, so ring order and time order agree.
        let ts = shared.ring.now_ns();
        now = ts;
        // The watchdog may have moved the device while the call hung: drop the late answer.
        if !dev.source().is_dcmi() {
            return now;
        }
        let invalid = |ts_ns| {
            shared.ring.push(Sample {
                device: idx as u16,
                ts_ns,
                value: 0,
                valid: false,
            })
        };
        // An answer slower than the deadline describes the past: not a current reading.
        if ts.saturating_sub(started) > deadline.as_nanos() as u64 {
            invalid(ts);
            // Identical text each time (the elapsed time is a debug line), so a driver that
            // is always late is one rate-limited warning, not one line per pass.
            tracing::warn!(
                device = dev.info.id,
                "AI Cube read answered later than the {deadline:?} deadline; reading discarded"
            );
            tracing::debug!(
                device = dev.info.id,
                "late AI Cube read took {:?}",
                Duration::from_nanos(ts - started)
            );
            return now;
        }
        match result {
            Ok(v) => {
                if before != Source::of_call(*call) {
                    dev.replace_source(before, Source::of_call(*call));
                }
                shared.ring.push(Sample {
                    device: idx as u16,
                    ts_ns: ts,
                    value: v,
                    valid: true,
                });
                let ended = dev.record_value(ts, v);
                if ended != 0 {
                    tracing::info!(
                        device = dev.info.id,
                        "AI Cube reads recovered after error {ended}"
                    );
                }
                if dev.clear_hung() {
                    tracing::info!(
                        device = dev.info.id,
                        "DCMI calls on the device answer in time again"
                    );
                }
                return now;
            }
            Err(DcmiError::NotSupport | DcmiError::SymbolMissing { .. })
                if *call == CubeCall::Multi =>
            {
                *call = CubeCall::Single;
            }
            Err(e @ (DcmiError::NotSupport | DcmiError::SymbolMissing { .. })) => {
                dev.record_error(ts, e.code());
                if dev.replace_source(before, Source::NpuSmiPending) {
                    tracing::warn!(device = dev.info.id, error = %e, "AI Cube is not available through DCMI (multi-utilization and type 14)");
                    let _ = fallback.send(idx);
                }
                return now;
            }
            Err(e) => {
                invalid(ts);
                if dev.record_error(ts, e.code()) {
                    tracing::warn!(device = dev.info.id, error = %e, "AI Cube read failed; samples are invalid until it recovers");
                }
                return now;
            }
        }
    }
}

/// HBM and health of one device. Skipped once a call on the device hung, so a broken device
/// does not stall the thread every second; the snapshot shows the figures' age.
fn read_hbm_and_health(dcmi: &Dcmi, shared: &Shared, idx: usize, chip: &NpuChip) {
    let dev = &shared.devices[idx];
    if dev.is_hung() {
        return;
    }
    shared
        .sampler
        .enter_call(idx, CallKind::Telemetry, shared.ring.now_ns());
    let hbm = dcmi.hbm(chip);
    let health = dcmi.health(chip);
    shared.sampler.leave_call();
    let ts = shared.ring.now_ns();
    if let Ok(h) = hbm {
        dev.record_hbm(ts, h.used_mb, h.total_mb);
    }
    if let Ok(h) = health {
        dev.record_health(ts, h);
    }
}
