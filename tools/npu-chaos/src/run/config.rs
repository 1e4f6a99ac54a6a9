//! The agent's config for one experiment (its policy's durations scaled). (The fake engine's
//! speed, main and draft alike, is [`crate::timescale::fake_engine_speed`].)

use super::options::{EngineKind, Policy};
use crate::timescale::{fmt_duration, scaled};
use std::time::Duration;

/// The `/health` timeout of the agent in front of a real engine: the reference's 5 s,
/// unscaled. It bounds how long the real engine's API server takes to answer, which
/// compressing the experiment does not shorten (as Node Manager's poll timeout bounds the
/// agent's). Scaled to 1 s at 0.2, the reference's `/health` check, which is `abnormal` at
/// once, timed out 3 times in a row on a real vLLM serving 16 long streams on 2 cores (a
/// busy loop beside it) and decided a false kill. No detection depends on it: a hung
/// EngineCore leaves `/health` answering 200, and a crashed one refuses the connection.
pub(super) const REAL_ENGINE_HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The least floor of the learned probe timeout at any scale (rule 12): what it guards
/// against, an answer slowed by a loaded machine, takes real time.
const LEARNED_FLOOR_MIN: Duration = Duration::from_millis(100);

/// The `[engine.qos]` and `[engine.agent_policy]` keys of `policy` for `engine`, durations
/// through `d` (scaled). Under `agent` the preset turns stall detection and QoS eviction on;
/// its durations are written here only because they are scaled. `agent-observe` and
/// `reference-shadow` get `agent`'s keys, so that their shadow is the policy the `agent` row
/// runs: `stall_detection` and `eviction` are left out (written keys win), so the agent
/// preset turns them on in the shadow while the reference in force leaves them off.
fn policy_keys(
    policy: Policy,
    engine: EngineKind,
    scale: f64,
    d: &dyn Fn(f64, npu_health_agent::config::bounds::Within<Duration>) -> String,
) -> String {
    use npu_health_agent::config::qos::bounds as q;
    match policy.agent_runs() {
        // (MindIE's peer does not run the agent: this config is written and not used. The
        // peer health checks' rows run it as `reference`: `agent_runs` says so.)
        Policy::Reference
        | Policy::Mindie
        | Policy::K8sLiveness
        | Policy::DynamoCanary
        | Policy::SglangHealthGenerate
        | Policy::TokenHeartbeat
        | Policy::EnginePing => "stall_detection = false\neviction = false\n".to_owned(),
        Policy::Agent | Policy::AgentBefore40 | Policy::AgentObserve | Policy::ReferenceShadow => {
            use npu_health_agent::config::policy::bounds as p;
            use npu_health_agent::config::policy::{AGENT_STALL_WINDOW, AgentPolicy};
            let a = AgentPolicy::default();
            // A real engine's hangs are emulated by stopping its EngineCore (SIGSTOP): the
            // stopped-process rule would catch the emulation, not the hang it stands for, so
            // it is off there and those rows keep measuring the hang's own evidence.
            let stopped = match (engine, policy) {
                (EngineKind::Vllm, _) | (_, Policy::AgentBefore40) => {
                    "stopped_process_grace = \"0s\"\n"
                }
                _ => "",
            };
            // Issue 40's evidence: off for the "before" column; else the window scaled, and
            // the learned timeout's floor scaled but at least 100 ms, since what it guards
            // against (a slow answer on a loaded machine) is not compressed by the scale.
            let evidence = match policy {
                Policy::AgentBefore40 => {
                    "progress_window = \"0s\"\nlearned_timeout_floor = \"0s\"\n".to_owned()
                }
                _ => format!(
                    "progress_window = \"{}\"\nlearned_timeout_floor = \"{}\"\n",
                    d(a.progress_window.as_secs_f64(), p::PROGRESS_WINDOW),
                    fmt_duration(
                        Duration::from_secs_f64(a.learned_timeout_floor.as_secs_f64() * scale)
                            .max(LEARNED_FLOOR_MIN)
                    ),
                ),
            };
            // Every rule observed: `/status` is the reference's, the shadow the agent policy.
            let mode = match policy {
                Policy::AgentObserve => "mode = \"observe\"\n",
                _ => "",
            };
            format!(
                "stall_window = \"{}\"\n[engine.agent_policy]\n{mode}health_failure_grace = \"{}\"\nconfirm_interval = \"{}\"\nconfirm_timeout = \"{}\"\n{stopped}{evidence}",
                d(AGENT_STALL_WINDOW.as_secs_f64(), q::STALL_WINDOW),
                d(
                    a.health_failure_grace.as_secs_f64(),
                    p::HEALTH_FAILURE_GRACE
                ),
                d(a.confirm_interval.as_secs_f64(), p::CONFIRM_INTERVAL),
                d(a.confirm_timeout.as_secs_f64(), p::CONFIRM_TIMEOUT),
            )
        }
    }
}

