//! The state of one engine's virtual inference, shared by its loop (the writer) with
//! `/status` (atomics, never a lock on the verdict path), `/status/detail` and the metrics.

use super::account::Accounted;
use crate::probe::outcome::{Accounting, LATENCY_BUCKETS, ProbeRecord, ProbeResult, Probed};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use npu_health_wire::Phase;

/// [`Phase`] from its atomic encoding ([`phase_to_u8`]).
fn phase_from_u8(v: u8) -> Phase {
    match v {
        0 => Phase::NotStarted,
        1 => Phase::Disabled,
        2 => Phase::WarmingUp,
        3 => Phase::Running,
        _ => Phase::Stopped,
    }
}

/// [`Phase`] as the `u8` the state's atomic holds.
fn phase_to_u8(p: Phase) -> u8 {
    match p {
        Phase::NotStarted => 0,
        Phase::Disabled => 1,
        Phase::WarmingUp => 2,
        Phase::Running => 3,
        Phase::Stopped => 4,
    }
}

/// What of virtual inference outlives the agent process: the latched `abnormal` and why,
/// the failure count, whether the warm-up was sent, the interval, and the last probe (the
/// serving evidence and the QoS latency input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Saved {
    pub phase: Phase,
    pub abnormal: bool,
    pub abnormal_reason: Option<String>,
    /// The docs/policy.md rule that made it abnormal (`None`: the reference's own count or
    /// warm-up, or a state saved before the rule was kept). Absent from the file when `None`,
    /// so a state without one reads and writes as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abnormal_rule: Option<u8>,
    pub warmup_done: bool,
    pub failure_count: i64,
    pub interval_ms: u64,
    pub last_probe: Option<ProbeRecord>,
    /// The shadow's count and latched `abnormal` ([`ShadowCount`]); absent when there is no
    /// shadow, so a state without one reads and writes as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowCount>,
}

/// The shadow's accounting of the same probes (docs/policy.md, "Modes"): its own failure
/// count, and its own latched `abnormal` with the rule behind it. The probes are the policy
/// in force's; the shadow only counts them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ShadowCount {
    pub count: i64,
    /// Why the shadow's virtual inference is abnormal, and by which rule (`None`: the
    /// reference's own count).
    pub abnormal: Option<(String, Option<u8>)>,
    /// The rule that last kept a failure out of the shadow's count while the policy in force
    /// counted it (3 or 4): why the shadow would have stayed normal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<u8>,
}

/// Upper bounds of the detection histogram, seconds: the agent policy confirms an idle hang
/// in about 10 s, a busy stall within its 30 s stall window plus the count, the reference in
/// six 5 s probes or more.
pub(crate) const DETECTION_BUCKETS: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0,
];

