//! What the DCMI thread reads of one device in a pass: AI Cube through its fallback chain
//! (multi-utilization, judged → type 14, judged → handed to `npu-smi`), HBM and health, and
//! the fault codes, each written to the ring or the device's status. The loop that paces the
//! passes is [`super::dcmi_thread`]; whether an answer is a reading is decided by
//! [`super::plausibility`].

use super::Shared;
use super::codes;
use super::liveness::CallKind;
use super::plausibility::{CubeJudge, MultiStep, MultiTrust, SingleStep, Unreal};
use super::source::{Source, SourceReason};
use super::status::FaultCode;
use super::watchdog::{NO_FALLBACK, WatchRequest};
use crate::driver::Backend;
use crate::driver::dcmi::{CubeCall, Dcmi, DcmiError, Health, MultiUtil, NpuChip, UtilType};
use crate::ring::Sample;
use crossbeam_channel::Sender;
use std::collections::HashMap;
use std::time::Duration;

/// Timing of the loop.
#[derive(Debug, Clone, Copy)]
pub(super) struct LoopTiming {
    /// Time between passes.
    pub period: Duration,
    /// Time between HBM/health reads.
    pub hbm_period: Duration,
    /// Time between fault-code reads.
    pub fault_period: Duration,
    /// Answers slower than this are discarded (the watchdog uses the same deadline).
    pub call_deadline: Duration,
    /// Time between re-checks of a judged multi-utilization call.
    pub recheck: Duration,
    /// A cross-check `npu-smi` row older than this no longer vouches against a type-14 zero.
    pub npu_smi_opinion_max_age: Duration,
}

/// One DCMI-served device as the thread sees it.
pub(super) struct Slot {
    /// Ring device index.
    pub(super) idx: usize,
    pub(super) chip: NpuChip,
    pub(super) call: CubeCall,
    pub(super) judge: CubeJudge,
    /// The watchdog was asked for an `npu-smi` cross-check watch (the device reads type 14).
    pub(super) cross_check: bool,
    /// Texts of the fault codes seen on this device (asked once per code).
    pub(super) fault_texts: HashMap<u32, Option<String>>,
}

/// What every read needs.
pub(super) struct Ctx<'a> {
    pub(super) dcmi: &'a Dcmi,
    pub(super) shared: &'a Shared,
    pub(super) fallback: Option<&'a Sender<WatchRequest>>,
    pub(super) timing: &'a LoopTiming,
}

/// Whether the DCMI thread reads AI Cube of a device on `source`.
pub(super) fn on_dcmi(source: Source) -> bool {
    source.backend == Backend::Dcmi
}

/// The source of a device whose AI Cube DCMI reads through `call`.
fn source_of(call: CubeCall) -> Source {
    match call {
        CubeCall::Multi => Source::DCMI_MULTI,
        CubeCall::Single => Source::DCMI_SINGLE,
    }
}

/// Reads every device's fault codes; `false` (said once on every device) when the driver
/// has no fault-code call.
pub(super) fn read_all_faults(dcmi: &Dcmi, shared: &Shared, slots: &mut [Slot]) -> bool {
    for slot in slots.iter_mut() {
        if !read_faults(dcmi, shared, slot) {
            // Said once on every device, so a report shows why it has no codes.
            for s in slots.iter() {
                shared.devices[s.idx].record_faults(
                    shared.ring.now_ns(),
                    Err("the driver has no fault-code call (not asked again)".to_owned()),
                );
            }
            return false;
        }
    }
    true
}

/// What one pass decided for a device.
enum Outcome {
    Reading(u8),
    Invalid(i32),
    /// Read again this pass with the call now in `slot.call`.
    Again,
    /// Nothing to store (the device left DCMI, or the answer was discarded).
    Done,
}

