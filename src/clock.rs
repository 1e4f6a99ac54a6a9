//! Wall-clock milliseconds and their conversion to and from tokio's monotonic clock.
//!
//! The rules age their inputs on tokio's clock (so they run under paused time in tests), but a
//! moment that must outlive the process (the state file, `continuity`) can only be written
//! as wall-clock time. These convert at the moment of saving and of loading; a moment that
//! lies in the future is taken as now.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Milliseconds since the Unix epoch, now (0 if the clock is before the epoch).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wall-clock time of `at` (a moment on tokio's clock), in Unix milliseconds.
pub(crate) fn unix_ms_of(at: Instant) -> u64 {
    let ago = Instant::now().saturating_duration_since(at);
    unix_ms().saturating_sub(ago.as_millis() as u64)
}

/// The moment on tokio's clock of a wall-clock time `ms`; one in the future is now, one
/// before the clock's start is its start.
pub(crate) fn instant_of(ms: u64) -> Instant {
    let now = Instant::now();
    let ago = Duration::from_millis(unix_ms().saturating_sub(ms));
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_moment_survives_the_round_trip_to_wall_clock_time() {
        let at = Instant::now() - Duration::from_secs(7);
        let back = instant_of(unix_ms_of(at));
        let diff = if back > at { back - at } else { at - back };
        assert!(diff <= Duration::from_millis(2), "{diff:?}");
    }

    #[tokio::test]
    async fn a_moment_in_the_future_is_now() {
        let future = unix_ms() + 60_000;
        assert!(instant_of(future) <= Instant::now());
    }
}
