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
//! A failed scrape brings no news: it leaves the last state and the stall start as they were,
//! and the next successful scrape is compared with the last successful one. Readers decide
//! how old a state may be ([`Progress::state_at`], [`Progress::stalled_for`]).

use crate::probe::engine_metrics::EngineMetrics;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// What the last scrapes say about progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Not enough data (no scrape yet, counters missing or reset, or too old).
    Unknown,
    /// Nothing running.
    Idle,
    /// Requests running and tokens advancing.
    Advancing,
    /// Requests running and no token advanced since the previous scrape.
    Stalled,
}

/// [`Progress`] as the state file keeps it, with wall-clock times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// Prompt and generation counters of the last successful scrape, and whether requests
    /// were running then.
    pub last: Option<(f64, f64, bool)>,
    pub state: State,
    pub stalled_since_unix_ms: Option<u64>,
    pub last_ok_unix_ms: Option<u64>,
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
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            last: None,
            state: State::Unknown,
            stalled_since: None,
            last_ok: None,
        }
    }
}

impl Progress {
    /// Takes one scrape made at `now` (`None`: the scrape failed, which changes nothing).
    pub fn observe(&mut self, m: Option<&EngineMetrics>, now: Instant) {
        let Some(m) = m else { return };
        let running = m.running;
        let counters = m.prompt_tokens.zip(m.generation_tokens);
        let previous = self.last;
        let previous_at = self.last_ok;
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

    /// The state, or `Unknown` when the last successful scrape is older than `max_age`.
    pub fn state_at(&self, now: Instant, max_age: Duration) -> State {
        match self.last_ok {
            Some(t) if now.saturating_duration_since(t) <= max_age => self.state,
            _ => State::Unknown,
        }
    }

    /// How long the engine has been stalled at `now`; `None` unless the last successful
    /// scrape (no older than `max_age`) says it is stalled.
    pub fn stalled_for(&self, now: Instant, max_age: Duration) -> Option<Duration> {
        if self.state_at(now, max_age) != State::Stalled {
            return None;
        }
        self.stalled_since.map(|s| now.saturating_duration_since(s))
    }

    /// What outlives the agent process ([`Saved`]).
    pub fn saved(&self) -> Saved {
        Saved {
            last: self.last,
            state: self.state,
            stalled_since_unix_ms: self.stalled_since.map(crate::clock::unix_ms_of),
            last_ok_unix_ms: self.last_ok.map(crate::clock::unix_ms_of),
        }
    }

    /// The tracking as it was saved: a stall goes on being measured from when it began.
    pub fn restored(s: &Saved) -> Progress {
        Progress {
            last: s.last,
            state: s.state,
            stalled_since: s.stalled_since_unix_ms.map(crate::clock::instant_of),
            last_ok: s.last_ok_unix_ms.map(crate::clock::instant_of),
        }
    }

    /// Progress component of the QoS score: 1 advancing or idle, 0 stalled, none unknown.
    pub fn score(state: State) -> Option<f64> {
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
