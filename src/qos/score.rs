//! The QoS score and the degradation levels (pure functions, no I/O).
//!
//! `score = Σ wᵢ·sᵢ / Σ wᵢ` over the components that have an input (missing inputs re-weight
//! the rest):
//! - latency `s = max(0, 1 − ttft / budget)` (budget 2 s; a failed probe scores 0);
//! - memory `s = min(1, (1 − kv_cache_usage) / kv_headroom_full)` (full score down to 10 %
//!   KV-cache headroom); the raw HBM ratio is not used, because vLLM preallocates the KV cache
//!   and HBM sits near 90 % on a healthy node;
//! - progress `s = 1` if prompt or generation tokens advanced since the previous scrape while
//!   requests were running, `0` if they did not; no input while nothing runs.
//!
//! Levels: `normal` ≥ 0.7, `throttle` [0.5, 0.7), `degrade` [0.3, 0.5), `evict` < 0.3 held for 3
//! consecutive evaluations. A level is entered as soon as the score falls below its upper
//! boundary (evict: after the 3rd consecutive score below 0.3; before that the level is at
//! most `degrade`); a better level is entered only when the score reaches its lower boundary
//! plus the hysteresis (0.05). The band `[boundary, boundary + 0.05)` is a dead band both
//! ways: a score falling into it from above keeps the better level, a score rising into it
//! from below keeps the worse one, so a score hovering at a boundary changes level at most
//! once. Eviction also needs positive evidence that the engine is stuck (progress stalled):
//! otherwise the level stops at `degrade`.
//! See `docs/qos.md`.

use serde::Serialize;

pub(crate) use npu_health_wire::Level;

/// Lowest score of `l` (its boundary with the next worse level).
fn floor(l: Level) -> f64 {
    match l {
        Level::Normal => 0.7,
        Level::Throttle => 0.5,
        Level::Degrade => 0.3,
        Level::Evict => 0.0,
    }
}

/// The nominal level of a score, before hysteresis and the eviction hold.
pub(crate) fn nominal(score: f64) -> Level {
    Level::ALL
        .into_iter()
        .find(|l| score >= floor(*l))
        .unwrap_or(Level::Evict)
}

/// Latency component: `max(0, 1 − ttft / budget)`; `None` (failed probe) scores 0.
pub(crate) fn latency_score(ttft_s: Option<f64>, budget_s: f64) -> f64 {
    match ttft_s {
        Some(t) if budget_s > 0.0 => (1.0 - t / budget_s).clamp(0.0, 1.0),
        _ => 0.0,
    }
}

/// Memory component from KV-cache usage (0..1).
pub(crate) fn memory_score(kv_cache_usage: f64, headroom_full: f64) -> f64 {
    let headroom = (1.0 - kv_cache_usage).clamp(0.0, 1.0);
    if headroom_full <= 0.0 {
        return if headroom > 0.0 { 1.0 } else { 0.0 };
    }
    // Tolerate rounding: 1 − 0.9 is a hair below 0.1.
    if headroom + 1e-9 >= headroom_full {
        return 1.0;
    }
    headroom / headroom_full
}

/// Weighted mean over the components present: `(score, weight used)`; `None` if none is.
pub(crate) fn combine(parts: &[(Option<f64>, f64)]) -> Option<(f64, f64)> {
    let (num, den) = parts
        .iter()
        .filter_map(|(s, w)| s.map(|s| (s * w, *w)))
        .fold((0.0, 0.0), |(n, d), (sw, w)| (n + sw, d + w));
    (den > 0.0).then(|| ((num / den).clamp(0.0, 1.0), den))
}

/// The level state machine: hysteresis on the way back, a hold before eviction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Levels {
    pub level: Level,
    /// Consecutive evaluations with a score below the eviction boundary.
    pub below_evict: u32,
    /// Evaluations needed below the boundary before `evict` (default 3).
    pub evict_after: u32,
    /// Margin above a boundary needed to move to a better level (default 0.05).
    pub hysteresis: f64,
}

impl Levels {
    /// Starts at `normal`.
    pub(crate) fn new(evict_after: u32, hysteresis: f64) -> Levels {
        Levels {
            level: Level::Normal,
            below_evict: 0,
            evict_after: evict_after.max(1),
            hysteresis,
        }
    }

