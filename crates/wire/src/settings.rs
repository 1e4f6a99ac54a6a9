//! The engine's settings `/status/detail` names: its MindIE role and its detection policy.

use serde::{Deserialize, Serialize};

/// An engine role (`--role`, MindIE's `motor_engine_<role>_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
    Union,
    Encode,
}

impl Role {
    /// Every role, in the order `--help` lists them.
    pub const ALL: [Role; 4] = [Role::Prefill, Role::Decode, Role::Union, Role::Encode];

    /// Name as written in configs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Union => "union",
            Role::Encode => "encode",
        }
    }

    /// The `user_config.json` section holding this role's engine.
    pub fn section(self) -> String {
        format!("motor_engine_{}_config", self.as_str())
    }

    /// The `env.json` section for this role's engine.
    pub fn env_section(self) -> String {
        format!("motor_engine_{}_env", self.as_str())
    }
}

/// Which detection policy an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// MindIE V5 virtual inference, exactly.
    Reference,
    /// Stall detection, QoS eviction, fast confirmation and the `/health` grace. The
    /// default: it passed the chaos suite (both Node Manager cadences, fake and real engine)
    /// and MindIE PyMotor's own Node Manager (docs/policy.md).
    #[default]
    Agent,
}

impl Policy {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: [Policy; 2] = [Policy::Reference, Policy::Agent];

    /// Name as written in configs, logs and `/status/detail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reference => "reference",
            Policy::Agent => "agent",
        }
    }
}
