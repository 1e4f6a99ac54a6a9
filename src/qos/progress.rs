//! Forward progress of the engine, from successive `/metrics` scrapes.
//!
//! The engine is making progress when requests are running and the prompt or the generation
//! token counter advanced since the previous successful scrape; it is *stalled* when requests
//! are running and neither advanced. Nothing running is idle: nothing is owed, which scores
//! like progress. Unknown counters are unknown, never "stalled"; a counter that went down (the
//! engine restarted) is unknown too.
//!
//! What vLLM reports (every release from 0.8.5 to 0.33, docs/real-vllm.md): a prompt is added
//! to `prompt_tokens_total` whole, when the request's first output token comes out; a prefill
//! in progress is never reported. So a long prefill with nothing else decoding reads here as
//! *stalled* until it completes, and the counters alone cannot tell it from a stuck engine.
//! Stall detection therefore also asks for the absence of the other sign of life, a virtual
//! request served (`probe::virtual_inference`), and `stall_window` must exceed the longest
//! prefill the engine is expected to run (docs/qos.md).
//!
//! **Signs of life** (the agent policy's rule 11, docs/policy.md) are wider than tokens: the
//! scheduler's own figures, which vLLM refreshes after every engine step — the two token
//! counters, the KV-cache usage, and the running and waiting counts. A chunked prefill moves
//! the KV-cache usage at every chunk (its blocks are allocated chunk by chunk), a burst moves
//! the counts; a stuck step freezes all of them, since vLLM's API server only repeats the
//! last figures its engine core sent. The engine is *quiet* while it should be working —
//! requests running by its own count, or its NPU busy (a stuck step can freeze the count at 0:
//! the step that stuck was the one admitting a request, measured on real vLLM) — and not one
//! of them changed since the previous scrape ([`Progress::quiet_for`]). The quiet is measured
//! from the earlier scrape if the engine should have been working then too, else from now:
//! an engine idle for an hour that starts a long unchunked prefill is quiet from the first
//! scrape that saw it work. An engine that does not export the KV-cache usage is never quiet
//! (its prefill would be invisible).
//!
//! A failed scrape brings no news: it leaves the last state and the stall start as they were,
//! and the next successful scrape is compared with the last successful one. Readers decide
//! how old a state may be ([`Progress::state_at`], [`Progress::stalled_for`]).

use crate::probe::engine_metrics::EngineMetrics;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// What the last scrapes say about progress (`progress` in `/qos`).
pub(crate) use npu_health_wire::Progress as State;

/// [`Progress`] as the state file keeps it, with wall-clock times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Saved {
    /// Prompt and generation counters of the last successful scrape, and whether requests
    /// were running then.
    pub last: Option<(f64, f64, bool)>,
    pub state: State,
    pub stalled_since_unix_ms: Option<u64>,
    pub last_ok_unix_ms: Option<u64>,
    /// The signs of life of the last successful scrape (absent in a file written before
    /// they were kept).
    #[serde(default)]
    pub signs: Option<Signs>,
    #[serde(default)]
    pub quiet_since_unix_ms: Option<u64>,
    #[serde(default)]
    pub working: bool,
}

/// The scheduler's figures one scrape showed: what moves while the engine works.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Signs {
    pub prompt_tokens: f64,
    pub generation_tokens: f64,
    pub kv_cache_usage: f64,
    pub running: f64,
    /// Absent from some engines; compared when present.
    pub waiting: Option<f64>,
}

impl Signs {
    /// The signs in a scrape; `None` when a figure the rule needs is missing.
    pub(crate) fn of(m: &EngineMetrics) -> Option<Signs> {
        Some(Signs {
            prompt_tokens: m.prompt_tokens?,
            generation_tokens: m.generation_tokens?,
            kv_cache_usage: m.kv_cache_usage?,
            running: m.running?,
            waiting: m.waiting,
        })
    }
}

