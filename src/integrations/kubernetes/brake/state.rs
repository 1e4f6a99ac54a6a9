//! The fleet brake's shared state as plain data, and every decision on it as a plain
//! function (tested as tables): which engines tripped within the window, whether the brake
//! is engaged, and whether one engine's new verdict acts or is held.
//!
//! The state is one ConfigMap's `data` (docs/kubernetes.md, "The fleet brake"): `trips`, a
//! JSON object of engine (`node/engine`) → `[unix seconds, acted 0|1]`, one entry per
//! engine (NVSentinel dedups nodes the same way: `fault-quarantine/pkg/breaker/breaker.go`
//! in NVIDIA/NVSentinel), pruned to the window at every write; `engines`, the fleet's engine
//! count, and `counted`, when it was counted; `engaged_since`, when the brake engaged.
//! At 10,000 engines a full window is about 0.4 MB, under the 1 MiB a ConfigMap may hold.

use std::collections::BTreeMap;

/// One engine's trip: when (Unix seconds), and whether its verdict acted (else it was held).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trip {
    pub at: u64,
    pub acted: bool,
}

/// The shared state, as the ConfigMap holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fleet {
    pub trips: BTreeMap<String, Trip>,
    /// The fleet's engines as last counted; 0: not counted yet.
    pub engines: u64,
    /// When they were counted (Unix seconds).
    pub counted: u64,
    /// When the brake engaged (Unix seconds), while it is.
    pub engaged_since: Option<u64>,
}

/// What a new agent-rule verdict does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It acts: `/status` answers it.
    Act,
    /// It is held: `/status` answers as the reference.
    Hold,
}

/// The most trips in `window` before the brake engages: more than `max_fraction` of
/// `engines` engages it (NVSentinel trips at `>= ceil(total × pct)`: one engine sooner).
pub(crate) fn allowed(engines: u64, max_fraction: f64) -> u64 {
    (engines as f64 * max_fraction).floor() as u64
}

impl Fleet {
    /// Drops the trips older than `window` seconds before `now`.
    pub(crate) fn prune(&mut self, now: u64, window: u64) {
        self.trips.retain(|_, t| t.at + window > now);
    }

    /// Trips within `window` seconds before `now`.
    pub(crate) fn recent(&self, now: u64, window: u64) -> u64 {
        self.trips.values().filter(|t| t.at + window > now).count() as u64
    }

    /// Whether the brake is engaged at `now`: more than the allowed trips in the window. A
    /// fleet never counted (0 engines) never engages: nothing to take a fraction of.
    pub(crate) fn engaged(&self, now: u64, window: u64, max_fraction: f64) -> bool {
        self.engines > 0 && self.recent(now, window) > allowed(self.engines, max_fraction)
    }

    /// Records `engine`'s new agent-rule verdict at `now` and decides it: it acts while the
    /// trips, its own counted, stay within the allowed; else it is held, and its trip counts
    /// still (so the brake stays engaged while the wave lasts). An engine whose earlier
    /// verdict in the window acted acts again (a restarted agent finds its engine abnormal
    /// still: it keeps its verdict).
    pub(crate) fn decide(
        &mut self,
        engine: &str,
        now: u64,
        window: u64,
        max_fraction: f64,
    ) -> Decision {
        self.prune(now, window);
        let acted_before = self.trips.get(engine).is_some_and(|t| t.acted);
        let others = self.trips.keys().filter(|k| *k != engine).count() as u64;
        let act = acted_before || self.engines == 0 || others < allowed(self.engines, max_fraction);
        self.trips.insert(
            engine.to_owned(),
            Trip {
                at: now,
                acted: act,
            },
        );
        self.engaged_since = if self.engaged(now, window, max_fraction) {
            Some(self.engaged_since.unwrap_or(now))
        } else {
            None
        };
        if act { Decision::Act } else { Decision::Hold }
    }

    /// The state as the ConfigMap's `data`.
    pub(crate) fn to_data(&self) -> BTreeMap<String, String> {
        let trips: serde_json::Map<String, serde_json::Value> = self
            .trips
            .iter()
            .map(|(k, t)| (k.clone(), serde_json::json!([t.at, u8::from(t.acted)])))
            .collect();
        let mut d = BTreeMap::from([
            (
                "trips".to_owned(),
                serde_json::Value::Object(trips).to_string(),
            ),
            ("engines".to_owned(), self.engines.to_string()),
            ("counted".to_owned(), self.counted.to_string()),
        ]);
        if let Some(at) = self.engaged_since {
            d.insert("engaged_since".to_owned(), at.to_string());
        }
        d
    }

