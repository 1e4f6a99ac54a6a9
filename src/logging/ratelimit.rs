//! Suppression of repeated identical warnings and errors, as a layer around whichever output
//! layer is in use ([`RateLimited`]).
//!
//! A failing driver call or an unreachable engine can produce the same line every sampling
//! period. The first line is written; identical ones (same level, place in the code, message
//! and fields) within `interval` after it are only counted; the first one after the interval
//! is written again with the count of what was suppressed. Counts that no later line carries
//! are written as a summary line once the interval has passed (swept on later events, see
//! [`RateLimiter::expired`]) and at shutdown ([`flush`]). Info and below are never
//! suppressed: they are transitions, not floods.

use super::format::Fields;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::field::{Field, Value, display};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_core::callsite::{Callsite, Identifier};
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;
use tracing_core::subscriber::Interest;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// Most distinct lines remembered; the oldest is forgotten beyond this.
const MAX_KEYS: usize = 1024;

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Write it, saying how many identical lines were suppressed before it.
    Write { suppressed: u64 },
    /// Count it and write nothing.
    Suppress,
}

/// A count of suppressed lines that no later line will carry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending<K> {
    pub key: K,
    pub suppressed: u64,
    pub over: Duration,
}

#[derive(Debug)]
struct Window {
    written: Instant,
    suppressed: u64,
}

/// Per-line suppression state.
#[derive(Debug)]
pub(crate) struct RateLimiter<K> {
    interval: Duration,
    entries: HashMap<K, Window>,
}

impl<K: std::hash::Hash + Eq + Clone> RateLimiter<K> {
    /// Identical lines are written at most once per `interval`.
    pub(crate) fn new(interval: Duration) -> RateLimiter<K> {
        RateLimiter {
            interval,
            entries: HashMap::new(),
        }
    }

    /// Decides about an event with `key` seen at `now`.
    pub(crate) fn check(&mut self, key: &K, now: Instant) -> Decision {
        if let Some(e) = self.entries.get_mut(key) {
            if now.saturating_duration_since(e.written) < self.interval {
                e.suppressed += 1;
                return Decision::Suppress;
            }
            let suppressed = std::mem::take(&mut e.suppressed);
            e.written = now;
            return Decision::Write { suppressed };
        }
        if self.entries.len() >= MAX_KEYS {
            self.forget_oldest();
        }
        self.entries.insert(
            key.clone(),
            Window {
                written: now,
                suppressed: 0,
            },
        );
        Decision::Write { suppressed: 0 }
    }