/// Tracks the token counters across scrapes.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Counters of the last successful scrape, and whether requests were running then.
    last: Option<(f64, f64, bool)>,
    state: State,
    /// Since when no token has advanced with requests running.
    stalled_since: Option<Instant>,
    /// Time of the last successful scrape.
    last_ok: Option<Instant>,
    /// The signs of life of the last successful scrape.
    signs: Option<Signs>,
    /// Since when no sign of life changed while the engine should have been working.
    quiet_since: Option<Instant>,
    /// The last scrape found the engine working: requests running, or its NPU busy.
    working: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            last: None,
            state: State::Unknown,
            stalled_since: None,
            last_ok: None,
            signs: None,
            quiet_since: None,
            working: false,
        }
    }
}

impl Progress {
    /// Takes one scrape made at `now` (`None`: the scrape failed, which changes nothing).
    pub(crate) fn observe(&mut self, m: Option<&EngineMetrics>, now: Instant) {
        self.observe_beside(m, now, None);
    }

    /// [`Progress::observe`], with whether the engine's NPU was busy over the time since the
    /// previous scrape (`None`: not known; the last known state stands).
    pub(crate) fn observe_beside(
        &mut self,
        m: Option<&EngineMetrics>,
        now: Instant,
        npu_busy: Option<bool>,
    ) {
        let Some(m) = m else { return };
        let running = m.running;
        let counters = m.prompt_tokens.zip(m.generation_tokens);
        let previous = self.last;
        let previous_at = self.last_ok;
        self.observe_signs(Signs::of(m), previous_at, now, npu_busy);
        self.last = counters.map(|(p, g)| (p, g, running.is_some_and(|r| r > 0.0)));
        self.last_ok = Some(now);
        self.state = match (running, counters, previous) {
            (Some(r), _, _) if r <= 0.0 => State::Idle,
            (Some(_), Some((p, g)), Some((p0, g0, _))) => {
                if p < p0 || g < g0 {
                    State::Unknown
                } else if p > p0 || g > g0 {
                    State::Advancing
                } else {
                    State::Stalled
                }
            }
            _ => State::Unknown,
        };
        if self.state != State::Stalled {
            self.stalled_since = None;
        } else if self.stalled_since.is_none() {
            // The counters have not moved since the previous scrape. If requests were
            // running then, the stall began no later than that scrape; if not, they arrived
            // in between and the stall is counted from now.
            let ran_before = previous.is_some_and(|(_, _, r)| r);
            self.stalled_since = Some(match previous_at {
                Some(t) if ran_before => t,
                _ => now,
            });
        }
    }

    /// Quiet: the engine should be working (requests running, or its NPU busy) and not one
    /// sign of life changed since the previous scrape. The quiet began no later than that
    /// scrape if the engine should have been working then too, else now.
    fn observe_signs(
        &mut self,
        signs: Option<Signs>,
        previous_at: Option<Instant>,
        now: Instant,
        npu_busy: Option<bool>,
    ) {
        let (before, was_working) = (self.signs, self.working);
        let working = signs.is_some_and(|s| s.running > 0.0)
            || npu_busy.unwrap_or(was_working && signs.is_some());
        self.signs = signs;
        self.working = working;
        match (signs, before) {
            (Some(s), Some(b)) if working && s == b => {
                if self.quiet_since.is_none() {
                    self.quiet_since = Some(match previous_at {
                        Some(t) if was_working => t,
                        _ => now,
                    });
                }
            }
            _ => self.quiet_since = None,
        }
    }

    /// How long the engine has shown no sign of life at `now`; `None` unless the last
    /// successful scrape (no older than `max_age`) says it is quiet.
    pub(crate) fn quiet_for(&self, now: Instant, max_age: Duration) -> Option<Duration> {
        match self.last_ok {
            Some(t) if now.saturating_duration_since(t) <= max_age => {
                self.quiet_since.map(|s| now.saturating_duration_since(s))
            }
            _ => None,
        }
    }

