//! What one experiment's agent said about its rules and its shadow, read from
//! `/status/detail` at every sample (the outcome's `shadow`; issue 50). The comparison of the
//! shadow rows is [`crate::shadow`].

use npu_health_wire::{EngineDetail, Status};
use serde::Serialize;

/// What one experiment's agent said about its rules and its shadow. Times are milliseconds
/// from the scheduled injection on the agent's clock (negative: before), as scaled.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShadowSeen {
    /// The shadow's first turn to `abnormal`; `null`: it never said so.
    pub shadow_abnormal_ms: Option<i64>,
    /// The rule behind it (docs/policy.md's number).
    pub shadow_rule: Option<u8>,
    pub shadow_reason: Option<String>,
    /// The first turn to `abnormal` of the policy in force (what `/status` answered).
    pub in_force_abnormal_ms: Option<i64>,
    /// The rules that turned the verdict in force `abnormal`, in the order first seen (the
    /// `agent` row's cause).
    pub fired: Vec<u8>,
    /// Every disagreement of the shadow with `/status`, oldest first.
    pub disagreements: Vec<SeenDisagreement>,
}

/// One disagreement, its times from the scheduled injection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeenDisagreement {
    pub began_ms: i64,
    pub ended_ms: Option<i64>,
    /// What `/status` answered.
    pub status: String,
    /// What the shadow would have answered.
    pub would_status: String,
    pub rule: Option<u8>,
    pub reason: String,
}

impl ShadowSeen {
    /// Takes in one `/status/detail` read at a sample: `t0_unix_ms` is the scheduled
    /// injection on the agent's clock. The first `abnormal` of each side is kept once seen
    /// (the agent keeps only its last turns); the disagreements are the latest list.
    pub fn note(seen: &mut Option<ShadowSeen>, d: &EngineDetail, t0_unix_ms: i64) {
        let fired = d.rules.iter().filter(|r| r.fired > 0);
        if d.shadow.is_none() && fired.clone().next().is_none() {
            return;
        }
        let s = seen.get_or_insert_with(ShadowSeen::default);
        for r in fired {
            if !s.fired.contains(&r.id) {
                s.fired.push(r.id);
            }
        }
        let Some(shadow) = &d.shadow else {
            return;
        };
        let rel = |unix: u64| unix as i64 - t0_unix_ms;
        let first = |side: &str| {
            shadow
                .turns
                .iter()
                .find(|t| t.side == side && t.status == Status::Abnormal)
        };
        if s.shadow_abnormal_ms.is_none()
            && let Some(t) = first("shadow")
        {
            s.shadow_abnormal_ms = Some(rel(t.at_unix_ms));
            s.shadow_rule = t.rule;
            s.shadow_reason = Some(t.reason.clone());
        }
        if s.in_force_abnormal_ms.is_none()
            && let Some(t) = first("in_force")
        {
            s.in_force_abnormal_ms = Some(rel(t.at_unix_ms));
        }
        s.disagreements = shadow
            .disagreements
            .iter()
            .map(|g| SeenDisagreement {
                began_ms: rel(g.began_unix_ms),
                ended_ms: g.ended_unix_ms.map(rel),
                status: g.status.as_str().to_owned(),
                would_status: g.would_status.as_str().to_owned(),
                rule: g.rule,
                reason: g.reason.clone(),
            })
            .collect();
    }
}
