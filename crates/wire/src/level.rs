//! The QoS degradation level, as `/qos`, `/status/detail` and the metrics name it.

use serde::{Deserialize, Serialize};

/// Degradation levels, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Level {
    /// Serve normally.
    Normal,
    /// Stop admitting new requests, finish in-flight ones.
    Throttle,
    /// Route to a smaller draft model.
    Degrade,
    /// Take the node out.
    Evict,
}

impl Level {
    /// Every level, best first (the metrics write one series per level).
    pub const ALL: [Level; 4] = [Level::Normal, Level::Throttle, Level::Degrade, Level::Evict];

    /// Name as shown in JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::Throttle => "throttle",
            Level::Degrade => "degrade",
            Level::Evict => "evict",
        }
    }

    /// The level whose `u8` (its discriminant, the encoding the QoS state's atomic holds) is
    /// `v`.
    pub fn from_repr(v: u8) -> Option<Level> {
        Level::ALL.get(usize::from(v)).copied()
    }

    /// Its place in [`Level::ALL`]: an exhaustive match, so a new level does not build until
    /// it has one (the test below holds the list to it).
    pub fn index(self) -> usize {
        match self {
            Level::Normal => 0,
            Level::Throttle => 1,
            Level::Degrade => 2,
            Level::Evict => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Level;

    #[test]
    fn every_level_sits_at_its_own_place_in_the_list_and_reads_back_from_its_u8() {
        for (i, l) in Level::ALL.into_iter().enumerate() {
            assert_eq!(l.index(), i, "{l:?}");
            assert_eq!(l as usize, i, "{l:?}: its discriminant is its place");
            assert_eq!(Level::from_repr(l as u8), Some(l));
        }
    }
}