    /// The running count of the last successful scrape (no older than `max_age`); `None`
    /// when unknown.
    pub(crate) fn running(&self, now: Instant, max_age: Duration) -> Option<f64> {
        match self.last_ok {
            Some(t) if now.saturating_duration_since(t) <= max_age => self.signs.map(|s| s.running),
            _ => None,
        }
    }

    /// The state, or `Unknown` when the last successful scrape is older than `max_age`.
    pub(crate) fn state_at(&self, now: Instant, max_age: Duration) -> State {
        match self.last_ok {
            Some(t) if now.saturating_duration_since(t) <= max_age => self.state,
            _ => State::Unknown,
        }
    }

    /// How long the engine has been stalled at `now`; `None` unless the last successful
    /// scrape (no older than `max_age`) says it is stalled.
    pub(crate) fn stalled_for(&self, now: Instant, max_age: Duration) -> Option<Duration> {
        if self.state_at(now, max_age) != State::Stalled {
            return None;
        }
        self.stalled_since.map(|s| now.saturating_duration_since(s))
    }

    /// What outlives the agent process ([`Saved`]).
    pub(crate) fn saved(&self) -> Saved {
        Saved {
            last: self.last,
            state: self.state,
            stalled_since_unix_ms: self.stalled_since.map(crate::clock::unix_ms_of),
            last_ok_unix_ms: self.last_ok.map(crate::clock::unix_ms_of),
            signs: self.signs,
            quiet_since_unix_ms: self.quiet_since.map(crate::clock::unix_ms_of),
            working: self.working,
        }
    }

    /// The tracking as it was saved: a stall goes on being measured from when it began.
    pub(crate) fn restored(s: &Saved) -> Progress {
        Progress {
            last: s.last,
            state: s.state,
            stalled_since: s.stalled_since_unix_ms.map(crate::clock::instant_of),
            last_ok: s.last_ok_unix_ms.map(crate::clock::instant_of),
            signs: s.signs,
            quiet_since: s.quiet_since_unix_ms.map(crate::clock::instant_of),
            working: s.working,
        }
    }

