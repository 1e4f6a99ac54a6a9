//! What Envoy's active health check is told about an engine, in Envoy's own words (its
//! host health: `healthy`, `degraded`, `unhealthy`). Data only.

use serde::{Deserialize, Serialize};

/// The state an answer to Envoy's health checker puts the engine's host in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum EnvoyState {
    /// 200 without `x-envoy-degraded`.
    Healthy,
    /// 200 with `x-envoy-degraded: true`: Envoy routes to it only when no healthy host is left.
    Degraded,
    /// 503.
    Unhealthy,
}

impl EnvoyState {
    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}