/// A histogram updated with atomics: per-bucket counts for the first `N` bounds (the rest
/// is +Inf), the count and the sum in microseconds.
#[derive(Debug)]
struct Histogram<const N: usize> {
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> Histogram<N> {
    fn observe(&self, bounds: &[f64; N], d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = bounds.iter().position(|le| secs <= *le) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Per-bucket counts (not cumulative; the last bucket is +Inf), count, sum in seconds.
    fn read(&self, bounds: &[f64; N]) -> (Vec<(f64, u64)>, u64, f64) {
        let count = self.count.load(Ordering::Relaxed);
        let mut buckets: Vec<(f64, u64)> = bounds
            .iter()
            .zip(&self.buckets)
            .map(|(le, c)| (*le, c.load(Ordering::Relaxed)))
            .collect();
        let in_buckets: u64 = buckets.iter().map(|b| b.1).sum();
        buckets.push((f64::INFINITY, count.saturating_sub(in_buckets)));
        (
            buckets,
            count,
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// Loop state shared with `/status` (atomics) and `/status/detail` and metrics.
#[derive(Debug, Default)]
pub(crate) struct ViState {
    phase: AtomicU8,
    abnormal: AtomicBool,
    warmup_done: AtomicBool,
    failure_count: AtomicI64,
    interval_ms: AtomicU64,
    successes: AtomicU64,
    failures: AtomicU64,
    latency: Histogram<{ LATENCY_BUCKETS.len() }>,
    detection: Histogram<{ DETECTION_BUCKETS.len() }>,
    last: Mutex<Option<Probed>>,
    abnormal_reason: Mutex<Option<String>>,
    /// The docs/policy.md rule behind `abnormal`; 0: none (the reference's own).
    abnormal_rule: AtomicU8,
    /// The shadow's accounting (only the loop and the observer read it: off `/status`'s path).
    shadow: Mutex<ShadowCount>,
}

impl ViState {
    /// A loop state before any start, with the interval it will begin with (the reference
    /// starts at 5 s).
    pub(crate) fn new(interval: Duration) -> ViState {
        let s = ViState::default();
        s.set_interval(interval);
        s
    }

    /// What the loop is doing.
    pub(crate) fn phase(&self) -> Phase {
        phase_from_u8(self.phase.load(Ordering::Acquire))
    }
    pub(crate) fn set_phase(&self, p: Phase) {
        self.phase.store(phase_to_u8(p), Ordering::Release);
    }
    pub(crate) fn abnormal(&self) -> bool {
        self.abnormal.load(Ordering::Acquire)
    }
    pub(crate) fn abnormal_reason(&self) -> Option<String> {
        self.abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    pub(crate) fn set_abnormal(&self, reason: &str) {
        *self
            .abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(reason.to_owned());
        self.abnormal.store(true, Ordering::Release);
    }
    /// The docs/policy.md rule that made virtual inference abnormal; `None` for the
    /// reference's own count and warm-up.
    pub(crate) fn abnormal_rule(&self) -> Option<u8> {
        match self.abnormal_rule.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }
    /// Records the rule behind the latched `abnormal` (the loop calls it with the probe that
    /// made it so).
    pub(crate) fn set_abnormal_rule(&self, rule: Option<u8>) {
        self.abnormal_rule
            .store(rule.unwrap_or(0), Ordering::Release);
    }
    pub(crate) fn warmup_done(&self) -> bool {
        self.warmup_done.load(Ordering::Acquire)
    }
    pub(crate) fn failure_count(&self) -> i64 {
        self.failure_count.load(Ordering::Acquire)
    }
    /// Current sleep between probes.
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Acquire))
    }
    pub(super) fn set_interval(&self, d: Duration) {
        self.interval_ms
            .store(d.as_millis() as u64, Ordering::Release);
    }
    pub(crate) fn last_probe(&self) -> Option<Probed> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// (successes, failures) since start.
    pub(crate) fn outcomes(&self) -> (u64, u64) {
        (
            self.successes.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
    /// Latency histogram: per-bucket counts (not cumulative; the last bucket is +Inf), count,
    /// sum in seconds.
    pub(crate) fn latency_histogram(&self) -> (Vec<(f64, u64)>, u64, f64) {
        self.latency.read(&LATENCY_BUCKETS)
    }

    /// Detection histogram (same shape): for each abnormal verdict, the time from the start
    /// of the first failed virtual request of the run that led to it.
    pub(crate) fn detection_histogram(&self) -> (Vec<(f64, u64)>, u64, f64) {
        self.detection.read(&DETECTION_BUCKETS)
    }

    /// One abnormal verdict, `took` after its first failed request started.
    pub(super) fn record_detection(&self, took: Duration) {
        self.detection.observe(&DETECTION_BUCKETS, took);
    }

    /// The warm-up request has been sent (whatever its outcome).
    pub(super) fn set_warmup_done(&self) {
        self.warmup_done.store(true, Ordering::Release);
    }

    /// Applies one probe's accounting: the new count, and abnormal when it says so.
    pub(super) fn apply(&self, a: &Accounted) {
        self.failure_count.store(a.count, Ordering::Release);
        if let Some(why) = &a.abnormal {
            self.set_abnormal(why);
        }
    }

    /// The shadow's accounting now.
    pub(crate) fn shadow(&self) -> ShadowCount {
        self.shadow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Applies one probe's shadow accounting (`rule`: what made it abnormal, when it did;
    /// `held_by`: the rule that kept the failure out of the count, when one did).
    pub(crate) fn apply_shadow(&self, a: &Accounted, rule: Option<u8>, held_by: Option<u8>) {
        let mut s = self.shadow.lock().unwrap_or_else(|p| p.into_inner());
        if s.abnormal.is_some() {
            return;
        }
        s.count = a.count;
        if let Some(why) = &a.abnormal {
            s.abnormal = Some((why.clone(), rule));
        }
        if held_by.is_some() || a.count == 0 {
            s.held_by = held_by;
        }
    }

    /// What outlives the agent process ([`Saved`]).
    pub(crate) fn saved(&self) -> Saved {
        Saved {
            phase: self.phase(),
            abnormal: self.abnormal(),
            abnormal_reason: self.abnormal_reason(),
            abnormal_rule: self.abnormal_rule(),
            warmup_done: self.warmup_done(),
            failure_count: self.failure_count(),
            interval_ms: self.interval().as_millis() as u64,
            last_probe: self.last_probe().map(|p| p.record),
            shadow: Some(self.shadow()).filter(|s| *s != ShadowCount::default()),
        }
    }

    /// Takes back a saved state. A loop that was warming up or running resumes (without a
    /// new warm-up once it was sent); an abnormal one stays stopped.
    pub(crate) fn restore(&self, s: &Saved) {
        *self
            .abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = s.abnormal_reason.clone();
        self.abnormal.store(s.abnormal, Ordering::Release);
        self.set_abnormal_rule(s.abnormal_rule.filter(|_| s.abnormal));
        self.warmup_done.store(s.warmup_done, Ordering::Release);
        self.failure_count
            .store(s.failure_count.max(0), Ordering::Release);
        self.interval_ms.store(s.interval_ms, Ordering::Release);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
            s.last_probe.clone().map(|record| Probed {
                at: crate::clock::instant_of(record.at_unix_ms),
                record,
            });
        self.set_phase(if s.abnormal { Phase::Stopped } else { s.phase });
        *self.shadow.lock().unwrap_or_else(|p| p.into_inner()) =
            s.shadow.clone().unwrap_or_default();
    }

    /// Back to the initial state (the engine restarted): not started, not abnormal, count 0,
    /// warm-up pending. Counters and histograms are kept.
    pub(crate) fn rearm(&self) {
        self.abnormal.store(false, Ordering::Release);
        self.set_abnormal_rule(None);
        *self
            .abnormal_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.warmup_done.store(false, Ordering::Release);
        self.failure_count.store(0, Ordering::Release);
        *self.shadow.lock().unwrap_or_else(|p| p.into_inner()) = ShadowCount::default();
        self.set_phase(Phase::NotStarted);
    }

    pub(crate) fn record(
        &self,
        r: &ProbeResult,
        warmup: bool,
        peak: Option<f64>,
        accounting: Accounting,
    ) {
        match r.outcome {
            Ok(()) => self.successes.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failures.fetch_add(1, Ordering::Relaxed),
        };
        self.latency.observe(&LATENCY_BUCKETS, r.latency);
        let secs = r.latency.as_secs_f64();
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Probed {
            at: tokio::time::Instant::now(),
            record: ProbeRecord {
                at_unix_ms,
                warmup,
                latency_ms: secs * 1e3,
                outcome: match &r.outcome {
                    Ok(()) => "success".to_owned(),
                    Err(e) => format!("failed: {e}"),
                },
                success: r.outcome.is_ok(),
                ttft_ms: r.first_token().map(|d| d.as_secs_f64() * 1e3),
                tpot_ms: r.tpot.map(|d| d.as_secs_f64() * 1e3),
                peak,
                accounting,
                failure_count: self.failure_count(),
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // test_sim_inference.py: init state (initial, not abnormal, count 0, interval 5 s).
    #[test]
    fn initial_state() {
        let st = ViState::new(Duration::from_secs(5));
        assert_eq!(st.phase(), Phase::NotStarted);
        assert!(!st.abnormal() && !st.warmup_done());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.interval(), Duration::from_secs(5));
    }

    #[test]
    fn rearm_returns_to_the_initial_state() {
        let st = ViState::default();
        st.warmup_done.store(true, Ordering::Release);
        st.failure_count.store(4, Ordering::Release);
        st.set_abnormal("x");
        st.set_abnormal_rule(Some(5));
        st.set_phase(Phase::Stopped);
        st.rearm();
        assert!(!st.abnormal() && !st.warmup_done());
        assert_eq!(st.failure_count(), 0);
        assert_eq!(st.phase(), Phase::NotStarted);
        assert_eq!(st.abnormal_reason(), None);
        assert_eq!(st.abnormal_rule(), None);
    }

    #[test]
    fn the_rule_behind_abnormal_outlives_the_agent_and_an_older_state_reads_without_one() {
        let st = ViState::default();
        st.set_abnormal("no sign of life");
        st.set_abnormal_rule(Some(11));
        let text = serde_json::to_string(&st.saved()).unwrap();
        assert!(text.contains(r#""abnormal_rule":11"#), "{text}");
        let back = ViState::default();
        back.restore(&serde_json::from_str(&text).unwrap());
        assert_eq!(back.abnormal_rule(), Some(11));
        // A state saved by an agent that did not keep the rule (or with none to keep) has
        // no key, and reads as the reference's own.
        st.set_abnormal_rule(None);
        let text = serde_json::to_string(&st.saved()).unwrap();
        assert!(!text.contains("abnormal_rule"), "{text}");
        let back = ViState::default();
        back.restore(&serde_json::from_str(&text).unwrap());
        assert_eq!((back.abnormal(), back.abnormal_rule()), (true, None));
    }
}
