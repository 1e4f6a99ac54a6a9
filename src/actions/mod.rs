//! What the verdict and the QoS level do, per integration, as plain functions of what the
//! monitor knows (docs/degradation.md has the table):
//!
//! - MindIE's Node Manager reads `/status` ([`crate::monitor`]'s verdict, unchanged here);
//! - the kubelet reads `/readyz` and `/livez` ([`readiness`], [`liveness`]);
//! - the Kubernetes API mode sets a readiness-gate condition from [`readiness`] and evicts at
//!   a held `evict` ([`eviction_ground`]; the client and its loop are [`crate::k8s`]);
//! - HAProxy polls its agent check ([`haproxy::agent_check`]; the listener is
//!   [`crate::server::agent_check`]).
//!
//! Readiness is for traffic: an engine that should not take new requests is taken out of
//! its Service (or its router's pool) and put back when it recovers, with nothing restarted.
//! Liveness is for restarts: the kubelet kills and restarts the engine's container in place,
//! so `/livez` fails only where Node Manager would kill (the verdict is `abnormal`) or at a
//! held `evict`, and never for want of an input, during the engine's warm-up, or while the
//! engine's port is closed (a container that died is restarted by the kubelet without a
//! probe; one that is starting must be left to load its model).

pub mod eviction;
pub mod haproxy;
pub mod observe;

use crate::config::actions::{ActionsConfig, NotReadyOn};
use crate::monitor::Monitor;
use crate::monitor::verdict::{HealthState, Status};
use crate::monitor::vi_state::Phase;
use crate::probe::health::Transport;
use crate::qos::score::Level;
use serde::{Deserialize, Serialize};

/// Why the verdict is `abnormal`, as far as the actions care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbnormalCause {
    /// `/health` answered before and fails now (past the agent policy's grace).
    Health,
    /// Virtual inference went abnormal (warm-up failed, or the failure count reached its
    /// maximum).
    VirtualInference,
    /// A held QoS `evict` with `qos.eviction` on.
    QosEviction,
}

/// What the action rules read of one engine, taken at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionInputs {
    /// The verdict `/status` serves under the policy in force.
    pub status: Status,
    /// Why it is abnormal; `None` unless `status` is `abnormal`.
    pub cause: Option<AbnormalCause>,
    /// The verdict's reason, in words.
    pub reason: String,
    /// `/health` as last judged.
    pub health: HealthState,
    /// The last `/health` failure was a refused connection: the engine's port is closed.
    pub port_closed: bool,
    /// Virtual inference's phase (warming up: the engine answers its first request).
    pub phase: Phase,
    pub level: Level,
    pub score: Option<f64>,
    /// Every QoS component had an input at the last evaluation: the score does not rest on
    /// missing inputs.
    pub inputs_complete: bool,
    /// Requests running when the level left `normal` (a router's cap while it is not).
    pub admission_cap: Option<u32>,
}

impl ActionInputs {
    /// The facts of `m` now.
    pub fn of(m: &Monitor) -> ActionInputs {
        let status = m.peek_status();
        let health = m.health_detail();
        let cause = (status == Status::Abnormal).then(|| {
            if health.state == HealthState::Unhealthy {
                AbnormalCause::Health
            } else if m.vi.abnormal() {
                AbnormalCause::VirtualInference
            } else {
                AbnormalCause::QosEviction
            }
        });
        let components = m.qos.components();
        ActionInputs {
            status,
            cause,
            // One line, whatever the engine's error said.
            reason: m.reason().replace(['\n', '\r'], " "),
            port_closed: health.last_transport_error == Some(Transport::Refused),
            health: health.state,
            phase: m.vi.phase(),
            level: m.qos.level(),
            score: m.qos.score(),
            inputs_complete: !components.is_empty() && components.iter().all(|c| c.score.is_some()),
            admission_cap: m.qos.admission_cap(),
        }
    }

    fn level_words(&self) -> String {
        match self.score {
            Some(s) => format!("QoS level {} (score {s:.3})", self.level.as_str()),
            None => format!("QoS level {}", self.level.as_str()),
        }
    }

    /// A held `evict` whose score rests on no missing input.
    pub fn evict_held(&self) -> bool {
        self.level == Level::Evict && self.inputs_complete
    }
}

/// `GET /readyz`: should the engine take new requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    /// At `degrade`: answered with `x-envoy-degraded: true` (Envoy's active health check
    /// honours it on a passing answer only).
    pub degraded: bool,
    /// One line: why.
    pub reason: String,
}

