//! The poll: `List` every period on a task of its own, the labels in force replaced on each
//! good answer, kept for a while when the kubelet does not answer, then dropped.
//!
//! The rule is [`after`], a pure function of what the last call gave; the loop ([`run`])
//! only calls, applies and logs. Nothing here runs on the path of `/status` or `/metrics`:
//! they read the labels in force ([`PodLabels::now`]), an `Arc` clone.
//!
//! What is logged of an answer is bounded as the answer is ([`NoteLog`]): its notes are
//! compared with those last logged as a set (a kubelet lists pods in any order), at most
//! [`MAX_NOTES`] of them are written, and a new set at most once per
//! [`RATE_LIMIT_INTERVAL`], the changes in between counted. A failed call's line is cut
//! ([`crate::logging::clip`]), and the log layer folds its repeats.

use super::PodLabels;
use super::devices::{Assignment, MAX_NOTES, Notes, assign};
use super::grpc::{self, CallError};
use super::proto::Bounds;
use crate::config::PodResourcesSettings;
use crate::logging::RATE_LIMIT_INTERVAL;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// The largest answer read: a node's pods and their device ids fit many times over
/// (gRPC's own default limit for a received message is the same).
pub(crate) const MAX_ANSWER: usize = 4 << 20;

/// Failed polls, counted from the last good answer, through which its labels are kept.
pub(crate) const KEEP_PERIODS: u32 = 3;

/// Longest wait for one answer (shorter when the period is).
pub(crate) const CALL_DEADLINE: Duration = Duration::from_secs(5);

/// The deadline of one call at `period`.
pub(crate) fn call_deadline(period: Duration) -> Duration {
    CALL_DEADLINE.min(period)
}

/// How long the labels of the last good answer outlive it when the calls fail.
pub(crate) fn keep_for(period: Duration) -> Duration {
    period * KEEP_PERIODS
}

/// What the poll knows between two calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum State {
    /// No call answered yet: no labels.
    #[default]
    NeverAnswered,
    /// The labels in force come from the answer at `at`.
    Answered { at: Instant },
    /// The labels were dropped after the calls failed past the keep time.
    Dropped,
}

/// What to do after one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Apply {
    /// Put this assignment in force.
    Set(Assignment),
    /// Keep the labels in force.
    Keep,
    /// Drop every label.
    Drop,
}

/// What one call gave, as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    /// The kubelet answered: the holders of the NPUs.
    Answered(Assignment),
    /// No answer (the log says why).
    Failed,
}

/// The rule: an answer is put in force; a failure keeps the labels of the last answer until
/// `keep` has passed since it, then drops them once.
pub(crate) fn after(state: &State, call: Call, now: Instant, keep: Duration) -> (State, Apply) {
    match (call, state) {
        (Call::Answered(a), _) => (State::Answered { at: now }, Apply::Set(a)),
        (Call::Failed, State::Answered { at }) if now.duration_since(*at) >= keep => {
            (State::Dropped, Apply::Drop)
        }
        (Call::Failed, s) => (s.clone(), Apply::Keep),
    }
}

/// What the poll needs: where, how often, and the agent's NPUs (logic id, physical id).
#[derive(Debug, Clone)]
pub(crate) struct Poll {
    pub socket: PathBuf,
    pub period: Duration,
    pub npus: Vec<(u32, Option<u32>)>,
}

impl Poll {
    /// The poll `settings` asks for, over `npus`.
    pub(crate) fn new(settings: &PodResourcesSettings, npus: Vec<(u32, Option<u32>)>) -> Poll {
        Poll {
            socket: settings.socket.clone(),
            period: settings.period,
            npus,
        }
    }
}

