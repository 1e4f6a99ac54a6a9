//! `[engine.actions]`: what the degradation levels and the verdict do through the kubelet's
//! probes, the Kubernetes API and HAProxy's agent check (the rules are in
//! [`crate::integrations`]).

use crate::integrations::answers::config::NotReadyOn;
use crate::integrations::haproxy::config::HaproxyMap;
use crate::integrations::kubernetes::config::PodSelector;
use serde::{Deserialize, Serialize};

/// An engine's action settings as read: `[engine.actions]` and `[engine.kubernetes]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineActions {
    pub actions: ActionsConfig,
    pub pod: PodSelector,
}

/// `[engine.actions]`, a key left out keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActionsConfig {
    /// What makes `/readyz` answer 503 and the readiness gate `False`. Default `degrade`,
    /// `evict` and `abnormal`; `throttle` is opt-in. A level listed covers the worse ones
    /// (`throttle` also fails at `degrade` and `evict`). An engine whose `/health` never
    /// answered is never ready, whatever the list.
    pub not_ready_on: Vec<NotReadyOn>,
    /// What HAProxy's agent check answers at each level (`[agent] haproxy_agent_listen`).
    pub haproxy: HaproxyMap,
}

impl Default for ActionsConfig {
    fn default() -> Self {
        ActionsConfig {
            not_ready_on: vec![NotReadyOn::Degrade, NotReadyOn::Evict, NotReadyOn::Abnormal],
            haproxy: HaproxyMap::default(),
        }
    }
}

impl ActionsConfig {
    /// Checks the list and the HAProxy cap; `Err((key, message))`.
    pub fn validate(&self) -> Result<(), super::KeyError> {
        if self.haproxy.maxconn == 0 {
            return Err((
                "haproxy.maxconn".to_owned(),
                "`0` would leave HAProxy's queued requests waiting until `timeout queue`: give a cap of 1 or more (the default 100000 is none in effect)".to_owned(),
            ));
        }
        let mut seen = self.not_ready_on.clone();
        seen.sort();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err((
                "not_ready_on".to_owned(),
                format!("`{}` is listed twice", w[0].as_str()),
            ));
        }
        Ok(())
    }

    /// Whether `on` is in the list.
    pub fn fails_on(&self, on: NotReadyOn) -> bool {
        self.not_ready_on.contains(&on)
    }
}
