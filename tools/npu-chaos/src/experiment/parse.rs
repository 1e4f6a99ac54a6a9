//! Reading an experiment file: the YAML's raw shape, then every key checked and turned into
//! an [`Experiment`], with errors that name the experiment and the key.

use super::{Expect, Experiment, Fault, Guard, KubeletExpect, Load, Target};
use serde::Deserialize;
use std::time::Duration;

#[derive(Deserialize)]
#[serde(untagged)]
enum File {
    Wrapped {
        experiments: Vec<serde_yaml_ng::Value>,
    },
    List(Vec<serde_yaml_ng::Value>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: String,
    target: Target,
    fault: String,
    duration: String,
    #[serde(default)]
    load: Load,
    #[serde(default)]
    guard: Option<OneOrMany>,
    expect: RawExpect,
    #[serde(default)]
    known_false_kill: Vec<String>,
    #[serde(default)]
    kubelet: Option<KubeletExpect>,
    #[serde(default)]
    driver_codes: Vec<String>,
    #[serde(default)]
    repeat: Option<u32>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawExpect {
    Word(String),
    Detect(RawDetect),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDetect {
    detect_within: String,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    max_nm_heartbeat: Option<String>,
}

fn parse_duration(key: &str, s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{key}: {s:?} is not a duration like \"30s\": {e}"))?;
    if d.is_zero() {
        return Err(format!("{key}: must be above zero"));
    }
    Ok(d)
}

/// Parses and validates an experiment file; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Vec<Experiment>, String> {
    let doc: File = serde_yaml_ng::from_str(text).map_err(|e| {
        format!("{file}: expected a list of experiments (or `experiments:` with one): {e}")
    })?;
    let raws = match doc {
        File::Wrapped { experiments } | File::List(experiments) => experiments,
    };
    if raws.is_empty() {
        return Err(format!("{file}: no experiment"));
    }
    let mut out: Vec<Experiment> = Vec::with_capacity(raws.len());
    for (i, v) in raws.into_iter().enumerate() {
        let label = v
            .get("name")
            .and_then(|n| n.as_str())
            .map_or_else(|| format!("#{}", i + 1), |n| format!("#{} ({n})", i + 1));
        let e = serde_yaml_ng::from_value(v)
            .map_err(|e| e.to_string())
            .and_then(|raw| experiment(raw, &out))
            .map_err(|e| format!("{file}: experiment {label}: {e}"))?;
        out.push(e);
    }
    Ok(out)
}

/// One experiment, every key checked in the file's order of concern; `earlier` are the
/// file's experiments before it. Errors name the key (the caller names the experiment).
fn experiment(raw: RawExperiment, earlier: &[Experiment]) -> Result<Experiment, String> {
    check_name(&raw.name, earlier)?;
    let fault = Fault::parse(&raw.fault).map_err(|e| format!("fault: {e}"))?;
    let driver_codes = driver_codes(&raw.driver_codes, fault)?;
    let duration = parse_duration("duration", &raw.duration)?;
    let known_false_kills = raw
        .known_false_kill
        .iter()
        .map(|k| known_false_kill(k))
        .collect::<Result<Vec<_>, _>>()?;
    let guards = match raw.guard {
        None => Vec::new(),
        Some(OneOrMany::One(g)) => vec![g],
        Some(OneOrMany::Many(g)) => g,
    }
    .iter()
    .map(|g| Guard::parse(g).map_err(|e| format!("guard: {e}")))
    .collect::<Result<Vec<_>, _>>()?;
    let (expect, agent_policy_only, max_nm_heartbeat_s) = expectation(raw.expect)?;
    check_load(&raw.load)?;
    let kubelet = raw.kubelet.unwrap_or(match (expect, fault) {
        (Expect::Healthy, _) => KubeletExpect::NoRestart,
        (_, Fault::DriverError | Fault::DriverHang) => KubeletExpect::NoRestart,
        (_, Fault::EngineRestart(_)) => KubeletExpect::NotReady,
        _ => KubeletExpect::Restart,
    });
    if expect == Expect::Healthy && kubelet == KubeletExpect::Restart {
        return Err(
            "kubelet: restart: a benign experiment's engine must not be restarted".to_owned(),
        );
    }
    let repeat = repeat(raw.repeat, fault, expect, &guards, &driver_codes)?;
    Ok(Experiment {
        name: raw.name,
        target: raw.target,
        fault,
        duration,
        load: raw.load,
        guards,
        expect,
        agent_policy_only,
        max_nm_heartbeat_s,
        known_false_kills,
        kubelet,
        driver_codes,
        repeat,
    })
}

