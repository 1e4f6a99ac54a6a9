//! The fleet brake's shared state as plain data, and every decision on it as a plain
//! function (tested as tables): which engines tripped within the window, whether the brake
//! is engaged, and whether one engine's new verdict acts or is held.
//!
//! The state is one ConfigMap's `data` (docs/kubernetes.md, "The fleet brake"), one key per
//! engine so that no two agents ever write the same key:
//! - `trip.<node>_<engine>` (or `trip.-<16 hex>` when the name is not a valid key): the
//!   engine's last trip, `<unix seconds>` while its verdict is held or being decided,
//!   `<unix seconds>,acted` once it acted. One entry per engine (NVSentinel dedups nodes the
//!   same way: `fault-quarantine/pkg/breaker/breaker.go` in NVIDIA/NVSentinel);
//! - `engines`, the fleet's engine count, and `counted`, when it was counted (Unix seconds).
//!
//! An agent adds its trip with a JSON merge patch, which the API server applies to the object
//! as stored, one after the other: the object it answers holds every trip applied before, so
//! the k-th trip of a window sees k and acts while k is within the allowed.
//! At 10,000 engines with 40-character node names a full window is about 0.5 MB, under the
//! 1 MiB a ConfigMap may hold.

use std::collections::BTreeMap;

/// The prefix of an engine's key.
pub(crate) const TRIP: &str = "trip.";
/// The value's suffix of a trip whose verdict acted.
const ACTED: &str = ",acted";
/// Most expired trips one patch removes (a patch stays small; the next one removes more).
pub(crate) const PRUNE: usize = 100;

/// One engine's trip: when (Unix seconds), and whether its verdict acted (else it was held,
/// or is being decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trip {
    pub at: u64,
    pub acted: bool,
}

impl Trip {
    /// The trip as its key's value.
    pub(crate) fn value(self) -> String {
        format!("{}{}", self.at, if self.acted { ACTED } else { "" })
    }

    fn of(v: &str) -> Option<Trip> {
        let (at, acted) = match v.strip_suffix(ACTED) {
            Some(at) => (at, true),
            None => (v, false),
        };
        Some(Trip {
            at: at.parse().ok()?,
            acted,
        })
    }
}

/// The shared state, as the ConfigMap holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fleet {
    /// By key (`trip.…`).
    pub trips: BTreeMap<String, Trip>,
    /// The fleet's engines as last counted; 0: not counted yet.
    pub engines: u64,
    /// When they were counted (Unix seconds); `None`: the key is missing.
    pub counted: Option<u64>,
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

/// The key of engine `node/engine`: readable when it can be (a node name is a DNS
/// subdomain, which has no `_`, so the first `_` splits it), else an FNV-1a hash of the
/// name (stable across agent versions and restarts). A key is `[-._a-zA-Z0-9]`, at most 253.
pub(crate) fn key(engine: &str) -> String {
    let readable = format!("{TRIP}{}", engine.replacen('/', "_", 1));
    let valid = readable.len() <= 253
        && readable
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if valid {
        return readable;
    }
    let h = engine.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{TRIP}-{h:016x}")
}

impl Fleet {
    fn in_window(&self, now: u64, window: u64) -> impl Iterator<Item = (&String, &Trip)> {
        self.trips.iter().filter(move |(_, t)| t.at + window > now)
    }

    /// Trips within `window` seconds before `now`.
    pub(crate) fn recent(&self, now: u64, window: u64) -> u64 {
        self.in_window(now, window).count() as u64
    }

    /// Whether the brake is engaged at `now`: more than the allowed trips in the window. A
    /// fleet never counted (0 engines) never engages: nothing to take a fraction of.
    pub(crate) fn engaged(&self, now: u64, window: u64, max_fraction: f64) -> bool {
        self.engines > 0 && self.recent(now, window) > allowed(self.engines, max_fraction)
    }

    /// Since when it is engaged: the trip that went past the allowed, of those in the window.
    pub(crate) fn engaged_since(&self, now: u64, window: u64, max_fraction: f64) -> Option<u64> {
        if !self.engaged(now, window, max_fraction) {
            return None;
        }
        let mut at: Vec<u64> = self.in_window(now, window).map(|(_, t)| t.at).collect();
        at.sort_unstable();
        at.get(allowed(self.engines, max_fraction) as usize)
            .copied()
    }