/// Polls until `cancel`, keeping `labels` up to date.
pub(crate) async fn run(poll: Poll, labels: Arc<PodLabels>, cancel: CancellationToken) {
    let keep = keep_for(poll.period);
    let deadline = call_deadline(poll.period);
    let mut tick = tokio::time::interval(poll.period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut state = State::default();
    let mut failures: u64 = 0;
    let mut note_log = NoteLog::default();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let called = tokio::select! {
            () = cancel.cancelled() => return,
            r = grpc::list(&poll.socket, deadline, MAX_ANSWER, &Bounds::AGENT) => r,
        };
        let call = match called {
            Ok(list) => {
                let (a, notes) = assign(&list, &poll.npus);
                for line in note_log.lines(notes, Instant::now(), RATE_LIMIT_INTERVAL) {
                    tracing::warn!("pod labels: {line}");
                }
                if failures > 0 {
                    tracing::info!(
                        "pod labels: the kubelet's PodResources API at {} answers again, after {failures} failed call(s)",
                        poll.socket.display()
                    );
                }
                failures = 0;
                Call::Answered(a)
            }
            Err(e) => {
                failures += 1;
                log_failure(&poll, &state, &e);
                Call::Failed
            }
        };
        let (next, apply) = after(&state, call, Instant::now(), keep);
        match apply {
            Apply::Set(a) => labels.set(a),
            Apply::Keep => {}
            Apply::Drop => {
                tracing::warn!(
                    "pod labels: dropped, no answer from the kubelet's PodResources API at {} for {:?}",
                    poll.socket.display(),
                    keep
                );
                labels.set(Assignment::default());
            }
        }
        state = next;
    }
}

/// One failed call, in the log. The same line each period is what the log's rate limit
/// folds (src/logging/ratelimit.rs); a change of cause is a new line.
fn log_failure(poll: &Poll, state: &State, e: &CallError) {
    let kept = match state {
        State::Answered { .. } => "; the last labels are kept for now",
        State::NeverAnswered | State::Dropped => "; no pod labels",
    };
    tracing::warn!(
        "pod labels: List on the kubelet's PodResources API at {} failed: {}{kept}",
        poll.socket.display(),
        crate::logging::clip(&e.to_string())
    );
}

/// What the log has said of the answers' notes: the set last logged, when, and how many
/// new sets were held back since.
#[derive(Debug, Default)]
pub(crate) struct NoteLog {
    said: Notes,
    at: Option<Instant>,
    held: u64,
}

impl NoteLog {
    /// The lines to log for an answer's `notes` at `now`: none when they are the notes last
    /// logged (in any order), nor within `every` of the last lines (the change is counted and
    /// logged once `every` has passed, if it lasts); else each note not logged last time,
    /// and a line for those not kept and the changes held back.
    pub(crate) fn lines(&mut self, notes: Notes, now: Instant, every: Duration) -> Vec<String> {
        if notes == self.said {
            return Vec::new();
        }
        let fresh: Vec<String> = notes
            .kept()
            .filter(|n| !self.said.has(n))
            .map(str::to_owned)
            .collect();
        let more_changed = notes.more() != self.said.more() && notes.more() > 0;
        if fresh.is_empty() && !more_changed {
            // Fewer notes than before: nothing new to say.
            self.said = notes;
            return Vec::new();
        }
        if self.at.is_some_and(|at| now.duration_since(at) < every) {
            self.held += 1;
            return Vec::new();
        }
        let mut out = fresh;
        let mut tail = Vec::new();
        if notes.more() > 0 {
            tail.push(format!(
                "{} more note(s) of this answer not logged (the first {MAX_NOTES} in order are)",
                notes.more()
            ));
        }
        if self.held > 0 {
            tail.push(format!(
                "the notes changed {} more time(s) in {:.0} s, not logged",
                self.held,
                self.at
                    .map_or(0.0, |at| now.duration_since(at).as_secs_f64())
            ));
        }
        if !tail.is_empty() {
            out.push(tail.join("; "));
        }
        self.said = notes;
        self.at = Some(now);
        self.held = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_resources::devices::Holder;

    fn some() -> Assignment {
        let mut a = Assignment::default();
        a.holders.insert(
            0,
            Holder {
                namespace: "s".into(),
                pod: "p".into(),
                container: "c".into(),
            },
        );
        a
    }

    /// (state before, the call, seconds since the last answer, state after, what is applied)
    type Case<'a> = (&'a State, Call, u64, State, Apply);