/// One AI Cube read with the fallback chain: multi (judged) → single type 14 (judged) → hand
/// to npu-smi. `now` is the ring time before the call; returns the ring time after it.
pub(super) fn read_cube(ctx: &Ctx<'_>, slot: &mut Slot, mut now: u64) -> u64 {
    let shared = ctx.shared;
    let idx = slot.idx;
    let dev = &shared.devices[idx];
    if !on_dcmi(dev.source()) {
        return now;
    }
    // The driver says the device does not exist: no call, and no reading.
    if dev.is_gone() {
        push(shared, idx, now, None);
        dev.record_error(now, codes::DEVICE_GONE);
        return now;
    }
    loop {
        let before = dev.source();
        if !on_dcmi(before) {
            return now;
        }
        let started = now;
        let outcome = match slot.call {
            CubeCall::Multi => read_multi(ctx, slot, &mut now),
            CubeCall::Single => read_single(ctx, slot, &mut now),
        };
        // The watchdog may have moved the device while a call hung: drop the late answer.
        if !on_dcmi(dev.source()) {
            return now;
        }
        // An answer slower than the deadline describes the past: not a current reading.
        let deadline = ctx.timing.call_deadline;
        if now.saturating_sub(started) > deadline.as_nanos() as u64 {
            push(shared, idx, now, None);
            // Identical text each time (the elapsed time is a debug line), so a driver that
            // is always late is one rate-limited warning, not one line per pass.
            tracing::warn!(
                device = dev.info.id,
                "AI Cube read answered later than the {deadline:?} deadline; reading discarded"
            );
            tracing::debug!(
                device = dev.info.id,
                "late AI Cube read took {:?}",
                Duration::from_nanos(now - started)
            );
            return now;
        }
        match outcome {
            Outcome::Again => continue,
            Outcome::Done => return now,
            Outcome::Reading(v) => {
                let source = source_of(slot.call);
                if before != source {
                    dev.replace_source(before, source);
                }
                push(shared, idx, now, Some(v));
                let ended = dev.record_value(now, v);
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
            Outcome::Invalid(code) => {
                if before == Source::DCMI_PROBING && code == codes::SUSPECT {
                    dev.replace_source(before, source_of(slot.call));
                }
                push(shared, idx, now, None);
                if dev.record_error(now, code) {
                    if code == codes::SUSPECT {
                        let why = match slot.call {
                            CubeCall::Multi => super::source::note(dev.reason(), 0, UtilType::AiCube),
                            CubeCall::Single => "utilization type 14 read 0 while a second source reads non-zero (npu-smi, or the multi-utilization call before)".to_owned(),
                        };
                        tracing::warn!(
                            device = dev.info.id,
                            "AI Cube figure answered OK is suspect: {why}; samples are invalid"
                        );
                    } else {
                        tracing::warn!(
                            device = dev.info.id,
                            error = code,
                            "AI Cube read failed; samples are invalid until it recovers"
                        );
                    }
                }
                return now;
            }
        }
    }
}

/// Calls `f` as a tracked AI Cube call on device `idx`; `now` moves to the answer's time.
fn tracked<T>(shared: &Shared, idx: usize, now: &mut u64, f: impl FnOnce() -> T) -> T {
    shared.sampler.enter_call(idx, CallKind::Cube, *now);
    let r = f();
    shared.sampler.leave_call();
    // Stamped when the answer arrived, so ring order and time order agree.
    *now = shared.ring.now_ns();
    r
}

/// Stores a sample: `Some(v)` a reading, `None` an invalid one.
fn push(shared: &Shared, idx: usize, ts_ns: u64, value: Option<u8>) {
    shared.ring.push(Sample {
        device: idx as u16,
        ts_ns,
        value: value.unwrap_or(0),
        valid: value.is_some(),
    });
}

fn read_multi(ctx: &Ctx<'_>, slot: &mut Slot, now: &mut u64) -> Outcome {
    let (shared, idx) = (ctx.shared, slot.idx);
    let dev = &shared.devices[idx];
    let answer = tracked(shared, idx, now, || ctx.dcmi.multi_utilization(&slot.chip));
    let m = match answer {
        Ok(m) => m,
        Err(e @ (DcmiError::NotSupport | DcmiError::SymbolMissing { .. })) => {
            let reason = if matches!(e, DcmiError::NotSupport) {
                SourceReason::MultiUnsupported
            } else {
                SourceReason::MultiMissing
            };
            dev.set_reason(reason, 0, UtilType::AiCube);
            slot.call = CubeCall::Single;
            return Outcome::Again;
        }
        Err(e) => return Outcome::Invalid(e.code()),
    };
    let step = match slot.judge.multi_answer(*now, &m) {
        MultiStep::Ask => {
            let single = corroborate(ctx, slot, now);
            if !on_dcmi(dev.source()) {
                return Outcome::Done;
            }
            slot.judge.pair(*now, &m, single)
        }
        step => step,
    };
    publish_multi_reason(dev, &slot.judge);
    match step {
        MultiStep::Reading(v) => Outcome::Reading(v),
        MultiStep::Invalid(code) => Outcome::Invalid(code),
        MultiStep::Ask => Outcome::Invalid(codes::SUSPECT),
        MultiStep::Abandon(why) => {
            let (reason, figure, kind) = match why {
                Unreal::Zeroed { kind, single } => (SourceReason::MultiZeroed, single, kind),
                Unreal::Layout { value } => {
                    (SourceReason::MultiPrereleaseLayout, value, UtilType::AiCube)
                }
            };
            // The source first, then the reason: whoever sees the verdict (wait_settled,
            // `devices`) sees the source it names, not the multi call it abandons.
            let current = dev.source();
            if on_dcmi(current) {
                dev.replace_source(current, source_of(CubeCall::Single));
            }
            dev.set_reason(reason, figure, kind);
            tracing::warn!(
                device = dev.info.id,
                "{}; AI Cube is read through utilization type 14 instead",
                super::source::note(reason, figure, kind)
            );
            slot.call = CubeCall::Single;
            Outcome::Again
        }
    }
}

/// Reads the single call that checks a multi answer (type 14, else type 2); `None` when
/// none answers.
fn corroborate(ctx: &Ctx<'_>, slot: &mut Slot, now: &mut u64) -> Option<(UtilType, u32)> {
    let (shared, idx) = (ctx.shared, slot.idx);
    while let Some(kind) = slot.judge.corroborator() {
        match tracked(shared, idx, now, || ctx.dcmi.utilization(&slot.chip, kind)) {
            Ok(v) => {
                if kind == UtilType::AiCube {
                    shared.devices[idx].record_type14(*now, v);
                }
                return Some((kind, v));
            }
            Err(DcmiError::NotSupport | DcmiError::SymbolMissing { .. }) => {
                slot.judge.corroborator_missing(kind);
            }
            Err(_) => return None,
        }
    }
    None
}

/// The reason of a device on the multi call, from its judge.
fn publish_multi_reason(dev: &super::DeviceStatus, judge: &CubeJudge) {
    let reason = match judge.multi() {
        MultiTrust::Verified => SourceReason::MultiVerified,
        MultiTrust::Unreal(_) => return,
        MultiTrust::Unverified if judge.disputed() => SourceReason::MultiDisputed,
        MultiTrust::Unverified if judge.corroborator().is_none() => {
            SourceReason::MultiUncorroborated
        }
        MultiTrust::Unverified => SourceReason::MultiUnverified,
    };
    if dev.reason() != reason {
        dev.set_reason(reason, 0, UtilType::AiCube);
    }
}

fn read_single(ctx: &Ctx<'_>, slot: &mut Slot, now: &mut u64) -> Outcome {
    let (shared, idx) = (ctx.shared, slot.idx);
    let dev = &shared.devices[idx];
    let answer = tracked(shared, idx, now, || {
        ctx.dcmi.utilization(&slot.chip, UtilType::AiCube)
    });
    let value = match answer {
        Ok(v) => v,
        Err(e @ (DcmiError::NotSupport | DcmiError::SymbolMissing { .. })) => {
            let before = dev.source();
            dev.record_error(*now, e.code());
            // To npu-smi, or (no fallback) to no source at all.
            let after = match ctx.fallback {
                Some(_) => Source::NPU_SMI_PENDING,
                None => Source::UNAVAILABLE,
            };
            if dev.replace_source(before, after) {
                dev.set_reason(SourceReason::Type14Unsupported, 0, UtilType::AiCube);
                tracing::warn!(device = dev.info.id, error = %e, "AI Cube is not available through DCMI (multi-utilization and type 14)");
                match ctx.fallback {
                    Some(f) => {
                        let _ = f.send(WatchRequest::HandOver(idx));
                    }
                    None => tracing::warn!(
                        device = dev.info.id,
                        "no AI Cube source for this device: {NO_FALLBACK}"
                    ),
                }
            }
            return Outcome::Done;
        }
        Err(e) => return Outcome::Invalid(e.code()),
    };
    dev.record_type14(*now, value);
    // The device reads type 14: ask for a cross-check watch, whose first row is awaited
    // before a zero counts.
    if !slot.cross_check {
        slot.cross_check = true;
        match ctx.fallback {
            Some(f) => {
                dev.expect_npu_smi_opinion(*now);
                let _ = f.send(WatchRequest::CrossCheck(idx));
            }
            None => tracing::info!(
                device = dev.info.id,
                "no npu-smi cross-check of type 14's zeros: {NO_FALLBACK}"
            ),
        }
    }
    // An abandoned zeroed multi call is tried again now and then (a firmware upgrade).
    if slot.judge.multi_recheck_due(*now) {
        let m: Option<MultiUtil> =
            tracked(shared, idx, now, || ctx.dcmi.multi_utilization(&slot.chip)).ok();
        if slot.judge.multi_recheck(*now, m.as_ref()) {
            tracing::info!(
                device = dev.info.id,
                "the multi-utilization call answers non-zero figures again; AI Cube is read through it"
            );
            dev.set_reason(SourceReason::MultiVerified, 0, UtilType::AiCube);
            slot.call = CubeCall::Multi;
            if std::mem::take(&mut slot.cross_check) {
                dev.clear_npu_smi_opinion();
                if let Some(f) = ctx.fallback {
                    let _ = f.send(WatchRequest::EndCrossCheck(idx));
                }
            }
        }
    }
    let opinion = dev.npu_smi_opinion(*now, ctx.timing.npu_smi_opinion_max_age);
    match slot.judge.single_answer(value, opinion) {
        SingleStep::Reading(v) => Outcome::Reading(v),
        SingleStep::Invalid(code) => Outcome::Invalid(code),
    }
}

/// Most fault-code texts kept per device (the driver's list holds 128 codes at a time).
const MAX_FAULT_TEXTS: usize = 512;

/// The fault codes of one device, and the text of each code not seen before. Skipped once a
/// call on the device hung. `false` when the driver has no fault-code call at all (an older
/// driver): the thread stops asking.
fn read_faults(dcmi: &Dcmi, shared: &Shared, slot: &mut Slot) -> bool {
    let dev = &shared.devices[slot.idx];
    if dev.is_hung() {
        return true;
    }
    shared
        .sampler
        .enter_call(slot.idx, CallKind::Telemetry, shared.ring.now_ns());
    let read = dcmi.error_codes(&slot.chip);
    let codes = match read {
        Ok(codes) => {
            // Bounded: a driver that reports new garbage on every read gets no more texts
            // asked once this many codes have been seen on the device.
            let room = MAX_FAULT_TEXTS.saturating_sub(slot.fault_texts.len());
            let new: Vec<u32> = codes
                .iter()
                .copied()
                .filter(|c| !slot.fault_texts.contains_key(c))
                .take(room)
                .collect();
            for c in new {
                let text = dcmi
                    .error_text(&slot.chip, c)
                    .ok()
                    .filter(|t| !t.is_empty());
                slot.fault_texts.insert(c, text);
            }
            Ok(codes
                .into_iter()
                .map(|c| FaultCode::new(c, slot.fault_texts.get(&c).cloned().flatten()))
                .collect())
        }
        Err(DcmiError::SymbolMissing { symbol }) => {
            shared.sampler.leave_call();
            tracing::info!(
                "the driver has no {symbol}: the NPUs' fault codes are not read (health words and HBM still are)"
            );
            return false;
        }
        Err(e) => Err(e.to_string()),
    };
    shared.sampler.leave_call();
    dev.record_faults(shared.ring.now_ns(), codes);
    true
}

/// HBM and health of one device. Skipped once a call on the device hung, so a broken device
/// does not stall the thread every second; the snapshot shows the figures' age. Health
/// `0xFFFFFFFF` marks the device gone (logged once); its HBM figures are not kept then.
pub(super) fn read_hbm_and_health(dcmi: &Dcmi, shared: &Shared, idx: usize, chip: &NpuChip) {
    let dev = &shared.devices[idx];
    if dev.is_hung() {
        return;
    }
    shared
        .sampler
        .enter_call(idx, CallKind::Telemetry, shared.ring.now_ns());
    let health = dcmi.health(chip);
    let hbm = dcmi.hbm(chip);
    shared.sampler.leave_call();
    let ts = shared.ring.now_ns();
    match health {
        Ok(Health::DeviceGone) => {
            if dev.set_gone(true) {
                tracing::warn!(
                    device = dev.info.id,
                    "the driver reports the NPU does not exist (health 0xFFFFFFFF); its AI Cube windows are unavailable until it is back"
                );
            }
            return;
        }
        Ok(Health::Code(h)) => {
            if dev.set_gone(false) {
                tracing::info!(
                    device = dev.info.id,
                    health = h,
                    "the driver reports the NPU again"
                );
            }
            dev.record_health(ts, u32::from(h));
        }
        Err(_) => {}
    }
    if let Ok(h) = hbm {
        dev.record_hbm(ts, h.used_mb, h.total_mb);
    }
}
