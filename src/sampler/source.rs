//! Where a device's AI Cube figures come from: a backend ([`Backend`]) and its method
//! ([`Method`]), stored in one atomic byte; and why a device is on the source it is on
//! ([`SourceReason`]), for `/status/detail`, the metrics and the log.

use crate::driver::Backend;
use crate::driver::dcmi::UtilType;

/// How a backend obtains a device's AI Cube figure. Its discriminant is its half of a
/// source's one-byte encoding (below 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter, strum::FromRepr)]
#[repr(u8)]
pub enum Method {
    /// Not decided yet: DCMI's first read is pending, or the `npu-smi` capability probe runs.
    Pending,
    /// `dcmi_get_device_multi_utilization_rate` (`aic_util`).
    Multi,
    /// `dcmi_get_device_utilization_rate` type 14.
    Single,
    /// A long-lived `npu-smi info watch -s u` child.
    Watch,
    /// No method: the device has no AI Cube figure.
    None,
    /// Read from a script (the scripted backend).
    Script,
}

impl Method {
    /// Its word in a source's name.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Method::Pending => "pending",
            Method::Multi => "multi",
            Method::Single => "single",
            Method::Watch => "watch",
            Method::None => "none",
            Method::Script => "script",
        }
    }
}

/// Where a device's AI Cube figures come from now: a backend and its method. Stored in one
/// atomic byte (backend index × 16 + method index); printed under the names it always had
/// (`dcmi-multi`, `npu-smi`, …), and `<backend>-<method>` for any other pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    pub backend: Backend,
    pub method: Method,
}

impl Source {
    /// DCMI, method not yet known (first read pending).
    pub(crate) const DCMI_PROBING: Source = Source::of(Backend::Dcmi, Method::Pending);
    /// `dcmi_get_device_multi_utilization_rate` (`aic_util`).
    pub const DCMI_MULTI: Source = Source::of(Backend::Dcmi, Method::Multi);
    /// `dcmi_get_device_utilization_rate` type 14.
    pub const DCMI_SINGLE: Source = Source::of(Backend::Dcmi, Method::Single);
    /// Being handed to `npu-smi` (capability probe running).
    pub(crate) const NPU_SMI_PENDING: Source = Source::of(Backend::NpuSmi, Method::Pending);
    /// A long-lived `npu-smi info watch -s u` child.
    pub const NPU_SMI: Source = Source::of(Backend::NpuSmi, Method::Watch);
    /// No source: DCMI lacks AI Cube and `npu-smi` cannot provide it.
    pub(crate) const UNAVAILABLE: Source = Source::of(Backend::Unavailable, Method::None);

    /// The names the wire has always used for the sources of DCMI and `npu-smi`.
    const NAMED: [(Source, &'static str); 6] = [
        (Source::DCMI_PROBING, "dcmi-probing"),
        (Source::DCMI_MULTI, "dcmi-multi"),
        (Source::DCMI_SINGLE, "dcmi-single"),
        (Source::NPU_SMI_PENDING, "npu-smi-pending"),
        (Source::NPU_SMI, "npu-smi"),
        (Source::UNAVAILABLE, "unavailable"),
    ];

    /// `backend` reading through `method`.
    pub(crate) const fn of(backend: Backend, method: Method) -> Source {
        Source { backend, method }
    }

    pub(super) fn from_u8(v: u8) -> Source {
        match (Backend::from_repr(v >> 4), Method::from_repr(v & 0x0F)) {
            (Some(b), Some(m)) => Source::of(b, m),
            _ => Source::UNAVAILABLE,
        }
    }

    pub(super) fn to_u8(self) -> u8 {
        ((self.backend as u8) << 4) | self.method as u8
    }

    /// The name `/status/detail`, `devices --json` and the metrics' `source` label print.
    pub(crate) fn name(self) -> std::borrow::Cow<'static, str> {
        match Source::NAMED.iter().find(|(s, _)| *s == self) {
            Some((_, n)) => std::borrow::Cow::Borrowed(n),
            None => format!("{}-{}", self.backend.as_str(), self.method.as_str()).into(),
        }
    }

    /// The backend the figures come through.
    pub(crate) fn backend(self) -> Backend {
        self.backend
    }

    /// How the figure is obtained, for humans.
    pub(crate) fn method(self) -> &'static str {
        match (self.backend, self.method) {
            (Backend::Dcmi, Method::Pending) => "probing",
            (Backend::NpuSmi, Method::Pending) => "npu-smi pending",
            (_, Method::Multi) => "multi-utilization aic_util",
            (_, Method::Single) => "utilization type 14",
            (_, Method::Watch) => "npu-smi info watch -s u",
            (_, Method::Script) => "script",
            (_, Method::Pending) => "pending",
            (Backend::Unavailable, _) | (_, Method::None) => "none",
        }
    }

    #[cfg(test)]
    /// Whether the source is decided (not probing or pending).
    pub(crate) fn settled(self) -> bool {
        self.method != Method::Pending
    }
}

impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Source, D::Error> {
        let name = String::deserialize(d)?;
        use strum::IntoEnumIterator;
        Backend::iter()
            .flat_map(|b| Method::iter().map(move |m| Source::of(b, m)))
            .find(|s| s.name() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown source {name:?}")))
    }
}

pub(crate) use npu_health_wire::SourceReason;

/// The reason stored as `v`; only the sampler stores one, so an unknown value cannot occur,
/// and would read as [`SourceReason::NoDcmi`].
pub(super) fn reason_from_u8(v: u8) -> SourceReason {
    SourceReason::from_repr(v).unwrap_or(SourceReason::NoDcmi)
}

/// One sentence for humans on `reason`; `figure` is the single call's reading behind
/// `MultiZeroed`, or the bad figure behind `MultiPrereleaseLayout`.
pub(crate) fn note(reason: SourceReason, figure: u32, kind: UtilType) -> String {
    match reason {
        SourceReason::Probing => "first read pending".to_owned(),
        SourceReason::MultiVerified => "the multi-utilization call answered non-zero figures: the firmware has the sub-command".to_owned(),
        SourceReason::MultiUnverified => "the multi-utilization call has answered only zeros so far; each zero is checked against a single utilization call".to_owned(),
        SourceReason::MultiUncorroborated => "the multi-utilization call has answered only zeros so far and no single utilization call answers to check them: its zeros are suspect, not readings".to_owned(),
        SourceReason::MultiDisputed => "the multi-utilization call answers zeros while a single utilization call reads non-zero: figures are suspect while this lasts".to_owned(),
        SourceReason::MultiZeroed => format!(
            "the multi-utilization call answers OK with every field 0 while {} read {figure} %: the firmware lacks the sub-command",
            kind.describe()
        ),
        SourceReason::MultiPrereleaseLayout => format!(
            "the pre-release name dcmi_get_device_utilization_rate_v2 answered a figure of {figure}: the library writes the early 4-byte struct"
        ),
        SourceReason::MultiUnsupported => "the multi-utilization call answered -8255 (not supported)".to_owned(),
        SourceReason::MultiMissing => "libdcmi.so has no multi-utilization symbol".to_owned(),
        SourceReason::Type14Unsupported => "DCMI has no AI Cube call for the device (multi-utilization unusable, type 14 not supported)".to_owned(),
        SourceReason::Type14Zero => "type 14 read 0 while npu-smi read non-zero, three rows in a row".to_owned(),
        SourceReason::Hung => "a DCMI call on the device blocked past the deadline".to_owned(),
        SourceReason::NoDcmi => "libdcmi.so is not loaded or did not enumerate the device".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every source round-trips through its byte and its name, the names are those the
    // wire always had, and (backend, method) says where the figure comes from.
    #[test]
    fn sources_are_a_backend_and_a_method_and_keep_their_names() {
        use strum::IntoEnumIterator;
        let mut names = std::collections::BTreeSet::new();
        for b in Backend::iter() {
            for m in Method::iter() {
                let src = Source::of(b, m);
                assert_eq!(Source::from_u8(src.to_u8()), src, "{src:?}");
                let name = src.name().into_owned();
                let json = serde_json::to_string(&src).unwrap();
                assert_eq!(json, format!("\"{name}\""));
                assert_eq!(serde_json::from_str::<Source>(&json).unwrap(), src);
                assert!(names.insert(name.clone()), "{name} twice");
            }
        }
        for (src, name) in Source::NAMED {
            assert_eq!(src.name(), name, "the wire's names stay");
        }
        assert_eq!(
            Source::of(Backend::Scripted, Method::Script).name(),
            "scripted-script"
        );
        assert_eq!(Source::from_u8(0xFF), Source::UNAVAILABLE);
        assert!(serde_json::from_str::<Source>("\"dcmi-magic\"").is_err());
        assert_eq!(Source::DCMI_MULTI.backend, Backend::Dcmi);
        assert_eq!(Source::NPU_SMI.method, Method::Watch);
        assert!(!Source::NPU_SMI_PENDING.settled() && Source::UNAVAILABLE.settled());
        assert_eq!(Source::DCMI_SINGLE.method(), "utilization type 14");
    }

    #[test]
    fn every_reason_survives_its_atomic() {
        let all: Vec<SourceReason> = SourceReason::ALL.to_vec();
        assert!(all.contains(&SourceReason::NoDcmi), "{all:?}");
        for r in all {
            assert_eq!(reason_from_u8(r as u8), r);
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "one name");
            assert!(!note(r, 40, UtilType::AiCube).is_empty());
        }
    }
}
