//! The detection policy: `policy = "reference" | "agent"` in `[agent]`, overridable per
//! `[[engine]]`, and the agent policy's own settings (`[engine.agent_policy]`).
//!
//! - `reference` is MindIE V5's virtual inference exactly (the opt-in QoS rules stay as
//!   configured, off by default).
//! - `agent` changes the defaults of three `[engine.qos]` keys (`stall_detection = true`,
//!   `eviction = true`, `stall_window = "30s"`; a key written in the file keeps its value) and
//!   turns on the rules of [`AgentPolicy`]: a grace for `/health` failures that are not a
//!   dead engine, and fast confirmation of a failed probe. The rules, the scenario behind
//!   each and the test that pins it: `docs/policy.md`.

use super::qos::QosConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub use npu_health_wire::Policy;

/// `stall_window` under `agent` when the file does not set it.
pub const AGENT_STALL_WINDOW: Duration = Duration::from_secs(30);

/// `[engine.agent_policy]`: used only under `policy = "agent"`. A key left out keeps its
/// default; the defaults come from the chaos suite's measurements (`docs/policy.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentPolicy {
    /// A `/health` that fails without the engine being gone (an HTTP error, `false`, a
    /// timeout, a reset) is `abnormal` only once it has failed this long without a healthy
    /// answer. A refused connection (the engine's port is closed) is `abnormal` at once.
    /// Default 15 s: the 12 s hot reload, plus a 3 s margin for the probe period.
    #[serde(with = "super::duration")]
    pub health_failure_grace: Duration,
    /// Counted probe failures that make the engine abnormal when each was confirmed (the NPU
    /// idle over the whole time since the first, the token counters not advancing, or the
    /// engine stalled by stall detection). Default 2: the failure and one re-probe.
    pub confirm_failures: u32,
    /// Sleep before a confirming re-probe. Default 1 s.
    #[serde(with = "super::duration")]
    pub confirm_interval: Duration,
    /// Timeout of a re-probe confirming a failure on an idle NPU (an idle engine answers a
    /// one-token request in milliseconds). Default 2 s.
    #[serde(with = "super::duration")]
    pub confirm_timeout: Duration,
    /// The engine's process (the one listening on its port, or one of its children such as
    /// vLLM's `EngineCore`) stopped this long (`T` in `/proc/<pid>/stat`: SIGSTOP, a
    /// debugger's stop) makes the engine `abnormal`: a stopped process answers nothing.
    /// Default 2 s; `0s` turns the rule off. Needs the engine's processes in sight
    /// (`/proc`, docs/policy.md).
    #[serde(with = "super::duration")]
    pub stopped_process_grace: Duration,
    /// No sign of life (docs/policy.md, rule 11): requests running, the NPU busy, and none of
    /// the engine's scheduler signals (prompt and generation token counters, KV-cache usage,
    /// running and waiting counts) moved for this long, and a virtual request sent meanwhile
    /// went unanswered: `abnormal`. Default 8 s; `0s` turns the rule off. With chunked prefill
    /// off, one prefill step longer than this reads as no sign of life (docs/policy.md).
    #[serde(with = "super::duration")]
    pub progress_window: Duration,
    /// The floor of a probe's timeout learned from the engine's own answers (docs/policy.md,
    /// rule 12): a periodic probe sent to an idle NPU times out after ten times the slowest
    /// of the engine's last 8 answers, at least this, at most the request timeout. Default
    /// 500 ms; `0s` turns the rule off (the request timeout, as the reference).
    #[serde(with = "super::duration")]
    pub learned_timeout_floor: Duration,
    /// The restart loop (docs/runbook.md, "NpuHealthEngineRestartLoop"): this many `abnormal`
    /// episodes within `escalate_window` escalate the engine (the reason says so, a metric and
    /// an alert fire; `/status` answers as before). Read under both policies. Default 3; `0`
    /// never escalates.
    pub escalate_after: u32,
    /// The window of `escalate_after`, and the clean period that clears an escalation.
    /// Default 1 h; at most 24 h (the memory's reach).
    #[serde(with = "super::duration")]
    pub escalate_window: Duration,
    /// The mode of every rule not named in `rules` (docs/policy.md, "Modes"). Default
    /// `enforce`.
    pub mode: Mode,
    /// The mode of single rules, by docs/policy.md's number or name
    /// (`{ no_sign_of_life = "observe", 12 = "off" }`).
    pub rules: BTreeMap<String, Mode>,
}

