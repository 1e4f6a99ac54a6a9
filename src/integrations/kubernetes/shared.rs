//! One pod list per question, shared by every engine's loop: the agent asks the API server
//! for this node's pods once per `resync_period`, however many engines it serves.
//!
//! Each engine's loop looks its pod up at start and at every resync ([`super::task`]); the
//! resyncs of all engines fall on one schedule (multiples of `resync_period` from the mode's
//! start), so they ask together. The first to ask sends the request; the others wait for its
//! answer (or failure) instead of sending their own, and a later loop takes a list that is
//! younger than half a `resync_period`. Engines asking a different question (another
//! namespace or label selector) get a list of their own.
//!
//! Why: a list may be up to [`super::api::LIST_LIMIT`] (16 MiB), and reading and parsing one
//! costs several times that. Sixteen engines each reading its own at the same instant reached
//! 325 MB, over the 256 MiB both the unit and the DaemonSet allow.
//!
//! A pod found gone (a 404 on it) makes every list older than that moment stale
//! ([`SharedLists::forget`]), so a replaced pod is found in the next list, not one
//! `resync_period` later.

use super::api::{ApiError, KubeApi, PodInfo};
use k8s_openapi::api::core::v1::PodCondition;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The question: `(node, namespace, label selector)`.
type Question = (Option<String>, Option<String>, Option<String>);

/// A list as answered, and when the answer came.
type Answer = Option<(Instant, Result<Arc<[PodInfo]>, ApiError>)>;

/// `A`'s calls, with `list_pods` shared (the other calls go through as they are). A clone
/// shares the lists: each engine's loop holds one.
pub(crate) struct SharedLists<A>(Arc<Shared<A>>);

impl<A> Clone for SharedLists<A> {
    fn clone(&self) -> Self {
        SharedLists(self.0.clone())
    }
}

impl<A> std::ops::Deref for SharedLists<A> {
    type Target = Shared<A>;
    fn deref(&self) -> &Shared<A> {
        &self.0
    }
}

/// What the clones of a [`SharedLists`] share.
pub(crate) struct Shared<A> {
    inner: A,
    /// A list younger than this answers a new question at once.
    fresh: Duration,
    /// Per question, the last answer; its lock is held while the request is out, so
    /// loops asking the same question meanwhile wait for that one answer.
    answers: Mutex<HashMap<Question, Arc<tokio::sync::Mutex<Answer>>>>,
    /// Lists answered before this are stale (a pod was found gone).
    stale_before: Mutex<Option<Instant>>,
    /// Requests sent (`/status/detail` does not show it; the tests and the log do).
    sent: std::sync::atomic::AtomicU64,
}

