//! Kubernetes Events (`events.k8s.io/v1`) for what the agent does to an engine's pod, so that
//! `kubectl describe pod` and `kubectl get events` show it: the readiness condition set
//! (ready or not, and why), an eviction or MindCluster's fault annotation (and a refusal),
//! a restart loop (escalation), a MindCluster public fault published.
//!
//! [`Recorder::record`] is all an action calls: it builds the Event, counts it into its
//! series ([`series`], client-go's semantics) under a short lock, and puts what is to be
//! written on a bounded queue without waiting; a full queue drops the write and counts it.
//! One writer task per agent ([`sink::run`]) writes them, with client-go's retries. Nothing
//! here waits on the API server in an action's path, and nothing touches a verdict.
//!
//! The Event's fields as the API server validates them (kubernetes
//! `pkg/apis/core/validation/events.go`): `reportingController` a qualified name,
//! `reportingInstance`, `action` and `reason` at most 128 bytes, the note at most 1024
//! bytes (cut here on a character boundary), `eventTime` set, `type` Normal or Warning, the
//! legacy fields unset, the name a DNS subdomain.

pub(crate) mod series;
pub(crate) mod sink;

use super::api::PodInfo;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use series::{Cache, Key, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `reportingController` of every Event the agent posts (a qualified name, as the API
/// server requires).
pub(crate) const CONTROLLER: &str = "npu-health-agent.io/agent";
/// The most writes waiting for the writer (client-go's `maxQueuedEvents`); past it, writes
/// are dropped and counted.
pub(crate) const QUEUE: usize = 1000;
/// The most Event keys the series cache holds (an agent serves at most a few engines, each
/// with a handful of reasons: far below).
pub(crate) const CACHE: usize = 1024;
/// The API server's limits (`events.go`): the note, and `reportingInstance`.
pub(crate) const NOTE_LIMIT: usize = 1024;
pub(crate) const INSTANCE_LIMIT: usize = 128;

/// Why the agent posts an Event: its `reason`, and with it the Event's type and action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// The readiness condition set True.
    EngineReady,
    /// The readiness condition set False.
    EngineNotReady,
    /// An Eviction went through.
    EngineEvicted,
    /// MindCluster's fault annotation was set.
    MindClusterFaultAnnotated,
    /// An eviction (or the annotation) was refused for now: a PodDisruptionBudget (429).
    EvictionRefused,
    /// An eviction (or the annotation) failed.
    EvictionFailed,
    /// The engine is in a restart loop (escalated, `agent_policy.escalate_after`).
    RestartLoop,
    /// A MindCluster public fault `occur` was published for the engine's NPUs (by the
    /// public-fault loop, `super::public_fault`).
    PublicFaultPublished,
    /// A MindCluster public fault `recover` was published for the engine's NPUs (the same).
    PublicFaultRecovered,
}

impl Reason {
    /// Every reason, as docs/kubernetes.md lists them.
    #[cfg(test)]
    pub(crate) const ALL: [Reason; 9] = [
        Reason::EngineReady,
        Reason::EngineNotReady,
        Reason::EngineEvicted,
        Reason::MindClusterFaultAnnotated,
        Reason::EvictionRefused,
        Reason::EvictionFailed,
        Reason::RestartLoop,
        Reason::PublicFaultPublished,
        Reason::PublicFaultRecovered,
    ];

    /// The Event's `reason` (CamelCase).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::EngineReady => "EngineReady",
            Reason::EngineNotReady => "EngineNotReady",
            Reason::EngineEvicted => "EngineEvicted",
            Reason::MindClusterFaultAnnotated => "MindClusterFaultAnnotated",
            Reason::EvictionRefused => "EvictionRefused",
            Reason::EvictionFailed => "EvictionFailed",
            Reason::RestartLoop => "RestartLoop",
            Reason::PublicFaultPublished => "PublicFaultPublished",
            Reason::PublicFaultRecovered => "PublicFaultRecovered",
        }
    }

    /// `Normal` or `Warning`: Warning when the pod is taken out of service or something
    /// failed.
    pub(crate) fn type_(self) -> &'static str {
        match self {
            Reason::EngineReady | Reason::PublicFaultRecovered => "Normal",
            _ => "Warning",
        }
    }

    /// The Event's `action`: what the agent did.
    pub(crate) fn action(self) -> &'static str {
        match self {
            Reason::EngineReady | Reason::EngineNotReady => "SetCondition",
            Reason::EngineEvicted | Reason::EvictionRefused | Reason::EvictionFailed => "Evict",
            Reason::MindClusterFaultAnnotated => "Annotate",
            Reason::RestartLoop => "Escalate",
            Reason::PublicFaultPublished | Reason::PublicFaultRecovered => "PublishPublicFault",
        }
    }
}

