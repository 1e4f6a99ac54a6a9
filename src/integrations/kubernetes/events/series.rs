//! Which Events are written, and when (pure; time from tokio's clock, so the windows run under
//! paused time): the series of client-go's events.k8s.io/v1 recorder
//! (`staging/src/k8s.io/client-go/tools/events/event_broadcaster.go`, `recordToSink`,
//! `finishSeries`, `refreshExistingEventSeries`, `getKey`).
//!
//! - An Event is keyed by what makes two of them the same occurrence ([`Key`]: type, action,
//!   reason, reporting controller and instance, regarding, related); the note is not in it,
//!   so an occurrence whose figures changed still joins the series.
//! - The first of a key is created. The second while the first is cached becomes a series:
//!   count 2, written at once (a strategic-merge PATCH of `series`). Later ones only count in
//!   memory.
//! - [`Cache::finish`] (every [`FINISH`]): a series quiet for [`FINISH`] has its count
//!   written and leaves the cache; a single Event older than [`FINISH`] leaves it. The next
//!   occurrence then creates a new Event.
//! - [`Cache::refresh`] (every [`REFRESH`]): every series has its count written.
//!
//! Unlike client-go's map, the cache holds at most a cap of keys: past it the key observed
//! longest ago leaves first (its count written, when a series).

use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// A series quiet this long is finished (client-go's `finishTime`), and finishing runs this
/// often.
pub(crate) const FINISH: Duration = Duration::from_secs(6 * 60);
/// Every series has its count written this often (client-go's `refreshTime`).
pub(crate) const REFRESH: Duration = Duration::from_secs(30 * 60);

/// What makes two Events the same occurrence (client-go's `eventKey`; the note is not in it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub type_: &'static str,
    pub action: &'static str,
    pub reason: &'static str,
    pub controller: String,
    pub instance: String,
    /// The regarding object: `(namespace, name, uid)`.
    pub regarding: (String, String, String),
    /// The agent names no related object: always empty, kept for the key's shape.
    pub related: Option<(String, String, String)>,
}

/// A write to the API server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// Create this Event.
    Create(Box<Event>),
    /// Patch the series of this Event (already created under its name); create it, series
    /// and all, if the API server no longer has it.
    Series(Box<Event>),
}

impl Write {
    /// The Event written.
    pub(crate) fn event(&self) -> &Event {
        match self {
            Write::Create(e) | Write::Series(e) => e,
        }
    }
}

#[derive(Debug)]
struct Entry {
    event: Event,
    /// The first occurrence, or the series' last.
    observed: Instant,
}

/// The cached Events, by key.
#[derive(Debug)]
pub(crate) struct Cache {
    entries: HashMap<Key, Entry>,
    cap: usize,
}