/// The most a fault may come back: three episodes show an escalation at the default
/// `escalate_after`, and each round costs a hang, a kill and a restart.
const MAX_REPEAT: u32 = 10;

/// `repeat`: 1 to [`MAX_REPEAT`]; above 1 only for a hang the fake engine takes by a patch
/// and loses when it restarts, expected to be detected, with no guard and no fault code (the
/// rounds inject it whole, one after another).
fn repeat(
    raw: Option<u32>,
    fault: Fault,
    expect: Expect,
    guards: &[Guard],
    codes: &[u32],
) -> Result<u32, String> {
    let n = raw.unwrap_or(1);
    if !(1..=MAX_REPEAT).contains(&n) {
        return Err(format!("repeat: {n} is not within 1..={MAX_REPEAT}"));
    }
    if n == 1 {
        return Ok(n);
    }
    let hang = matches!(
        fault,
        Fault::EngineHang | Fault::NpuHangIdle | Fault::NpuBusyStuck | Fault::Http5xx
    );
    let why = if !hang {
        "only engine_hang, npu_hang_idle, npu_busy_stuck and http_5xx can repeat (a fault the restarted engine no longer has)"
    } else if expect == Expect::Healthy {
        "a repeated fault must be detected: `expect: { detect_within: … }`"
    } else if !guards.is_empty() || !codes.is_empty() {
        "a repeated fault takes no guard and no driver_codes"
    } else {
        return Ok(n);
    };
    Err(format!("repeat: {why}"))
}

/// Names become file names and table cells, so they are plain and unique in the file.
fn check_name(name: &str, earlier: &[Experiment]) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        || name.starts_with('.')
    {
        return Err(
            "name: letters, digits, `_`, `-` and `.` only, not starting with `.`".to_owned(),
        );
    }
    if earlier.iter().any(|e| e.name == name) {
        return Err("name: used twice in the file".to_owned());
    }
    Ok(())
}

/// The NPU fault codes: non-zero 32-bit hex, at most 10, at least one for `npu_fault_code`.
fn driver_codes(codes: &[String], fault: Fault) -> Result<Vec<u32>, String> {
    let codes = codes
        .iter()
        .map(|c| {
            let hex = c
                .strip_prefix("0x")
                .or_else(|| c.strip_prefix("0X"))
                .unwrap_or(c);
            u32::from_str_radix(hex, 16)
                .ok()
                .filter(|v| *v != 0)
                .ok_or_else(|| format!("driver_codes: {c:?} is not a non-zero 32-bit hex code"))
        })
        .collect::<Result<Vec<u32>, String>>()?;
    if codes.len() > 10 {
        return Err("driver_codes: at most 10".to_owned());
    }
    if fault == Fault::NpuFaultCode && codes.is_empty() {
        return Err("driver_codes: npu_fault_code needs at least one code".to_owned());
    }
    Ok(codes)
}

/// `<policy>@<heartbeat>` (whole seconds, written back as `<n>s`) or `<policy>@kubelet`.
fn known_false_kill(k: &str) -> Result<(String, String), String> {
    let parsed = k.split_once('@').and_then(|(p, h)| {
        if p.is_empty() {
            return None;
        }
        if h == "kubelet" {
            return Some((p.to_owned(), h.to_owned()));
        }
        let h = humantime::parse_duration(h).ok()?;
        (h.subsec_nanos() == 0 && !h.is_zero()).then(|| (p.to_owned(), format!("{}s", h.as_secs())))
    });
    parsed.ok_or_else(|| {
        format!(
            "known_false_kill: {k:?}: expected `<policy>@<heartbeat>` or `<policy>@kubelet`, e.g. `reference@1s`"
        )
    })
}

