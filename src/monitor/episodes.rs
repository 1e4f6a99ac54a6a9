//! The restart-loop memory: when each `abnormal` episode of one engine began, over the last
//! day, and whether so many fell in `agent_policy.escalate_window` that the engine is in a
//! restart loop (escalated).
//!
//! An episode begins when the verdict turns `abnormal` and ends when it is `normal` again
//! (Node Manager restarted the engine and the monitor re-armed). The verdict is computed on
//! demand, so the change is noted wherever it is read ([`Monitor::verdict`] and `/status`):
//! one atomic load per read, a short lock only at the change itself.
//!
//! Escalation changes nothing `/status` answers (a hung engine is still hung, and Node
//! Manager needs `abnormal` to act): it adds a clause to the reason, a metric and an alert
//! (docs/runbook.md, "NpuHealthEngineRestartLoop"). It clears once no episode has begun for a
//! whole window, and none is open.
//!
//! Times are wall-clock milliseconds ([`crate::clock`]): the memory is saved in the state
//! file ([`super::saved`]) and outlives the agent's restarts and handovers.

use super::Monitor;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// How far back the memory reaches: one day (`/status/detail`'s `last_day`).
pub(crate) const DAY_MS: u64 = 24 * 3600 * 1000;
/// One hour (`/status/detail`'s `last_hour`).
pub(crate) const HOUR_MS: u64 = 3600 * 1000;
/// The most episode starts kept (a bounded state file: an engine flapping faster than one
/// episode every 11 minutes for a day shows a `last_day` of at most this).
pub(crate) const KEPT: usize = 128;

/// The memory as the state file keeps it; absent from the file while empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Saved {
    /// When each episode of the last day began, oldest first (Unix milliseconds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts_unix_ms: Vec<u64>,
    /// An episode is under way (the verdict was `abnormal` when saved): a restarted agent
    /// that finds the engine still abnormal does not count it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
}

impl Saved {
    /// Nothing to keep.
    pub(crate) fn is_empty(&self) -> bool {
        self.starts_unix_ms.is_empty() && !self.open
    }
}

/// One engine's episodes (in the [`Monitor`]).
#[derive(Debug, Default)]
pub(crate) struct Episodes {
    /// An episode is under way: read at every verdict.
    open: AtomicBool,
    starts: Mutex<VecDeque<u64>>,
}

/// What [`Episodes::note`] found: an episode began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Began,
    Ended,
}

impl Episodes {
    /// Notes the verdict now (`abnormal` or not) at `now_ms`; `Some` when an episode began or
    /// ended with it.
    pub(crate) fn note(&self, abnormal: bool, now_ms: u64) -> Option<Change> {
        if self.open.load(Ordering::Acquire) == abnormal
            || self.open.swap(abnormal, Ordering::AcqRel) == abnormal
        {
            return None;
        }
        if !abnormal {
            return Some(Change::Ended);
        }
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        starts.push_back(now_ms);
        prune(&mut starts, now_ms);
        Some(Change::Began)
    }

    /// An episode is under way.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The starts of the last day, oldest first, and whether an episode is under way.
    pub(crate) fn saved(&self, now_ms: u64) -> Saved {
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut starts, now_ms);
        Saved {
            starts_unix_ms: starts.iter().copied().collect(),
            open: self.open.load(Ordering::Acquire),
        }
    }

    /// Takes back a saved memory (an agent restart or a handover).
    pub(crate) fn restore(&self, s: &Saved) {
        let mut starts: VecDeque<u64> = s.starts_unix_ms.iter().copied().collect();
        starts.make_contiguous().sort_unstable();
        while starts.len() > KEPT {
            starts.pop_front();
        }
        *self.starts.lock().unwrap_or_else(|p| p.into_inner()) = starts;
        self.open.store(s.open, Ordering::Release);
    }
}

/// Drops the starts older than a day, and the oldest beyond [`KEPT`].
fn prune(starts: &mut VecDeque<u64>, now_ms: u64) {
    while starts
        .front()
        .is_some_and(|&s| now_ms.saturating_sub(s) >= DAY_MS)
        || starts.len() > KEPT
    {
        starts.pop_front();
    }
}