/// What the Events came to, for the whole agent (`npu_health_agent_kubernetes_events_total`).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Events created.
    pub created: AtomicU64,
    /// Series counts written.
    pub patched: AtomicU64,
    /// Writes refused by the API server, or not answered within the tries.
    pub failed: AtomicU64,
    /// Writes dropped: the queue was full (or the writer gone).
    pub dropped: AtomicU64,
}

impl Counts {
    /// The agent's counts (the metric reads them).
    pub(crate) fn global() -> Arc<Counts> {
        static GLOBAL: LazyLock<Arc<Counts>> = LazyLock::new(Arc::default);
        GLOBAL.clone()
    }

    /// `(outcome, count)` for every outcome.
    pub(crate) fn rows(&self) -> [(&'static str, u64); 4] {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("created", n(&self.created)),
            ("patched", n(&self.patched)),
            ("failed", n(&self.failed)),
            ("dropped", n(&self.dropped)),
        ]
    }
}

/// Wall-clock time that follows tokio's clock from a start (so the series' times move under
/// paused time in the tests as they do in a running agent).
#[derive(Debug)]
struct Clock {
    at: Instant,
    micros: i64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            at: Instant::now(),
            micros: k8s_openapi::jiff::Timestamp::now().as_microsecond(),
        }
    }

    fn now(&self) -> k8s_openapi::jiff::Timestamp {
        let us = self.micros + self.at.elapsed().as_micros() as i64;
        k8s_openapi::jiff::Timestamp::from_microsecond(us)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
    }
}

struct Inner {
    instance: String,
    cache: Mutex<Cache>,
    queue: mpsc::Sender<Write>,
    counts: Arc<Counts>,
    clock: Clock,
    /// Makes each Event's name unique within the agent.
    seq: AtomicU64,
    /// A dropped write was logged (once; the metric counts every one).
    warned: std::sync::atomic::AtomicBool,
}

/// Records the Events of the Kubernetes API mode (a clone shares the queue and the series).
#[derive(Clone)]
pub(crate) struct Recorder(Arc<Inner>);

/// One engine's Events: the agent's recorder, and the engine's pod as its pod loop last
/// found it, so that the engine's other loop (the public faults) posts on the same pod.
#[derive(Clone)]
pub(crate) struct EngineEvents {
    recorder: Recorder,
    pod: Arc<Mutex<Option<PodInfo>>>,
}

impl EngineEvents {
    /// The engine's Events through `recorder`; no pod known yet.
    pub(crate) fn new(recorder: Recorder) -> EngineEvents {
        EngineEvents {
            recorder,
            pod: Arc::default(),
        }
    }

    /// The pod loop found the engine's pod (or lost it).
    pub(crate) fn set_pod(&self, pod: Option<&PodInfo>) {
        *self.pod.lock().unwrap_or_else(|p| p.into_inner()) = pod.cloned();
    }

    /// Records `reason` on `pod` ([`Recorder::record`]).
    pub(crate) fn record(&self, pod: &PodInfo, reason: Reason, note: &str) {
        self.recorder.record(pod, reason, note);
    }

    /// Records `reason` on the engine's pod as last found; nothing while none is known (the
    /// action is in the journal either way).
    pub(crate) fn record_on_pod(&self, reason: Reason, note: &str) {
        let pod = self.pod.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(pod) = pod {
            self.recorder.record(&pod, reason, note);
        }
    }
}