    /// Progress component of the QoS score: 1 advancing or idle, 0 stalled, none unknown.
    pub(crate) fn score(state: State) -> Option<f64> {
        match state {
            State::Advancing | State::Idle => Some(1.0),
            State::Stalled => Some(0.0),
            State::Unknown => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGE: Duration = Duration::from_secs(15);

    fn m(running: f64, prompt: f64, gen_: f64) -> EngineMetrics {
        EngineMetrics {
            running: Some(running),
            prompt_tokens: Some(prompt),
            generation_tokens: Some(gen_),
            ..EngineMetrics::default()
        }
    }

    fn stalled(p: &Progress) -> Option<Duration> {
        p.stalled_for(Instant::now(), AGE)
    }

    #[tokio::test(start_paused = true)]
    async fn stall_measured_from_the_last_scrape_that_saw_the_counters() {
        let mut p = Progress::default();
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(
            p.state,
            State::Unknown,
            "one scrape says nothing about progress"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(p.state, State::Stalled);
        assert_eq!(stalled(&p), Some(Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(stalled(&p), Some(Duration::from_secs(10)));
        assert_eq!(Progress::score(p.state), Some(0.0));
    }

    // Requests that arrive on an idle engine are not stalled since before they arrived.
    #[tokio::test(start_paused = true)]
    async fn a_stall_after_idle_starts_now() {
        let mut p = Progress::default();
        p.observe(Some(&m(0.0, 100.0, 10.0)), Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(3.0, 100.0, 10.0)), Instant::now());
        assert_eq!(p.state, State::Stalled);
        assert_eq!(stalled(&p), Some(Duration::ZERO));
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(3.0, 100.0, 10.0)), Instant::now());
        assert_eq!(stalled(&p), Some(Duration::from_secs(5)));
    }

    // A long prefill as vLLM reports it: one request running, both counters flat until its
    // first token comes out, then the whole prompt at once. The counters alone say stalled
    // for the whole prefill (stall detection adds the served-probe rule on top), and the
    // prompt's arrival is progress.
    #[tokio::test(start_paused = true)]
    async fn long_prefill_reads_as_stalled_until_the_prompt_lands() {
        let mut p = Progress::default();
        for _ in 0..12 {
            p.observe(Some(&m(1.0, 10.0, 5.0)), Instant::now());
            tokio::time::advance(Duration::from_secs(5)).await;
        }
        assert_eq!(p.state_at(Instant::now(), AGE), State::Stalled);
        assert_eq!(stalled(&p), Some(Duration::from_secs(60)));
        p.observe(Some(&m(1.0, 10.0 + 100_000.0, 6.0)), Instant::now());
        assert_eq!(p.state, State::Advancing);
        assert_eq!(stalled(&p), None);
        assert_eq!(Progress::score(p.state), Some(1.0));
    }

    // A failed scrape is no news: the stall goes on being measured; a state older than the
    // freshness limit is unknown.
    #[tokio::test(start_paused = true)]
    async fn failed_scrapes_keep_the_last_state_until_it_is_too_old() {
        let mut p = Progress::default();
        p.observe(Some(&m(1.0, 5.0, 5.0)), Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(1.0, 5.0, 5.0)), Instant::now());
        assert_eq!(p.state, State::Stalled);
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(None, Instant::now());
        assert_eq!(stalled(&p), Some(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(1.0, 5.0, 5.0)), Instant::now());
        assert_eq!(
            stalled(&p),
            Some(Duration::from_secs(15)),
            "compared with the last good scrape"
        );
        tokio::time::advance(Duration::from_secs(16)).await;
        p.observe(None, Instant::now());
        assert_eq!(p.state_at(Instant::now(), AGE), State::Unknown, "16 s old");
        assert_eq!(stalled(&p), None);
    }

    fn signs(running: f64, prompt: f64, gen_: f64, kv: f64, waiting: f64) -> EngineMetrics {
        EngineMetrics {
            kv_cache_usage: Some(kv),
            waiting: Some(waiting),
            ..m(running, prompt, gen_)
        }
    }

    fn quiet(p: &Progress) -> Option<Duration> {
        p.quiet_for(Instant::now(), AGE)
    }

    // Each sign of life, alone, ends a quiet; a scrape that repeats the last one with
    // requests running is quiet since that last one.
    #[tokio::test(start_paused = true)]
    async fn any_sign_of_life_ends_a_quiet() {
        let base = (2.0, 100.0, 10.0, 0.25, 1.0);
        let moved: [(&str, EngineMetrics); 5] = [
            ("prompt tokens", signs(2.0, 101.0, 10.0, 0.25, 1.0)),
            ("generation tokens", signs(2.0, 100.0, 11.0, 0.25, 1.0)),
            (
                "KV-cache usage (a prefill chunk)",
                signs(2.0, 100.0, 10.0, 0.26, 1.0),
            ),
            ("running count", signs(3.0, 100.0, 10.0, 0.25, 1.0)),
            ("waiting count", signs(2.0, 100.0, 10.0, 0.25, 2.0)),
        ];
        for (what, next) in moved {
            let mut p = Progress::default();
            let b = signs(base.0, base.1, base.2, base.3, base.4);
            p.observe(Some(&b), Instant::now());
            tokio::time::advance(Duration::from_secs(5)).await;
            p.observe(Some(&b), Instant::now());
            assert_eq!(quiet(&p), Some(Duration::from_secs(5)), "{what}: quiet");
            tokio::time::advance(Duration::from_secs(5)).await;
            p.observe(Some(&next), Instant::now());
            assert_eq!(quiet(&p), None, "{what} moved: a sign of life");
        }
    }

    // Quiet needs requests running and the KV-cache figure; a failed scrape is no news; an
    // old state is unknown; the quiet outlives the agent through the state file.
    #[tokio::test(start_paused = true)]
    async fn quiet_needs_running_requests_and_the_kv_figure() {
        let mut p = Progress::default();
        let idle = signs(0.0, 100.0, 10.0, 0.0, 0.0);
        p.observe(Some(&idle), Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&idle), Instant::now());
        assert_eq!(quiet(&p), None, "nothing running is idle, never quiet");
        let no_kv = m(2.0, 100.0, 10.0);
        p.observe(Some(&no_kv), Instant::now());
        p.observe(Some(&no_kv), Instant::now());
        assert_eq!(
            quiet(&p),
            None,
            "no KV-cache figure: a prefill would be invisible"
        );
        let stuck = signs(2.0, 100.0, 10.0, 0.5, 0.0);
        p.observe(Some(&stuck), Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&stuck), Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        p.observe(None, Instant::now());
        assert_eq!(
            quiet(&p),
            Some(Duration::from_secs(7)),
            "a failed scrape: no news"
        );
        let restored = Progress::restored(&p.saved());
        assert_eq!(
            quiet(&restored),
            Some(Duration::from_secs(7)),
            "kept across a restart"
        );
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(quiet(&p), None, "the last good scrape is too old");
    }