impl<A: KubeApi> SharedLists<A> {
    /// `inner`'s calls, a list shared for half of `resync_period`.
    pub(crate) fn new(inner: A, resync_period: Duration) -> SharedLists<A> {
        SharedLists(Arc::new(Shared {
            inner,
            fresh: resync_period / 2,
            answers: Mutex::new(HashMap::new()),
            stale_before: Mutex::new(None),
            sent: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Lists answered until now are stale: the next question is sent again.
    pub(crate) fn forget(&self) {
        *self.stale_before.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// List requests sent so far.
    #[cfg(test)]
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn usable(&self, at: Instant, now: Instant) -> bool {
        let stale_before = *self.stale_before.lock().unwrap_or_else(|p| p.into_inner());
        now.saturating_duration_since(at) < self.fresh && stale_before.is_none_or(|s| at > s)
    }
}

impl<A: KubeApi> KubeApi for SharedLists<A> {
    async fn list_pods(
        &self,
        node: Option<&str>,
        namespace: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Arc<[PodInfo]>, ApiError> {
        let q: Question = (
            node.map(str::to_owned),
            namespace.map(str::to_owned),
            labels.map(str::to_owned),
        );
        let slot = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(q)
            .or_default()
            .clone();
        // Held across the request: whoever asks meanwhile waits for this answer.
        let mut answer = slot.lock().await;
        if let Some((at, a)) = answer.as_ref()
            && self.usable(*at, Instant::now())
        {
            return a.clone();
        }
        *answer = None;
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fresh = self.inner.list_pods(node, namespace, labels).await;
        *answer = Some((Instant::now(), fresh.clone()));
        fresh
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<PodInfo, ApiError> {
        self.inner.get_pod(namespace, name).await
    }

    async fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        condition: &PodCondition,
    ) -> Result<(), ApiError> {
        self.inner.set_condition(namespace, name, condition).await
    }

    async fn evict(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        self.inner.evict(namespace, name).await
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        self.inner.annotate(namespace, name, key, value).await
    }

    fn pod_gone(&self) {
        self.forget();
    }
}

/// The first multiple of `period` after `origin` that is later than `now`: where every
/// engine's next resync falls, so their lists are one.
pub(crate) fn next_resync(origin: Instant, now: Instant, period: Duration) -> Instant {
    if period.is_zero() {
        return now;
    }
    let since = now.saturating_duration_since(origin);
    let n = since.as_nanos() / period.as_nanos() + 1;
    origin + period.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Answers a list of one pod after `delay`, counting the requests.
    struct Counting {
        asked: AtomicU64,
        delay: Duration,
        fail: bool,
    }

    impl KubeApi for Counting {
        async fn list_pods(
            &self,
            _node: Option<&str>,
            namespace: Option<&str>,
            _labels: Option<&str>,
        ) -> Result<Arc<[PodInfo]>, ApiError> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(ApiError::Transport("refused".into()));
            }
            Ok(Arc::from(vec![PodInfo {
                namespace: namespace.unwrap_or("default").to_owned(),
                name: "p".into(),
                ..PodInfo::default()
            }]))
        }
        async fn get_pod(&self, _: &str, _: &str) -> Result<PodInfo, ApiError> {
            unreachable!()
        }
        async fn set_condition(&self, _: &str, _: &str, _: &PodCondition) -> Result<(), ApiError> {
            unreachable!()
        }
        async fn evict(&self, _: &str, _: &str) -> Result<(), ApiError> {
            unreachable!()
        }
        async fn annotate(&self, _: &str, _: &str, _: &str, _: &str) -> Result<(), ApiError> {
            unreachable!()
        }
    }

    fn shared(delay_ms: u64, fail: bool) -> SharedLists<Counting> {
        SharedLists::new(
            Counting {
                asked: AtomicU64::new(0),
                delay: Duration::from_millis(delay_ms),
                fail,
            },
            Duration::from_secs(30),
        )
    }

    async fn ask_together(s: &SharedLists<Counting>, n: usize, ns: Option<&str>) {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let s = s.clone();
            let ns = ns.map(str::to_owned);
            set.spawn(async move { s.list_pods(Some("n1"), ns.as_deref(), None).await });
        }
        while let Some(r) = set.join_next().await {
            let _ = r.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sixteen_loops_asking_together_send_one_request() {
        let s = shared(200, false);
        ask_together(&s, 16, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 1);
        // Within half a resync the list answers; after it, a new one is asked.
        tokio::time::advance(Duration::from_secs(14)).await;
        ask_together(&s, 16, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        ask_together(&s, 16, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 2);
        assert_eq!(s.sent(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_shared_too_and_another_question_is_its_own() {
        let s = shared(200, true);
        ask_together(&s, 8, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 1);
        ask_together(&s, 8, Some("inference")).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_gone_makes_the_lists_before_it_stale() {
        let s = shared(10, false);
        ask_together(&s, 4, None).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        s.pod_gone();
        tokio::time::advance(Duration::from_millis(1)).await;
        ask_together(&s, 4, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 2);
        // The list asked after the gone pod is good for the others.
        ask_together(&s, 4, None).await;
        assert_eq!(s.inner.asked.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn resyncs_fall_on_one_schedule() {
        let origin = Instant::now();
        let p = Duration::from_secs(30);
        assert_eq!(next_resync(origin, origin, p), origin + p);
        assert_eq!(
            next_resync(origin, origin + Duration::from_millis(29_999), p),
            origin + p
        );
        assert_eq!(next_resync(origin, origin + p, p), origin + p * 2);
        assert_eq!(
            next_resync(origin, origin + Duration::from_secs(95), p),
            origin + p * 4
        );
    }
}