    /// Counts whose interval has passed without a line to carry them (all counts when
    /// `all`, at shutdown). Quiet entries are forgotten.
    pub(crate) fn expired(&mut self, now: Instant, all: bool) -> Vec<Pending<K>> {
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

/// How often the suppressed counts are swept (not on every event: the sweep walks them all).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Most fields of an event the rate limiter's own lines repeat.
const MAX_FIELDS: usize = 32;

/// `inner`, with repeated identical warnings and errors held back: each event goes to `inner`
/// unchanged, is dropped and counted, or goes as a line of this layer's own saying how many
/// were suppressed (in the event's place, with its fields and a `suppressed` field).
pub(crate) struct RateLimited<L> {
    inner: L,
    state: Mutex<State>,
}

struct State {
    lines: RateLimiter<Key>,
    swept: Instant,
    /// The callsite of this layer's lines in each event's place, made once per place.
    derived: HashMap<Identifier, &'static Metadata<'static>>,
}

/// An event's identity: its callsite (level, place, target) and its fields.
#[derive(Clone)]
struct Key {
    meta: &'static Metadata<'static>,
    fields: Fields,
}

impl PartialEq for Key {
    fn eq(&self, o: &Key) -> bool {
        self.meta.callsite() == o.meta.callsite() && self.fields == o.fields
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.meta.callsite().hash(h);
        self.fields.hash(h);
    }
}

impl<L> RateLimited<L> {
    /// Identical lines reach `inner` at most once per `interval`.
    pub(crate) fn new(inner: L, interval: Duration) -> RateLimited<L> {
        RateLimited {
            inner,
            state: Mutex::new(State {
                lines: RateLimiter::new(interval),
                swept: Instant::now(),
                derived: HashMap::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `key`'s event with `message` and `suppressed = n` to `inner`.
    fn write<S: Subscriber>(&self, key: &Key, message: String, n: u64, ctx: &Context<'_, S>)
    where
        L: Layer<S>,
    {
        let meta = {
            let mut st = self.state();
            *st.derived
                .entry(key.meta.callsite())
                .or_insert_with(|| derived(key.meta))
        };
        let fields = meta.fields();
        let all: Vec<Field> = fields.iter().collect();
        let suppressed = display(n);
        let mut values: [(&Field, Option<&dyn Value>); MAX_FIELDS + 2] =
            [(&all[0], None); MAX_FIELDS + 2];
        for (slot, f) in values.iter_mut().zip(&all) {
            let v: Option<&dyn Value> = match f.name() {
                "message" => Some(&message),
                "suppressed" => Some(&suppressed),
                name => key
                    .fields
                    .fields
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.as_value()),
            };
            *slot = (f, v);
        }
        let values = fields.value_set(&values);
        self.inner.on_event(&Event::new(meta, &values), ctx.clone());
    }

    /// Writes the counts no later line will carry (every count when `all`).
    fn write_pending<S: Subscriber>(&self, now: Instant, all: bool, ctx: &Context<'_, S>)
    where
        L: Layer<S>,
    {
        let pending = {
            let mut st = self.state();
            if !all && now.saturating_duration_since(st.swept) < SWEEP_EVERY {
                return;
            }
            st.swept = now;
            st.lines.expired(now, all)
        };
        for p in pending {
            let message = format!(
                "{} (repeated {} more times in {:.0}s, suppressed)",
                p.key.fields.message,
                p.suppressed,
                p.over.as_secs_f64()
            );
            self.write(&p.key, message, p.suppressed, ctx);
        }
    }
}

impl<S: Subscriber, L: Layer<S>> Layer<S> for RateLimited<L> {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let now = Instant::now();
        if event.metadata().callsite() == FLUSH_META.callsite() {
            self.write_pending(now, true, &ctx);
            return;
        }
        let held = if *event.metadata().level() <= Level::WARN {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let key = Key {
                meta: event.metadata(),
                fields,
            };
            let verdict = self.state().lines.check(&key, now);
            Some((key, verdict))
        } else {
            None
        };
        self.write_pending(now, false, &ctx);
        match held {
            None | Some((_, Decision::Write { suppressed: 0 })) => self.inner.on_event(event, ctx),
            Some((key, Decision::Write { suppressed })) => {
                let message = format!(
                    "{} ({suppressed} identical lines suppressed before this one)",
                    key.fields.message
                );
                self.write(&key, message, suppressed, &ctx);
            }
            Some((_, Decision::Suppress)) => {}
        }
    }

    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(metadata, ctx)
    }

    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.event_enabled(event, ctx)
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        self.inner.on_new_span(attrs, id, ctx);
    }

    fn on_record(
        &self,
        span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        self.inner.on_record(span, values, ctx);
    }

    fn on_follows_from(
        &self,
        span: &tracing::span::Id,
        follows: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        self.inner.on_follows_from(span, follows, ctx);
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        self.inner.on_enter(id, ctx);
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: Context<'_, S>) {
        self.inner.on_exit(id, ctx);
    }

    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        self.inner.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &tracing::span::Id, new: &tracing::span::Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.inner.max_level_hint()
    }
}

/// Writes every suppressed count not yet reported (at shutdown): an event the current
/// subscriber's [`RateLimited`] layer takes as the cue, since a layer can reach its output
/// only from inside an event. Built by hand, not with a macro, so no level filter drops it.
pub(crate) fn flush() {
    let none: [(&Field, Option<&dyn Value>); 0] = [];
    Event::dispatch(&FLUSH_META, &FLUSH_META.fields().value_set(&none));
}

struct FlushCallsite;

static FLUSH_CALLSITE: FlushCallsite = FlushCallsite;

static FLUSH_META: Metadata<'static> = Metadata::new(
    "flush the suppressed counts",
    module_path!(),
    Level::ERROR,
    Some(file!()),
    Some(line!()),
    Some(module_path!()),
    FieldSet::new(&[], tracing_core::identify_callsite!(&FLUSH_CALLSITE)),
    Kind::EVENT,
);

impl Callsite for FlushCallsite {
    fn set_interest(&self, _: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        &FLUSH_META
    }
}

/// The callsite of the rate limiter's lines in the place of another callsite.
struct Derived(OnceLock<&'static Metadata<'static>>);

impl Callsite for Derived {
    fn set_interest(&self, _: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.0.get().expect("set as soon as it is made")
    }
}

/// The metadata of `meta`'s callsite with a `message` and a `suppressed` field (at most
/// [`MAX_FIELDS`] of the others), kept for the life of the process: `tracing` needs it
/// `'static`, and there is one per callsite that warns.
fn derived(meta: &'static Metadata<'static>) -> &'static Metadata<'static> {
    let mut names: Vec<&'static str> = meta
        .fields()
        .iter()
        .map(|f| f.name())
        .filter(|n| !matches!(*n, "message" | "suppressed"))
        .take(MAX_FIELDS)
        .collect();
    names.insert(0, "message");
    names.push("suppressed");
    let callsite: &'static Derived = Box::leak(Box::new(Derived(OnceLock::new())));
    let made: &'static Metadata<'static> = Box::leak(Box::new(Metadata::new(
        meta.name(),
        meta.target(),
        *meta.level(),
        meta.file(),
        meta.line(),
        meta.module_path(),
        FieldSet::new(
            Box::leak(names.into_boxed_slice()),
            tracing_core::identify_callsite!(callsite),
        ),
        Kind::EVENT,
    )));
    let _ = callsite.0.set(made);
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_lines_are_counted_and_the_count_rides_on_the_next_written_one() {
        let mut r = RateLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(r.check(&"a", t0), Decision::Write { suppressed: 0 });
        for i in 1..200u64 {
            // A failing call every 50 ms.
            assert_eq!(
                r.check(&"a", t0 + Duration::from_millis(50 * i)),
                Decision::Suppress
            );
        }
        assert_eq!(
            r.check(&"b", t0 + Duration::from_secs(1)),
            Decision::Write { suppressed: 0 },
            "a different line is not held back"
        );
        assert_eq!(
            r.check(&"a", t0 + Duration::from_secs(10)),
            Decision::Write { suppressed: 199 }
        );
        assert_eq!(
            r.check(&"a", t0 + Duration::from_millis(10_050)),
            Decision::Suppress
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
            Decision::Write { suppressed: 0 }
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

    /// Every event that reaches the output, as its level and fields.
    #[derive(Clone, Default)]
    struct Keep(std::sync::Arc<Mutex<Vec<(Level, Fields)>>>);

    impl<S: Subscriber> Layer<S> for Keep {
        fn on_event(&self, e: &Event<'_>, _: Context<'_, S>) {
            let mut f = Fields::default();
            e.record(&mut f);
            self.0.lock().unwrap().push((*e.metadata().level(), f));
        }
    }

    #[test]
    fn the_layer_passes_the_first_line_and_writes_the_count_of_the_rest() {
        use super::super::format::FieldValue;
        use tracing_subscriber::layer::SubscriberExt;
        let keep = Keep::default();
        let limited = RateLimited::new(keep.clone(), Duration::from_secs(60));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(limited), || {
            for _ in 0..5 {
                tracing::warn!(device = 1u32, "read failed");
            }
            tracing::warn!(device = 2u32, "read failed");
            tracing::info!("a transition");
            tracing::info!("a transition");
            flush();
        });
        let got = keep.0.lock().unwrap().clone();
        let lines: Vec<String> = got
            .iter()
            .map(|(l, f)| {
                let mut s = format!("{l} ");
                f.write_text(&mut s).unwrap();
                s
            })
            .collect();
        assert_eq!(
            lines,
            [
                "WARN read failed device=1",
                "WARN read failed device=2",
                "INFO a transition",
                "INFO a transition",
                "WARN read failed (repeated 4 more times in 0s, suppressed) device=1 suppressed=4",
            ]
        );
        assert_eq!(
            got[4].1.fields[0],
            ("device", FieldValue::U64(1)),
            "kept as a number"
        );
    }
}