/// How many of `starts` began within `span_ms` before `now_ms`.
pub(crate) fn within(starts: &[u64], now_ms: u64, span_ms: u64) -> usize {
    starts
        .iter()
        .filter(|&&s| now_ms.saturating_sub(s) < span_ms)
        .count()
}

/// Whether the engine is escalated at `now_ms`: some episode was the `after`-th within
/// `window_ms`, and since then no gap of a whole window passed without an episode beginning
/// (while one is `open`, the gap since the last start does not count). `after = 0`: never.
pub(crate) fn escalated(
    starts: &[u64],
    open: bool,
    now_ms: u64,
    after: u32,
    window_ms: u64,
) -> bool {
    if after == 0 {
        return false;
    }
    let mut on = false;
    for (i, &s) in starts.iter().enumerate() {
        if i > 0 && s.saturating_sub(starts[i - 1]) >= window_ms {
            on = false;
        }
        if within(&starts[..=i], s + 1, window_ms) >= after as usize {
            on = true;
        }
    }
    let clean = starts
        .last()
        .is_none_or(|&last| now_ms.saturating_sub(last) >= window_ms);
    on && (open || !clean)
}

/// `1st`, `2nd`, `3rd`, `4th`, … `11th`, `21st`.
pub(crate) fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A window in words: `1 h`, `30 min`, `90 s`.
pub(crate) fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        _ if s >= 3600 && s.is_multiple_of(3600) => format!("{} h", s / 3600),
        _ if s >= 60 && s.is_multiple_of(60) => format!("{} min", s / 60),
        _ => format!("{s} s"),
    }
}

impl Monitor {
    /// Notes the verdict's status in the episode memory (see the module's doc).
    pub(super) fn note_episode(&self, abnormal: bool) {
        // Every verdict comes here: without a change, one atomic load and no clock read.
        if self.episodes.is_open() == abnormal {
            return;
        }
        self.episodes.note(abnormal, crate::clock::unix_ms());
    }

    /// Logs the restart loop when the episode that just began escalated (the observer calls
    /// it at the verdict's turn to `abnormal`, off `/status`'s path).
    pub(super) fn warn_if_escalated(&self) {
        let s = self.episode_summary();
        if s.escalated {
            tracing::warn!(engine = %self.spec.name, "restart loop: {} abnormal episode in {} (agent_policy.escalate_after = {}); /status still answers abnormal, see docs/runbook.md", ordinal(s.in_window), span(s.window_ms), s.after);
        }
    }

    /// The episode memory now.
    pub(crate) fn episode_summary(&self) -> Summary {
        self.episode_summary_at(crate::clock::unix_ms())
    }

    fn episode_summary_at(&self, now_ms: u64) -> Summary {
        let saved = self.episodes.saved(now_ms);
        let p = &self.spec.agent_policy;
        let window_ms = p.escalate_window.as_millis() as u64;
        let starts = &saved.starts_unix_ms;
        Summary {
            last_hour: within(starts, now_ms, HOUR_MS),
            last_day: within(starts, now_ms, DAY_MS),
            in_window: within(starts, now_ms, window_ms),
            escalated: escalated(starts, saved.open, now_ms, p.escalate_after, window_ms),
            after: p.escalate_after,
            window_ms,
            saved,
        }
    }

    /// The memory to save.
    pub(crate) fn episodes_saved(&self) -> Saved {
        self.episodes.saved(crate::clock::unix_ms())
    }

    /// Takes back a saved memory.
    pub(crate) fn restore_episodes(&self, s: &Saved) {
        self.episodes.restore(s);
    }

    /// The reason's clause when escalated: `; restart loop: 3rd abnormal episode in 1 h
    /// (escalated)`; empty otherwise.
    pub(crate) fn escalation_clause(&self) -> String {
        let s = self.episode_summary();
        if !s.escalated {
            return String::new();
        }
        format!(
            "; restart loop: {} abnormal episode in {} (escalated)",
            ordinal(s.in_window.max(1)),
            span(s.window_ms)
        )
    }
}

/// The episode memory of one engine at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    pub last_hour: usize,
    pub last_day: usize,
    /// Episodes begun within `escalate_window`.
    pub in_window: usize,
    pub escalated: bool,
    pub after: u32,
    pub window_ms: u64,
    pub saved: Saved,
}

