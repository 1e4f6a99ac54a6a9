//! What `/status/detail` says of an NPU beyond its figures: why its AI Cube figures come from
//! where they come from, and the driver's fault codes with their level and effect.

use serde::{Deserialize, Serialize};

/// Why a device's AI Cube figures come from where they come from. The sampler stores it in an
/// atomic byte as its discriminant ([`SourceReason::from_repr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum SourceReason {
    /// The first DCMI read is pending.
    Probing,
    /// The multi-utilization call answered a non-zero field: the firmware has the
    /// sub-command, its figures are readings.
    MultiVerified,
    /// The multi-utilization call answered only zeros so far; each zero is checked against a
    /// single call (type 14, else type 2).
    MultiUnverified,
    /// As `MultiUnverified`, but no single call answers: its zeros are suspect.
    MultiUncorroborated,
    /// The multi-utilization call answers zeros while a single call reads non-zero; its
    /// figures are suspect until the disagreement ends or lasts a second.
    MultiDisputed,
    /// The multi-utilization call answered OK with an all-zero struct while a single call
    /// read non-zero, for a second: the firmware lacks the sub-command.
    MultiZeroed,
    /// The pre-release name answered a figure above 100: the library writes the early
    /// 4-byte struct.
    MultiPrereleaseLayout,
    /// The multi-utilization call answered -8255.
    MultiUnsupported,
    /// No multi-utilization symbol in the library.
    MultiMissing,
    /// Utilization type 14 answered -8255 or is missing.
    Type14Unsupported,
    /// Type 14 read 0 while `npu-smi` read non-zero, three rows in a row.
    Type14Zero,
    /// A DCMI call on the device blocked past the deadline.
    Hung,
    /// The library is not loaded (or did not enumerate the device).
    NoDcmi,
}

impl SourceReason {
    /// Every reason, in discriminant order.
    pub const ALL: [SourceReason; 13] = [
        SourceReason::Probing,
        SourceReason::MultiVerified,
        SourceReason::MultiUnverified,
        SourceReason::MultiUncorroborated,
        SourceReason::MultiDisputed,
        SourceReason::MultiZeroed,
        SourceReason::MultiPrereleaseLayout,
        SourceReason::MultiUnsupported,
        SourceReason::MultiMissing,
        SourceReason::Type14Unsupported,
        SourceReason::Type14Zero,
        SourceReason::Hung,
        SourceReason::NoDcmi,
    ];

    /// The reason's name in `/status/detail` and the metrics' `reason` label (serde's name).
    pub fn as_str(self) -> &'static str {
        match self {
            SourceReason::Probing => "probing",
            SourceReason::MultiVerified => "multi-verified",
            SourceReason::MultiUnverified => "multi-unverified",
            SourceReason::MultiUncorroborated => "multi-uncorroborated",
            SourceReason::MultiDisputed => "multi-disputed",
            SourceReason::MultiZeroed => "multi-zeroed",
            SourceReason::MultiPrereleaseLayout => "multi-prerelease-layout",
            SourceReason::MultiUnsupported => "multi-unsupported",
            SourceReason::MultiMissing => "multi-missing",
            SourceReason::Type14Unsupported => "type14-unsupported",
            SourceReason::Type14Zero => "type14-zero",
            SourceReason::Hung => "hung",
            SourceReason::NoDcmi => "no-dcmi",
        }
    }

    /// The reason whose discriminant is `v`.
    pub fn from_repr(v: u8) -> Option<SourceReason> {
        SourceReason::ALL.get(usize::from(v)).copied()
    }

    /// Whether a verdict is pending (two calls disagree; settled within a second or two).
    pub fn pending(self) -> bool {
        self == SourceReason::MultiDisputed
    }
}

/// MindCluster's handling levels, least severe first (its `getMostSeriousFaultType` order),
/// and `Unclassified` for a code no table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FaultLevel {
    /// In no table: published, never acted on.
    #[serde(rename = "unclassified")]
    Unclassified,
    NotHandleFault,
    SubHealthFault,
    RestartRequest,
    RestartBusiness,
    FreeRestartNPU,
    RestartNPU,
    PreSeparateNPU,
    SeparateNPU,
}

impl FaultLevel {
    /// Every level, least severe first (the metrics write one series per level).
    pub const ALL: [FaultLevel; 9] = [
        FaultLevel::Unclassified,
        FaultLevel::NotHandleFault,
        FaultLevel::SubHealthFault,
        FaultLevel::RestartRequest,
        FaultLevel::RestartBusiness,
        FaultLevel::FreeRestartNPU,
        FaultLevel::RestartNPU,
        FaultLevel::PreSeparateNPU,
        FaultLevel::SeparateNPU,
    ];

    /// The name MindCluster uses (and the metrics' `level` label).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultLevel::Unclassified => "unclassified",
            FaultLevel::NotHandleFault => "NotHandleFault",
            FaultLevel::SubHealthFault => "SubHealthFault",
            FaultLevel::RestartRequest => "RestartRequest",
            FaultLevel::RestartBusiness => "RestartBusiness",
            FaultLevel::FreeRestartNPU => "FreeRestartNPU",
            FaultLevel::RestartNPU => "RestartNPU",
            FaultLevel::PreSeparateNPU => "PreSeparateNPU",
            FaultLevel::SeparateNPU => "SeparateNPU",
        }
    }
}

impl std::fmt::Display for FaultLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a driver fault does to an engine on the NPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultEffect {
    /// Published, nothing else (every level under `reference`; `NotHandleFault`,
    /// `RestartRequest` and unclassified codes under `agent`).
    Published,
    /// The QoS level is one band lower, at most `throttle` (`SubHealthFault`, agent policy).
    LowersQos,
    /// One immediate confirming probe; a failure is abnormal at once (`RestartBusiness` or
    /// worse, agent policy).
    Confirms,
}

impl FaultEffect {
    /// In words, for `/status/detail`, `doctor` and the live page.
    pub fn describe(self) -> &'static str {
        match self {
            FaultEffect::Published => "published only",
            FaultEffect::LowersQos => "QoS level one band lower, at most throttle",
            FaultEffect::Confirms => {
                "one immediate confirming probe; a failed virtual request is abnormal at once"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FaultLevel, SourceReason};

    #[test]
    fn every_source_reason_sits_at_its_own_place_in_the_list() {
        for (i, r) in SourceReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "{r:?}");
            assert_eq!(SourceReason::from_repr(r as u8), Some(r));
        }
        assert_eq!(SourceReason::from_repr(13), None);
    }

    #[test]
    fn the_fault_levels_are_listed_least_severe_first() {
        for (i, l) in FaultLevel::ALL.into_iter().enumerate() {
            assert_eq!(l as usize, i, "{l:?}");
        }
        assert!(FaultLevel::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