impl Recorder {
    /// A recorder reporting as `CONTROLLER` on `node`, and the receiving end of its queue
    /// (of `queue` writes) for the writer ([`sink::run`]).
    pub(crate) fn new(
        node: Option<&str>,
        queue: usize,
        counts: Arc<Counts>,
    ) -> (Recorder, mpsc::Receiver<Write>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let instance = cut(
            &format!("{CONTROLLER}-{}", node.unwrap_or("unknown-node")),
            INSTANCE_LIMIT,
        );
        let inner = Inner {
            instance,
            cache: Mutex::new(Cache::new(CACHE)),
            queue: tx,
            counts,
            clock: Clock::new(),
            seq: AtomicU64::new(0),
            warned: std::sync::atomic::AtomicBool::new(false),
        };
        (Recorder(Arc::new(inner)), rx)
    }

    /// Records that the agent did `reason` to `pod`; `note` says what and why (cut to the
    /// API server's 1024 bytes). Never waits: a write that finds the queue full is dropped
    /// and counted.
    pub(crate) fn record(&self, pod: &PodInfo, reason: Reason, note: &str) {
        let now = Instant::now();
        let time = MicroTime(self.0.clock.now());
        let event = self.event(pod, reason, note, time.clone());
        let key = Key {
            type_: reason.type_(),
            action: reason.action(),
            reason: reason.as_str(),
            controller: CONTROLLER.to_owned(),
            instance: self.0.instance.clone(),
            regarding: (
                pod.namespace.clone(),
                pod.name.clone(),
                pod.uid.clone().unwrap_or_default(),
            ),
            related: None,
        };
        let writes = self
            .0
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(key, event, now, time);
        for w in writes {
            if self.0.queue.try_send(w).is_err() {
                self.0.counts.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.0.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "Kubernetes Events: an Event was dropped: {QUEUE} writes wait for the API server already (npu_health_agent_kubernetes_events_total{{outcome=\"dropped\"}} counts every one; this is said once)"
                    );
                }
            }
        }
    }

    /// The Event for `reason` on `pod` at `time`.
    fn event(&self, pod: &PodInfo, reason: Reason, note: &str, time: MicroTime) -> Event {
        let seq = self.0.seq.fetch_add(1, Ordering::Relaxed);
        // client-go's `<regarding name>.<hex nanoseconds>`, the name cut so the whole stays a
        // DNS subdomain (253); the sequence keeps two Events of one instant apart.
        let nanos = time.0.as_nanosecond() as u64;
        let suffix = format!(".{:x}", nanos.wrapping_add(seq));
        let name = format!("{}{suffix}", name_part(&pod.name, 253 - suffix.len()));
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(pod.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(time),
            type_: Some(reason.type_().to_owned()),
            reason: Some(reason.as_str().to_owned()),
            action: Some(reason.action().to_owned()),
            note: Some(cut(note, NOTE_LIMIT)),
            reporting_controller: Some(CONTROLLER.to_owned()),
            reporting_instance: Some(self.0.instance.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: pod.uid.clone(),
                ..ObjectReference::default()
            }),
            ..Event::default()
        }
    }

    fn counts(&self) -> Arc<Counts> {
        self.0.counts.clone()
    }

    fn finish(&self, now: Instant) -> Vec<(Key, Write)> {
        self.0
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(now)
    }

    fn finished(&self, key: &Key, now: Instant) {
        self.0
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finished(key, now);
    }

    fn refresh(&self) -> Vec<Write> {
        self.0
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refresh()
    }
}

/// The start of a pod's name (a DNS subdomain) of at most `max` bytes that can take a
/// `.suffix`: a cut name loses the `-` or `.` it would end on.
fn name_part(name: &str, max: usize) -> &str {
    let mut at = name.len().min(max);
    while !name.is_char_boundary(at) {
        at -= 1;
    }
    name[..at].trim_end_matches(['-', '.'])
}

/// `s` cut to at most `max` bytes on a character boundary; a cut one ends with `…`.
pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    const MORE: &str = "…";
    let mut at = max.saturating_sub(MORE.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}{MORE}", &s[..at])
}

#[cfg(test)]
mod tests;
