//! The evidence bundles of one engine, as `/status/detail`'s `evidence` shows them: where the
//! last one went and how many were written, refused or skipped.

use serde::{Deserialize, Serialize};

/// What the agent kept of one engine's verdicts (`/status/detail`'s `evidence`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    /// The directory of the last bundle written; `null` until one is.
    pub last_path: Option<String>,
    /// The last bundle's size in bytes.
    pub last_bytes: u64,
    /// Bundles written since the agent started.
    pub written: u64,
    /// Bundles that could not be written (the directory is a file, not writable, …).
    pub failed: u64,
    /// Bundles not written because the disk's free space was below `evidence_min_free`.
    pub skipped: u64,
    /// Why the last bundle was not written; `null` once one is written again.
    pub last_error: Option<String>,
}