/// What a rule of the agent policy does (docs/policy.md, "Modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// It decides: what `/status` answers and every action follow it.
    #[default]
    Enforce,
    /// It is computed and recorded ("would have"), and never changes `/status` or an action.
    Observe,
    /// It is not computed.
    Off,
}

impl Mode {
    /// The word the configuration and the records use.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Observe => "observe",
            Mode::Off => "off",
        }
    }
}

/// The rules of docs/policy.md by number (index + 1): the names the configuration takes.
/// The evidence wing's rules take their names from here, and a test holds docs/policy.md's
/// table to both.
pub const RULE_NAMES: [&str; 12] = [
    "health_grace",
    "refused_at_once",
    "not_counted_beside_failing_health",
    "asleep_not_counted",
    "fast_confirmation",
    "busy_npu_falls_idle",
    "stall_detection",
    "driver_fault",
    "qos_eviction",
    "stopped_process",
    "no_sign_of_life",
    "learned_timeout",
];

/// The name of rule `id` (1-based); `""` for a number no rule has.
pub const fn rule_name(id: u8) -> &'static str {
    if id == 0 || id as usize > RULE_NAMES.len() {
        ""
    } else {
        RULE_NAMES[id as usize - 1]
    }
}

/// A set of rules of docs/policy.md, by number (shown as the list of numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleSet(u16);

impl Serialize for RuleSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.ids())
    }
}

impl RuleSet {
    /// No rule.
    pub const NONE: RuleSet = RuleSet(0);

    /// Whether rule `id` is in the set.
    pub const fn has(self, id: u8) -> bool {
        id >= 1 && id <= 16 && self.0 & (1 << (id - 1)) != 0
    }

    /// The set with rule `id` in it too.
    pub const fn with(self, id: u8) -> RuleSet {
        RuleSet(self.0 | (1 << (id - 1)))
    }

    /// The set with rule `id` out of it.
    pub const fn without(self, id: u8) -> RuleSet {
        RuleSet(self.0 & !(1 << (id - 1)))
    }

    /// The rules in either set.
    pub const fn union(self, other: RuleSet) -> RuleSet {
        RuleSet(self.0 | other.0)
    }

    /// The numbers in the set, in order.
    pub fn ids(self) -> impl Iterator<Item = u8> {
        (1..=16u8).filter(move |&i| self.has(i))
    }
}

/// One way of judging an engine: a policy and the rules of docs/policy.md it applies, with
/// the two `[engine.qos]` switches its rules 7 and 9 read. The policy in force is one; the
/// shadow (rules in `observe`, or `shadow_policy`) is another, computed on the same evidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Judging {
    pub policy: Policy,
    /// The rules it applies (under `reference`: only 7 and 9, when `[engine.qos]` turns them
    /// on).
    pub rules: RuleSet,
    /// Rule 7's window (`qos.stall_window`), when it applies.
    #[serde(with = "super::duration::option")]
    pub stall_window: Option<Duration>,
}

impl Judging {
    /// Whether it applies rule `id`.
    pub fn applies(&self, id: u8) -> bool {
        self.rules.has(id)
    }

    /// Whether it is the agent policy (its settings, `[engine.agent_policy]`, apply).
    pub fn agent(&self) -> bool {
        self.policy == Policy::Agent
    }
}

