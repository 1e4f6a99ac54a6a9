//! HealthCollector: probes the engine's `GET /health` as the reference does (§3.4).
//!
//! Up to `health_collector_timeout_retry_attempts` attempts, each bounded by
//! `health_collector_timeout`; only timeouts are retried. Healthy ⇔ 2xx and a body the
//! engine's kind reads as healthy ([`HealthTransport::healthy_body`]: the reference's rule,
//! not exactly `false` after lower-casing, unless the kind says otherwise in
//! `src/engines/`). A failure after the engine has once answered is
//! *unhealthy* (→ `abnormal`); a failure before that means the engine was never reached
//! (→ `initial`).

use super::outcome::ProbeFailure;
pub(crate) use super::outcome::Transport;
use std::time::Duration;

/// What one transport attempt returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetch {
    /// An HTTP response.
    Response { status: u16, body: String },
    /// No answer within the timeout.
    Timeout,
    /// No usable answer: the class, and the error as the client described it.
    Error(Transport, String),
}

/// Something that can `GET /health` once with a timeout (the real client or a test double).
pub(crate) trait HealthTransport {
    /// One attempt.
    fn get(&self, timeout: Duration) -> impl Future<Output = Fetch> + Send;

    /// Whether a 2xx answer with `body` is healthy: the engine's kind says (the HTTP
    /// transport asks it); by default the reference's rule, healthy unless the body is
    /// exactly `false` after lower-casing (not trimmed).
    fn healthy_body(&self, body: &str) -> bool {
        body.to_lowercase() != "false"
    }
}

/// Result of one probe (all attempts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HealthOutcome {
    Healthy,
    /// Connected before, failing now (or answering `false`). `unreachable` when the last
    /// attempt was refused (nothing listens: the engine is down or restarting), as opposed to
    /// a timeout, an HTTP error, a garbled answer or a `false` body; `timed_out` when every
    /// attempt timed out; `transport` the class of a failure without a usable answer.
    Unhealthy {
        reason: String,
        unreachable: bool,
        timed_out: bool,
        transport: Option<Transport>,
    },
    /// Never reached: the reference re-raises, and `/status` says `initial`.
    NeverConnected(String),
}

/// The collector for one engine.
#[derive(Debug)]
pub(crate) struct HealthCollector<T> {
    transport: T,
    timeout: Duration,
    attempts: u64,
    has_connected: bool,
}

impl<T: HealthTransport> HealthCollector<T> {
    /// `timeout` per attempt; `attempts` in total (at least 1).
    pub(crate) fn new(transport: T, timeout: Duration, attempts: u64) -> Self {
        HealthCollector {
            transport,
            timeout,
            attempts: attempts.max(1),
            has_connected: false,
        }
    }

    /// Starts as though `/health` had answered before (`yes`): after an agent restart that
    /// took back its state, a failure is `unhealthy`, not `never answered`.
    pub(crate) fn answered_before(mut self, yes: bool) -> Self {
        self.has_connected = yes;
        self
    }

    /// Whether `/health` has ever answered with a 2xx.
    pub(crate) fn has_connected(&self) -> bool {
        self.has_connected
    }