/// `expect:`: what the agent must conclude, whether only the agent's policy is held to it,
/// and the slowest Node Manager heartbeat that can detect it (whole seconds).
fn expectation(raw: RawExpect) -> Result<(Expect, bool, Option<u64>), String> {
    let RawDetect {
        detect_within,
        policy,
        max_nm_heartbeat,
    } = match raw {
        RawExpect::Word(w) if w == "healthy" => return Ok((Expect::Healthy, false, None)),
        RawExpect::Word(w) => {
            return Err(format!(
                "expect: {w:?}: expected `healthy` or `detect_within: <duration>`"
            ));
        }
        RawExpect::Detect(d) => d,
    };
    let mut max_nm_heartbeat_s = None;
    if let Some(h) = max_nm_heartbeat {
        let d = parse_duration("expect.max_nm_heartbeat", &h)?;
        if d.subsec_nanos() != 0 || d.is_zero() {
            return Err(format!(
                "expect.max_nm_heartbeat: {h:?} is not whole seconds"
            ));
        }
        max_nm_heartbeat_s = Some(d.as_secs());
    }
    let expect = Expect::DetectWithin(parse_duration("expect.detect_within", &detect_within)?);
    let agent_policy_only = match policy.as_deref() {
        None | Some("any") => false,
        // `full`: this policy's name before it became `agent`.
        Some("agent" | "full") => true,
        Some(other) => {
            return Err(format!(
                "expect.policy: {other:?}: expected `any` (default) or `agent`"
            ));
        }
    };
    Ok((expect, agent_policy_only, max_nm_heartbeat_s))
}

