//! The word `/status` answers, as MindIE's engine server sends it (reference §3.3).

use serde::{Deserialize, Serialize};

/// What `/status` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Initial,
    Normal,
    Abnormal,
}

impl Status {
    /// The exact body MindIE's engine server returns.
    pub fn body(self) -> &'static str {
        match self {
            Status::Initial => r#"{"status":"initial"}"#,
            Status::Normal => r#"{"status":"normal"}"#,
            Status::Abnormal => r#"{"status":"abnormal"}"#,
        }
    }

    /// `initial`, `normal` or `abnormal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Initial => "initial",
            Status::Normal => "normal",
            Status::Abnormal => "abnormal",
        }
    }
}
