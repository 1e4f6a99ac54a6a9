//! The agent's answers to "should this engine take new requests" ([`readiness`], `/readyz`)
//! and "should its container be restarted" ([`liveness`], `/livez`), as plain functions of
//! the facts ([`ActionInputs`]). They are the agent's decisions, not one integration's: the
//! kubelet polls both, Envoy's health check and any other router read `/readyz`
//! ([`super::routes`]), and the Kubernetes API mode's readiness gate follows the readiness
//! rule. [`config`] is `[engine.actions] not_ready_on`, the states that make `/readyz` fail.
//!
//! Readiness is for traffic: an engine that should not take new requests is taken out of
//! its Service (or its router's pool) and put back when it recovers, with nothing restarted.
//! Liveness is for restarts: the kubelet kills and restarts the engine's container in place,
//! so `/livez` fails only where Node Manager would kill (the verdict is `abnormal`) or at a
//! held `evict`, and never for want of an input, during the engine's warm-up, or while the
//! engine's port is closed (a container that died is restarted by the kubelet without a
//! probe; one that is starting must be left to load its model).

pub(crate) mod config;

use super::facts::{AbnormalCause, ActionInputs};
use crate::monitor::Monitor;
use crate::monitor::verdict::Status;
use crate::monitor::vi_state::Phase;
use crate::qos::score::Level;
use config::{NotReadyList, NotReadyOn};
use serde::{Deserialize, Serialize};

/// `GET /readyz`: should the engine take new requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Readiness {
    pub ready: bool,
    /// At `degrade`: answered with `x-envoy-degraded: true` (Envoy's active health check
    /// honours it on a passing answer only).
    pub degraded: bool,
    /// One line: why.
    pub reason: String,
}

/// The readiness rule: not ready while `/health` never answered, and on every state listed
/// in `not_ready_on` (a level listed covers the worse levels).
pub(crate) fn readiness(f: &ActionInputs, cfg: &NotReadyList) -> Readiness {
    let degraded = f.level == Level::Degrade;
    let not_ready = |reason: String| Readiness {
        ready: false,
        degraded,
        reason,
    };
    if f.status == Status::Initial {
        return not_ready(format!("not ready: {}", f.reason));
    }
    if f.status == Status::Abnormal && cfg.fails_on(NotReadyOn::Abnormal) {
        return not_ready(format!("not ready: abnormal: {}", f.reason));
    }
    let from = [
        (NotReadyOn::Throttle, Level::Throttle),
        (NotReadyOn::Degrade, Level::Degrade),
        (NotReadyOn::Evict, Level::Evict),
    ]
    .into_iter()
    .filter(|(on, _)| cfg.fails_on(*on))
    .map(|(_, l)| l)
    .min();
    if let Some(from) = from
        && f.level >= from
    {
        return not_ready(format!(
            "not ready: {} (not_ready_on from {})",
            f.level_words(),
            from.as_str()
        ));
    }
    Readiness {
        ready: true,
        degraded,
        reason: match f.status {
            Status::Abnormal => format!(
                "ready ({}; abnormal is not in not_ready_on)",
                f.level_words()
            ),
            _ => format!("ready ({})", f.level_words()),
        },
    }
}

/// `GET /livez`: should the kubelet restart the engine's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Liveness {
    pub live: bool,
    /// One line: why.
    pub reason: String,
}

/// The liveness rule: 503 only where Node Manager would kill (the verdict is `abnormal`) or
/// at a held `evict`, and not then either when the ground is a closed port (the process is
/// gone or starting: the kubelet restarts a dead container itself, and a starting one must
/// load its model) or a QoS score resting on a missing input.
pub(crate) fn liveness(f: &ActionInputs) -> Liveness {
    let live = |reason: String| Liveness { live: true, reason };
    let dead = |reason: String| Liveness {
        live: false,
        reason,
    };
    match (f.status, f.cause) {
        (Status::Initial, _) => live(format!("live: the engine is starting ({})", f.reason)),
        _ if f.phase == Phase::WarmingUp => live(format!("live: warming up ({})", f.reason)),
        (Status::Abnormal, Some(AbnormalCause::Health)) if f.port_closed => live(format!(
            "live: the engine's port is closed, a dead container is restarted without a probe and a starting one is loading ({})",
            f.reason
        )),
        (Status::Abnormal, Some(AbnormalCause::QosEviction)) if !f.inputs_complete => {
            live(format!(
                "live: {} rests on a missing input; not restarted for it",
                f.level_words()
            ))
        }
        (Status::Abnormal, _) => dead(format!("not live: abnormal: {}", f.reason)),
        _ if f.evict_held() => dead(format!(
            "not live: {} held, every input present",
            f.level_words()
        )),
        _ => live(format!("live ({})", f.level_words())),
    }
}

/// What `/readyz` and `/livez` answer for an engine, with the facts behind them, taken at
/// one instant (the metrics, the views and the journal read them together).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answers {
    pub facts: ActionInputs,
    pub readiness: Readiness,
    pub liveness: Liveness,
}

impl Answers {
    /// The answers for `facts` under `cfg`.
    pub(crate) fn from_facts(facts: ActionInputs, cfg: &NotReadyList) -> Answers {
        Answers {
            readiness: readiness(&facts, cfg),
            liveness: liveness(&facts),
            facts,
        }
    }

    /// The answers for `m` now (reads only: the verdict is peeked).
    pub(crate) fn of(m: &Monitor) -> Answers {
        Answers::from_facts(ActionInputs::of(m), NotReadyList::of(m.spec()))
    }

    /// The answers for `m` now, from `verdict` the caller read (the observer's).
    pub(crate) fn with(m: &Monitor, verdict: &crate::monitor::evidence::Verdict) -> Answers {
        Answers::from_facts(ActionInputs::with(m, verdict), NotReadyList::of(m.spec()))
    }
}

#[cfg(test)]
mod tests;