impl Default for AgentPolicy {
    fn default() -> Self {
        AgentPolicy {
            health_failure_grace: Duration::from_secs(15),
            confirm_failures: 2,
            confirm_interval: Duration::from_secs(1),
            confirm_timeout: Duration::from_secs(2),
            stopped_process_grace: Duration::from_secs(2),
            progress_window: Duration::from_secs(8),
            learned_timeout_floor: Duration::from_millis(500),
            escalate_after: 3,
            escalate_window: Duration::from_secs(3600),
            mode: Mode::Enforce,
            rules: BTreeMap::new(),
        }
    }
}

impl AgentPolicy {
    /// Checks every value against its bound; `Err((key, message))`.
    pub(crate) fn validate(&self) -> Result<(), super::KeyError> {
        use bounds::{
            CONFIRM_FAILURES, CONFIRM_INTERVAL, CONFIRM_TIMEOUT, ESCALATE_AFTER, ESCALATE_WINDOW,
            HEALTH_FAILURE_GRACE, LEARNED_TIMEOUT_FLOOR, PROGRESS_WINDOW, STOPPED_PROCESS_GRACE,
        };
        HEALTH_FAILURE_GRACE.check("health_failure_grace", self.health_failure_grace)?;
        STOPPED_PROCESS_GRACE.check("stopped_process_grace", self.stopped_process_grace)?;
        CONFIRM_FAILURES.check("confirm_failures", self.confirm_failures)?;
        CONFIRM_INTERVAL.check("confirm_interval", self.confirm_interval)?;
        CONFIRM_TIMEOUT.check("confirm_timeout", self.confirm_timeout)?;
        PROGRESS_WINDOW.check("progress_window", self.progress_window)?;
        LEARNED_TIMEOUT_FLOOR.check("learned_timeout_floor", self.learned_timeout_floor)?;
        ESCALATE_AFTER.check("escalate_after", self.escalate_after)?;
        ESCALATE_WINDOW.check("escalate_window", self.escalate_window)?;
        for key in self.rules.keys() {
            rule_id(key)?;
        }
        Ok(())
    }

    /// The mode of rule `id`: its own line in `rules`, else `mode`.
    pub fn mode_of(&self, id: u8) -> Mode {
        self.rules
            .iter()
            .find(|(k, _)| rule_id(k).ok() == Some(id))
            .map_or(self.mode, |(_, m)| *m)
    }

    /// The rules whose own switch is on: the `0s` switches of rules 10, 11 and 12.
    fn switched_on(&self, id: u8) -> bool {
        match id {
            10 => !self.stopped_process_grace.is_zero(),
            11 => !self.progress_window.is_zero(),
            12 => !self.learned_timeout_floor.is_zero(),
            _ => true,
        }
    }

    /// The rules in one of `modes` whose switch is on (rules 7 and 9 also need their
    /// `[engine.qos]` switch, `qos`).
    fn in_modes(&self, modes: &[Mode], qos: &QosConfig) -> RuleSet {
        (1..=RULE_NAMES.len() as u8)
            .filter(|&id| modes.contains(&self.mode_of(id)) && self.switched_on(id))
            .filter(|&id| qos_switch(id, qos))
            .fold(RuleSet::NONE, RuleSet::with)
    }
}

/// Rule 7 needs `qos.stall_detection`, rule 9 `qos.eviction` (with the score on).
fn qos_switch(id: u8, qos: &QosConfig) -> bool {
    match id {
        7 => qos.stall_detection,
        9 => qos.enabled && qos.eviction,
        _ => true,
    }
}

/// The rule a key of `[engine.agent_policy] rules` names: its number or its name.
fn rule_id(key: &str) -> Result<u8, super::KeyError> {
    let by_number = key.parse::<u8>().ok().filter(|&n| !rule_name(n).is_empty());
    let by_name = || {
        RULE_NAMES
            .iter()
            .position(|n| *n == key)
            .map(|i| i as u8 + 1)
    };
    by_number.or_else(by_name).ok_or_else(|| {
        let all: Vec<String> = RULE_NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{} {n}", i + 1))
            .collect();
        (
            format!("rules.{key}"),
            format!(
                "names no rule of docs/policy.md; the rules are {}",
                all.join(", ")
            ),
        )
    })
}

