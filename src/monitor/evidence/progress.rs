//! The engine's progress, from its own `/metrics` figures (tracked by
//! [`crate::qos::progress`] from the QoS loop's scrapes and the fresh reads of a failed
//! probe): the sleep gauge, stalls and signs of life. Rules 4, 7 and 11 of docs/policy.md
//! read it, inside virtual inference's accounting ([`crate::monitor::account`]); it has no
//! loop and no finding of its own.

use super::{Rule, RuleId, Source};
use std::time::Duration;

/// The engine's progress.
pub(crate) struct Progress;

/// Rule 4: an engine that says it is asleep is not counted.
const ASLEEP: Rule = Rule {
    id: RuleId(4),
    name: "asleep_not_counted",
    doc: "a virtual request that fails while vllm:engine_sleep_state says asleep is not counted",
    keys: &[],
};

/// Rule 7: stall detection, with a shorter window and confirmation.
pub(super) const STALL: Rule = Rule {
    id: RuleId(7),
    name: "stall_detection",
    doc: "a failure on a busy NPU whose engine advanced no token and served no probe for the window is counted, confirmed",
    keys: &["qos.stall_detection", "qos.stall_window"],
};

/// Rule 11: no sign of life on a busy NPU is a hang in seconds.
pub(super) const NO_SIGN_OF_LIFE: Rule = Rule {
    id: RuleId(11),
    name: "no_sign_of_life",
    doc: "a failure on a busy NPU whose engine moved none of its scheduler's figures for the window is abnormal at once",
    keys: &["agent_policy.progress_window"],
};

impl Source for Progress {
    fn name(&self) -> &'static str {
        "progress"
    }

    fn rules(&self) -> &'static [Rule] {
        &[ASLEEP, STALL, NO_SIGN_OF_LIFE]
    }
}

/// Why a quiet engine woke the loop (rule 11), for the log: "requests running" only when the
/// engine's own count says so, since an engine with none running is quiet too when its NPU
/// was busy; `idle_now`: the NPU has been idle over the last window since.
pub(super) fn quiet_words(quiet: Duration, running: Option<f64>, idle_now: bool) -> String {
    let working = match running {
        Some(1.0) => "1 request running".to_owned(),
        Some(n) if n > 0.0 => format!("{n} requests running"),
        _ => "no request running by the engine's count but its NPU was busy".to_owned(),
    };
    format!(
        "{working}, and no sign of life for {:.1} s (no token, KV-cache usage, running or waiting count moved); probing now{}",
        quiet.as_secs_f64(),
        if idle_now {
            " (the NPU is idle now: the idle rules decide)"
        } else {
            ""
        }
    )
}