impl Cache {
    /// An empty cache of at most `cap` keys (at least one).
    pub(crate) fn new(cap: usize) -> Cache {
        Cache {
            entries: HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// Keys cached.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// An occurrence of `event` under `key` at `now` (`wall`: the same moment as the Event's
    /// time): what to write, oldest first (a key pushed out of a full cache, then this one).
    pub(crate) fn observe(
        &mut self,
        key: Key,
        event: Event,
        now: Instant,
        wall: MicroTime,
    ) -> Vec<Write> {
        if let Some(e) = self.entries.get_mut(&key) {
            e.observed = now;
            return match &mut e.event.series {
                Some(s) => {
                    s.count = s.count.saturating_add(1);
                    s.last_observed_time = wall;
                    Vec::new()
                }
                None => {
                    e.event.series = Some(EventSeries {
                        count: 2,
                        last_observed_time: wall,
                    });
                    vec![Write::Series(Box::new(e.event.clone()))]
                }
            };
        }
        let mut out = Vec::new();
        if self.entries.len() >= self.cap
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.observed)
                .map(|(k, _)| k.clone())
            && let Some(gone) = self.entries.remove(&oldest)
            && gone.event.series.is_some()
        {
            out.push(Write::Series(Box::new(gone.event)));
        }
        self.entries.insert(
            key,
            Entry {
                event: event.clone(),
                observed: now,
            },
        );
        out.push(Write::Create(Box::new(event)));
        out
    }

    /// At `now`: drops the single Events older than [`FINISH`], and returns the series quiet
    /// for [`FINISH`], whose final count is to be written; [`Cache::finished`] drops one once
    /// written.
    pub(crate) fn finish(&mut self, now: Instant) -> Vec<(Key, Write)> {
        let stale = |e: &Entry| now.saturating_duration_since(e.observed) >= FINISH;
        self.entries
            .retain(|_, e| !(e.event.series.is_none() && stale(e)));
        self.entries
            .iter()
            .filter(|(_, e)| stale(e))
            .map(|(k, e)| (k.clone(), Write::Series(Box::new(e.event.clone()))))
            .collect()
    }

    /// A finished series' count was written (or refused for good): it leaves the cache,
    /// unless it was observed again meanwhile.
    pub(crate) fn finished(&mut self, key: &Key, now: Instant) {
        if self
            .entries
            .get(key)
            .is_some_and(|e| now.saturating_duration_since(e.observed) >= FINISH)
        {
            self.entries.remove(key);
        }
    }

    /// Every series, its count to be written again.
    pub(crate) fn refresh(&self) -> Vec<Write> {
        self.entries
            .values()
            .filter(|e| e.event.series.is_some())
            .map(|e| Write::Series(Box::new(e.event.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &'static str) -> Key {
        Key {
            type_: "Warning",
            action: "SetCondition",
            reason,
            controller: "npu-health-agent.io/agent".into(),
            instance: "npu-health-agent.io/agent-n1".into(),
            regarding: ("inference".into(), "vllm-0".into(), "u1".into()),
            related: None,
        }
    }

    fn ev(note: &str) -> Event {
        Event {
            note: Some(note.into()),
            ..Event::default()
        }
    }

    fn wall() -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::now())
    }

    fn count(w: &Write) -> Option<i32> {
        w.event().series.as_ref().map(|s| s.count)
    }

    // client-go's series: create, then count 2 written, then counted in memory only; the note
    // is not in the key (the first note stays, as the API server keeps it immutable).
    #[tokio::test(start_paused = true)]
    async fn the_first_is_created_the_second_makes_a_series_and_later_ones_only_count() {
        let mut c = Cache::new(8);
        let t = Instant::now();
        let w = c.observe(key("EngineNotReady"), ev("a"), t, wall());
        assert!(matches!(w.as_slice(), [Write::Create(_)]), "{w:?}");
        let w = c.observe(key("EngineNotReady"), ev("b"), t, wall());
        assert!(matches!(w.as_slice(), [Write::Series(_)]), "{w:?}");
        assert_eq!(count(&w[0]), Some(2));
        assert_eq!(w[0].event().note.as_deref(), Some("a"));
        for _ in 0..3 {
            assert!(
                c.observe(key("EngineNotReady"), ev("c"), t, wall())
                    .is_empty()
            );
        }
        let r = c.refresh();
        assert_eq!(r.iter().map(count).collect::<Vec<_>>(), [Some(5)]);
        // Another reason is another Event.
        let w = c.observe(key("EngineReady"), ev("d"), t, wall());
        assert!(matches!(w.as_slice(), [Write::Create(_)]));
    }

    // Six minutes quiet finishes a series (its count written, then gone) and drops a single
    // Event; the next occurrence creates a new Event. Not before six minutes.
    #[tokio::test(start_paused = true)]
    async fn six_quiet_minutes_finish_a_series_and_the_next_occurrence_starts_over() {
        let mut c = Cache::new(8);
        let t0 = Instant::now();
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("B"), ev("b"), t0, wall());
        assert_eq!(
            FINISH,
            Duration::from_secs(6 * 60),
            "client-go's finishTime"
        );
        let early = t0 + FINISH - Duration::from_secs(1);
        assert!(c.finish(early).is_empty());
        assert_eq!(c.len(), 2);
        let t = t0 + FINISH;
        let f = c.finish(t);
        assert_eq!(c.len(), 1, "the single B is dropped, the series A waits");
        assert_eq!(f.len(), 1);
        assert_eq!(count(&f[0].1), Some(3));
        c.finished(&f[0].0, t);
        assert_eq!(c.len(), 0);
        let w = c.observe(key("A"), ev("a"), t, wall());
        assert!(matches!(w.as_slice(), [Write::Create(_)]));
    }

    // A series observed again between its finish and the write of its count stays.
    #[tokio::test(start_paused = true)]
    async fn a_series_observed_again_while_finishing_stays() {
        let mut c = Cache::new(8);
        let t0 = Instant::now();
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("A"), ev("a"), t0, wall());
        let t = t0 + FINISH;
        let f = c.finish(t);
        c.observe(key("A"), ev("a"), t, wall());
        c.finished(&f[0].0, t);
        assert_eq!(c.len(), 1);
        assert_eq!(c.refresh().iter().map(count).collect::<Vec<_>>(), [Some(3)]);
    }

    // The cache is bounded: past the cap, the key observed longest ago leaves, and a series
    // leaving has its count written first.
    #[tokio::test(start_paused = true)]
    async fn a_full_cache_lets_the_oldest_key_go_with_its_count_written() {
        let mut c = Cache::new(2);
        let t0 = Instant::now();
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("A"), ev("a"), t0, wall());
        c.observe(key("A"), ev("a"), t0, wall());
        let t1 = t0 + Duration::from_secs(1);
        c.observe(key("B"), ev("b"), t1, wall());
        let w = c.observe(key("C"), ev("c"), t1 + Duration::from_secs(1), wall());
        assert_eq!(c.len(), 2);
        assert!(
            matches!(w.as_slice(), [Write::Series(_), Write::Create(_)]),
            "{w:?}"
        );
        assert_eq!(count(&w[0]), Some(3));
        assert_eq!(w[1].event().note.as_deref(), Some("c"));
        // A single Event leaving writes nothing but its successor's create.
        let w = c.observe(key("D"), ev("d"), t1 + Duration::from_secs(2), wall());
        assert!(matches!(w.as_slice(), [Write::Create(_)]), "{w:?}");
    }
}