/// Which of an engine's two judgings: the policy in force, or the shadow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// What `/status` answers and every action follows.
    InForce,
    /// Computed on the same evidence and recorded; never answered.
    Shadow,
}

/// How an engine is judged: by the policy in force, and by the shadow when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Judgings {
    pub in_force: Judging,
    pub shadow: Option<Judging>,
}

/// The policy in force and the shadow of an engine whose policy is `policy`, shadow policy
/// `shadow`, agent-policy settings `a`, `[engine.qos]` `qos` (the preset of `policy` applied)
/// and written keys `written`. `Err((key, message))` when the two cannot sit together.
pub(crate) fn judgings(
    policy: Policy,
    shadow: Option<Policy>,
    a: &AgentPolicy,
    qos: &QosConfig,
    written: &[String],
) -> Result<Judgings, super::KeyError> {
    let reference = |qos: &QosConfig| Judging {
        policy: Policy::Reference,
        rules: [7u8, 9]
            .into_iter()
            .filter(|&id| qos_switch(id, qos))
            .fold(RuleSet::NONE, RuleSet::with),
        stall_window: qos.stall_detection.then_some(qos.stall_window),
    };
    let agent = |modes: &[Mode], qos: &QosConfig| {
        let rules = a.in_modes(modes, qos);
        Judging {
            policy: Policy::Agent,
            rules,
            stall_window: rules.has(7).then_some(qos.stall_window),
        }
    };
    let observing = (1..=RULE_NAMES.len() as u8).any(|id| a.mode_of(id) == Mode::Observe);
    let both = [Mode::Enforce, Mode::Observe];
    match (policy, shadow) {
        (p, Some(s)) if p == s => Err((
            "shadow_policy".to_owned(),
            format!("is the policy in force ({}); a shadow must differ", p.as_str()),
        )),
        (Policy::Agent, Some(Policy::Reference)) if observing => Err((
            "shadow_policy".to_owned(),
            "\"reference\" beside rules in observe mode: their records need the agent policy as the shadow; drop one".to_owned(),
        )),
        (Policy::Agent, Some(_)) => {
            let mut plain = qos.clone();
            preset_unwritten(Policy::Reference, &mut plain, written);
            Ok(Judgings {
                in_force: agent(&[Mode::Enforce], qos),
                shadow: Some(reference(&plain)),
            })
        }
        (Policy::Agent, None) => Ok(Judgings {
            in_force: agent(&[Mode::Enforce], qos),
            shadow: observing.then(|| agent(&both, qos)),
        }),
        (Policy::Reference, shadow) => {
            let mut preset = qos.clone();
            apply_preset(Policy::Agent, &mut preset, written);
            Ok(Judgings {
                in_force: reference(qos),
                shadow: shadow.map(|_| agent(&both, &preset)),
            })
        }
    }
}

/// The `[engine.qos]` keys a preset may change, by every name the file may use.
const PRESET_KEYS: [(&str, &[&str]); 3] = [
    ("stall_detection", &["stall_detection"]),
    ("eviction", &["eviction", "qos_eviction"]),
    ("stall_window", &["stall_window"]),
];

/// Applies `policy`'s defaults to the `[engine.qos]` keys the file did not write (`written`:
/// the keys of that table as written).
pub(crate) fn apply_preset(policy: Policy, qos: &mut QosConfig, written: &[String]) {
    if policy == Policy::Agent {
        preset_unwritten(policy, qos, written);
    }
}