    /// Probes once (with retries on timeout).
    pub(crate) async fn probe(&mut self) -> HealthOutcome {
        let mut last = String::new();
        let mut failed = None;
        let mut timed_out = false;
        for attempt in 1..=self.attempts {
            match self.transport.get(self.timeout).await {
                Fetch::Response { status, body } if (200..300).contains(&status) => {
                    self.has_connected = true;
                    // The kind reads the body (the reference: exactly `false` is not).
                    if !self.transport.healthy_body(&body) {
                        return HealthOutcome::Unhealthy {
                            reason: "/health answered false".to_owned(),
                            unreachable: false,
                            timed_out: false,
                            transport: None,
                        };
                    }
                    return HealthOutcome::Healthy;
                }
                Fetch::Response { status, .. } => {
                    timed_out = false;
                    last = ProbeFailure::Status(status).to_string();
                    break;
                }
                Fetch::Timeout => {
                    timed_out = true;
                    last = ProbeFailure::Timeout(self.timeout).to_string();
                    if attempt < self.attempts {
                        tracing::info!(
                            "Health check timed out (attempt {attempt}/{}), retrying...",
                            self.attempts
                        );
                    }
                }
                Fetch::Error(class, e) => {
                    timed_out = false;
                    last = ProbeFailure::Transport(class, e).to_string();
                    failed = Some(class);
                    break;
                }
            }
        }
        if self.has_connected {
            HealthOutcome::Unhealthy {
                reason: last,
                unreachable: failed == Some(Transport::Refused),
                timed_out,
                transport: failed,
            }
        } else {
            HealthOutcome::NeverConnected(last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The name in a reason and on the wire is one name: both derived by the snake_case rule.
    #[test]
    fn a_transport_class_has_one_name() {
        for t in Transport::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str(), "{t:?}");
            let back: Transport = serde_json::from_value(t.as_str().into()).unwrap();
            assert_eq!(back, t);
        }
        assert_eq!(Transport::BodyTooLarge.as_str(), "body_too_large");
        assert_eq!(
            crate::probe::outcome::NOT_DOWN.len() + 1,
            Transport::ALL.len(),
            "every class but Refused is in NOT_DOWN"
        );
    }
    use std::sync::Mutex;

    /// Replays scripted answers and counts calls.
    struct Script {
        answers: Mutex<Vec<Fetch>>,
        calls: Mutex<u32>,
        timeouts: Mutex<Vec<Duration>>,
    }

    impl Script {
        fn new(mut answers: Vec<Fetch>) -> Script {
            answers.reverse();
            Script {
                answers: Mutex::new(answers),
                calls: Mutex::new(0),
                timeouts: Mutex::new(Vec::new()),
            }
        }
        fn calls(&self) -> u32 {
            *self.calls.lock().unwrap()
        }
    }

    impl HealthTransport for &Script {
        async fn get(&self, timeout: Duration) -> Fetch {
            *self.calls.lock().unwrap() += 1;
            self.timeouts.lock().unwrap().push(timeout);
            self.answers
                .lock()
                .unwrap()
                .pop()
                .expect("no scripted answer left")
        }
    }

    fn ok(body: &str) -> Fetch {
        Fetch::Response {
            status: 200,
            body: body.into(),
        }
    }

    // test_health_collector.py: 3 timeouts, never connected → raises after 3 gets.
    #[tokio::test]
    async fn three_timeouts_never_connected_is_initial_after_three_gets() {
        let s = Script::new(vec![Fetch::Timeout, Fetch::Timeout, Fetch::Timeout]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert!(matches!(c.probe().await, HealthOutcome::NeverConnected(_)));
        assert_eq!(s.calls(), 3);
        assert_eq!(*s.timeouts.lock().unwrap(), vec![Duration::from_secs(5); 3]);
    }

    // Success, then 3 timeouts → False (4 gets in total).
    #[tokio::test]
    async fn success_then_three_timeouts_is_unhealthy_after_four_gets() {
        let s = Script::new(vec![
            ok("true"),
            Fetch::Timeout,
            Fetch::Timeout,
            Fetch::Timeout,
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert!(matches!(c.probe().await, HealthOutcome::Unhealthy { .. }));
        assert_eq!(s.calls(), 4);
    }

    // Both engines the agent serves: plain vLLM answers 200 with an empty body, and 503 with
    // an empty body once its engine core is dead (500 up to 0.10); MindIE's engine server
    // answers JSON `true` / `false`.
    #[tokio::test]
    async fn vllm_empty_bodies_and_mindie_booleans() {
        let s = Script::new(vec![
            ok(""),
            Fetch::Response {
                status: 503,
                body: String::new(),
            },
            ok("true"),
            ok("false"),
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert_eq!(c.probe().await, HealthOutcome::Healthy, "vLLM's empty 200");
        assert!(matches!(
            c.probe().await,
            HealthOutcome::Unhealthy { ref reason, unreachable: false, .. } if reason.contains("503")
        ));
        assert_eq!(c.probe().await, HealthOutcome::Healthy, "MindIE's true");
        assert!(matches!(c.probe().await, HealthOutcome::Unhealthy { .. }));
    }

    // ConnectError, never connected → raises after 1 get (no retry).
    #[tokio::test]
    async fn connect_error_is_not_retried() {
        let s = Script::new(vec![Fetch::Error(
            Transport::Refused,
            "connection refused".into(),
        )]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert!(matches!(c.probe().await, HealthOutcome::NeverConnected(_)));
        assert_eq!(s.calls(), 1);
    }

    // Success then ConnectError → False.
    #[tokio::test]
    async fn success_then_connect_error_is_unhealthy() {
        let s = Script::new(vec![
            ok(""),
            Fetch::Error(Transport::Refused, "connection refused".into()),
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert!(matches!(c.probe().await, HealthOutcome::Unhealthy { .. }));
        assert_eq!(s.calls(), 2);
    }

    // Body `false` → False; only exactly false after lower-casing counts (the reference does
    // not trim, so `false\n` is healthy there and here).
    #[tokio::test]
    async fn body_false_is_unhealthy_and_other_bodies_healthy() {
        let s = Script::new(vec![
            ok("false"),
            ok("FALSE"),
            ok("true"),
            ok(""),
            ok("{\"ok\":false}"),
            ok("false\n"),
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert!(matches!(c.probe().await, HealthOutcome::Unhealthy { .. }));
        assert!(matches!(c.probe().await, HealthOutcome::Unhealthy { .. }));
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
    }

    // A restart shows as "cannot connect"; timeouts and HTTP errors are something else.
    #[tokio::test]
    async fn unreachable_only_when_the_connection_fails() {
        let s = Script::new(vec![
            ok("true"),
            Fetch::Error(Transport::Refused, "connection refused".into()),
            Fetch::Timeout,
            Fetch::Response {
                status: 503,
                body: String::new(),
            },
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 1);
        c.probe().await;
        let flags: Vec<(bool, bool)> = [c.probe().await, c.probe().await, c.probe().await]
            .into_iter()
            .map(|o| match o {
                HealthOutcome::Unhealthy {
                    unreachable,
                    timed_out,
                    ..
                } => (unreachable, timed_out),
                other => panic!("{other:?}"),
            })
            .collect();
        // (unreachable, timed out): refused, timed out, HTTP 503.
        assert_eq!(flags, [(true, false), (false, true), (false, false)]);
    }

    // Issue 11, defect 2: a garbled answer (or the agent's own EMFILE) came from a process
    // that is still there, or says nothing about it: not "unreachable", so never the down
    // half of a restart; its class is carried.
    #[tokio::test]
    async fn garbled_health_answer_is_not_unreachable() {
        let classes = crate::probe::outcome::NOT_DOWN;
        let mut script = vec![ok("true")];
        script.extend(classes.iter().map(|&c| Fetch::Error(c, "x".into())));
        let s = Script::new(script);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        c.probe().await;
        for class in classes {
            match c.probe().await {
                HealthOutcome::Unhealthy {
                    unreachable,
                    transport,
                    reason,
                    ..
                } => {
                    assert!(!unreachable, "{class:?}");
                    assert_eq!(transport, Some(class));
                    let words = crate::probe::cause::words(class);
                    assert_eq!(reason, format!("{words}: x"));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(s.calls(), 8, "none of them is retried");
    }

    // HTTP errors (non-2xx) are not retried.
    #[tokio::test]
    async fn http_error_is_not_retried() {
        let s = Script::new(vec![
            ok("true"),
            Fetch::Response {
                status: 503,
                body: String::new(),
            },
        ]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        c.probe().await;
        let HealthOutcome::Unhealthy { reason: why, .. } = c.probe().await else {
            panic!("must be unhealthy")
        };
        assert!(why.contains("503"), "{why}");
        assert_eq!(s.calls(), 2);
    }

    #[tokio::test]
    async fn timeout_then_success_within_the_attempts_is_healthy() {
        let s = Script::new(vec![Fetch::Timeout, ok("true")]);
        let mut c = HealthCollector::new(&s, Duration::from_secs(5), 3);
        assert_eq!(c.probe().await, HealthOutcome::Healthy);
        assert_eq!(s.calls(), 2);
    }
}
