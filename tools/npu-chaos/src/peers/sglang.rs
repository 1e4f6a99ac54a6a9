//! `sglang-health-generate`: a kubelet liveness probe on SGLang's `GET /health_generate`.
//!
//! - What it calls (sgl-project/sglang `python/sglang/srt/entrypoints/http_server.py` @
//!   0025436eab0556737d615b36a4dd3e1e26e82f3d): 503 while the server starts or shuts down;
//!   else a one-token generation, and a poll every 1 s for any output of the engine since
//!   the call began, up to `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s): 200 if one came, else 503.
//!   The fake engine serves it in every profile (`fakes/fake-engine/src/engine/sglang.rs`);
//!   the runner gives it the poll and the budget scaled ([`engine_args`]).
//! - The probe's settings: SGLang's own Kubernetes examples (`docs/references/…/lws-examples`,
//!   the `sglang-leaderworkerset` chart) put no probe on `/health_generate`; the OME examples
//!   of the same organisation use it for readiness and start-up only. So: the API defaults
//!   (period 10 s, `failureThreshold` 3) with the timeout raised to 30 s, past the 20 s budget
//!   and its 1 s poll (30 s is what those OME examples give their start-up probe on it). A
//!   shorter timeout would see a client timeout, not SGLang's 503.

use crate::kubelet::ProbeSpec;
use crate::timescale::fmt_duration;
use std::time::Duration;

/// SGLang's poll for an output.
pub(super) const POLL: Duration = Duration::from_secs(1);
/// `SGLANG_HEALTH_CHECK_TIMEOUT`'s default.
pub(super) const BUDGET: Duration = Duration::from_secs(20);

/// The liveness probe on `/health_generate`: the API defaults, the timeout past the budget.
pub(super) const PROBE: ProbeSpec = ProbeSpec {
    timeout: Duration::from_secs(30),
    ..super::k8s::DEFAULTS
};

/// The fake engine's flags for this peer: SGLang's poll and budget, scaled (the budget at
/// least the timeout floor, as every peer timeout).
pub(super) fn engine_args(s: f64) -> Vec<String> {
    vec![
        "--health-poll".to_owned(),
        fmt_duration(super::interval(POLL, s)),
        "--health-budget".to_owned(),
        fmt_duration(super::timeout(BUDGET, s)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    // The probe waits longer than SGLang's check can take, or it would not be SGLang's
    // behaviour (a client timeout instead of its 503).
    #[test]
    fn the_probe_outwaits_the_budget_and_its_poll() {
        assert!(PROBE.timeout > BUDGET + POLL);
        assert_eq!(PROBE.failure_threshold, 3);
        assert_eq!(PROBE.period, Duration::from_secs(10));
        for s in [0.05, 0.2, 1.0] {
            let spec = crate::peers::scaled_spec(PROBE, s);
            assert!(spec.timeout > crate::peers::timeout(BUDGET, s), "{s}");
        }
    }
}