    /// Applies one score; returns the new level. A missing score changes nothing.
    /// `evictable` is the positive evidence eviction needs: the engine is stalled (requests
    /// running, no token advancing). Without it the level stops at `degrade`, the hold does not
    /// advance, and an engine already at `evict` drops to `degrade`: an engine producing
    /// tokens, idle, or whose progress is unknown is never evicted.
    pub(crate) fn update(&mut self, score: Option<f64>, evictable: bool) -> Level {
        let Some(s) = score else { return self.level };
        let target = nominal(s);
        self.below_evict = if target == Level::Evict && evictable {
            self.below_evict + 1
        } else {
            0
        };
        if !evictable && self.level == Level::Evict {
            self.level = Level::Degrade;
        }
        // Worse: enter at once, but evict only after the hold.
        let worse = if target == Level::Evict && self.below_evict < self.evict_after {
            Level::Degrade
        } else {
            target
        };
        if worse > self.level {
            self.level = worse;
            return self.level;
        }
        // Better: climb only as far as the score clears each boundary by the hysteresis.
        while self.level > Level::Normal {
            let Some(better) = Level::from_repr(self.level as u8 - 1) else {
                break;
            };
            if s >= floor(better) + self.hysteresis {
                self.level = better;
            } else {
                break;
            }
        }
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::qos::Weights;

    #[test]
    fn nominal_boundaries() {
        for (s, l) in [
            (1.0, Level::Normal),
            (0.7, Level::Normal),
            (0.6999, Level::Throttle),
            (0.5, Level::Throttle),
            (0.4999, Level::Degrade),
            (0.3, Level::Degrade),
            (0.2999, Level::Evict),
            (0.0, Level::Evict),
        ] {
            assert_eq!(nominal(s), l, "{s}");
        }
    }

    // The seed's latency score and our memory score.
    #[test]
    fn component_scores() {
        assert_eq!(latency_score(Some(0.0), 2.0), 1.0);
        assert_eq!(latency_score(Some(1.0), 2.0), 0.5);
        assert_eq!(latency_score(Some(3.0), 2.0), 0.0);
        assert_eq!(latency_score(None, 2.0), 0.0, "a failed probe");
        assert_eq!(memory_score(0.5, 0.1), 1.0);
        assert_eq!(memory_score(0.9, 0.1), 1.0);
        assert!((memory_score(0.95, 0.1) - 0.5).abs() < 1e-9);
        assert_eq!(memory_score(1.0, 0.1), 0.0);
        assert_eq!(memory_score(1.3, 0.1), 0.0, "clamped");
    }

    #[test]
    fn missing_inputs_reweight_the_rest() {
        let w = Weights::default();
        // All present.
        let (s, used) = combine(&[
            (Some(1.0), w.latency),
            (Some(0.5), w.memory),
            (Some(0.0), w.progress),
        ])
        .unwrap();
        assert!((s - 0.65).abs() < 1e-9);
        assert!((used - 1.0).abs() < 1e-9);
        // Idle engine: no progress input; latency and memory carry 0.5 / 0.3 of 0.8.
        let (s, used) = combine(&[
            (Some(1.0), w.latency),
            (Some(0.5), w.memory),
            (None, w.progress),
        ])
        .unwrap();
        assert!((s - (0.5 + 0.15) / 0.8).abs() < 1e-9);
        assert!((used - 0.8).abs() < 1e-9);
        assert_eq!(combine(&[(None, 0.5), (None, 0.3)]), None);
    }

    #[test]
    fn down_at_the_boundary_up_with_hysteresis() {
        let mut l = Levels::new(3, 0.05);
        assert_eq!(l.update(Some(0.69), true), Level::Throttle);
        // Hovering around 0.7 does not flap.
        for s in [0.71, 0.69, 0.72, 0.7, 0.74] {
            assert_eq!(l.update(Some(s), true), Level::Throttle, "{s}");
        }
        assert_eq!(l.update(Some(0.75), true), Level::Normal);
        assert_eq!(l.update(Some(0.45), true), Level::Degrade);
        // From degrade, 0.6 clears 0.5 + 0.05 but not 0.7 + 0.05: throttle.
        assert_eq!(l.update(Some(0.6), true), Level::Throttle);
        assert_eq!(
            l.update(Some(0.9), true),
            Level::Normal,
            "a big recovery climbs several levels"
        );
        assert_eq!(l.update(None, true), Level::Normal, "no score, no change");
    }

    #[test]
    fn evict_only_after_three_consecutive_scores_below_03() {
        let mut l = Levels::new(3, 0.05);
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        // An interruption resets the hold.
        assert_eq!(l.update(Some(0.31), true), Level::Degrade);
        assert_eq!(l.update(Some(0.2), true), Level::Degrade);
        assert_eq!(l.update(Some(0.2), true), Level::Degrade);
        assert_eq!(l.update(Some(0.2), true), Level::Evict);
        assert_eq!(l.below_evict, 3);
        // Leaving evict needs 0.35.
        assert_eq!(l.update(Some(0.32), true), Level::Evict);
        assert_eq!(l.update(Some(0.36), true), Level::Degrade);
        assert_eq!(l.update(Some(0.56), true), Level::Throttle);
    }

    #[test]
    fn every_boundary_entered_from_normal() {
        for (s, want) in [
            (0.7, Level::Normal),
            (0.5, Level::Throttle),
            (0.3, Level::Degrade),
            (0.29, Level::Degrade),
        ] {
            let mut l = Levels::new(3, 0.05);
            assert_eq!(l.update(Some(s), true), want, "{s}");
        }
    }

    // Without evidence of a stall (tokens advancing, idle, or progress unknown) the engine is
    // never evicted, the hold starts over, and an evicted engine that resumes drops to
    // degrade at once.
    #[test]
    fn eviction_needs_a_stall() {
        let mut l = Levels::new(3, 0.05);
        for _ in 0..10 {
            assert_eq!(l.update(Some(0.1), false), Level::Degrade);
        }
        assert_eq!(l.below_evict, 0);
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        assert_eq!(
            l.update(Some(0.1), false),
            Level::Degrade,
            "progress resets the hold"
        );
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        assert_eq!(l.update(Some(0.1), true), Level::Degrade);
        assert_eq!(l.update(Some(0.1), true), Level::Evict);
        assert_eq!(
            l.update(Some(0.2), false),
            Level::Degrade,
            "tokens advance again"
        );
        assert_eq!(
            l.update(Some(0.2), true),
            Level::Degrade,
            "the hold starts over"
        );
    }

    // The table of docs/qos.md, row by row: (ttft s or None for a failed probe, KV usage or
    // None, progress or None, expected score, level after 3 evaluations, evictable).
    #[test]
    fn worked_examples_in_docs() {
        let w = Weights::default();
        #[allow(clippy::type_complexity)]
        let rows: [(Option<Option<f64>>, Option<f64>, Option<f64>, f64, Level); 10] = [
            (Some(Some(0.2)), Some(0.4), Some(1.0), 0.95, Level::Normal),
            (
                Some(Some(0.05)),
                Some(0.0),
                Some(1.0),
                0.9875,
                Level::Normal,
            ),
            (
                Some(Some(1.5)),
                Some(0.6),
                Some(1.0),
                0.625,
                Level::Throttle,
            ),
            (Some(None), Some(0.8), Some(1.0), 0.5, Level::Throttle),
            (
                Some(Some(0.05)),
                Some(0.95),
                Some(1.0),
                0.8375,
                Level::Normal,
            ),
            (Some(None), Some(0.95), Some(1.0), 0.35, Level::Degrade),
            (Some(None), Some(1.0), Some(1.0), 0.2, Level::Degrade),
            (Some(None), Some(0.5), Some(0.0), 0.3, Level::Degrade),
            (Some(None), Some(0.99), Some(0.0), 0.03, Level::Evict),
            (Some(Some(0.1)), None, None, 0.95, Level::Normal),
        ];
        for (i, (ttft, kv, progress, want, level)) in rows.into_iter().enumerate() {
            let parts = [
                (ttft.map(|t| latency_score(t, 2.0)), w.latency),
                (kv.map(|k| memory_score(k, 0.1)), w.memory),
                (progress, w.progress),
            ];
            let (s, _) = combine(&parts).unwrap();
            assert!((s - want).abs() < 1e-9, "row {}: {s} != {want}", i + 1);
            let mut l = Levels::new(3, 0.05);
            let evictable = progress == Some(0.0);
            for _ in 0..3 {
                l.update(Some(s), evictable);
            }
            assert_eq!(l.level, level, "row {}", i + 1);
        }
    }
}
