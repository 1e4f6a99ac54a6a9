//! The recorder and its writer against a scripted sink, under paused time: the series as
//! the API server sees it, the retries, the bounded queue, the Event's fields.

use super::series::REFRESH;
use super::sink::{self, EventSink, MAX_TRIES};
use super::{Counts, NOTE_LIMIT, Reason, Recorder};
use crate::integrations::kubernetes::api::{ApiError, PodInfo};
use k8s_openapi::api::events::v1::{Event, EventSeries};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A call the writer made: `("create", name, series count)` or `("patch", name, count)`.
type Call = (&'static str, String, Option<i32>);

/// A sink that records each call and answers from a script (then `Ok`).
#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<Vec<Call>>>,
    answers: Arc<Mutex<VecDeque<Result<(), ApiError>>>>,
}

impl Script {
    fn answer(&self, a: Result<(), ApiError>, times: usize) {
        self.answers
            .lock()
            .unwrap()
            .extend(std::iter::repeat_n(a, times));
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn next(&self, call: Call) -> Result<(), ApiError> {
        self.calls.lock().unwrap().push(call);
        self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()))
    }
}

impl EventSink for Script {
    async fn create(&self, e: &Event) -> Result<(), ApiError> {
        let name = e.metadata.name.clone().unwrap_or_default();
        self.next(("create", name, e.series.as_ref().map(|s| s.count)))
    }

    async fn patch_series(&self, _ns: &str, name: &str, s: &EventSeries) -> Result<(), ApiError> {
        self.next(("patch", name.to_owned(), Some(s.count)))
    }
}

fn pod() -> PodInfo {
    PodInfo {
        namespace: "inference".into(),
        name: "vllm-0".into(),
        uid: Some("0b9e".into()),
        ..PodInfo::default()
    }
}

/// A recorder with a writer on `sink`, a queue of `queue`.
fn started(sink: &Script, queue: usize) -> (Recorder, Arc<Counts>, CancellationToken) {
    let counts = Arc::new(Counts::default());
    let (rec, rx) = Recorder::new(Some("n1"), queue, counts.clone());
    let cancel = CancellationToken::new();
    tokio::spawn(sink::run(sink.clone(), rx, rec.clone(), cancel.clone()));
    (rec, counts, cancel)
}

/// Lets the writer take what is queued (paused time: no clock moves).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn n(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn status(code: u16) -> ApiError {
    ApiError::Status {
        code,
        reason: String::new(),
        message: "scripted".into(),
    }
}

// The same action five times: one Event created, its series written with count 2 at once,
// the next three counted in memory, and the count 5 written when the series has been quiet
// for six minutes; the next occurrence creates a new Event.
#[tokio::test(start_paused = true)]
async fn a_repeated_action_is_one_event_with_a_series_flushed_after_six_quiet_minutes() {
    let sink = Script::default();
    let (rec, counts, _c) = started(&sink, 16);
    for i in 0..5 {
        rec.record(&pod(), Reason::EngineNotReady, &format!("hang {i}"));
        settle().await;
    }
    let calls = sink.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let name = calls[0].1.clone();
    assert_eq!(calls[0], ("create", name.clone(), None));
    assert_eq!(calls[1], ("patch", name.clone(), Some(2)));
    // The finish runs every six minutes: the series, quiet since the start, ends at its
    // first run.
    tokio::time::sleep(Duration::from_secs(6 * 60 - 1)).await;
    settle().await;
    assert_eq!(sink.calls().len(), 2, "not before the series is quiet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    let calls = sink.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[2], ("patch", name.clone(), Some(5)));
    rec.record(&pod(), Reason::EngineNotReady, "again");
    settle().await;
    let calls = sink.calls();
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[3].0, "create");
    assert_ne!(calls[3].1, name, "a new Event");
    assert_eq!((n(&counts.created), n(&counts.patched)), (2, 2));
}

// A series still going is written again at the refresh (every 30 min) with its count.
#[tokio::test(start_paused = true)]
async fn a_long_series_is_written_again_at_the_refresh() {
    let sink = Script::default();
    let (rec, _counts, _c) = started(&sink, 16);
    // One every five minutes: never quiet for six. The sixth at 25 min, the refresh at 30.
    for _ in 0..6 {
        rec.record(&pod(), Reason::RestartLoop, "loop");
        settle().await;
        tokio::time::sleep(Duration::from_secs(5 * 60)).await;
    }
    tokio::time::sleep(Duration::from_secs(2 * 60)).await;
    settle().await;
    let patches: Vec<Option<i32>> = sink
        .calls()
        .into_iter()
        .filter(|c| c.0 == "patch")
        .map(|c| c.2)
        .collect();
    assert_eq!(REFRESH, Duration::from_secs(30 * 60));
    assert_eq!(patches, [Some(2), Some(6)], "{:?}", sink.calls());
}

// A series whose Event the API server no longer has (404 on the PATCH) is created again,
// series and all.
#[tokio::test(start_paused = true)]
async fn a_series_patch_answered_404_creates_the_event_again() {
    let sink = Script::default();
    let (rec, counts, _c) = started(&sink, 16);
    rec.record(&pod(), Reason::EvictionRefused, "429");
    settle().await;
    sink.answer(Err(status(404)), 1);
    rec.record(&pod(), Reason::EvictionRefused, "429");
    settle().await;
    let calls = sink.calls();
    assert_eq!(
        calls.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
        [("create", None), ("patch", Some(2)), ("create", Some(2))]
    );
    assert_eq!(calls[2].1, calls[0].1, "under its name");
    assert_eq!(n(&counts.created), 2);
}

