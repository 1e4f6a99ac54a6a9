//! The driver's faults on the engine's NPUs (read by the sampler, [`crate::sampler::faults`]):
//! what each fault level does under each policy, which faults a probe has already checked or
//! been answered beside, and rule 8 of docs/policy.md. It has no loop of its own: virtual
//! inference's pause watches for a new fault, and the QoS loop lowers the level for a
//! `SubHealthFault`.

use super::{Rule, RuleId, Source};
use crate::driver::fault_levels::FaultLevel;
use crate::monitor::Monitor;
use crate::sampler::faults::NpuFault;

/// The driver's faults.
pub(crate) struct DriverFaults;

/// Rule 8: a driver fault explains a failure.
pub(super) const EXPLAINS: Rule = Rule {
    id: RuleId(8),
    name: "driver_fault",
    doc: "a failed virtual request beside a RestartBusiness-level fault or worse is abnormal at once; a SubHealthFault lowers the QoS level a band",
    keys: &[],
};

impl Source for DriverFaults {
    fn name(&self) -> &'static str {
        "driver_faults"
    }

    fn rules(&self) -> &'static [Rule] {
        &[EXPLAINS]
    }
}

/// The level from which a driver fault confirms a failed probe (the accounting's constant).
pub(crate) use crate::monitor::account::CONFIRM_LEVEL;

pub(crate) use npu_health_wire::FaultEffect;

/// What a fault at `level` does under the policy in force (`agent`: the agent policy).
pub(crate) fn fault_effect(agent: bool, level: FaultLevel) -> FaultEffect {
    match level {
        _ if !agent => FaultEffect::Published,
        l if l >= CONFIRM_LEVEL => FaultEffect::Confirms,
        FaultLevel::SubHealthFault => FaultEffect::LowersQos,
        _ => FaultEffect::Published,
    }
}

/// The most severe of `faults` (the first of equals).
pub(crate) fn worst(faults: &[NpuFault]) -> Option<&NpuFault> {
    faults.iter().fold(None, |w: Option<&NpuFault>, f| match w {
        Some(w) if w.level >= f.level => Some(w),
        _ => Some(f),
    })
}

/// The most severe of `faults` that no answered request was seen beside.
pub(super) fn unanswered_worst(faults: &[NpuFault], answered: &Checked) -> Option<NpuFault> {
    let unanswered: Vec<_> = faults
        .iter()
        .filter(|f| !answered.contains(&(f.npu, f.code)))
        .cloned()
        .collect();
    worst(&unanswered).cloned()
}

/// After a probe: what it checked (the faults at the confirming level that were there before
/// it started and still are), and `answered` updated — a fault that cleared is forgotten (it
/// is new again when it comes back), and the checked ones join it when the probe succeeded.
pub(super) fn remember_answered(
    answered: &mut Checked,
    before: &Checked,
    faults_after: &[NpuFault],
    failed: bool,
) -> Checked {
    let now_serious = serious(faults_after);
    let checked: Checked = before.intersection(&now_serious).copied().collect();
    answered.retain(|k| now_serious.contains(k));
    if !failed {
        answered.extend(checked.iter().copied());
    }
    checked
}

/// Why the engine's QoS level is one band lower: the `SubHealthFault`s among `faults`, under
/// the agent policy (the reference has no such rule).
pub(super) fn sub_health(state: &Monitor, faults: &[NpuFault]) -> Option<String> {
    let agent = state.spec.agent_policy_in_force().is_some();
    let lowering: Vec<String> = faults
        .iter()
        .filter(|f| fault_effect(agent, f.level) == FaultEffect::LowersQos)
        .map(|f| f.describe())
        .collect();
    (!lowering.is_empty()).then(|| lowering.join("; "))
}

/// Driver faults at the confirming level, by (NPU, code).
pub(super) type Checked = std::collections::BTreeSet<(u32, u32)>;

/// The faults of `faults` at the confirming level.
pub(super) fn serious(faults: &[NpuFault]) -> Checked {
    faults
        .iter()
        .filter(|f| f.level >= CONFIRM_LEVEL)
        .map(|f| (f.npu, f.code))
        .collect()
}
