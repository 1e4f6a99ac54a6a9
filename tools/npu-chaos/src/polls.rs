//! What a poller of the agent saw during an experiment's fault window: how many of its polls
//! failed, and the longest stretch without a successful answer. From Node Manager's polls of
//! `/status` (the emulator's per-poll record, `node-manager.json`), PyMotor's heartbeats, or
//! the kubelet's `/readyz` and `/livez` probes. When the agent itself restarts, these are what
//! decide whether the engine looks dead.

use serde::Serialize;

/// One answer (or failure) as a poller saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// When the poll ended (answered, failed or timed out), in milliseconds on the run's
    /// clock from the scheduled injection.
    pub at_ms: i64,
    /// A successful answer: for Node Manager any `/status` it could read (even `abnormal`:
    /// the agent answered); for a PyMotor heartbeat an endpoint not reported abnormal; for a
    /// kubelet probe a status in 200..400 within the timeout.
    pub ok: bool,
}

/// The figures of one poller over one window. Times are milliseconds on the run's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PollFigures {
    /// `node_manager` (the emulator's polls of `/status`), `pymotor_heartbeats`,
    /// `kubelet_readyz` or `kubelet_livez`.
    pub poller: String,
    /// The window: from the first injection to the later of the fault's end and the end of
    /// the last agent operation.
    pub window_ms: (i64, i64),
    /// Polls that ended in the window.
    pub polls: u32,
    /// Of those, the failed ones.
    pub failed: u32,
    /// The longest stretch between two successful answers that overlaps the window,
    /// measured whole (its ends may lie outside the window). With nothing wrong it is about
    /// one poll interval. A stretch with no success before it starts at the window's start;
    /// one with no success after it ends at the poller's last record (what came after that
    /// is unknown: the emulator stops at its kill decision).
    pub longest_gap_ms: u64,
}

/// The figures of `answers` (in any order) over `[from, to]`.
pub fn figures(poller: &str, answers: &[Answer], from: i64, to: i64) -> PollFigures {
    let mut sorted = answers.to_vec();
    sorted.sort_by_key(|a| a.at_ms);
    let in_window = sorted.iter().filter(|a| a.at_ms >= from && a.at_ms <= to);
    let (polls, failed) = in_window.fold((0u32, 0u32), |(n, f), a| (n + 1, f + u32::from(!a.ok)));
    let end = sorted.last().map_or(to, |a| a.at_ms);
    let oks: Vec<i64> = sorted.iter().filter(|a| a.ok).map(|a| a.at_ms).collect();
    // The success the window's first stretch starts from.
    let mut prev = oks
        .iter()
        .rev()
        .find(|&&t| t <= from)
        .copied()
        .unwrap_or(from);
    let mut longest = 0i64;
    for &t in oks.iter().filter(|&&t| t > from) {
        longest = longest.max(t - prev);
        prev = t;
        if t > to {
            break;
        }
    }
    // A stretch still open at the end of the record.
    if oks.last().is_none_or(|&t| t <= to) {
        longest = longest.max(end - prev);
    }
    PollFigures {
        poller: poller.to_owned(),
        window_ms: (from, to),
        polls,
        failed,
        longest_gap_ms: longest.max(0) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(spec: &[(i64, bool)]) -> Vec<Answer> {
        spec.iter()
            .map(|&(at_ms, ok)| Answer { at_ms, ok })
            .collect()
    }

    // A table of what a poller polling every second sees: the longest stretch between two
    // successes that touches the window, whole, and the failed polls inside it.
    #[test]
    fn failed_polls_and_the_longest_gap() {
        let every_second_ok: Vec<(i64, bool)> = (-5..=20).map(|s| (s * 1000, true)).collect();
        let with_outage: Vec<(i64, bool)> = (-5..=20)
            .map(|s| (s * 1000, !(2..=9).contains(&s)))
            .collect();
        // (name, polls as (end, ok), window, want (polls, failed, longest gap)).
        type Row = (&'static str, Vec<(i64, bool)>, (i64, i64), (u32, u32, u64));
        let rows: Vec<Row> = vec![
            (
                "all answered: one poll interval",
                every_second_ok.clone(),
                (0, 10_000),
                (11, 0, 1000),
            ),
            (
                "8 refused polls: 1 s .. 10 s without an answer",
                with_outage.clone(),
                (0, 10_000),
                (11, 8, 9000),
            ),
            (
                "a gap that starts in the window and ends after it counts whole",
                with_outage.clone(),
                (0, 4000),
                (5, 3, 9000),
            ),
            (
                "a gap that began before the window counts whole",
                with_outage,
                (5000, 15_000),
                (11, 5, 9000),
            ),
            (
                "no success after the last one: to the end of the record",
                vec![(0, true), (1000, true), (2000, false), (3000, false)],
                (0, 2500),
                (3, 1, 2000),
            ),
            (
                "nothing ever answered: from the window's start to the last record",
                vec![(1000, false), (2000, false)],
                (0, 3000),
                (2, 2, 2000),
            ),
            (
                "timeouts end late: polls are placed at their end",
                vec![(0, true), (3000, false), (3100, true)],
                (0, 5000),
                (3, 1, 3100),
            ),
        ];
        for (name, spec, (from, to), (polls, failed, gap)) in rows {
            let f = figures("node_manager", &answers(&spec), from, to);
            assert_eq!(
                (f.polls, f.failed, f.longest_gap_ms),
                (polls, failed, gap),
                "{name}"
            );
            assert_eq!(f.window_ms, (from, to), "{name}");
        }
    }

    #[test]
    fn order_does_not_matter_and_nothing_is_zero() {
        let mut a = answers(&[(2000, true), (0, true), (1000, false)]);
        let f = figures("x", &a, 0, 2000);
        a.reverse();
        assert_eq!(figures("x", &a, 0, 2000), f);
        assert_eq!((f.polls, f.failed, f.longest_gap_ms), (3, 1, 2000));
        let none = figures("x", &[], 0, 1000);
        assert_eq!((none.polls, none.failed, none.longest_gap_ms), (0, 0, 1000));
    }
}