/// The load's bounds.
fn check_load(l: &Load) -> Result<(), String> {
    if !(l.rate.is_finite() && l.rate >= 0.0 && l.rate <= 1000.0) {
        return Err("load.rate: must be 0..=1000 requests per second".to_owned());
    }
    if l.streams > 2000 {
        return Err("load.streams: at most 2000".to_owned());
    }
    if l.max_tokens == 0 || l.max_tokens > 4096 {
        return Err("load.max_tokens: must be 1..=4096".to_owned());
    }
    if l.prompt_tokens > 100_000 {
        return Err("load.prompt_tokens: at most 100000".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The seed's three experiments, as its file writes them (under `experiments:`).
    const SEED: &str = r#"
experiments:
  - name: prefill_delay
    target: prefill_stage
    fault: network_latency_50ms
    duration: 60s
    guard: skip_if_queue_depth > 10
    expect: healthy
  - name: decode_cpu_contention
    target: decode_stage
    fault: cpu_stress_30pct
    duration: 60s
    guard: abort_if_health < 0.5
    expect: healthy
  - name: kv_cache_eviction
    target: kv_cache_manager
    fault: memory_pressure_20pct
    duration: 60s
    guard: limit_affected_tokens 4096
    load: { streams: 8, rate: 4, prompt_tokens: 1024 }
    expect: healthy
"#;

    // `driver_codes`: hex with or without `0x`; `npu_fault_code` needs one; garbage is an
    // error naming the key.
    #[test]
    fn driver_codes_are_hex_and_npu_fault_code_needs_them() {
        let one = |extra: &str, fault: &str| {
            parse(
                &format!(
                    "- name: a\n  target: driver\n  fault: {fault}\n  duration: 10s\n  expect: healthy\n{extra}"
                ),
                "f.yaml",
            )
        };
        let e = one(
            "  driver_codes: [\"80E18402\", \"0x81078605\"]\n",
            "npu_fault_code",
        )
        .unwrap();
        assert_eq!(e[0].fault, Fault::NpuFaultCode);
        assert_eq!(e[0].driver_codes, [0x80E1_8402, 0x8107_8605]);
        assert_eq!(Fault::NpuFaultCode.to_string(), "npu_fault_code");
        let e = one("  driver_codes: [\"80C98001\"]\n", "engine_hang").unwrap();
        assert_eq!(e[0].driver_codes, [0x80C9_8001]);
        assert!(one("", "engine_hang").unwrap()[0].driver_codes.is_empty());
        let err = one("", "npu_fault_code").unwrap_err();
        assert!(
            err.contains("driver_codes: npu_fault_code needs at least one code"),
            "{err}"
        );
        let err = one("  driver_codes: [\"xyz\"]\n", "engine_hang").unwrap_err();
        assert!(
            err.contains("#1 (a)") && err.contains("\"xyz\" is not a non-zero 32-bit hex code"),
            "{err}"
        );
        let err = one("  driver_codes: [\"1FFFFFFFF\"]\n", "engine_hang").unwrap_err();
        assert!(err.contains("not a non-zero 32-bit hex code"), "{err}");
    }

    #[test]
    fn the_seeds_experiments() {
        let e = parse(SEED, "seed.yaml").unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].target, Target::Prefill);
        assert_eq!(e[0].fault, Fault::NetworkLatency(Duration::from_millis(50)));
        assert_eq!(e[0].guards, vec![Guard::SkipIfQueueDepth(10)]);
        assert_eq!(e[1].fault, Fault::CpuStress(30));
        assert_eq!(e[1].guards, vec![Guard::AbortIfHealth(0.5)]);
        assert_eq!(e[2].target, Target::KvCache);
        assert_eq!(e[2].fault, Fault::MemoryPressure(20));
        assert_eq!(e[2].guards, vec![Guard::LimitAffectedTokens(4096)]);
        assert_eq!(e[2].load.streams, 8);
        assert_eq!(e[2].load.max_tokens, 64, "default filled in");
        assert_eq!(e[0].load, Load::default());
        assert!(e.iter().all(|x| x.expect == Expect::Healthy));
    }

    #[test]
    fn a_bare_list_and_detection() {
        let e = parse(
            "- name: hang\n  target: engine\n  fault: engine_hang\n  duration: 30s\n  expect: { detect_within: 45s }\n  guard: [\"abort_if_health 0.1\"]\n",
            "f.yaml",
        )
        .unwrap();
        assert_eq!(e[0].expect, Expect::DetectWithin(Duration::from_secs(45)));
        assert_eq!(e[0].guards, vec![Guard::AbortIfHealth(0.1)]);
        assert!(!e[0].agent_policy_only);
        let e = parse(
            "- name: stuck\n  target: engine\n  fault: npu_busy_stuck\n  duration: 90s\n  expect: { detect_within: 150s, policy: full }\n",
            "f.yaml",
        )
        .unwrap();
        assert!(e[0].agent_policy_only);
        let e = parse(
            "- name: restart\n  target: engine\n  fault: engine_restart_8s\n  duration: 8s\n  expect: { detect_within: 30s, max_nm_heartbeat: 1s }\n",
            "f.yaml",
        )
        .unwrap();
        assert_eq!(e[0].max_nm_heartbeat_s, Some(1));
        assert_eq!(e[0].fault, Fault::EngineRestart(Duration::from_secs(8)));
        let err = parse(
            "- name: stuck\n  target: engine\n  fault: npu_busy_stuck\n  duration: 90s\n  expect: { detect_within: 150s, policy: best }\n",
            "f.yaml",
        )
        .unwrap_err();
        assert!(err.contains("expect.policy"), "{err}");
        let err = parse(
            "- name: stuck\n  target: engine\n  fault: npu_busy_stuck\n  duration: 90s\n  expect: { detect_within: 150s, polcy: full }\n",
            "f.yaml",
        )
        .unwrap_err();
        assert!(err.contains("stuck"), "a misspelt key is an error: {err}");
    }

    #[test]
    fn every_fault_name_round_trips() {
        for s in [
            "network_latency_100ms",
            "cpu_stress_100pct",
            "memory_pressure_20pct",
            "hot_reload_5s",
            "long_streams_200",
            "batch_jitter_20ms",
            "slow_health_30s",
            "engine_hang",
            "engine_crash",
            "npu_hang_idle",
            "npu_busy_stuck",
            "driver_error",
            "driver_hang",
            "http_5xx",
            "engine_sleep",
            "long_prefill_12s",
            "long_prefill_unchunked_8s",
            "burst_64",
            "slow_health_3s_latency_100ms",
            "engine_restart_8s",
            "degraded_2500ms",
            "slow_answers_2000_3000ms",
            "slow_answers_0_500ms",
            "agent_restart",
            "agent_crash",
            "agent_upgrade",
            "agent_outage_8s",
            "compile_stall_30s",
            "compile_stall_70s",
            "saturation_10m",
        ] {
            assert_eq!(Fault::parse(s).unwrap().to_string(), s);
        }
        for bad in [
            "agent_outage_0s",
            "agent_outage_8",
            "agent_outage_fives",
            "agent_reboot",
            "cpu_stress_0pct",
            "cpu_stress_101pct",
            "network_latency_fastms",
            "long_streams_0",
            "slow_answers_3000_2000ms",
            "slow_answers_2000ms",
            "slow_answers_2s_3s",
            "compile_stall_0s",
            "compile_stall_601s",
            "compile_stall_30",
            "saturation_0m",
            "saturation_61m",
            "saturation_10s",
            "explode",
        ] {
            assert!(Fault::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn guards() {
        assert_eq!(
            Guard::parse("skip_if_queue_depth 10").unwrap(),
            Guard::SkipIfQueueDepth(10)
        );
        assert!(
            Guard::parse("skip_if_queue_depth < 10")
                .unwrap_err()
                .contains("takes `>`")
        );
        assert!(
            Guard::parse("abort_if_health < 1.5")
                .unwrap_err()
                .contains("[0, 1]")
        );
        assert!(
            Guard::parse("retry_if_sad > 1")
                .unwrap_err()
                .contains("unknown guard")
        );
        assert!(Guard::parse("limit_affected_tokens").is_err());
        assert_eq!(
            Guard::parse(&Guard::AbortIfHealth(0.5).to_string()).unwrap(),
            Guard::AbortIfHealth(0.5)
        );
    }

    // Errors name the file, the experiment and the key.
    #[test]
    fn errors_name_the_experiment_and_the_key() {
        let cases = [
            (
                SEED.replace("network_latency_50ms", "network_lag_50ms"),
                "prefill_delay",
                "fault",
            ),
            (
                SEED.replace(
                    "duration: 60s\n    guard: abort",
                    "duration: soon\n    guard: abort",
                ),
                "decode_cpu_contention",
                "duration",
            ),
            (
                SEED.replace("target: kv_cache_manager", "target: gpu"),
                "kv_cache_eviction",
                "unknown variant",
            ),
            (
                SEED.replace(
                    "expect: healthy\n  - name: decode",
                    "expect: fine\n  - name: decode",
                ),
                "prefill_delay",
                "expect",
            ),
            (
                SEED.replace("rate: 4", "rate: -1"),
                "kv_cache_eviction",
                "load.rate",
            ),
            (
                SEED.replace("prompt_tokens: 1024", "prompt_tokns: 1024"),
                "kv_cache_eviction",
                "prompt_tokns",
            ),
            (
                SEED.replace("name: decode_cpu_contention", "name: prefill_delay"),
                "prefill_delay",
                "used twice",
            ),
            (
                SEED.replace("name: decode_cpu_contention", "name: ../escape"),
                "../escape",
                "letters, digits",
            ),
        ];
        for (text, experiment, key) in cases {
            let err = parse(&text, "x.yaml").unwrap_err();
            assert!(err.starts_with("x.yaml: experiment #"), "{err}");
            assert!(
                err.contains(experiment) && err.contains(key),
                "{key}: {err}"
            );
        }
        assert!(parse("[]", "x.yaml").unwrap_err().contains("no experiment"));
        assert!(
            parse("{a: 1}", "x.yaml")
                .unwrap_err()
                .contains("list of experiments")
        );
    }

    // What the kubelet must do: derived from the experiment unless written; `known` rows name
    // a heartbeat or the kubelet; a benign experiment cannot expect a restart.
    #[test]
    fn kubelet_expectations_and_known_rows() {
        let one = |fault: &str, expect: &str, extra: &str| {
            parse(
                &format!(
                    "- name: x\n  target: engine\n  fault: {fault}\n  duration: 10s\n  expect: {expect}\n{extra}"
                ),
                "x.yaml",
            )
        };
        let k = |fault: &str, expect: &str| one(fault, expect, "").unwrap()[0].kubelet;
        assert_eq!(
            k("engine_hang", "{ detect_within: 1m }"),
            KubeletExpect::Restart
        );
        assert_eq!(
            k("engine_crash", "{ detect_within: 1m }"),
            KubeletExpect::Restart
        );
        assert_eq!(
            k("engine_restart_8s", "{ detect_within: 1m }"),
            KubeletExpect::NotReady
        );
        assert_eq!(
            k("driver_hang", "{ detect_within: 1m }"),
            KubeletExpect::NoRestart
        );
        assert_eq!(k("hot_reload_8s", "healthy"), KubeletExpect::NoRestart);
        let e = one(
            "memory_pressure_20pct",
            "healthy",
            "  kubelet: not_ready\n  known_false_kill: [reference@kubelet, agent@3s]\n",
        )
        .unwrap();
        assert_eq!(e[0].kubelet, KubeletExpect::NotReady);
        assert_eq!(
            e[0].known_false_kills,
            [
                ("reference".to_owned(), "kubelet".to_owned()),
                ("agent".to_owned(), "3s".to_owned())
            ]
        );
        let err = one("hot_reload_8s", "healthy", "  kubelet: restart\n").unwrap_err();
        assert!(err.contains("must not be restarted"), "{err}");
        let err = one("hot_reload_8s", "healthy", "  kubelet: reboot\n").unwrap_err();
        assert!(err.contains("unknown variant"), "{err}");
        let err = one(
            "hot_reload_8s",
            "healthy",
            "  known_false_kill: [reference@kublet]\n",
        )
        .unwrap_err();
        assert!(err.contains("<policy>@kubelet"), "{err}");
    }

    // The agent's own faults: a target of their own, a healthy engine expected (so no
    // restart by the kubelet either), and the outage's known false kills.
    #[test]
    fn agent_fault_experiments() {
        let e = parse(
            "- name: out\n  target: agent\n  fault: agent_outage_8s\n  duration: 15s\n  expect: healthy\n  known_false_kill: [reference@1s, agent@1s]\n- name: up\n  target: agent\n  fault: agent_upgrade\n  duration: 15s\n  expect: healthy\n",
            "agent.yaml",
        )
        .unwrap();
        assert_eq!(e[0].target, Target::Agent);
        assert_eq!(e[0].fault, Fault::AgentOutage(Duration::from_secs(8)));
        assert!(e[0].fault.is_agent_fault());
        assert_eq!(e[0].kubelet, KubeletExpect::NoRestart);
        assert_eq!(e[0].known_false_kills.len(), 2);
        assert_eq!(e[1].fault, Fault::AgentUpgrade);
        assert!(!Fault::EngineCrash.is_agent_fault());
    }

    // A driver fault is the driver's alone: neither the engine's nor the agent's.
    #[test]
    fn a_driver_fault_is_neither_the_engines_nor_the_agents() {
        for f in [Fault::DriverError, Fault::DriverHang] {
            assert!(f.is_driver_fault() && !f.is_agent_fault(), "{f}");
        }
        for f in [Fault::EngineHang, Fault::EngineCrash, Fault::AgentCrash] {
            assert!(!f.is_driver_fault(), "{f}");
        }
    }

    // `repeat`: a hang may come back up to 10 times, only a detected one, with no guard or
    // code; anything else is refused naming the key.
    #[test]
    fn a_hang_may_repeat_and_nothing_else_may() {
        let one = |fault: &str, expect: &str, extra: &str| {
            parse(
                &format!(
                    "- name: r\n  target: engine\n  fault: {fault}\n  duration: 60s\n  expect: {expect}\n{extra}"
                ),
                "f.yaml",
            )
        };
        let within = "{ detect_within: 60s }";
        assert_eq!(one("engine_hang", within, "").unwrap()[0].repeat, 1);
        assert_eq!(
            one("engine_hang", within, "  repeat: 3\n").unwrap()[0].repeat,
            3
        );
        assert_eq!(
            one("npu_hang_idle", within, "  repeat: 10\n").unwrap()[0].repeat,
            10
        );
        for (fault, expect, extra, says) in [
            ("engine_hang", within, "  repeat: 0\n", "within 1..=10"),
            ("engine_hang", within, "  repeat: 11\n", "within 1..=10"),
            ("engine_crash", within, "  repeat: 3\n", "only engine_hang"),
            (
                "engine_hang",
                "healthy",
                "  repeat: 3\n",
                "must be detected",
            ),
            (
                "engine_hang",
                within,
                "  repeat: 3\n  guard: skip_if_queue_depth > 10\n",
                "no guard",
            ),
        ] {
            let err = one(fault, expect, extra).unwrap_err();
            assert!(
                err.contains("experiment #1 (r): repeat: ") && err.contains(says),
                "{fault} {extra}: {err}"
            );
        }
    }

    /// Every shipped experiment file parses: a typo in one that only a long CI stage reads
    /// (the real engine, PyMotor) fails here in seconds instead.
    #[test]
    fn every_shipped_experiment_file_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the experiments directory") {
            let path = entry.expect("a directory entry").path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            let name = path.display().to_string();
            let parsed = parse(&text, &name).unwrap_or_else(|e| panic!("{e}"));
            assert!(!parsed.is_empty(), "{name} has no experiment");
            seen += 1;
        }
        assert!(
            seen >= 6,
            "only {seen} experiment files under {}",
            dir.display()
        );
    }
}