    // A stuck step can freeze the running count at 0 (real vLLM: the step that stuck was
    // admitting a request); the busy NPU says the engine should be working. And an engine idle
    // for long that starts a long unchunked prefill (vLLM publishes nothing until the step
    // ends) is quiet from the first scrape that saw its NPU busy, not from the idle hour.
    #[tokio::test(start_paused = true)]
    async fn a_busy_npu_makes_a_frozen_idle_count_quiet_from_when_it_began() {
        let mut p = Progress::default();
        let idle = signs(0.0, 100.0, 10.0, 0.0, 0.0);
        for _ in 0..12 {
            p.observe_beside(Some(&idle), Instant::now(), Some(false));
            tokio::time::advance(Duration::from_secs(5)).await;
        }
        assert_eq!(quiet(&p), None, "idle: not working");
        p.observe_beside(Some(&idle), Instant::now(), Some(true));
        assert_eq!(
            quiet(&p),
            Some(Duration::ZERO),
            "quiet from the first busy scrape"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe_beside(Some(&idle), Instant::now(), Some(true));
        assert_eq!(quiet(&p), Some(Duration::from_secs(5)));
        assert_eq!(
            p.running(Instant::now(), AGE),
            Some(0.0),
            "quiet with nothing running by the engine's count (the loop's line says so)"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        p.observe_beside(Some(&idle), Instant::now(), None);
        assert_eq!(
            quiet(&p),
            Some(Duration::from_secs(6)),
            "a fresh read without the NPU keeps the last known state"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        p.observe_beside(
            Some(&signs(0.0, 32_868.0, 11.0, 0.0, 0.0)),
            Instant::now(),
            Some(true),
        );
        assert_eq!(quiet(&p), None, "the prompt landed: a sign of life");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_unknown_resets_and_recovery() {
        let mut p = Progress::default();
        p.observe(Some(&m(0.0, 5.0, 5.0)), Instant::now());
        assert_eq!(p.state, State::Idle);
        assert_eq!(Progress::score(State::Idle), Some(1.0), "idle owes nothing");
        p.observe(Some(&m(1.0, 5.0, 5.0)), Instant::now());
        assert_eq!(p.state, State::Stalled);
        // The engine restarted: counters went down. Unknown, not advancing, not stalled.
        p.observe(Some(&m(1.0, 0.0, 0.0)), Instant::now());
        assert_eq!(p.state, State::Unknown);
        assert_eq!(stalled(&p), None);
        p.observe(Some(&m(1.0, 0.0, 1.0)), Instant::now());
        assert_eq!(p.state, State::Advancing);
        let missing = EngineMetrics {
            running: Some(1.0),
            ..EngineMetrics::default()
        };
        p.observe(Some(&missing), Instant::now());
        assert_eq!(p.state, State::Unknown, "counters missing");
        assert_eq!(Progress::score(State::Unknown), None);
    }
}