    /// The state from a ConfigMap's `data`; a key that does not read is named in the error
    /// (the caller warns and starts from what it could read: a state it cannot read must not
    /// stop the brake).
    pub(crate) fn of_data(d: &BTreeMap<String, String>) -> (Fleet, Option<String>) {
        let mut bad = None;
        let mut num = |key: &str| match d.get(key).map(|v| v.parse::<u64>()) {
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => {
                bad.get_or_insert_with(|| format!("data.{key} is not a number"));
                None
            }
            None => None,
        };
        let engines = num("engines").unwrap_or(0);
        let counted = num("counted").unwrap_or(0);
        let engaged_since = num("engaged_since");
        let trips = match d.get("trips").map(|t| trips_of(t)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                bad.get_or_insert(format!("data.trips: {e}"));
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
        let f = Fleet {
            trips,
            engines,
            counted,
            engaged_since,
        };
        (f, bad)
    }
}

fn trips_of(text: &str) -> Result<BTreeMap<String, Trip>, String> {
    let raw: BTreeMap<String, (u64, u8)> =
        serde_json::from_str(text).map_err(|e| crate::logging::clip(&e.to_string()))?;
    Ok(raw
        .into_iter()
        .map(|(k, (at, acted))| {
            (
                k,
                Trip {
                    at,
                    acted: acted != 0,
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 300;

    fn fleet(engines: u64) -> Fleet {
        Fleet {
            engines,
            ..Fleet::default()
        }
    }

    // Half of ten engines may act within the window; the sixth is held, and so is every
    // later one while the trips last.
    #[test]
    fn more_than_the_fraction_within_the_window_is_held_and_the_held_count_too() {
        let mut f = fleet(10);
        let d: Vec<Decision> = (0..8)
            .map(|i| f.decide(&format!("n{i}/e"), 1000 + i, W, 0.5))
            .collect();
        use Decision::{Act, Hold};
        assert_eq!(d, [Act, Act, Act, Act, Act, Hold, Hold, Hold]);
        assert_eq!(f.recent(1010, W), 8, "held engines count as trips");
        assert!(f.engaged(1010, W, 0.5));
        assert_eq!(f.engaged_since, Some(1005));
    }

    // The window clears: trips older than the window no longer count, and the brake
    // releases.
    #[test]
    fn the_brake_releases_once_the_window_holds_no_more_than_the_fraction() {
        let mut f = fleet(4);
        for i in 0..4 {
            f.decide(&format!("n{i}/e"), 1000, W, 0.5);
        }
        assert!(f.engaged(1000, W, 0.5));
        assert!(f.engaged(1000 + W - 1, W, 0.5));
        assert!(!f.engaged(1000 + W, W, 0.5));
        assert_eq!(
            f.decide("n9/e", 1000 + W, W, 0.5),
            Decision::Act,
            "a new verdict after the window acts"
        );
        assert_eq!(f.trips.len(), 1, "pruned to the window");
        assert_eq!(f.engaged_since, None);
    }

    // One engine counts once (its trip moves to now), and an engine whose verdict acted
    // acts again after an agent restart, even with the brake engaged since.
    #[test]
    fn an_engine_counts_once_and_one_that_acted_keeps_acting() {
        let mut f = fleet(2);
        assert_eq!(f.decide("a/e", 1000, W, 0.5), Decision::Act);
        assert_eq!(f.decide("a/e", 1001, W, 0.5), Decision::Act);
        assert_eq!(f.recent(1001, W), 1);
        assert_eq!(f.decide("b/e", 1002, W, 0.5), Decision::Hold);
        assert_eq!(f.decide("a/e", 1003, W, 0.5), Decision::Act);
        assert_eq!(f.decide("b/e", 1004, W, 0.5), Decision::Hold);
    }

    // A fleet not yet counted cannot be braked (nothing to take a fraction of).
    #[test]
    fn a_fleet_of_unknown_size_never_engages() {
        let mut f = fleet(0);
        for i in 0..5 {
            assert_eq!(f.decide(&format!("n{i}/e"), 1000, W, 0.5), Decision::Act);
        }
        assert!(!f.engaged(1000, W, 0.5));
        assert_eq!(allowed(10, 0.5), 5);
        assert_eq!(allowed(3, 0.5), 1);
        assert_eq!(allowed(10, 1.0), 10, "1 never engages");
    }

    // The state reads back from the ConfigMap's data; a key that does not read is named and
    // the rest is kept.
    #[test]
    fn the_state_reads_back_and_a_bad_key_is_named_not_fatal() {
        let mut f = fleet(3);
        f.counted = 900;
        f.decide("n1/e", 1000, W, 0.5);
        f.decide("n2/e", 1001, W, 0.5);
        let (back, bad) = Fleet::of_data(&f.to_data());
        assert_eq!((back, bad), (f.clone(), None));
        let mut d = f.to_data();
        d.insert("trips".to_owned(), "{\"x\": 5}".to_owned());
        let (back, bad) = Fleet::of_data(&d);
        assert!(back.trips.is_empty() && back.engines == 3);
        assert!(bad.unwrap().starts_with("data.trips"));
        d.insert("engines".to_owned(), "many".to_owned());
        let (back, bad) = Fleet::of_data(&d);
        assert_eq!(back.engines, 0);
        assert!(bad.is_some());
    }

    // The size at 10,000 engines in one window stays under a ConfigMap's 1 MiB.
    #[test]
    fn a_wave_of_ten_thousand_engines_fits_in_one_config_map() {
        let mut f = fleet(10_000);
        for i in 0..10_000u64 {
            f.decide(
                &format!("node-{i:05}.cluster.local/engine-0"),
                1_765_000_000 + i / 100,
                W,
                0.5,
            );
        }
        let bytes: usize = f.to_data().iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes < 1 << 20, "{bytes} bytes");
    }
}