impl From<Summary> for npu_health_wire::AbnormalEpisodes {
    fn from(s: Summary) -> Self {
        npu_health_wire::AbnormalEpisodes {
            last_hour: s.last_hour as u32,
            last_day: s.last_day as u32,
            in_window: s.in_window as u32,
            open: s.saved.open,
            escalated: s.escalated,
            escalate_after: s.after,
            escalate_window_s: s.window_ms as f64 / 1e3,
            starts_unix_ms: s.saved.starts_unix_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;
    const T0: u64 = 1_700_000_000_000;

    /// Episodes at `at` (minutes after T0), each ending a minute later.
    fn run(at: &[u64]) -> Episodes {
        let e = Episodes::default();
        for &m in at {
            assert_eq!(e.note(true, T0 + m * MIN), Some(Change::Began));
            assert_eq!(
                e.note(true, T0 + m * MIN + 1),
                None,
                "still the same episode"
            );
            assert_eq!(e.note(false, T0 + m * MIN + MIN / 2), Some(Change::Ended));
        }
        e
    }

    fn esc(e: &Episodes, now_min: u64) -> bool {
        let s = e.saved(T0 + now_min * MIN);
        escalated(&s.starts_unix_ms, s.open, T0 + now_min * MIN, 3, 60 * MIN)
    }

    #[test]
    fn the_third_episode_within_the_window_escalates_and_the_second_does_not() {
        let e = run(&[0, 20]);
        assert!(!esc(&e, 21));
        let e = run(&[0, 20, 40]);
        assert!(esc(&e, 41));
        assert_eq!(
            within(&e.saved(T0).starts_unix_ms, T0 + 41 * MIN, HOUR_MS),
            3
        );
    }

    #[test]
    fn three_episodes_spread_wider_than_the_window_do_not_escalate() {
        let e = run(&[0, 40, 80, 120]);
        assert!(!esc(&e, 121), "never three within an hour");
    }

    #[test]
    fn escalation_clears_after_a_whole_clean_window_and_not_before() {
        let e = run(&[0, 20, 40]);
        // 61 min: the first episode left the window, but no clean hour yet.
        assert!(esc(&e, 61));
        assert!(esc(&e, 99));
        assert!(
            !esc(&e, 100),
            "an hour without an episode since the last (40 min)"
        );
    }

    #[test]
    fn an_episode_still_open_keeps_the_escalation() {
        let e = run(&[0, 20]);
        e.note(true, T0 + 40 * MIN);
        let s = e.saved(T0 + 200 * MIN);
        assert!(s.open);
        assert!(escalated(
            &s.starts_unix_ms,
            true,
            T0 + 200 * MIN,
            3,
            60 * MIN
        ));
    }

    #[test]
    fn a_new_episode_within_the_window_of_the_last_keeps_the_loop_escalated() {
        let e = run(&[0, 20, 40, 90, 140]);
        assert!(esc(&e, 141), "each gap under an hour: still the same loop");
        assert!(!esc(&e, 200));
    }

    #[test]
    fn escalate_after_zero_never_escalates() {
        let starts: Vec<u64> = (0..10).map(|m| T0 + m * MIN).collect();
        assert!(!escalated(&starts, true, T0 + 10 * MIN, 0, HOUR_MS));
        assert!(escalated(&starts, true, T0 + 10 * MIN, 1, HOUR_MS));
    }

    #[test]
    fn the_memory_forgets_what_is_older_than_a_day_and_keeps_a_bounded_number() {
        let e = run(&[0, 10]);
        let s = e.saved(T0 + 24 * 60 * MIN + 5 * MIN);
        assert_eq!(s.starts_unix_ms, vec![T0 + 10 * MIN]);
        let e = Episodes::default();
        for i in 0..(KEPT as u64 + 10) {
            e.note(true, T0 + i * 1000);
            e.note(false, T0 + i * 1000 + 500);
        }
        let s = e.saved(T0 + 1_000_000);
        assert_eq!(s.starts_unix_ms.len(), KEPT);
        assert_eq!(s.starts_unix_ms[0], T0 + 10_000, "the oldest went first");
    }

    #[test]
    fn a_restored_open_episode_is_not_counted_again() {
        let e = run(&[0]);
        e.note(true, T0 + 5 * MIN);
        let saved = e.saved(T0 + 6 * MIN);
        let back = Episodes::default();
        back.restore(&saved);
        assert_eq!(back.note(true, T0 + 7 * MIN), None, "the same episode");
        assert_eq!(back.saved(T0 + 7 * MIN), saved);
        assert_eq!(back.note(false, T0 + 8 * MIN), Some(Change::Ended));
    }

    #[test]
    fn an_empty_memory_is_absent_from_the_state_file() {
        assert_eq!(serde_json::to_string(&Saved::default()).unwrap(), "{}");
        let s: Saved = serde_json::from_str("{}").unwrap();
        assert!(s.is_empty());
    }

    #[test]
    fn ordinals_and_spans_read_as_words() {
        let words: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            words,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st"
            ]
        );
        assert_eq!(span(HOUR_MS), "1 h");
        assert_eq!(span(30 * MIN), "30 min");
        assert_eq!(span(90_000), "90 s");
    }

