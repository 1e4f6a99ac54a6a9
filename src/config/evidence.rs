//! `[agent] evidence_dir`, `evidence_max_bytes`, `evidence_max_count`, `evidence_min_free`:
//! where the evidence bundles of the engines' verdicts go and how much of the disk they may
//! take (`crate::bundles` writes them), their defaults, bounds and check.

use super::KeyError;
use super::bounds::Within;
use serde::Serialize;
use std::path::PathBuf;

/// Where the evidence bundles go, and their caps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvidenceSettings {
    /// The bundles' own directory; `None`: no bundle is written. The packaged
    /// configurations set `/var/lib/npu-health-agent/evidence`.
    pub dir: Option<PathBuf>,
    /// The bundles together take at most this many bytes; the oldest go first.
    pub max_bytes: u64,
    /// At most this many bundles are kept; the oldest go first.
    pub max_count: usize,
    /// No bundle is written while the file system holding `dir` has less free space.
    pub min_free: u64,
}

/// Default of `evidence_max_bytes`: 256 MiB, room for about 36 bundles of the largest size
/// (seven parts of at most 1 MiB each).
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Default of `evidence_max_count`.
pub(crate) const DEFAULT_MAX_COUNT: usize = 32;
/// Default of `evidence_min_free`: 1 GiB, so that the bundles never take a node's last space.
pub(crate) const DEFAULT_MIN_FREE: u64 = 1 << 30;

impl Default for EvidenceSettings {
    fn default() -> Self {
        EvidenceSettings {
            dir: None,
            max_bytes: DEFAULT_MAX_BYTES,
            max_count: DEFAULT_MAX_COUNT,
            min_free: DEFAULT_MIN_FREE,
        }
    }
}

/// `evidence_max_bytes`: at least one bundle of the largest size (16 MiB), at most 64 GiB.
pub(crate) const MAX_BYTES: Within<u64> = Within::new(16 << 20, 64 << 30);
/// `evidence_max_count`.
pub(crate) const MAX_COUNT: Within<usize> = Within::new(1, 10_000);
/// `evidence_min_free`: up to 1 TiB (0: no floor).
pub(crate) const MIN_FREE: Within<u64> = Within::new(0, 1 << 40);

impl EvidenceSettings {
    /// The directory absolute, the caps within their bounds.
    pub(crate) fn validate(&self) -> Result<(), KeyError> {
        if let Some(d) = &self.dir
            && !d.is_absolute()
        {
            return Err((
                "evidence_dir".to_owned(),
                format!("{:?} is not an absolute path", d.display()),
            ));
        }
        MAX_BYTES.check("evidence_max_bytes", self.max_bytes)?;
        MAX_COUNT.check("evidence_max_count", self.max_count)?;
        MIN_FREE.check("evidence_min_free", self.min_free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_evidence_dir_and_caps_out_of_bounds_are_refused_by_their_key() {
        assert!(EvidenceSettings::default().validate().is_ok());
        let with = |f: fn(&mut EvidenceSettings)| {
            let mut s = EvidenceSettings::default();
            f(&mut s);
            s.validate().unwrap_err()
        };
        let (key, msg) = with(|s| s.dir = Some(PathBuf::from("evidence")));
        assert_eq!(key, "evidence_dir");
        assert!(msg.contains("not an absolute path"), "{msg}");
        assert_eq!(with(|s| s.max_bytes = 1).0, "evidence_max_bytes");
        assert_eq!(with(|s| s.max_count = 0).0, "evidence_max_count");
        assert_eq!(with(|s| s.min_free = u64::MAX).0, "evidence_min_free");
    }
}
