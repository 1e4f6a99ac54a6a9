//! `engine-ping`: vllm-ascend's health ping (vllm-project/vllm-ascend PR #14240, open),
//! and the kubelet liveness probe with the API defaults on the `/health` it changes.
//!
//! The patch makes vLLM's `check_health` ping the EngineCore over its utility path with a
//! timeout (`VLLM_HEALTH_CHECK_TIMEOUT_S`, 10 s); a ping with no answer sets `engine_dead`,
//! and `/health` answers 503 from then on. The EngineCore answers between two steps, so a
//! hang, a stuck NPU or one long unchunked step leaves it unanswered; a saturated engine
//! answers at its next step. The fake engine does this when started with
//! `--health-ping-timeout` ([`engine_args`]), which the runner passes for this policy only.

use crate::timescale::fmt_duration;
use std::time::Duration;

/// `VLLM_HEALTH_CHECK_TIMEOUT_S`'s default in the patch.
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The fake engine's flag for this peer: the ping's timeout, scaled.
pub(super) fn engine_args(s: f64) -> Vec<String> {
    vec![
        "--health-ping-timeout".to_owned(),
        fmt_duration(super::timeout(PING_TIMEOUT, s)),
    ]
}