    /// Whether `key`'s trip in the window acted (a restarted agent finds its engine abnormal
    /// still: it keeps its verdict).
    pub(crate) fn acted(&self, key: &str, now: u64, window: u64) -> bool {
        self.trips
            .get(key)
            .is_some_and(|t| t.acted && t.at + window > now)
    }

    /// The keys of trips that left the window, at most [`PRUNE`].
    pub(crate) fn expired(&self, now: u64, window: u64) -> Vec<String> {
        self.trips
            .iter()
            .filter(|(_, t)| t.at + window <= now)
            .map(|(k, _)| k.clone())
            .take(PRUNE)
            .collect()
    }

    /// Decides a trip as the state shows it right after the trip was applied (its own trip
    /// among those in the window): it acts while those are within the allowed; else it is
    /// held, and its trip counts still (so the brake stays engaged while the wave lasts). A
    /// fleet not counted yet acts.
    pub(crate) fn decide(&self, now: u64, window: u64, max_fraction: f64) -> Decision {
        if self.engines == 0 || self.recent(now, window) <= allowed(self.engines, max_fraction) {
            Decision::Act
        } else {
            Decision::Hold
        }
    }

    /// The state from a ConfigMap's `data`; what does not read is named in the error and left
    /// out (the caller warns and goes on with the rest: a state it cannot read must not stop
    /// the brake).
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
        let counted = num("counted");
        let mut trips = BTreeMap::new();
        for (k, v) in d
            .range(TRIP.to_owned()..)
            .take_while(|(k, _)| k.starts_with(TRIP))
        {
            match Trip::of(v) {
                Some(t) => {
                    trips.insert(k.clone(), t);
                }
                None => {
                    bad.get_or_insert_with(|| {
                        format!(
                            "data.{k} is not \"<unix seconds>\" or \"<unix seconds>{ACTED}\": {}",
                            crate::logging::clip(v)
                        )
                    });
                }
            }
        }
        let f = Fleet {
            trips,
            engines,
            counted,
        };
        (f, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 300;

    /// The state after the API server applied `trips` (engine, at) one after another, each
    /// decided on the state its patch answered with, and marked acted when it acted.
    fn applied(engines: u64, trips: &[(&str, u64)]) -> (Fleet, Vec<Decision>) {
        let mut f = Fleet {
            engines,
            ..Fleet::default()
        };
        let mut d = Vec::new();
        for &(e, at) in trips {
            let k = key(e);
            let acted = f.acted(&k, at, W);
            f.trips.insert(k.clone(), Trip { at, acted });
            let decision = if acted {
                Decision::Act
            } else {
                f.decide(at, W, 0.5)
            };
            if decision == Decision::Act {
                f.trips.insert(k, Trip { at, acted: true });
            }
            d.push(decision);
        }
        (f, d)
    }

    // Half of ten engines may act within the window; the sixth is held, and so is every
    // later one while the trips last.
    #[test]
    fn more_than_the_fraction_within_the_window_is_held_and_the_held_count_too() {
        let trips: Vec<(String, u64)> = (0..8).map(|i| (format!("n{i}/e"), 1000 + i)).collect();
        let trips: Vec<(&str, u64)> = trips.iter().map(|(e, t)| (e.as_str(), *t)).collect();
        let (f, d) = applied(10, &trips);
        use Decision::{Act, Hold};
        assert_eq!(d, [Act, Act, Act, Act, Act, Hold, Hold, Hold]);
        assert_eq!(f.recent(1010, W), 8, "held engines count as trips");
        assert!(f.engaged(1010, W, 0.5));
        assert_eq!(f.engaged_since(1010, W, 0.5), Some(1005));
    }

    // The window clears: trips older than the window no longer count, the brake releases,
    // and they are the ones a patch removes.
    #[test]
    fn the_brake_releases_once_the_window_holds_no_more_than_the_fraction() {
        let (f, _) = applied(4, &[("a/e", 1000), ("b/e", 1000), ("c/e", 1000)]);
        assert!(f.engaged(1000, W, 0.5));
        assert!(f.engaged(1000 + W - 1, W, 0.5));
        assert!(!f.engaged(1000 + W, W, 0.5));
        assert_eq!(f.engaged_since(1000 + W, W, 0.5), None);
        assert_eq!(f.expired(1000 + W - 1, W).len(), 0);
        assert_eq!(f.expired(1000 + W, W).len(), 3);
        let (_, d) = applied(
            4,
            &[
                ("a/e", 1000),
                ("b/e", 1000),
                ("c/e", 1000),
                ("d/e", 1000 + W),
            ],
        );
        assert_eq!(d[3], Decision::Act, "a new verdict after the window acts");
    }

    // One engine counts once (a new trip replaces its last), and an engine whose verdict
    // acted acts again after an agent restart, even with the brake engaged since.
    #[test]
    fn an_engine_counts_once_and_one_that_acted_keeps_acting() {
        use Decision::{Act, Hold};
        let (f, d) = applied(
            2,
            &[
                ("a/e", 1000),
                ("a/e", 1001),
                ("b/e", 1002),
                ("a/e", 1003),
                ("b/e", 1004),
            ],
        );
        assert_eq!(d, [Act, Act, Hold, Act, Hold]);
        assert_eq!(f.recent(1004, W), 2);
    }

    // A fleet not yet counted cannot be braked (nothing to take a fraction of).
    #[test]
    fn a_fleet_of_unknown_size_never_engages() {
        let (f, d) = applied(0, &[("a/e", 1000), ("b/e", 1000), ("c/e", 1000)]);
        assert!(d.iter().all(|d| *d == Decision::Act));
        assert!(!f.engaged(1000, W, 0.5));
        assert_eq!(allowed(10, 0.5), 5);
        assert_eq!(allowed(3, 0.5), 1);
        assert_eq!(allowed(10, 1.0), 10, "1 never engages");
    }

    // Keys: readable for a node name and an engine name, the hash for what a key cannot hold;
    // two engines never share one.
    #[test]
    fn a_key_names_its_engine_or_hashes_it() {
        assert_eq!(
            key("node-1.cluster.local/main"),
            "trip.node-1.cluster.local_main"
        );
        assert_eq!(key("n/e_x"), "trip.n_e_x");
        let hashed = key("node/engine with spaces");
        assert!(
            hashed.starts_with("trip.-") && hashed.len() == 5 + 17,
            "{hashed}"
        );
        assert_eq!(hashed, key("node/engine with spaces"), "stable");
        assert_ne!(hashed, key("node/engine with space"));
        let long = format!("n/{}", "e".repeat(300));
        assert!(key(&long).len() <= 253);
    }

    // The state reads back from the ConfigMap's data; what does not read is named and the
    // rest is kept.
    #[test]
    fn the_state_reads_back_and_a_bad_key_is_named_not_fatal() {
        let d: BTreeMap<String, String> = [
            ("engines", "3"),
            ("counted", "900"),
            ("trip.n1_e", "1000,acted"),
            ("trip.n2_e", "1001"),
            ("trip.n3_e", "soon"),
            ("unrelated", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let (f, bad) = Fleet::of_data(&d);
        assert_eq!((f.engines, f.counted), (3, Some(900)));
        assert_eq!(
            f.trips.get("trip.n1_e"),
            Some(&Trip {
                at: 1000,
                acted: true
            })
        );
        assert_eq!(
            f.trips.get("trip.n2_e").map(|t| t.value()),
            Some("1001".to_owned())
        );
        assert_eq!(f.trips.len(), 2);
        assert!(bad.unwrap().starts_with("data.trip.n3_e"));
        let mut d = d;
        d.insert("engines".to_owned(), "many".to_owned());
        let (f, bad) = Fleet::of_data(&d);
        assert_eq!(f.engines, 0);
        assert!(bad.unwrap().starts_with("data.engines"));
    }

    // The size at 10,000 engines in one window stays under a ConfigMap's 1 MiB.
    #[test]
    fn a_wave_of_ten_thousand_engines_fits_in_one_config_map() {
        let bytes: usize = (0..10_000u64)
            .map(|i| {
                let k = key(&format!("node-{i:05}.cluster.local/engine-0"));
                let v = Trip {
                    at: 1_765_000_000 + i / 100,
                    acted: i % 2 == 0,
                }
                .value();
                k.len() + v.len()
            })
            .sum();
        assert!(bytes < 1 << 20, "{bytes} bytes");
    }
}