/// The readiness rule: not ready while `/health` never answered, and on every state listed
/// in `not_ready_on` (a level listed covers the worse levels).
pub fn readiness(f: &ActionInputs, cfg: &ActionsConfig) -> Readiness {
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
pub struct Liveness {
    pub live: bool,
    /// One line: why.
    pub reason: String,
}

/// The liveness rule: 503 only where Node Manager would kill (the verdict is `abnormal`) or
/// at a held `evict`, and not then either when the ground is a closed port (the process is
/// gone or starting: the kubelet restarts a dead container itself, and a starting one must
/// load its model) or a QoS score resting on a missing input.
pub fn liveness(f: &ActionInputs) -> Liveness {
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
pub struct Answers {
    pub facts: ActionInputs,
    pub readiness: Readiness,
    pub liveness: Liveness,
}

impl Answers {
    /// The answers for `facts` under `cfg`.
    pub fn from_facts(facts: ActionInputs, cfg: &ActionsConfig) -> Answers {
        Answers {
            readiness: readiness(&facts, cfg),
            liveness: liveness(&facts),
            facts,
        }
    }

    /// The answers for `m` now (reads only: the verdict is peeked).
    pub fn of(m: &Monitor) -> Answers {
        Answers::from_facts(ActionInputs::of(m), &m.spec.actions)
    }
}

/// Whether the Kubernetes API mode may evict the engine's pod now: a held `evict` whose
/// score rests on no missing input.
pub fn eviction_ground(f: &ActionInputs) -> Option<String> {
    f.evict_held().then(|| {
        format!(
            "{} held for the eviction hold, every input present",
            f.level_words()
        )
    })
}

/// One integration's action for an engine, as `check-config` and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    /// `node_manager`, `kubelet`, `kubernetes_api`, `haproxy`, `envoy`, `routers`.
    pub integration: &'static str,
    /// What acts, and on what, in one line.
    pub action: String,
}

/// The actions in force for `spec` under the agent's settings `agent` (the Kubernetes API
/// mode, HAProxy's agent-check listener, the admin listener).
pub fn active(
    spec: &crate::config::EngineSpec,
    agent: &crate::config::AgentSettings,
) -> Vec<Active> {
    let kube = agent.kubernetes.as_ref();
    let not_ready: Vec<&str> = spec
        .actions
        .not_ready_on
        .iter()
        .map(|o| o.as_str())
        .collect();
    let mut out = vec![
        Active {
            integration: "node_manager",
            action: format!(
                "/status on {}: abnormal under the {} policy{}; Node Manager kills after 5 abnormal heartbeats",
                spec.mgmt_listen,
                spec.policy.value.as_str(),
                if spec.qos.eviction {
                    ", and at a held QoS evict (qos.eviction)"
                } else {
                    ""
                }
            ),
        },
        Active {
            integration: "kubelet",
            action: format!(
                "/readyz 503 while /health never answered{}{}; /livez 503 at abnormal (not with the engine's port closed) or a held evict on every input",
                if not_ready.is_empty() {
                    String::new()
                } else {
                    format!(" and on {}", not_ready.join(", "))
                },
                if not_ready.contains(&"degrade") || not_ready.contains(&"throttle") {
                    ""
                } else {
                    " (x-envoy-degraded at degrade on a 200)"
                }
            ),
        },
    ];
    out.push(Active {
        integration: "kubernetes_api",
        action: match kube {
            None => "off ([agent.kubernetes] not set)".to_owned(),
            Some(k) => {
                let pod = match (&spec.pod.pod, &spec.pod.pod_selector) {
                    (Some(p), _) => format!("pod {p}"),
                    (None, Some(sel)) => format!("the pod on this node with labels {sel}"),
                    (None, None) => format!("the pod on this node serving port {}", spec.port),
                };
                let gate = if k.readiness_gate {
                    format!("condition {} follows /readyz", k.condition_type)
                } else {
                    "no readiness gate".to_owned()
                };
                let evict = match k.eviction {
                    crate::config::kubernetes::EvictionMode::Api => format!(
                        "an Eviction at a held evict (at most one per {})",
                        humantime::format_duration(k.eviction_cooldown)
                    ),
                    crate::config::kubernetes::EvictionMode::Mindcluster => format!(
                        "MindCluster's {} at a held evict (at most once per {})",
                        crate::config::kubernetes::MINDCLUSTER_ANNOTATION,
                        humantime::format_duration(k.eviction_cooldown)
                    ),
                    crate::config::kubernetes::EvictionMode::Off => "no eviction".to_owned(),
                };
                format!("{pod}: {gate}; {evict}")
            }
        },
    });
    let h = &spec.actions.haproxy;
    out.push(Active {
        integration: "haproxy",
        action: match agent.haproxy_agent_listen {
            None => "off ([agent] haproxy_agent_listen not set)".to_owned(),
            Some(addr) => format!(
                "agent check on {addr} (agent-send \"{}\\n\"): normal ready, throttle {}, degrade {}, evict {}, abnormal {}",
                spec.name,
                h.throttle.as_str(),
                h.degrade.as_str(),
                h.evict.as_str(),
                h.abnormal.as_str()
            ),
        },
    });
    out.push(Active {
        integration: "envoy",
        action: format!(
            "active health check on /readyz at {}{}: 503 where /readyz is (the kubelet's line), x-envoy-degraded: true at degrade",
            spec.mgmt_listen,
            match agent.admin_listen {
                Some(a) => format!(" or /engines/{}/readyz at {a}", spec.name),
                None => String::new(),
            }
        ),
    });
    out.push(Active {
        integration: "routers",
        action: "others: /qos (score, level), inference_node_health and npu_health_agent_qos_level in /metrics".to_owned(),
    });
    out
}

#[cfg(test)]
mod tests;
