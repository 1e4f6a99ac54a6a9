//! The fleet brake's hold on one engine (docs/kubernetes.md, "The fleet brake"): the local
//! half of the brake, which needs nothing of Kubernetes.
//!
//! With the brake on, an engine is judged twice, as issue 50's modes judge it: in force by
//! its configured judging *held* — the rules that make an engine abnormal (2, 5–12) in
//! `observe`, the rules that only hold a verdict back (1, 3, 4) still in force, so
//! `/status` answers as the reference does, never sooner — and in the shadow by the
//! configured judging itself. Both sides are computed all the time by the loops as they are
//! (their states: the health atomics, virtual inference's count and its shadow count).
//!
//! The gate ([`Gate`]) says which side `/status` answers: `held` (the first), or `acting`
//! (the second: an agent rule's verdict that the fleet brake let through). The brake's loop
//! (`integrations::kubernetes::brake`) moves it, off every handler's path; the verdict reads
//! it with one atomic load ([`Monitor::sided`]). An engine `acting` stays so while its
//! configured verdict is `abnormal`, whatever the fleet does later: the brake holds only
//! *further* verdicts.

use super::Monitor;
use crate::config::policy::{Judging, Judgings, RuleSet, Side};
use npu_health_wire::BrakeRecord;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// The rules that only hold a verdict back (rule 1's grace, 3 and 4 not counting a
/// failure): in force under the brake too, since they can only make `/status` later than
/// the reference's.
pub(crate) const RESTRAINING: RuleSet = RuleSet::NONE.with(1).with(3).with(4);

/// Which side of a braked engine `/status` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// No brake: the judgings as configured.
    Off,
    /// The held judging answers; the configured one is the shadow.
    Held,
    /// The configured judging answers (an agent rule's verdict the brake let through).
    Acting,
}

impl Gate {
    fn of(v: u8) -> Gate {
        match v {
            1 => Gate::Held,
            2 => Gate::Acting,
            _ => Gate::Off,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Gate::Off => 0,
            Gate::Held => 1,
            Gate::Acting => 2,
        }
    }
}

/// One engine's gate and what the brake's loop last said of it (`/status/detail`'s `brake`).
#[derive(Debug, Default)]
pub(crate) struct Hold {
    gate: AtomicU8,
    record: Mutex<Option<BrakeRecord>>,
}

/// `j` with the rules that make an engine abnormal taken out: what a braked engine answers.
pub(crate) fn held(j: &Judging) -> Judging {
    let rules = j
        .rules
        .ids()
        .filter(|&id| RESTRAINING.has(id))
        .fold(RuleSet::NONE, RuleSet::with);
    Judging {
        policy: j.policy,
        rules,
        stall_window: None,
    }
}

/// The judgings of an engine under the brake (the held judging in force, the configured one
/// as the shadow); `Err` with the reason when the brake cannot hold the engine: it applies
/// no rule that makes an engine abnormal (nothing to hold), or its shadow is taken (a
/// `shadow_policy`, or rules in `observe`: their records need the shadow).
pub(crate) fn braked(j: &Judgings) -> Result<Judgings, &'static str> {
    if j.shadow.is_some() {
        return Err(
            "its shadow is taken (shadow_policy, or rules in observe): the brake needs it for the configured judging",
        );
    }
    let h = held(&j.in_force);
    if h == j.in_force {
        return Err("it applies no rule that makes an engine abnormal: nothing to hold");
    }
    Ok(Judgings {
        in_force: h,
        shadow: Some(j.in_force),
    })
}

impl Monitor {
    /// Puts the engine under the brake before any loop starts: the held judging in force,
    /// the configured one as the shadow. `Err` with the reason when it cannot be held (the
    /// engine then runs as configured).
    pub(crate) fn hold_under_brake(&mut self) -> Result<(), &'static str> {
        self.spec.judging = braked(&self.spec.judging)?;
        self.set_gate(Gate::Held);
        Ok(())
    }

    /// The gate now.
    pub(crate) fn gate(&self) -> Gate {
        Gate::of(self.hold.gate.load(Ordering::Acquire))
    }

    /// Moves the gate (the brake's loop; never a handler).
    pub(crate) fn set_gate(&self, g: Gate) {
        self.hold.gate.store(g.to_u8(), Ordering::Release);
    }

    /// The computed side that `side` reads now: the same, except that an engine `acting`
    /// answers from the configured judging (computed as the shadow) and has no shadow.
    pub(crate) fn sided(&self, side: Side) -> Option<Side> {
        match (self.gate(), side) {
            (Gate::Acting, Side::InForce) => Some(Side::Shadow),
            (Gate::Acting, Side::Shadow) => None,
            (_, s) => Some(s),
        }
    }

    /// Whether virtual inference is `abnormal` as the verdict reads it (re-arm after a
    /// restart needs it on either side).
    pub(in crate::monitor) fn vi_abnormal_in_force(&self) -> bool {
        match self.sided(Side::InForce) {
            Some(Side::Shadow) => self.vi.shadow().abnormal.is_some(),
            _ => self.vi.abnormal(),
        }
    }

    /// What the brake's loop last said of the engine; `None` without the brake.
    pub(crate) fn brake_record(&self) -> Option<BrakeRecord> {
        self.hold
            .record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the brake's record under its lock (the brake's loop).
    pub(crate) fn note_brake(&self, f: impl FnOnce(&mut BrakeRecord)) {
        let mut r = self.hold.record.lock().unwrap_or_else(|p| p.into_inner());
        f(r.get_or_insert_with(BrakeRecord::default));
    }
}

#[cfg(test)]
mod tests;
