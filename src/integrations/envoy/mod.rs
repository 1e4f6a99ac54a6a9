//! Envoy: its active health check polls the kubelet's `/readyz` (on the engine's listener, or
//! `/engines/<name>/readyz` on the admin one), so Envoy's rule is the readiness rule, read in
//! Envoy's words ([`told::EnvoyState`]): 503 is `unhealthy`, a 200 with
//! `x-envoy-degraded: true` (at `degrade`) is `degraded`. An answer to Envoy's health checker
//! (`user-agent: Envoy/HC`) is recorded as what Envoy was told. Checked against Envoy 1.40
//! (docs/degradation.md).

pub mod told;

use super::Integration;
use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::kubelet::Readiness;
use crate::monitor::Monitor;
use crate::monitor::journal::{self, Told};
use axum::http::{HeaderMap, header};
use strum::IntoEnumIterator;
use told::EnvoyState;

/// The header that makes a passing answer `degraded` to Envoy.
pub const DEGRADED: &str = "x-envoy-degraded";

/// The user agent of Envoy's health checker (`Envoy/HC`).
const HEALTH_CHECKER: &str = "Envoy/HC";

/// Envoy, in the registry.
pub struct Envoy;

impl Integration for Envoy {
    fn id(&self) -> journal::Integration {
        journal::Integration::Envoy
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
        EnvoyState::iter().map(Told::Envoy).collect()
    }
}

/// What Envoy reads in the answer `r`.
pub fn state(r: &Readiness) -> EnvoyState {
    match (r.ready, r.degraded) {
        (true, false) => EnvoyState::Healthy,
        (true, true) => EnvoyState::Degraded,
        (false, _) => EnvoyState::Unhealthy,
    }
}

/// Whether the request comes from Envoy's health checker.
pub fn is_health_checker(headers: &HeaderMap) -> bool {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with(HEALTH_CHECKER))
}

/// Records the answer `r` as what Envoy was told, when Envoy's health checker asked.
pub fn note(e: &Monitor, headers: &HeaderMap, r: &Readiness) {
    if is_health_checker(headers) {
        e.told_router(Told::Envoy(state(r)), &r.reason);
    }
}
