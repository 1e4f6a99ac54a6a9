//! Forward progress of the engine, from successive `/metrics` scrapes.
//!
//! The engine is making progress when requests are running and the prompt or the generation
//! token counter advanced since the previous scrape; it is *stalled* when requests are
//! running and neither advanced. A long chunked prefill of a huge prompt advances the prompt
//! counter while generating nothing: that is progress, not a stall. Nothing running is idle,
//! neither progress nor stall. Unknown counters are unknown, never "stalled".

use super::vllm_metrics::EngineMetrics;
use serde::Serialize;
use tokio::time::Instant;

/// What the last scrapes say about progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Not enough data (no scrape yet, a failed scrape, or counters missing).
    Unknown,
    /// Nothing running.
    Idle,
    /// Requests running and tokens advancing.
    Advancing,
    /// Requests running and no token advanced since the previous scrape.
    Stalled,
}

/// Tracks the token counters across scrapes.
#[derive(Debug, Clone)]
pub struct Progress {
    last: Option<(f64, f64)>,
    state: State,
    /// Since when the engine has been stalled (first stalled scrape's previous scrape time).
    stalled_since: Option<Instant>,
    last_scrape: Option<Instant>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            last: None,
            state: State::Unknown,
            stalled_since: None,
            last_scrape: None,
        }
    }
}

impl Progress {
    /// Takes one scrape made at `now` (`None`: the scrape failed).
    pub fn observe(&mut self, m: Option<&EngineMetrics>, now: Instant) {
        let counters = m.and_then(|m| Some((m.prompt_tokens?, m.generation_tokens?)));
        let running = m.and_then(|m| m.running);
        let previous = self.last;
        let since = self.last_scrape;
        self.last = counters;
        self.last_scrape = Some(now);
        self.state = match (running, counters, previous) {
            (Some(r), _, _) if r <= 0.0 => State::Idle,
            (Some(_), Some((p, g)), Some((p0, g0))) => {
                if p > p0 || g > g0 {
                    State::Advancing
                } else {
                    State::Stalled
                }
            }
            _ => State::Unknown,
        };
        match self.state {
            // The stall began no later than the previous scrape, which saw the same counters.
            State::Stalled => {
                self.stalled_since.get_or_insert(since.unwrap_or(now));
            }
            _ => self.stalled_since = None,
        }
    }

    /// The state after the last scrape.
    pub fn state(&self) -> State {
        self.state
    }

    /// How long the engine has been stalled at `now`; `None` unless stalled.
    pub fn stalled_for(&self, now: Instant) -> Option<std::time::Duration> {
        (self.state == State::Stalled)
            .then(|| self.stalled_since.map(|s| now.saturating_duration_since(s)))
            .flatten()
    }

    /// Progress component of the QoS score: 1 advancing, 0 stalled, none otherwise.
    pub fn score(&self) -> Option<f64> {
        match self.state {
            State::Advancing => Some(1.0),
            State::Stalled => Some(0.0),
            State::Idle | State::Unknown => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn m(running: f64, prompt: f64, gen_: f64) -> EngineMetrics {
        EngineMetrics {
            running: Some(running),
            prompt_tokens: Some(prompt),
            generation_tokens: Some(gen_),
            ..EngineMetrics::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stall_measured_from_the_last_scrape_that_saw_the_counters() {
        let mut p = Progress::default();
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(
            p.state(),
            State::Unknown,
            "one scrape says nothing about progress"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(p.state(), State::Stalled);
        assert_eq!(p.stalled_for(Instant::now()), Some(Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(5)).await;
        p.observe(Some(&m(2.0, 100.0, 10.0)), Instant::now());
        assert_eq!(p.stalled_for(Instant::now()), Some(Duration::from_secs(10)));
        assert_eq!(p.score(), Some(0.0));
    }

    // Long chunked prefill: the generation counter is flat for a long time while the prompt
    // counter advances. That is progress.
    #[tokio::test(start_paused = true)]
    async fn long_prefill_is_progress_not_a_stall() {
        let mut p = Progress::default();
        for i in 0..20 {
            p.observe(Some(&m(1.0, 1000.0 * f64::from(i), 0.0)), Instant::now());
            tokio::time::advance(Duration::from_secs(5)).await;
        }
        assert_eq!(p.state(), State::Advancing);
        assert_eq!(p.stalled_for(Instant::now()), None);
        assert_eq!(p.score(), Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_unknown_and_recovery() {
        let mut p = Progress::default();
        p.observe(Some(&m(0.0, 5.0, 5.0)), Instant::now());
        assert_eq!(p.state(), State::Idle);
        assert_eq!(p.score(), None, "idle has no progress input");
        p.observe(Some(&m(1.0, 5.0, 5.0)), Instant::now());
        assert_eq!(p.state(), State::Stalled);
        p.observe(None, Instant::now());
        assert_eq!(
            p.state(),
            State::Unknown,
            "a failed scrape is unknown, not stalled"
        );
        assert_eq!(p.stalled_for(Instant::now()), None);
        p.observe(Some(&m(1.0, 5.0, 6.0)), Instant::now());
        assert_eq!(
            p.state(),
            State::Unknown,
            "no previous counters after the failed scrape"
        );
        p.observe(Some(&m(1.0, 5.0, 7.0)), Instant::now());
        assert_eq!(p.state(), State::Advancing);
        let missing = EngineMetrics {
            running: Some(1.0),
            ..EngineMetrics::default()
        };
        p.observe(Some(&missing), Instant::now());
        assert_eq!(p.state(), State::Unknown, "counters missing");
    }
}
