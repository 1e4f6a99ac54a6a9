//! The systems that act on the agent's verdict and QoS level, one folder each, behind one
//! trait ([`Integration`], the seam: [`seam`]) and one list ([`REGISTRY`], here):
//!
//! - [`node_manager`]: MindIE's Node Manager polls `/status` (the monitor's verdict);
//! - [`kubelet`]: the kubelet polls `/readyz` and `/livez`;
//! - [`kubernetes`]: the Kubernetes API mode keeps a readiness-gate condition on the pod and
//!   evicts it at a held `evict`;
//! - [`haproxy`]: HAProxy polls its agent check on a listener of its own;
//! - [`envoy`]: Envoy's active health check polls `/readyz`.
//!
//! Beside the folders, the seam's own parts: the facts every rule reads ([`facts`]), the
//! agent's readiness and liveness ([`answers`]), `/readyz` and the hook through which every
//! integration hears its answers ([`routes`]), and the observer that writes what changed to
//! each engine's journal ([`observe`]). Each folder owns its configuration table (`config.rs`:
//! its type, how it is read and checked), which the configuration reads through this list
//! ([`Integration::tables`]; the configuration names no integration), its pure rule, its
//! listener or task, its typed states (`told.rs`) and the
//! [`crate::monitor::journal::Told`] it makes of them, and its memory of an engine if it
//! keeps one. The folders name the seam, never this list and never each
//! other. Every rule reads the facts of one instant; none waits on the engine.
//! docs/architecture.md shows what adding one takes.

pub(crate) mod answers;
pub(crate) mod envoy;
pub(crate) mod facts;
pub(crate) mod haproxy;
pub(crate) mod kubelet;
pub mod kubernetes;
pub(crate) mod node_manager;
pub(crate) mod observe;
pub(crate) mod routes;
pub(crate) mod seam;

pub(crate) use answers::Answers;
pub(crate) use seam::{Engines, Integration, Listen, Started};

use crate::config::tables::{Listed, Readers, TableReader};
use crate::config::{AgentSettings, EngineSpec};
use crate::monitor::Monitor;
use serde::{Deserialize, Serialize};

/// Every integration, in the order `check-config` lists them.
pub(crate) static REGISTRY: &[&dyn Integration] = &[
    &node_manager::NodeManager,
    &kubelet::Kubelet,
    &kubernetes::KubernetesApi,
    &haproxy::Haproxy,
    &envoy::Envoy,
];

/// The configuration reads every integration's table through the list: the seam's own
/// (`[engine.actions] not_ready_on`), then each integration's, in the list's order.
impl Listed for Readers {
    fn readers() -> Vec<&'static dyn TableReader> {
        tables_of(REGISTRY)
    }
}

/// The tables of the integrations of `list`, after the seam's own.
pub(crate) fn tables_of(list: &[&'static dyn Integration]) -> Vec<&'static dyn TableReader> {
    let mut tables: Vec<&'static dyn TableReader> = vec![&answers::config::TABLE];
    tables.extend(list.iter().flat_map(|i| i.tables()));
    tables
}

/// Gives the engine `m` each integration's memory ([`Integration::memory`]), before its tasks
/// start: the state file then holds every integration's keys from its first write.
pub(crate) fn equip(m: &Monitor) {
    m.acted()
        .equip(REGISTRY.iter().filter_map(|i| i.memory()).collect());
}

/// One integration's action for an engine, as `check-config` and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Active {
    /// `node_manager`, `kubelet`, `kubernetes_api`, `haproxy`, `envoy`, `routers`.
    pub integration: &'static str,
    /// What acts, and on what, in one line.
    pub action: String,
}

/// The actions in force for `spec` under the agent's settings `agent`: every integration's,
/// then what any other router may read.
pub(crate) fn active(spec: &EngineSpec, agent: &AgentSettings) -> Vec<Active> {
    let mut out: Vec<Active> = REGISTRY
        .iter()
        .map(|i| Active {
            integration: i.id().as_str(),
            action: i.describe(spec, agent),
        })
        .collect();
    out.push(Active {
        integration: "routers",
        action: "others: /qos (score, level), inference_node_health and npu_health_agent_qos_level in /metrics".to_owned(),
    });
    out
}

#[cfg(test)]
mod seam_tests;
#[cfg(test)]
pub(crate) mod tests;
