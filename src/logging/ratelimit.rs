//! Suppression of repeated identical warnings and errors.
//!
//! A failing driver call or an unreachable engine can produce the same line every sampling
//! period. The first line is written; identical ones (same level, place in the code, message
//! and fields) within `interval` after it are only counted; the first one after the interval
//! is written again with the count of what was suppressed. Counts that no later line carries
//! are written as a summary line once the interval has passed (the caller sweeps them, see
//! [`RateLimiter::expired`]) and at shutdown. Info and below are never suppressed: they are transitions, not floods.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most distinct lines remembered; the oldest is forgotten beyond this.
const MAX_KEYS: usize = 1024;

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write it, saying how many identical lines were suppressed before it.
    Write { suppressed: u64 },
    /// Count it and write nothing.
    Suppress,
}

/// A count of suppressed lines that no later line will carry.
#[derive(Debug, PartialEq, Eq)]
pub struct Pending<K> {
    pub key: K,
    pub suppressed: u64,
    pub over: Duration,
}

#[derive(Debug)]
struct Entry {
    written: Instant,
    suppressed: u64,
}

/// Per-line suppression state.
#[derive(Debug)]
pub struct RateLimiter<K> {
    interval: Duration,
    entries: HashMap<K, Entry>,
}

impl<K: std::hash::Hash + Eq + Clone> RateLimiter<K> {
    /// Identical lines are written at most once per `interval`.
    pub fn new(interval: Duration) -> RateLimiter<K> {
        RateLimiter {
            interval,
            entries: HashMap::new(),
        }
    }

    /// Decides about an event with `key` seen at `now`.
    pub fn check(&mut self, key: &K, now: Instant) -> Verdict {
        if let Some(e) = self.entries.get_mut(key) {
            if now.saturating_duration_since(e.written) < self.interval {
                e.suppressed += 1;
                return Verdict::Suppress;
            }
            let suppressed = std::mem::take(&mut e.suppressed);
            e.written = now;
            return Verdict::Write { suppressed };
        }
        if self.entries.len() >= MAX_KEYS {
            self.forget_oldest();
        }
        self.entries.insert(
            key.clone(),
            Entry {
                written: now,
                suppressed: 0,
            },
        );
        Verdict::Write { suppressed: 0 }
    }

    /// Counts whose interval has passed without a line to carry them (all counts when
    /// `all`, at shutdown). Quiet entries are forgotten.
    pub fn expired(&mut self, now: Instant, all: bool) -> Vec<Pending<K>> {
        let mut out = Vec::new();
        let interval = self.interval;
        self.entries.retain(|k, e| {
            let age = now.saturating_duration_since(e.written);
            if !(all || age >= interval) {
                return true;
            }
            if e.suppressed > 0 {
                out.push(Pending {
                    key: k.clone(),
                    suppressed: e.suppressed,
                    over: age,
                });
                e.suppressed = 0;
                e.written = now;
                return true;
            }
            // Quiet for a whole interval: the next identical line is written at once.
            false
        });
        out
    }

    fn forget_oldest(&mut self) {
        if let Some(k) = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.written)
            .map(|(k, _)| k.clone())
        {
            self.entries.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_lines_are_counted_and_the_count_rides_on_the_next_written_one() {
        let mut r = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.check(&"a", t0), Verdict::Write { suppressed: 0 });
        for i in 1..200u64 {
            // A failing call every 50 ms.
            assert_eq!(
                r.check(&"a", t0 + Duration::from_millis(50 * i)),
                Verdict::Suppress
            );
        }
        assert_eq!(
            r.check(&"b", t0 + Duration::from_secs(1)),
            Verdict::Write { suppressed: 0 },
            "a different line is not held back"
        );
        assert_eq!(
            r.check(&"a", t0 + Duration::from_secs(10)),
            Verdict::Write { suppressed: 199 }
        );
        assert_eq!(
            r.check(&"a", t0 + Duration::from_millis(10_050)),
            Verdict::Suppress
        );
    }

    #[test]
    fn counts_without_a_later_line_are_reported_once_and_quiet_lines_forgotten() {
        let mut r = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        r.check(&"a", t0);
        r.check(&"a", t0 + Duration::from_secs(1));
        r.check(&"a", t0 + Duration::from_secs(2));
        r.check(&"q", t0);
        assert!(r.expired(t0 + Duration::from_secs(5), false).is_empty());
        let p = r.expired(t0 + Duration::from_secs(11), false);
        assert_eq!(
            p,
            vec![Pending {
                key: "a",
                suppressed: 2,
                over: Duration::from_secs(11)
            }]
        );
        assert!(r.expired(t0 + Duration::from_secs(12), false).is_empty());
        // "q" was quiet: forgotten, so it is written at once next time.
        assert_eq!(
            r.check(&"q", t0 + Duration::from_secs(12)),
            Verdict::Write { suppressed: 0 }
        );
    }

    #[test]
    fn shutdown_reports_every_count() {
        let mut r = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        r.check(&"a", t0);
        r.check(&"a", t0 + Duration::from_millis(1));
        let p = r.expired(t0 + Duration::from_millis(2), true);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].suppressed, 1);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut r = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..(MAX_KEYS as u64 + 10) {
            r.check(&i, t0 + Duration::from_micros(i));
        }
        assert_eq!(r.entries.len(), MAX_KEYS);
        assert!(!r.entries.contains_key(&0));
    }
}