    // The rule as a table. Keep is 30 s (3 periods of 10 s); an answer comes at t0.
    #[test]
    fn labels_outlive_failed_calls_for_the_keep_time_then_go() {
        let t0 = Instant::now();
        let keep = keep_for(Duration::from_secs(10));
        assert_eq!(keep, Duration::from_secs(30));
        let answered = State::Answered { at: t0 };
        let cases: [Case; 7] = [
            (
                &State::NeverAnswered,
                Call::Answered(some()),
                0,
                answered.clone(),
                Apply::Set(some()),
            ),
            (
                &State::NeverAnswered,
                Call::Failed,
                40,
                State::NeverAnswered,
                Apply::Keep,
            ),
            (&answered, Call::Failed, 10, answered.clone(), Apply::Keep),
            (&answered, Call::Failed, 29, answered.clone(), Apply::Keep),
            (&answered, Call::Failed, 30, State::Dropped, Apply::Drop),
            (
                &State::Dropped,
                Call::Failed,
                90,
                State::Dropped,
                Apply::Keep,
            ),
            (
                &State::Dropped,
                Call::Answered(Assignment::default()),
                0,
                answered.clone(),
                Apply::Set(Assignment::default()),
            ),
        ];
        for (i, (before, call, secs, want_state, want_apply)) in cases.into_iter().enumerate() {
            let now = t0 + Duration::from_secs(secs);
            let (state, apply) = after(before, call, now, keep);
            assert_eq!((state, apply), (want_state, want_apply), "case {i}");
        }
    }

    fn notes(items: &[&str]) -> Notes {
        let mut n = Notes::default();
        for i in items {
            n.push((*i).to_owned());
        }
        n
    }

    // Issue 48, R4: the same notes in another order are not logged again; a change logs
    // only what is new, at most once per interval, the changes in between counted; past
    // MAX_NOTES one line counts the rest.
    #[test]
    fn notes_are_logged_as_a_set_once_per_change_and_at_most_once_per_interval() {
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut log = NoteLog::default();
        assert_eq!(log.lines(notes(&["a", "b"]), at(0), every), ["a", "b"]);
        assert!(
            log.lines(notes(&["b", "a"]), at(2), every).is_empty(),
            "reordered"
        );
        assert!(log.lines(notes(&["a"]), at(3), every).is_empty(), "fewer");
        // New notes within the interval of the last lines: held, then logged with the count.
        assert!(log.lines(notes(&["a", "c"]), at(4), every).is_empty());
        assert!(log.lines(notes(&["a", "d"]), at(6), every).is_empty());
        assert_eq!(
            log.lines(notes(&["a", "d"]), at(12), every),
            ["d", "the notes changed 2 more time(s) in 12 s, not logged"]
        );
        assert!(log.lines(notes(&["d", "a"]), at(60), every).is_empty());
        // Many notes: MAX_NOTES lines and one that counts the rest.
        let many: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let lines = log.lines(notes(&many), at(70), every);
        assert_eq!(lines.len(), MAX_NOTES + 1);
        assert_eq!(
            lines[MAX_NOTES],
            format!(
                "{} more note(s) of this answer not logged (the first {MAX_NOTES} in order are)",
                1000 - MAX_NOTES
            )
        );
        let mut shuffled = many.clone();
        shuffled.reverse();
        assert!(log.lines(notes(&shuffled), at(90), every).is_empty());
    }

    #[test]
    fn a_call_waits_at_most_five_seconds_or_one_period() {
        assert_eq!(
            call_deadline(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(
            call_deadline(Duration::from_millis(200)),
            Duration::from_millis(200)
        );
    }

    // A socket nobody listens on: the call fails with the path in its error, and the poll
    // goes on without labels (under paused time: no waiting).
    #[tokio::test(start_paused = true)]
    async fn a_dead_socket_leaves_no_labels_and_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let e = grpc::list(&socket, Duration::from_secs(1), MAX_ANSWER, &Bounds::AGENT)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(&socket.display().to_string()), "{e}");
        let labels = Arc::new(PodLabels::default());
        let cancel = CancellationToken::new();
        let poll = Poll {
            socket,
            period: Duration::from_secs(10),
            npus: vec![(0, Some(0))],
        };
        let task = tokio::spawn(run(poll, labels.clone(), cancel.clone()));
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert_eq!(*labels.now(), Assignment::default());
        assert!(!task.is_finished(), "the poll goes on after failed calls");
        cancel.cancel();
        task.await.unwrap();
    }
}