// The API server unreachable: each Event is tried 12 times (client-go's maxTriesPerEvent),
// 10 s (+ up to 25 %) apart, then given up and counted failed; the writer lives on and writes
// the next one once it answers.
#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_gets_twelve_tries_then_the_event_is_counted_failed() {
    assert_eq!(MAX_TRIES, 12);
    let sink = Script::default();
    sink.answer(
        Err(ApiError::Transport("connection refused".into())),
        MAX_TRIES as usize,
    );
    let (rec, counts, _c) = started(&sink, 16);
    rec.record(&pod(), Reason::EngineEvicted, "evicted");
    settle().await;
    assert_eq!(sink.calls().len(), 1);
    // Eleven waits of 10 to 12.5 s: not all tries within 109 s, all within 138 s.
    tokio::time::sleep(Duration::from_secs(109)).await;
    settle().await;
    assert!(
        sink.calls().len() < MAX_TRIES as usize,
        "{}",
        sink.calls().len()
    );
    assert_eq!(n(&counts.failed), 0);
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(sink.calls().len(), MAX_TRIES as usize);
    assert_eq!(n(&counts.failed), 1);
    rec.record(&pod(), Reason::EngineReady, "back");
    settle().await;
    assert_eq!(sink.calls().len(), MAX_TRIES as usize + 1);
    assert_eq!(n(&counts.created), 1);
}

// An Event the API server refuses (422) is not tried again.
#[tokio::test(start_paused = true)]
async fn a_refused_event_is_not_tried_again() {
    let sink = Script::default();
    sink.answer(Err(status(422)), 1);
    let (rec, counts, _c) = started(&sink, 16);
    rec.record(&pod(), Reason::EngineNotReady, "x");
    settle().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    settle().await;
    assert_eq!(sink.calls().len(), 1);
    assert_eq!(n(&counts.failed), 1);
}

// While the writer waits on the API server, recording never waits: what does not fit the
// queue is dropped and counted, and the recorder's caller goes on at once.
#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_and_counts_and_never_blocks_the_caller() {
    let sink = Script::default();
    sink.answer(Err(ApiError::Transport("timed out".into())), 100);
    let (rec, counts, _c) = started(&sink, 2);
    let reasons = [
        Reason::EngineReady,
        Reason::EngineNotReady,
        Reason::EngineEvicted,
        Reason::RestartLoop,
        Reason::EvictionFailed,
        Reason::PublicFaultPublished,
    ];
    for r in reasons {
        rec.record(&pod(), r, "x");
        settle().await;
    }
    // One in the writer's hands, two queued, three dropped.
    assert_eq!(n(&counts.dropped), 3);
    assert_eq!(sink.calls().len(), 1);
}

// The Event as the API server validates it (events.go): qualified controller, instance and
// note within their limits (the note cut on a character boundary), type, action, reason,
// eventTime set, legacy fields unset, the name a DNS subdomain even for a long pod name.
#[tokio::test(start_paused = true)]
async fn the_event_meets_the_api_servers_limits() {
    let counts = Arc::new(Counts::default());
    let long_node = "n".repeat(200);
    let (rec, mut rx) = Recorder::new(Some(&long_node), 4, counts);
    let mut p = pod();
    p.name = format!("{}-", "a".repeat(252));
    rec.record(&p, Reason::EngineNotReady, &"é".repeat(2000));
    let w = rx.recv().await.unwrap();
    let e = w.event();
    let note = e.note.as_deref().unwrap();
    assert!(
        note.len() <= NOTE_LIMIT && note.ends_with('…'),
        "{}",
        note.len()
    );
    assert!(e.reporting_instance.as_deref().unwrap().len() <= 128);
    assert_eq!(e.reporting_controller.as_deref(), Some(super::CONTROLLER));
    assert_eq!(
        (e.type_.as_deref(), e.action.as_deref(), e.reason.as_deref()),
        (
            Some("Warning"),
            Some("SetCondition"),
            Some("EngineNotReady")
        )
    );
    assert!(e.event_time.is_some() && e.series.is_none());
    assert!(e.deprecated_count.is_none() && e.deprecated_source.is_none());
    let name = e.metadata.name.as_deref().unwrap();
    assert!(name.len() <= 253, "{}", name.len());
    assert!(!name.contains("-."), "{name}");
    let r = e.regarding.as_ref().unwrap();
    assert_eq!(
        (r.kind.as_deref(), r.uid.as_deref()),
        (Some("Pod"), Some("0b9e"))
    );
    for reason in Reason::ALL {
        assert!(matches!(reason.type_(), "Normal" | "Warning"));
        assert!(reason.as_str().chars().next().unwrap().is_ascii_uppercase());
    }
}

// Another loop of the engine (the public faults) posts on the pod as the pod loop last found
// it, and on none while none is known (the action is in the journal either way).
#[tokio::test(start_paused = true)]
async fn an_engines_other_loops_post_on_the_pod_its_pod_loop_found() {
    let (rec, mut rx) = Recorder::new(Some("n1"), 4, Arc::new(Counts::default()));
    let ev = super::EngineEvents::new(rec);
    ev.record_on_pod(Reason::PublicFaultPublished, "before the pod is known");
    assert!(rx.try_recv().is_err(), "no pod, no Event");
    ev.set_pod(Some(&pod()));
    ev.clone()
        .record_on_pod(Reason::PublicFaultPublished, "occur 010019001");
    let w = rx.try_recv().expect("an Event");
    let e = w.event();
    assert_eq!(
        (
            e.reason.as_deref(),
            e.regarding.as_ref().and_then(|r| r.name.as_deref())
        ),
        (Some("PublicFaultPublished"), Some("vllm-0"))
    );
    ev.set_pod(None);
    ev.record_on_pod(Reason::PublicFaultRecovered, "after the pod is gone");
    assert!(rx.try_recv().is_err(), "the pod gone, no Event");
}
