//! The Kubernetes API mode (`[agent.kubernetes]`, opt-in): for each engine, find its pod on
//! this node ([`pods`]), keep a readiness-gate condition on it that follows the `/readyz`
//! rule, and at a held `evict` create an Eviction (or set MindCluster's fault annotation).
//! The rules are [`crate::actions`]'; [`api`] makes the calls; [`task`] is the loop (I/O
//! only). What it did is in the engine's record ([`crate::monitor::acted`]), which
//! `/status/detail` shows; nothing it does or fails to do changes the verdict, and no
//! handler waits on it.

pub mod api;
pub mod pods;
pub mod task;

use crate::config::kubernetes::KubernetesConfig;
use api::KubeClient;
use std::sync::Arc;

/// The mode as started: its settings, the node, and the client (or why there is none).
#[derive(Debug, Clone)]
pub struct ApiMode {
    pub cfg: KubernetesConfig,
    pub node: Option<String>,
    pub client: Result<KubeClient, String>,
}

impl ApiMode {
    /// Builds the client for `cfg`; a failure is kept (each engine's record shows it) and
    /// logged once, and the agent runs on without the mode.
    pub fn start(cfg: &KubernetesConfig) -> Arc<ApiMode> {
        let client = KubeClient::new(cfg);
        let node = cfg.node();
        match &client {
            Ok(_) => tracing::info!(
                node = node.as_deref().unwrap_or("unknown"),
                eviction = cfg.eviction.as_str(),
                readiness_gate = cfg.readiness_gate,
                "the Kubernetes API mode is on"
            ),
            Err(e) => tracing::error!("the Kubernetes API mode cannot start: {e}"),
        }
        Arc::new(ApiMode {
            cfg: cfg.clone(),
            node,
            client,
        })
    }
}
