//! Time scaling: every interval of an experiment (the agent's, Node Manager's, the engine's
//! speed, the fault's) is multiplied by the run's `time_scale`. A bottom module: it names no
//! other module of the crate, so the runner, the agent's operations and the router all read
//! it without reaching into each other.

use std::time::Duration;

/// The scaled duration.
pub(crate) fn scaled(d: Duration, s: f64) -> Duration {
    Duration::from_secs_f64(d.as_secs_f64() * s)
}

/// The scaled duration, at least `floor`.
pub(crate) fn scaled_at_least(d: Duration, s: f64, floor: Duration) -> Duration {
    scaled(d, s).max(floor)
}

/// A duration as configs and flags take it, to the microsecond (at least 1 µs).
pub(crate) fn fmt_duration(d: Duration) -> String {
    format!("{}us", d.as_micros().max(1))
}

/// The fake engine's speed in a run, main and draft alike: 20 ms to the first token and
/// 5 ms a token (scaled), and vLLM's default `max_num_seqs` (long streams run instead of
/// queueing).
pub fn fake_engine_speed(s: f64) -> Vec<String> {
    vec![
        "--ttft".to_owned(),
        fmt_duration(scaled(Duration::from_millis(20), s)),
        "--tpot".to_owned(),
        fmt_duration(scaled(Duration::from_millis(5), s)),
        "--max-running".to_owned(),
        "256".to_owned(),
    ]
}