/// Sets the preset's keys that the file did not write (`written`) to `policy`'s values: the
/// agent's preset, or the defaults (how the reference reads a file written for the agent).
fn preset_unwritten(policy: Policy, qos: &mut QosConfig, written: &[String]) {
    let d = QosConfig::default();
    let agent = policy == Policy::Agent;
    let set = |names: &[&str]| names.iter().any(|n| written.iter().any(|w| w == n));
    for (key, names) in PRESET_KEYS {
        if set(names) {
            continue;
        }
        match key {
            "stall_detection" => qos.stall_detection = agent || d.stall_detection,
            "eviction" => qos.eviction = agent || d.eviction,
            _ if agent => qos.stall_window = AGENT_STALL_WINDOW,
            _ => qos.stall_window = d.stall_window,
        }
    }
}

/// `[engine.agent_policy]` bounds (checked by [`AgentPolicy::validate`]).
pub mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    /// `0s` reports every failure at once, as the reference does.
    pub const HEALTH_FAILURE_GRACE: Within<Duration> = Within::new(ms(0), secs(600));
    pub(crate) const CONFIRM_FAILURES: Within<u32> = Within::new(1, 100);
    pub const CONFIRM_INTERVAL: Within<Duration> = Within::new(ms(10), secs(600));
    pub const CONFIRM_TIMEOUT: Within<Duration> = Within::new(ms(50), secs(600));
    /// `0s` turns the rule off.
    pub(crate) const STOPPED_PROCESS_GRACE: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0s` turns the rule off.
    pub const PROGRESS_WINDOW: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0s` turns the rule off.
    pub(crate) const LEARNED_TIMEOUT_FLOOR: Within<Duration> = Within::new(ms(0), secs(600));
    /// `0` never escalates; 1000 is far beyond what a day can hold.
    pub(crate) const ESCALATE_AFTER: Within<u32> = Within::new(0, 1000);
    /// At least a minute (a shorter one cannot hold two engine restarts); at most a day, the
    /// memory's reach.
    pub(crate) const ESCALATE_WINDOW: Within<Duration> = Within::new(secs(60), secs(24 * 3600));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_preset_fills_only_the_keys_left_out() {
        let mut q = QosConfig::default();
        apply_preset(Policy::Reference, &mut q, &[]);
        assert_eq!(q, QosConfig::default(), "reference changes nothing");
        apply_preset(Policy::Agent, &mut q, &[]);
        assert!(q.stall_detection && q.eviction);
        assert_eq!(q.stall_window, AGENT_STALL_WINDOW);
        let mut q = QosConfig::default();
        apply_preset(
            Policy::Agent,
            &mut q,
            &["qos_eviction".to_owned(), "stall_window".to_owned()],
        );
        assert!(q.stall_detection, "left out: the preset's");
        assert!(!q.eviction, "written (by its alias): the file's");
        assert_eq!(q.stall_window, QosConfig::default().stall_window);
    }

    #[test]
    fn bounds_name_the_key() {
        let bad = AgentPolicy {
            confirm_failures: 0,
            ..AgentPolicy::default()
        };
        let (k, m) = bad.validate().unwrap_err();
        assert_eq!(k, "confirm_failures");
        assert!(m.contains("outside"), "{m}");
        assert!(AgentPolicy::default().validate().is_ok());
        let bad = AgentPolicy {
            escalate_window: Duration::from_secs(25 * 3600),
            ..AgentPolicy::default()
        };
        let (k, m) = bad.validate().unwrap_err();
        assert_eq!(k, "escalate_window");
        assert!(m.contains("outside"), "{m}");
    }

    fn judged(text: &str) -> Result<Judgings, String> {
        let head = "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\nengine_env = {}\n";
        crate::config::file::parse(&format!("{head}{text}"), std::path::Path::new("/x/a.toml"))
            .map(|c| c.engines[0].judging)
            .map_err(|e| e.to_string())
    }

    fn ids(r: RuleSet) -> Vec<u8> {
        r.ids().collect()
    }

    // A rule's mode by number or name, every other the default `mode`; the policy in force
    // applies the rules in `enforce`, the shadow those in `observe` too.
    #[test]
    fn each_rule_takes_its_mode_by_number_or_name_and_the_shadow_enforces_those_in_observe() {
        let all: Vec<u8> = (1..=12).collect();
        let plain = judged("").unwrap();
        assert_eq!(
            ids(plain.in_force.rules),
            all,
            "every rule, the preset's 7 and 9 too"
        );
        assert_eq!(plain.shadow, None, "no rule in observe: no shadow");
        let j = judged(
            "[engine.agent_policy]\nrules = { no_sign_of_life = \"observe\", 12 = \"off\" }\n",
        )
        .unwrap();
        assert_eq!(ids(j.in_force.rules), (1..=10).collect::<Vec<_>>());
        let shadow = j.shadow.unwrap();
        assert_eq!(
            (shadow.policy, ids(shadow.rules)),
            (Policy::Agent, (1..=11).collect())
        );
        let j = judged("[engine.agent_policy]\nmode = \"observe\"\nrules = { 5 = \"enforce\" }\n")
            .unwrap();
        assert_eq!(ids(j.in_force.rules), [5]);
        assert_eq!(ids(j.shadow.unwrap().rules), all);
        assert_eq!(j.in_force.stall_window, None, "rule 7 in observe");
        assert_eq!(j.shadow.unwrap().stall_window, Some(AGENT_STALL_WINDOW));
        let j = judged("[engine.agent_policy]\nmode = \"off\"\n").unwrap();
        assert_eq!((ids(j.in_force.rules), j.shadow), (vec![], None));
    }

    // `shadow_policy` beside the policy in force, either way round; the reference's shadow
    // reads `[engine.qos]` without the agent's preset, the agent's shadow with it.
    #[test]
    fn a_shadow_policy_sits_beside_the_policy_in_force_either_way_round() {
        let j = judged("policy = \"reference\"\nshadow_policy = \"agent\"\n").unwrap();
        assert_eq!(
            (j.in_force.policy, ids(j.in_force.rules)),
            (Policy::Reference, vec![])
        );
        let shadow = j.shadow.unwrap();
        assert_eq!(ids(shadow.rules), (1..=12).collect::<Vec<_>>());
        assert_eq!(shadow.stall_window, Some(AGENT_STALL_WINDOW));
        let j = judged("shadow_policy = \"reference\"\n").unwrap();
        assert_eq!(j.in_force.policy, Policy::Agent);
        let shadow = j.shadow.unwrap();
        assert_eq!(
            (shadow.policy, ids(shadow.rules), shadow.stall_window),
            (Policy::Reference, vec![], None)
        );
        let j = judged("policy = \"reference\"\nshadow_policy = \"agent\"\n[engine.agent_policy]\nrules = { qos_eviction = \"off\" }\n").unwrap();
        assert!(!j.shadow.unwrap().applies(9));
    }

    // Each wrong combination names the key and what to do.
    #[test]
    fn a_rule_that_does_not_exist_or_a_shadow_that_cannot_be_is_refused_with_its_key() {
        let e =
            judged("[engine.agent_policy]\nrules = { no_such_rule = \"observe\" }\n").unwrap_err();
        assert!(
            e.contains("agent_policy.rules.no_such_rule") && e.contains("11 no_sign_of_life"),
            "{e}"
        );
        let e = judged("[engine.agent_policy]\nrules = { 13 = \"off\" }\n").unwrap_err();
        assert!(e.contains("rules.13"), "{e}");
        let e = judged("[engine.agent_policy]\nrules = { 5 = \"maybe\" }\n").unwrap_err();
        assert!(e.contains("maybe") && e.contains("observe"), "{e}");
        let e = judged("shadow_policy = \"agent\"\n").unwrap_err();
        assert!(
            e.contains("shadow_policy") && e.contains("must differ"),
            "{e}"
        );
        let e =
            judged("shadow_policy = \"reference\"\n[engine.agent_policy]\nmode = \"observe\"\n")
                .unwrap_err();
        assert!(e.contains("shadow_policy") && e.contains("observe"), "{e}");
    }
}
