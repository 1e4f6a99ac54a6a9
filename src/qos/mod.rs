//! Inference-semantic QoS: a score in [0, 1] per engine from time to first token, KV-cache
//! headroom and forward progress; graded levels a router can act on before anything is
//! killed; and the inputs of stall detection.
//!
//! Inputs: the virtual probe's latency ([`crate::probe::outcome`]), the engine's
//! `/metrics` scraped every `metrics_period` ([`engine_metrics`], [`progress`]). The formula
//! and the level rules are in [`score`] and `docs/qos.md`. `/status` is unchanged unless
//! `eviction` is on, in which case a held `evict` level answers `abnormal`.

pub mod progress;
pub(crate) mod score;

pub use crate::config::qos::{QosConfig, Weights};
use crate::probe::engine_metrics::EngineMetrics;
use crate::probe::outcome::Probed;
use progress::Progress;
use score::{Level, Levels};
use serde::Serialize;
use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

pub(crate) use npu_health_wire::{Component, QosReport, round3};

/// The components in one line, for the log: each with its score (or `none`) and its input.
pub(crate) fn explain(components: &[Component]) -> String {
    components
        .iter()
        .map(|c| {
            let score = c
                .score
                .map_or_else(|| "none".to_owned(), |s| format!("{s:.2}"));
            format!(
                "{} {score} ({})",
                c.name,
                c.input.replace(['\n', '\r'], " ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What of an engine's QoS state outlives the agent process: the level and its hold (the
/// three lows before `evict`), and the progress tracking behind stall detection. The score's
/// components are recomputed at the next evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub(crate) struct Saved {
    pub level: Level,
    pub below_evict: u32,
    pub level_since_unix_ms: u64,
    pub score: Option<f64>,
    pub evaluations: u64,
    pub progress: progress::Saved,
    /// Requests running when the engine left `normal` ([`QosState::admission_cap`]).
    #[serde(default)]
    pub admission_cap: Option<u32>,
}

/// A level change.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: Level,
    pub to: Level,
    pub score: Option<f64>,
    /// The components behind the score, in words: `latency 0.00 (probe timeout); …`.
    pub why: String,
}

#[derive(Debug)]
struct Inner {
    metrics: Option<(EngineMetrics, Instant)>,
    scrape_error: Option<String>,
    scrapes: u64,
    scrape_failures: u64,
    progress: Progress,
    levels: Levels,
    score: Option<f64>,
    components: Vec<Component>,
    level_since_unix_ms: u64,
    evaluations: u64,
    /// Requests running at the last scrape when the level left `normal`; `None` at `normal`
    /// or when no scrape showed the running gauge then.
    admission_cap: Option<u32>,
    /// Why the published level is one band lower than the score's, at most `throttle`.
    lowered_by: Option<String>,
    /// Evaluations the lowering still holds after its cause cleared ([`LOWER_HOLD`]).
    lowered_left: u32,
}

impl Inner {
    /// Starts, renews or runs down the lowering: a cause renews its hold, and it ends
    /// [`LOWER_HOLD`] evaluations after the cause cleared.
    fn lower(&mut self, lowered_by: Option<String>) {
        match lowered_by {
            Some(why) => {
                self.lowered_by = Some(why);
                self.lowered_left = LOWER_HOLD;
            }
            None => {
                self.lowered_left = self.lowered_left.saturating_sub(1);
                if self.lowered_left == 0 {
                    self.lowered_by = None;
                }
            }
        }
    }
}

/// The admission cap after an evaluation that moved the level from `before` to `after`:
/// the requests `running` (at least 1) when the level leaves `normal`, none back at
/// `normal`, else unchanged.
fn next_admission_cap(
    cap: Option<u32>,
    before: Level,
    after: Level,
    running: Option<f64>,
) -> Option<u32> {
    if before == Level::Normal && after != Level::Normal {
        running
            .filter(|r| r.is_finite() && *r >= 0.0)
            .map(|r| (r.round() as u32).max(1))
    } else if after == Level::Normal {
        None
    } else {
        cap
    }
}

/// Latency: the last virtual probe (a failure scores 0), when recent enough. Ages on the
/// monotonic clock.
fn latency_component(cfg: &QosConfig, probe: Option<&Probed>, now: Instant) -> Component {
    let probe = probe.filter(|p| now.saturating_duration_since(p.at) <= cfg.max_input_age);
    let budget = cfg.ttft_budget.as_secs_f64();
    let Some(p) = probe else {
        return Component {
            name: "latency".into(),
            weight: cfg.weights.latency,
            score: None,
            input: "no recent virtual probe".to_owned(),
            age_ms: None,
            series: Vec::new(),
        };
    };
    let ttft = p.ttft_ms.map(|t| t / 1e3);
    let mut input = match ttft {
        Some(t) => format!("time to first token {t:.3} s (budget {budget} s)"),
        None => format!("probe {}", p.outcome),
    };
    if let Some(tpot) = p.tpot_ms {
        input.push_str(&format!(", {tpot:.1} ms per output token"));
    }
    Component {
        name: "latency".into(),
        weight: cfg.weights.latency,
        score: Some(score::latency_score(ttft, budget)),
        input,
        age_ms: Some(now.saturating_duration_since(p.at).as_millis() as u64),
        series: Vec::new(),
    }
}

/// Memory: KV-cache headroom from a recent scrape (`metrics`), else why there is none.
fn memory_component(
    cfg: &QosConfig,
    metrics: Option<&EngineMetrics>,
    scrape_error: Option<&str>,
    scrape_age: Option<u64>,
) -> Component {
    let sources = metrics.map(|m| m.sources).unwrap_or_default();
    let series: Vec<Cow<'static, str>> = [sources.kv_cache_usage, sources.waiting_for_capacity]
        .into_iter()
        .flatten()
        .map(Cow::Borrowed)
        .collect();
    let (score, input) = match metrics.and_then(|m| m.kv_cache_usage) {
        Some(kv) => (
            Some(score::memory_score(kv, cfg.kv_headroom_full)),
            format!(
                "KV-cache usage {:.1} %{}",
                kv * 100.0,
                match metrics.and_then(|m| m.waiting_for_capacity) {
                    Some(c) if c > 0.0 => format!(", {c} requests waiting for capacity"),
                    _ => String::new(),
                }
            ),
        ),
        None => (
            None,
            scrape_error.map_or_else(
                || "no KV-cache figure".to_owned(),
                |e| format!("scrape failed: {e}"),
            ),
        ),
    };
    Component {
        name: "memory".into(),
        weight: cfg.weights.memory,
        score,
        input,
        age_ms: scrape_age,
        series,
    }
}

/// Progress: whether the engine's token counters advance while requests run, from a recent
/// scrape (`metrics`).
fn progress_component(
    cfg: &QosConfig,
    metrics: Option<&EngineMetrics>,
    state: progress::State,
    stalled_for: Option<Duration>,
    scrape_age: Option<u64>,
) -> Component {
    let sources = metrics.map(|m| m.sources).unwrap_or_default();
    let series: Vec<Cow<'static, str>> = [
        sources.running,
        sources.prompt_tokens,
        sources.generation_tokens,
    ]
    .into_iter()
    .flatten()
    .map(Cow::Borrowed)
    .collect();
    let input = match (metrics.is_some(), state) {
        (false, _) => "no recent /metrics scrape".to_owned(),
        (true, progress::State::Unknown) => {
            "unknown (needs two scrapes with the running gauge and both token counters)".to_owned()
        }
        (true, progress::State::Idle) => "idle: no request running".to_owned(),
        (true, progress::State::Advancing) => {
            "requests running, token counters advancing".to_owned()
        }
        (true, progress::State::Stalled) => format!(
            "requests running, no token advanced for {:.1} s",
            stalled_for.unwrap_or_default().as_secs_f64()
        ),
    };
    Component {
        name: "progress".into(),
        weight: cfg.weights.progress,
        score: Progress::score(state),
        input,
        age_ms: scrape_age,
        series,
    }
}

/// Evaluations a lowering holds after the fault behind it cleared, so a code the driver
/// reports on and off does not flap the level (and every router and readiness behind it).
pub(crate) const LOWER_HOLD: u32 = 3;

/// QoS state of one engine.
#[derive(Debug)]
pub struct QosState {
    inner: Mutex<Inner>,
    level: AtomicU8,
    /// Age beyond which a scrape (and the progress it showed) is missing.
    scrape_max_age: Duration,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl QosState {
    /// Fresh state: level `normal`, no score.
    pub fn new(cfg: &QosConfig) -> QosState {
        QosState {
            inner: Mutex::new(Inner {
                metrics: None,
                scrape_error: None,
                scrapes: 0,
                scrape_failures: 0,
                progress: Progress::default(),
                levels: Levels::new(cfg.evict_after, cfg.hysteresis),
                score: None,
                components: Vec::new(),
                level_since_unix_ms: unix_ms(),
                evaluations: 0,
                admission_cap: None,
                lowered_by: None,
                lowered_left: 0,
            }),
            level: AtomicU8::new(Level::Normal as u8),
            scrape_max_age: cfg.scrape_max_age(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current level (lock-free, for `/status`).
    pub(crate) fn level(&self) -> Level {
        Level::from_repr(self.level.load(Ordering::Acquire)).unwrap_or(Level::Evict)
    }

    /// Records one scrape of `/metrics` (`Err`: why it failed).
    pub fn record_scrape(&self, result: Result<EngineMetrics, String>) {
        self.record_scrape_beside(result, None);
    }

    /// [`QosState::record_scrape`], with whether the engine's NPU was busy since the
    /// previous scrape (`None`: not known), for the signs of life.
    pub(crate) fn record_scrape_beside(
        &self,
        result: Result<EngineMetrics, String>,
        npu_busy: Option<bool>,
    ) {
        let now = Instant::now();
        let mut i = self.lock();
        i.scrapes += 1;
        match result {
            Ok(m) => {
                i.progress.observe_beside(Some(&m), now, npu_busy);
                i.metrics = Some((m, now));
                i.scrape_error = None;
            }
            Err(e) => {
                // No news: the last scrape and the progress it showed stand until too old.
                i.progress.observe(None, now);
                i.scrape_failures += 1;
                i.scrape_error = Some(e);
            }
        }
    }

    /// How long the engine has shown no sign of life while it should be working.
    pub(crate) fn quiet_for(&self) -> Option<Duration> {
        self.lock()
            .progress
            .quiet_for(Instant::now(), self.scrape_max_age)
    }

    /// The engine's running count at the last scrape; `None` when unknown.
    pub(crate) fn requests_running(&self) -> Option<f64> {
        self.lock()
            .progress
            .running(Instant::now(), self.scrape_max_age)
    }

    /// How long the engine has been stalled (requests running, no token advancing).
    pub(crate) fn stalled_for(&self) -> Option<Duration> {
        self.lock()
            .progress
            .stalled_for(Instant::now(), self.scrape_max_age)
    }

    /// Computes the score and the level from the last probe and the last scrape. With
    /// `lowered_by` (why: a `SubHealthFault` on the engine's NPU), the level published is
    /// one band lower than the score's, at most `throttle`: `normal` becomes `throttle`, a
    /// worse level stays as it is. The score's own level keeps its hysteresis; the lowering
    /// ends [`LOWER_HOLD`] evaluations after the fault cleared.
    pub fn evaluate(
        &self,
        cfg: &QosConfig,
        probe: Option<&Probed>,
        lowered_by: Option<String>,
    ) -> (Option<f64>, Level, Option<Transition>) {
        let now_ms = unix_ms();
        let now = Instant::now();
        let mut i = self.lock();
        let metrics = i
            .metrics
            .filter(|(_, at)| now.saturating_duration_since(*at) <= self.scrape_max_age);
        let scrape_age =
            metrics.map(|(_, at)| now.saturating_duration_since(at).as_millis() as u64);
        let state = i.progress.state_at(now, self.scrape_max_age);
        let stalled_for = i.progress.stalled_for(now, self.scrape_max_age);
        let m = metrics.map(|(m, _)| m);
        let components = vec![
            latency_component(cfg, probe, now),
            memory_component(cfg, m.as_ref(), i.scrape_error.as_deref(), scrape_age),
            progress_component(cfg, m.as_ref(), state, stalled_for, scrape_age),
        ];
        let parts: Vec<(Option<f64>, f64)> =
            components.iter().map(|c| (c.score, c.weight)).collect();
        let score = score::combine(&parts).map(|(s, _)| s);
        let before = self.level();
        // Eviction needs positive evidence that the engine is stuck.
        let evictable = state == progress::State::Stalled;
        let scored = i.levels.update(score, evictable);
        i.lower(lowered_by);
        let after = match &i.lowered_by {
            Some(_) => scored.max(Level::Throttle),
            None => scored,
        };
        i.score = score;
        i.components = components;
        i.evaluations += 1;
        i.admission_cap =
            next_admission_cap(i.admission_cap, before, after, m.and_then(|m| m.running));
        let transition = (before != after).then(|| {
            i.level_since_unix_ms = now_ms;
            Transition {
                from: before,
                to: after,
                score,
                why: match &i.lowered_by {
                    Some(l) if after > scored => format!(
                        "{}; one band lower, at most throttle: {l}",
                        explain(&i.components)
                    ),
                    _ => explain(&i.components),
                },
            }
        });
        self.level.store(after as u8, Ordering::Release);
        (score, after, transition)
    }

    /// How many requests a router may keep running on the engine while it is not `normal`:
    /// those running (by the engine's own gauge, at the last scrape) when it left `normal`,
    /// at least 1. `None` at `normal`, or when no scrape showed the gauge at that moment.
    pub(crate) fn admission_cap(&self) -> Option<u32> {
        self.lock().admission_cap
    }

    /// What outlives the agent process ([`Saved`]).
    pub(crate) fn saved(&self) -> Saved {
        let i = self.lock();
        Saved {
            level: i.levels.level,
            below_evict: i.levels.below_evict,
            level_since_unix_ms: i.level_since_unix_ms,
            score: i.score.filter(|s| s.is_finite()),
            evaluations: i.evaluations,
            progress: i.progress.saved(),
            admission_cap: i.admission_cap,
        }
    }

    /// Takes back a saved level, its hold and the progress tracking.
    pub(crate) fn restore(&self, s: &Saved) {
        let mut i = self.lock();
        i.levels.level = s.level;
        i.levels.below_evict = s.below_evict;
        i.level_since_unix_ms = s.level_since_unix_ms;
        i.score = s.score.filter(|v| v.is_finite());
        i.evaluations = s.evaluations;
        i.progress = Progress::restored(&s.progress);
        i.admission_cap = s.admission_cap.filter(|_| s.level != Level::Normal);
        self.level.store(s.level as u8, Ordering::Release);
    }

    /// Back to the fresh state (`normal`, no score, no history), scrape counters kept.
    pub(crate) fn reset(&self, cfg: &QosConfig) {
        let mut i = self.lock();
        i.levels = Levels::new(cfg.evict_after, cfg.hysteresis);
        i.score = None;
        i.components.clear();
        i.progress = Progress::default();
        i.metrics = None;
        i.admission_cap = None;
        i.lowered_by = None;
        i.lowered_left = 0;
        i.level_since_unix_ms = unix_ms();
        self.level.store(Level::Normal as u8, Ordering::Release);
    }

    /// The score and level part of what `GET /qos` and `/status/detail` show.
    pub(crate) fn report(&self, cfg: &QosConfig) -> QosReport {
        let i = self.lock();
        QosReport {
            enabled: cfg.enabled,
            score: i.score.map(round3),
            level: self.level(),
            level_since_unix_ms: i.level_since_unix_ms,
            consecutive_below_evict: i.levels.below_evict,
            evaluations: i.evaluations,
            components: i.components.clone(),
            progress: i.progress.state_at(Instant::now(), self.scrape_max_age),
            stalled_for_s: i
                .progress
                .stalled_for(Instant::now(), self.scrape_max_age)
                .map(|d| d.as_secs_f64()),
            quiet_for_s: i
                .progress
                .quiet_for(Instant::now(), self.scrape_max_age)
                .map(|d| d.as_secs_f64()),
            scrapes: i.scrapes,
            scrape_failures: i.scrape_failures,
            eviction_answers_abnormal: cfg.eviction,
            admission_cap: i.admission_cap,
            lowered_by: i.lowered_by.clone(),
        }
    }

    /// The last score.
    pub(crate) fn score(&self) -> Option<f64> {
        self.lock().score
    }

    /// Progress as the latest fresh scrape shows it.
    pub(crate) fn progress(&self) -> progress::State {
        self.lock()
            .progress
            .state_at(Instant::now(), self.scrape_max_age)
    }

    /// Consecutive evaluations below the eviction boundary.
    pub(crate) fn below_evict(&self) -> u32 {
        self.lock().levels.below_evict
    }

    /// The components of the last evaluation.
    pub(crate) fn components(&self) -> Vec<Component> {
        self.lock().components.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::outcome::{Accounting, ProbeRecord};

    // The admission cap is taken when the level leaves normal (at least 1, from a sane
    // gauge), kept while it stays away, dropped back at normal.
    #[test]
    fn admission_cap_table() {
        use Level::{Degrade, Normal, Throttle};
        for (cap, before, after, running, want) in [
            (None, Normal, Throttle, Some(7.4), Some(7)),
            (None, Normal, Degrade, Some(0.0), Some(1)),
            (None, Normal, Throttle, Some(f64::NAN), None),
            (None, Normal, Throttle, Some(-1.0), None),
            (None, Normal, Throttle, None, None),
            (Some(7), Throttle, Degrade, Some(30.0), Some(7)),
            (Some(7), Throttle, Normal, Some(30.0), None),
            (None, Normal, Normal, Some(30.0), None),
        ] {
            assert_eq!(
                next_admission_cap(cap, before, after, running),
                want,
                "{cap:?} {before:?} -> {after:?} at {running:?}"
            );
        }
    }

    fn probe(ok: bool, ttft_ms: f64) -> Probed {
        Probed {
            at: Instant::now(),
            record: ProbeRecord {
                at_unix_ms: unix_ms(),
                warmup: false,
                latency_ms: ttft_ms,
                outcome: if ok {
                    "success".into()
                } else {
                    "failed: timed out".into()
                },
                success: ok,
                ttft_ms: ok.then_some(ttft_ms),
                tpot_ms: None,
                peak: Some(0.0),
                accounting: Accounting::Reset,
                failure_count: 0,
            },
        }
    }

    fn scrape(running: f64, gen_tokens: f64, kv: f64) -> EngineMetrics {
        EngineMetrics {
            running: Some(running),
            prompt_tokens: Some(1.0),
            generation_tokens: Some(gen_tokens),
            kv_cache_usage: Some(kv),
            ..EngineMetrics::default()
        }
    }

    // KV cache at 95 % (HBM near full is not an input) on an otherwise healthy engine: not
    // below throttle.
    #[tokio::test(start_paused = true)]
    async fn full_kv_cache_on_a_healthy_engine_is_not_below_throttle() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(8.0, 100.0, 0.95)));
        q.record_scrape(Ok(scrape(8.0, 200.0, 0.95)));
        let (s, level, _) = q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
        let s = s.unwrap();
        assert!(
            (s - (0.5 * 0.975 + 0.3 * 0.5 + 0.2 * 1.0)).abs() < 1e-9,
            "{s}"
        );
        assert!(level <= Level::Throttle, "{level:?}");
        assert_eq!(level, Level::Normal);
    }

    // A level change says which component moved the score and on what input: here a probe
    // that timed out on an engine whose memory and progress are fine (the log line an
    // operator reads to tell a slow engine from a full one).
    #[tokio::test(start_paused = true)]
    async fn a_transition_says_which_input_moved_the_score() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(2.0, 100.0, 0.2)));
        q.record_scrape(Ok(scrape(2.0, 200.0, 0.2)));
        let (_, level, t) = q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
        assert_eq!((level, t), (Level::Normal, None));
        let (s, level, t) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
        assert_eq!((s, level), (Some(0.5), Level::Throttle));
        let t = t.expect("normal -> throttle");
        assert_eq!((t.from, t.to), (Level::Normal, Level::Throttle));
        assert_eq!(
            t.why,
            "latency 0.00 (probe failed: timed out); memory 1.00 (KV-cache usage 20.0 %); \
             progress 1.00 (requests running, token counters advancing)"
        );
    }

    // A SubHealthFault lowers the level one band, at most to throttle, and says why; it
    // ends with the fault, and a worse level is left as the score makes it.
    #[tokio::test(start_paused = true)]
    async fn a_sub_health_fault_lowers_the_level_one_band_at_most_to_throttle() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(2.0, 100.0, 0.2)));
        q.record_scrape(Ok(scrape(2.0, 200.0, 0.2)));
        let why = || Some("NPU 0 reports 0x81078605, level SubHealthFault".to_owned());
        let (s, level, t) = q.evaluate(&cfg, Some(&probe(true, 50.0)), why());
        assert!(s.unwrap() >= 0.7, "a healthy score: {s:?}");
        assert_eq!(level, Level::Throttle);
        let t = t.expect("normal -> throttle");
        assert!(
            t.why.ends_with(
                "one band lower, at most throttle: NPU 0 reports 0x81078605, level SubHealthFault"
            ),
            "{}",
            t.why
        );
        let r = q.report(&cfg);
        assert_eq!(r.level, Level::Throttle);
        assert_eq!(r.lowered_by, why());
        // A score at degrade is not lowered further.
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), why());
        assert_eq!(
            level,
            Level::Throttle,
            "the failed probe scores 0.5: throttle"
        );
        q.record_scrape(Ok(scrape(2.0, 200.0, 0.99)));
        q.record_scrape(Ok(scrape(2.0, 200.0, 0.99)));
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), why());
        assert_eq!(level, Level::Degrade, "never past the score's own level");
        // The fault gone, with a healthy score: the lowering holds LOWER_HOLD evaluations
        // (a code reported on and off does not flap the level), then normal.
        q.record_scrape(Ok(scrape(2.0, 300.0, 0.2)));
        q.record_scrape(Ok(scrape(2.0, 400.0, 0.2)));
        for k in 1..LOWER_HOLD {
            let (_, level, _) = q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
            assert_eq!(
                level,
                Level::Throttle,
                "held, evaluation {k} after the fault"
            );
        }
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
        assert_eq!(level, Level::Normal);
        assert_eq!(q.report(&cfg).lowered_by, None);
    }

    // The admission cap is the running gauge when the level left normal (at least 1); it
    // holds through worse levels and back up to throttle, and is gone at normal.
    #[tokio::test(start_paused = true)]
    async fn the_admission_cap_is_what_ran_when_normal_was_left() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(5.0, 100.0, 0.2)));
        q.record_scrape(Ok(scrape(5.0, 200.0, 0.2)));
        q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
        assert_eq!((q.level(), q.admission_cap()), (Level::Normal, None));
        q.record_scrape(Ok(scrape(5.0, 300.0, 0.2)));
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
        assert_eq!((level, q.admission_cap()), (Level::Throttle, Some(5)));
        // Fewer running later (the queue holds new ones back): the cap stays.
        q.record_scrape(Ok(scrape(2.0, 400.0, 0.97)));
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
        assert_eq!((level, q.admission_cap()), (Level::Degrade, Some(5)));
        q.record_scrape(Ok(scrape(0.0, 400.0, 0.2)));
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
        assert_eq!((level, q.admission_cap()), (Level::Normal, None));
        // Nothing running when it left normal: at least 1.
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
        assert_ne!(level, Level::Normal);
        assert_eq!(q.admission_cap(), Some(1));
    }

    // The components name the series actually read: vLLM 0.8's old KV-cache name, SGLang's
    // names; nothing for the probe.
    #[tokio::test(start_paused = true)]
    async fn components_name_the_series_read() {
        let cfg = QosConfig::default();
        let names = |text: &str| {
            let q = QosState::new(&cfg);
            q.record_scrape(Ok(crate::probe::engine_metrics::parse(text)));
            q.evaluate(&cfg, Some(&probe(true, 50.0)), None);
            q.components()
                .into_iter()
                .map(|c| {
                    let series: Vec<String> = c.series.iter().map(|s| s.to_string()).collect();
                    (c.name.to_string(), series)
                })
                .collect::<Vec<_>>()
        };
        let own = |v: Vec<(&str, Vec<&str>)>| -> Vec<(String, Vec<String>)> {
            v.into_iter()
                .map(|(n, s)| (n.to_owned(), s.into_iter().map(str::to_owned).collect()))
                .collect()
        };
        assert_eq!(
            names(
                "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 1\nvllm:prompt_tokens_total 3\nvllm:generation_tokens_total 4\n"
            ),
            own(vec![
                ("latency", vec![]),
                ("memory", vec!["vllm:gpu_cache_usage_perc"]),
                (
                    "progress",
                    vec![
                        "vllm:num_requests_running",
                        "vllm:prompt_tokens_total",
                        "vllm:generation_tokens_total"
                    ]
                ),
            ])
        );
        assert_eq!(
            names(
                "sglang:token_usage 0.1\nsglang:num_running_reqs 0\nsglang:prompt_tokens_total 1\nsglang:generation_tokens_total 1\n"
            )[1..]
                .to_vec(),
            own(vec![
                ("memory", vec!["sglang:token_usage"]),
                (
                    "progress",
                    vec![
                        "sglang:num_running_reqs",
                        "sglang:prompt_tokens_total",
                        "sglang:generation_tokens_total"
                    ]
                ),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stuck_engine_is_evicted_after_three_evaluations() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(4.0, 100.0, 0.5)));
        let mut levels = Vec::new();
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(5)).await;
            q.record_scrape(Ok(scrape(4.0, 100.0, 0.5)));
            let (s, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
            // latency 0, memory 1, progress 0: 0.3.
            assert!((s.unwrap() - 0.3).abs() < 1e-9);
            levels.push(level);
        }
        assert_eq!(levels, [Level::Degrade; 3], "0.3 is degrade, not evict");
        let cfg_kv = QosConfig::default();
        let q = QosState::new(&cfg_kv);
        q.record_scrape(Ok(scrape(4.0, 100.0, 0.99)));
        let mut last = None;
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(5)).await;
            q.record_scrape(Ok(scrape(4.0, 100.0, 0.99)));
            last = Some(q.evaluate(&cfg_kv, Some(&probe(false, 5000.0)), None));
        }
        let (s, level, t) = last.unwrap();
        assert!(s.unwrap() < 0.3);
        assert_eq!(level, Level::Evict);
        assert_eq!(t.unwrap().from, Level::Degrade);
        assert_eq!(q.level(), Level::Evict);
    }

    // An agent restart in the middle of the hold: two lows kept, the third evicts; the stall
    // goes on being measured from when it began (wall-clock time, real clock).
    #[tokio::test]
    async fn a_restored_state_keeps_the_hold_toward_evict_and_the_stall() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.restore(&Saved {
            level: Level::Degrade,
            below_evict: 2,
            level_since_unix_ms: 1,
            score: Some(0.2),
            evaluations: 9,
            progress: progress::Saved {
                last: Some((1.0, 100.0, true)),
                state: progress::State::Stalled,
                stalled_since_unix_ms: Some(crate::clock::unix_ms() - 20_000),
                last_ok_unix_ms: Some(crate::clock::unix_ms()),
                signs: None,
                quiet_since_unix_ms: None,
                working: true,
            },
            admission_cap: Some(3),
        });
        assert_eq!(q.level(), Level::Degrade);
        assert_eq!(q.admission_cap(), Some(3), "the router's cap survives too");
        assert_eq!(q.below_evict(), 2);
        let stalled = q.stalled_for().unwrap();
        assert!(stalled >= Duration::from_secs(19), "{stalled:?}");
        q.record_scrape(Ok(scrape(4.0, 100.0, 0.99)));
        let (_, level, _) = q.evaluate(&cfg, Some(&probe(false, 5000.0)), None);
        assert_eq!(level, Level::Evict, "the third low, after the restart");
        let again = QosState::new(&cfg);
        again.restore(&q.saved());
        assert_eq!(again.level(), Level::Evict);
        again.reset(&cfg);
        assert_eq!((again.level(), again.below_evict()), (Level::Normal, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn stale_inputs_are_missing() {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        q.record_scrape(Ok(scrape(0.0, 1.0, 0.2)));
        tokio::time::advance(Duration::from_secs(16)).await;
        let (s, _, _) = q.evaluate(&cfg, None, None);
        assert_eq!(s, None, "scrape older than 3 periods, no probe: no score");
        let r = q.report(&cfg);
        assert_eq!(r.score, None);
        assert_eq!(r.components[0].input, "no recent virtual probe");
        q.record_scrape(Err("connection refused".into()));
        let r = q.report(&cfg);
        assert_eq!(r.scrape_failures, 1);
    }
}
