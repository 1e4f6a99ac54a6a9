//! MindIE's Node Manager: it polls `GET /status` on each engine's listener at its heartbeat
//! and kills the node after 5 `abnormal` answers in a row. The rule is the monitor's verdict
//! ([`crate::monitor::verdict`], under the policy in force); the answer is 200 with a body of
//! exactly `{"status":"initial"|"normal"|"abnormal"}`, as MindIE's engine server gives it.
//! What it was told is [`told`] of the verdict.

use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::seam::{Integration, Route};
use crate::monitor::Monitor;
use crate::monitor::journal::{Id, Told};
use crate::monitor::verdict::Status;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// Its name in the journal, `/status/detail` and the metrics.
pub(crate) const ID: Id = Id("node_manager");

/// The verdict `/status` serves, as the journal records what Node Manager is told.
pub(crate) fn told(s: Status) -> Told {
    Told::state(ID, "status", s.as_str())
}

/// Node Manager, in the registry.
pub(crate) struct NodeManager;

impl Integration for NodeManager {
    fn id(&self) -> Id {
        ID
    }

    fn routes(&self) -> &'static [Route] {
        &[Route {
            path: "/status",
            answer: |e, _| status(e),
            on_admin: false,
        }]
    }

    fn describe(&self, spec: &EngineSpec, _agent: &AgentSettings) -> String {
        format!(
            "/status on {}: abnormal under the {} policy{}; Node Manager kills after 5 abnormal heartbeats",
            spec.mgmt_listen,
            spec.policy.value.as_str(),
            if spec.qos.eviction {
                ", and at a held QoS evict (qos.eviction)"
            } else {
                ""
            }
        )
    }
}

/// `GET /status` of one engine: the verdict (a poll: the first healthy one starts virtual
/// inference, as the reference's does).
pub(crate) fn status(e: &Monitor) -> Response {
    let s = e.status();
    ([(header::CONTENT_TYPE, "application/json")], s.body()).into_response()
}
