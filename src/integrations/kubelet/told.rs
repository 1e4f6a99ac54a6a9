//! What the kubelet is told about an engine, as the journal records it: `/readyz`
//! (`ready`, `not_ready`) and `/livez` (`live`, `restart`). Data only.

use serde::{Deserialize, Serialize};

/// `/readyz`'s answer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Ready {
    Ready,
    NotReady,
}

/// `/livez`'s answer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::EnumIter, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Live {
    Live,
    /// 503: the kubelet restarts the container after its failure threshold.
    Restart,
}

impl Ready {
    /// `ready` or `not_ready`.
    pub(crate) fn of(ready: bool) -> Ready {
        if ready { Ready::Ready } else { Ready::NotReady }
    }

    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Live {
    /// `live` or `restart`.
    pub(crate) fn of(live: bool) -> Live {
        if live { Live::Live } else { Live::Restart }
    }

    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }
}