    /// An engine from its `[[engine]]` table's `extra` lines, healthy.
    fn engine(extra: &str) -> Monitor {
        let m = crate::monitor::evidence::tests::engine(extra);
        m.record_health(&crate::probe::health::HealthOutcome::Healthy, true);
        m
    }

    /// One hang seen by `/status`, then the engine normal again (the re-arm after a restart).
    fn hang_and_restart(m: &Monitor) -> String {
        m.vi.set_abnormal("6 consecutive virtual requests failed");
        assert_eq!(m.status(), crate::monitor::Status::Abnormal);
        let reason = m.verdict().reason;
        m.vi.rearm();
        assert_eq!(m.status(), crate::monitor::Status::Normal);
        reason
    }

    #[test]
    fn the_third_hang_in_an_hour_says_restart_loop_in_the_reason_and_status_stays_abnormal() {
        let m = engine("");
        for _ in 0..2 {
            let r = hang_and_restart(&m);
            assert!(!r.contains("restart loop"), "{r}");
        }
        m.vi.set_abnormal("6 consecutive virtual requests failed");
        assert_eq!(
            m.status(),
            crate::monitor::Status::Abnormal,
            "/status unchanged"
        );
        let r = m.verdict().reason;
        assert!(
            r.ends_with("; restart loop: 3rd abnormal episode in 1 h (escalated)"),
            "{r}"
        );
        let s = m.episode_summary();
        assert_eq!((s.last_hour, s.last_day, s.escalated), (3, 3, true));
        assert!(s.saved.open);
    }

    #[test]
    fn escalate_after_zero_keeps_the_count_and_never_says_restart_loop() {
        let m = engine("[engine.agent_policy]\nescalate_after = 0\n");
        for _ in 0..4 {
            let r = hang_and_restart(&m);
            assert!(!r.contains("restart loop"), "{r}");
        }
        assert_eq!(m.episode_summary().last_hour, 4);
    }

    // The state file: written, read back into another agent's monitor (the count survives),
    // and a file written before the memory existed reads as no episodes.
    #[test]
    fn the_memory_round_trips_through_the_state_file_and_an_older_file_reads_as_empty() {
        let m = engine("");
        hang_and_restart(&m);
        hang_and_restart(&m);
        let text = serde_json::to_string(&m.saved()).unwrap();
        assert!(text.contains("\"episodes\""), "{text}");
        let back: super::super::saved::EngineState = serde_json::from_str(&text).unwrap();
        let n = engine("");
        n.restore(&back, super::super::saved::Carry::ALL);
        assert_eq!(n.episode_summary().last_hour, 2);
        m.vi.set_abnormal("x");
        n.vi.set_abnormal("x");
        assert_eq!(m.status(), n.status());
        assert_eq!(
            m.verdict().reason,
            n.verdict().reason,
            "the 3rd, escalated in both"
        );

        let fresh = serde_json::to_string(&engine("").saved()).unwrap();
        assert!(!fresh.contains("episodes"), "empty: absent from the file");
        let older = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-v1.json"),
        )
        .unwrap();
        let f: crate::continuity::statefile::StateFile = serde_json::from_str(&older).unwrap();
        assert!(f.engines[0].episodes.is_empty());
    }
}