/// The agent's config for one experiment.
pub(super) fn agent_toml(
    engine_port: u16,
    mgmt_port: u16,
    devices: usize,
    policy: Policy,
    s: f64,
    engine: EngineKind,
    model: &str,
) -> String {
    use npu_health_agent::config::qos::bounds as q;
    use npu_health_agent::config::timing::bounds as e;
    // Scaled, and kept within the agent's bounds (a very small scale would leave them).
    let d = |secs: f64, within: npu_health_agent::config::bounds::Within<Duration>| {
        fmt_duration(within.clamp(Duration::from_secs_f64(secs * s)))
    };
    let ids: Vec<String> = (0..devices).map(|i| i.to_string()).collect();
    let policy_keys = policy_keys(policy, engine, s, &d);
    format!(
        r#"[agent]
sample_period = "{sample}"
driver_call_deadline = "{deadline}"
fault_period = "{faults}"
policy = "{policy}"
{shadow}
[[engine]]
name = "chaos"
engine_type = "vllm"
served_model_name = "{model}"
host = "127.0.0.1"
port = {engine_port}
mgmt_port = {mgmt_port}
devices = [{ids}]
engine_env = {{ ASCEND_GLOBAL_LOG_LEVEL = "3" }}
[engine.health_check_config]
enable_virtual_inference = true
[engine.timing]
warmup_timeout = "{warmup}"
request_timeout = "{request}"
window = "{window}"
interval = "{interval}"
high_load_interval = "{high}"
health_period = "{health}"
health_timeout = "{health_timeout}"
[engine.qos]
period = "{qos_period}"
metrics_period = "{qos_period}"
max_input_age = "{max_age}"
ttft_budget = "{ttft_budget}"
{policy_keys}"#,
        policy = match policy.agent_runs() {
            Policy::Agent | Policy::AgentBefore40 | Policy::AgentObserve => "agent",
            _ => "reference",
        },
        shadow = match policy {
            Policy::ReferenceShadow => "shadow_policy = \"agent\"\n",
            _ => "",
        },
        sample = fmt_duration(scaled(Duration::from_millis(50), s).max(Duration::from_millis(10))),
        deadline = fmt_duration(scaled(Duration::from_secs(1), s).max(Duration::from_millis(20))),
        faults = fmt_duration(scaled(Duration::from_secs(1), s).max(Duration::from_millis(10))),
        ids = ids.join(", "),
        warmup = d(180.0, e::WARMUP_TIMEOUT),
        request = d(5.0, e::REQUEST_TIMEOUT),
        window = d(5.0, e::WINDOW),
        interval = d(5.0, e::INTERVAL),
        high = d(20.0, e::HIGH_LOAD_INTERVAL),
        health = d(1.0, e::HEALTH_PERIOD),
        health_timeout = match engine {
            EngineKind::Vllm => fmt_duration(REAL_ENGINE_HEALTH_TIMEOUT),
            EngineKind::Fake => d(5.0, e::HEALTH_TIMEOUT),
        },
        qos_period = d(5.0, q::PERIOD),
        max_age = d(60.0, q::MAX_INPUT_AGE),
        ttft_budget = d(2.0, q::TTFT_BUDGET),
    )
}

#[cfg(test)]
mod tests {
    use super::agent_toml;
    use crate::run::options::{EngineKind, Policy};
    use std::path::Path;

    /// The engine config the agent reads from `policy`'s file.
    fn engine(policy: Policy) -> npu_health_agent::config::EngineSpec {
        let text = agent_toml(8000, 8001, 2, policy, 0.1, EngineKind::Fake, "m");
        let cfg = npu_health_agent::config::file::parse(&text, Path::new("agent.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        cfg.engines.into_iter().next().unwrap()
    }

    // Both shadow rows answer `/status` by the reference (no rule of the agent policy in
    // force), and their shadow is exactly the judging the `agent` row runs: the same rules,
    // the same stall window. (Writing `stall_detection = false` for `reference-shadow`, as
    // `reference` does, leaves rule 7 and 9 out of its shadow and fails here.)
    #[test]
    fn the_shadow_rows_answer_by_the_reference_and_shadow_the_agent_row() {
        let agent = engine(Policy::Agent).judging.in_force;
        let reference = engine(Policy::Reference).judging.in_force;
        assert!(engine(Policy::Agent).judging.shadow.is_none());
        for policy in [Policy::AgentObserve, Policy::ReferenceShadow] {
            let e = engine(policy);
            assert_eq!(
                e.judging.in_force.rules.ids().collect::<Vec<_>>(),
                reference.rules.ids().collect::<Vec<_>>(),
                "{policy:?}: /status by the reference's rules"
            );
            let shadow = e
                .judging
                .shadow
                .unwrap_or_else(|| panic!("{policy:?}: no shadow"));
            assert_eq!(
                shadow.rules.ids().collect::<Vec<_>>(),
                agent.rules.ids().collect::<Vec<_>>(),
                "{policy:?}"
            );
            assert_eq!(shadow.stall_window, agent.stall_window, "{policy:?}");
            assert_eq!(
                e.agent_policy.confirm_interval,
                engine(Policy::Agent).agent_policy.confirm_interval
            );
        }
    }
}
