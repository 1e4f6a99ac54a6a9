//! The kubelet: it polls `/readyz` (the seam's route, [`crate::integrations::routes`]) and
//! `/livez` (this folder's) on the engine's listener, or as `/engines/<name>/…` on the admin
//! one. What the two answer is the agent's decision ([`crate::integrations::answers`]); here
//! is the `/livez` route, what `check-config` says of it, and the words the journal records
//! of what the kubelet is told ([`told`]: `ready`/`not_ready`, `live`/`restart`).

pub(crate) mod told;

use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::answers::config::NotReadyList;
use crate::integrations::answers::liveness;
use crate::integrations::facts::ActionInputs;
use crate::integrations::seam::{Integration, Route, probe_answer};
use crate::monitor::Monitor;
use crate::monitor::journal::{Id, Told};
use axum::http::StatusCode;
use axum::response::Response;
use told::{Live, Ready};

/// Its name in the journal, `/status/detail` and the metrics.
pub(crate) const ID: Id = Id("kubelet");

/// What `/readyz` answered, as the journal records it.
impl From<Ready> for Told {
    fn from(r: Ready) -> Told {
        Told::state(ID, "readyz", r.as_str())
    }
}

/// What `/livez` answered, as the journal records it.
impl From<Live> for Told {
    fn from(l: Live) -> Told {
        Told::state(ID, "livez", l.as_str())
    }
}

/// The kubelet, in the registry.
pub(crate) struct Kubelet;

impl Integration for Kubelet {
    fn id(&self) -> Id {
        ID
    }

    fn routes(&self) -> &'static [Route] {
        &[Route {
            path: "/livez",
            answer: |e, _| livez(e),
            on_admin: true,
        }]
    }

    fn describe(&self, spec: &EngineSpec, _agent: &AgentSettings) -> String {
        let not_ready: Vec<&str> = NotReadyList::of(spec)
            .0
            .iter()
            .map(|o| o.as_str())
            .collect();
        format!(
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
        )
    }
}

/// `/livez` of one engine: 503 only where the kubelet should restart it.
pub(crate) fn livez(e: &Monitor) -> Response {
    e.status();
    let l = liveness(&ActionInputs::of(e));
    let code = if l.live {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    probe_answer(code, l.reason)
}
