//! Envoy: its active health check polls `/readyz` (on the engine's listener, or
//! `/engines/<name>/readyz` on the admin one), so Envoy's rule is the agent's readiness rule,
//! read in Envoy's words ([`told::EnvoyState`]): 503 is `unhealthy`, a 200 with
//! `x-envoy-degraded: true` (at `degrade`) is `degraded`. It hears every `/readyz` answer
//! through the seam's hook ([`Integration::heard_readyz`]): it adds `x-envoy-degraded` at
//! `degrade`, and records an answer to Envoy's health checker (`user-agent: Envoy/HC`) as
//! what Envoy was told. Checked against Envoy 1.40 (docs/degradation.md).

pub(crate) mod told;

use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::answers::Readiness;
use crate::integrations::seam::{Integration, Readyz};
use crate::monitor::journal::{Id, Told};
use axum::http::{HeaderMap, HeaderValue, header};
use strum::IntoEnumIterator;
use told::EnvoyState;

/// Its name in the journal, `/status/detail` and the metrics.
pub(crate) const ID: Id = Id("envoy");

/// The host state Envoy read, as the journal records it.
impl From<EnvoyState> for Told {
    fn from(s: EnvoyState) -> Told {
        Told::state(ID, "health_check", s.as_str())
    }
}

/// The header that makes a passing answer `degraded` to Envoy.
pub(crate) const DEGRADED: &str = "x-envoy-degraded";

/// The user agent of Envoy's health checker (`Envoy/HC`).
const HEALTH_CHECKER: &str = "Envoy/HC";

/// Envoy, in the registry.
pub(crate) struct Envoy;

impl Integration for Envoy {
    fn id(&self) -> Id {
        ID
    }

    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String {
        format!(
            "active health check on /readyz at {}{}: 503 where /readyz is (the kubelet's line), x-envoy-degraded: true at degrade",
            spec.mgmt_listen,
            match agent.admin_listen {
                Some(a) => format!(" or /engines/{}/readyz at {a}", spec.name),
                None => String::new(),
            }
        )
    }

    fn router_states(&self) -> Vec<Told> {
        EnvoyState::iter().map(Told::from).collect()
    }

    fn heard_readyz(&self, a: &Readyz<'_>, extra: &mut HeaderMap) {
        if is_health_checker(a.asked) {
            a.engine
                .told_router(Told::from(state(a.readiness)), &a.readiness.reason);
        }
        if a.readiness.degraded {
            extra.insert(DEGRADED, HeaderValue::from_static("true"));
        }
    }
}

/// What Envoy reads in the answer `r`.
pub(crate) fn state(r: &Readiness) -> EnvoyState {
    match (r.ready, r.degraded) {
        (true, false) => EnvoyState::Healthy,
        (true, true) => EnvoyState::Degraded,
        (false, _) => EnvoyState::Unhealthy,
    }
}

/// Whether the request comes from Envoy's health checker.
pub(crate) fn is_health_checker(headers: &HeaderMap) -> bool {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with(HEALTH_CHECKER))
}
