//! The experiment file of the chaos suite: YAML, a list of experiments (at the top level or
//! under `experiments:`, as in the seed), each naming a fault to inject into a stack of real
//! processes, the load to run meanwhile, optional guards, and what the agent must conclude.
//! Parsing validates everything up front and names the experiment and the key of any error;
//! the format is documented in `docs/chaos.md`.

use serde::Deserialize;
use std::fmt;
use std::time::Duration;

mod parse;
pub use parse::parse;

/// What part of the inference path an experiment aims at (documentation and reporting; the
/// fault decides what is injected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    #[serde(alias = "prefill_stage")]
    Prefill,
    #[serde(alias = "decode_stage")]
    Decode,
    #[serde(alias = "kv_cache_manager")]
    KvCache,
    Engine,
    Driver,
    Network,
    Host,
    /// The agent itself (its process: restarted, crashed, upgraded, stopped for a while).
    Agent,
}

/// A fault, parsed from its name (`network_latency_50ms`, `cpu_stress_30pct`, …).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// A TCP proxy between every client (load, agent) and the engine delays each chunk.
    NetworkLatency(Duration),
    /// Busy threads on this machine, `pct` of every core (the agent's included).
    CpuStress(u8),
    /// The engine reports this much more KV-cache usage (percentage points).
    MemoryPressure(u8),
    /// The engine pauses (completions wait, `/health` answers 503) this long.
    HotReload(Duration),
    /// This many extra SSE streams held open for the whole fault window.
    LongStreams(u32),
    /// Random extra latency per decoded token, up to this.
    BatchJitter(Duration),
    /// `/health` answers after this long.
    SlowHealth(Duration),
    /// Completions accepted and never answered, the NPU idle.
    EngineHang,
    /// The engine process is killed.
    EngineCrash,
    /// The engine's process is stopped (SIGSTOP) for the fault window, then continued
    /// (SIGCONT): it answers nothing meanwhile (a real engine: its API server).
    EngineStop,
    /// Requests hang, AI Cube at 0 %, HBM full.
    NpuHangIdle,
    /// AI Cube ≥ 90 %, requests running, no token produced.
    NpuBusyStuck,
    /// Every DCMI AI Cube read returns an error code.
    DriverError,
    /// DCMI AI Cube reads block.
    DriverHang,
    /// Completions answer HTTP 500.
    Http5xx,
    /// vLLM's sleep mode for the experiment's duration: `engine_sleep_state` says so,
    /// completions wait, `/health` answers.
    EngineSleep,
    /// One request prefills a long prompt this long, with nothing else decoding (chunked
    /// prefill, vLLM's default: the KV-cache usage grows chunk by chunk).
    LongPrefill(Duration),
    /// The same in one engine step, chunked prefill off: nothing moves until it ends.
    LongPrefillUnchunked(Duration),
    /// This many extra streams opened within 1 s (0 to saturation), the KV cache near full.
    Burst(u32),
    /// `/health` answers after the first duration, and the network adds the second.
    SlowHealthWithLatency(Duration, Duration),
    /// The engine restarts under its own supervisor: its port is closed for this long, then
    /// it serves again with fresh counters.
    EngineRestart(Duration),
    /// A degraded engine: every completion this much later (time to first token past its
    /// budget) and the KV cache at 97 %, tokens still flowing: the QoS level `degrade`.
    Degraded(Duration),
    /// An engine slow to answer for a while: every completion waits a time drawn between the
    /// two before it runs (nothing running meanwhile, its NPU idle), tokens as usual.
    SlowAnswers(Duration, Duration),
    /// The agent is restarted: SIGTERM, then started again at once (`systemctl restart`).
    AgentRestart,
    /// The agent is killed (SIGKILL) and started again after the shipped unit's
    /// `RestartSec=` (`Restart=on-failure`).
    AgentCrash,
    /// A second agent starts beside the first with the same config and state directory
    /// and takes over (the Kubernetes rolling update); the first exits by itself.
    AgentUpgrade,
    /// The agent is stopped, nothing runs for this long, then it starts again (a DaemonSet
    /// update with `maxSurge: 0`).
    AgentOutage(Duration),
    /// Only the experiment's `driver_codes`: the driver reports them, the engine is fine.
    NpuFaultCode,
    /// The engine compiles a new shape for this long, then serves again (ai-dynamo/dynamo PR
    /// #14735: 30–70 s): `/health` 200, no token, new requests queue, the scheduler's figures
    /// as they were, the NPU idle, one host core busy compiling.
    CompileStall(Duration),
    /// The engine at `max_num_seqs` for this long (gonka-ai/gonka PR #1421): every slot
    /// running, a queue waiting, tokens slower, `/health` answering.
    Saturation(Duration),
}

impl Fault {
    /// Parses a fault name; the error lists the known forms.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let known = "known: network_latency_<N>ms, cpu_stress_<N>pct, memory_pressure_<N>pct, hot_reload_<N>s, long_streams_<N>, batch_jitter_<N>ms, slow_health_<N>s, slow_health_<N>s_latency_<M>ms, slow_answers_<MIN>_<MAX>ms, long_prefill_<N>s, long_prefill_unchunked_<N>s, burst_<N>, engine_restart_<N>s, degraded_<N>ms, agent_outage_<N>s, compile_stall_<N>s, saturation_<N>m, engine_sleep, engine_hang, engine_crash, npu_hang_idle, npu_busy_stuck, driver_error, driver_hang, http_5xx, agent_restart, agent_crash, agent_upgrade, npu_fault_code";
        if let Some(f) = Fault::fixed(s) {
            return Ok(f);
        }
        // Before `slow_health_<N>s`, which would read its number as `<N>s_latency_<M>m`.
        if let Some(f) = Fault::slow_health_with_latency(s) {
            return f;
        }
        if let Some(f) = Fault::slow_answers(s) {
            return f;
        }
        Fault::with_number(s).unwrap_or_else(|| Err(format!("unknown fault {s:?} ({known})")))
    }

    /// The faults named by a word alone.
    fn fixed(s: &str) -> Option<Fault> {
        Some(match s {
            "engine_hang" => Fault::EngineHang,
            "engine_crash" => Fault::EngineCrash,
            "engine_stop" => Fault::EngineStop,
            "npu_hang_idle" => Fault::NpuHangIdle,
            "npu_busy_stuck" => Fault::NpuBusyStuck,
            "driver_error" => Fault::DriverError,
            "driver_hang" => Fault::DriverHang,
            "http_5xx" => Fault::Http5xx,
            "engine_sleep" => Fault::EngineSleep,
            "agent_restart" => Fault::AgentRestart,
            "agent_crash" => Fault::AgentCrash,
            "agent_upgrade" => Fault::AgentUpgrade,
            "npu_fault_code" => Fault::NpuFaultCode,
            _ => return None,
        })
    }

    /// `slow_health_<N>s_latency_<M>ms`, if `s` has that shape.
    fn slow_health_with_latency(s: &str) -> Option<Result<Fault, String>> {
        let (health, latency) = s.strip_prefix("slow_health_")?.split_once("s_latency_")?;
        let whole = |n: &str| {
            n.parse::<u64>()
                .map_err(|_| format!("{s:?}: {n:?} is not a whole number"))
        };
        let Some(latency) = latency.strip_suffix("ms") else {
            return Some(Err(format!("{s:?}: the latency ends in ms")));
        };
        Some(whole(health).and_then(|h| {
            Ok(Fault::SlowHealthWithLatency(
                Duration::from_secs(h),
                Duration::from_millis(whole(latency)?),
            ))
        }))
    }

    /// `slow_answers_<MIN>_<MAX>ms`, if `s` has that shape.
    fn slow_answers(s: &str) -> Option<Result<Fault, String>> {
        let range = s.strip_prefix("slow_answers_")?;
        let Some((min, max)) = range.strip_suffix("ms").and_then(|r| r.split_once('_')) else {
            return Some(Err(format!(
                "{s:?}: expected slow_answers_<MIN>_<MAX>ms, e.g. slow_answers_2000_3000ms"
            )));
        };
        let whole = |n: &str| {
            n.parse::<u64>()
                .map_err(|_| format!("{s:?}: {n:?} is not a whole number"))
        };
        Some(whole(min).and_then(|min| {
            let max = whole(max)?;
            if min > max {
                return Err(format!("{s:?}: the least delay is above the most"));
            }
            Ok(Fault::SlowAnswers(
                Duration::from_millis(min),
                Duration::from_millis(max),
            ))
        }))
    }

    /// The faults of one number, `<prefix><N><unit>`, if `s` has one of their shapes.
    fn with_number(s: &str) -> Option<Result<Fault, String>> {
        let pct = |n: u64| -> Result<u8, String> {
            if (1..=100).contains(&n) {
                Ok(n as u8)
            } else {
                Err(format!("{s:?}: the percentage must be 1..=100"))
            }
        };
        let count = |n: u64| -> Result<u32, String> {
            if n == 0 || n > 10_000 {
                Err(format!("{s:?}: the stream count must be 1..=10000"))
            } else {
                Ok(n as u32)
            }
        };
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        type Make<'a> = &'a dyn Fn(u64) -> Result<Fault, String>;
        let forms: [(&str, &str, Make); 15] = [
            ("network_latency_", "ms", &|n| {
                Ok(Fault::NetworkLatency(ms(n)))
            }),
            ("cpu_stress_", "pct", &|n| pct(n).map(Fault::CpuStress)),
            ("memory_pressure_", "pct", &|n| {
                pct(n).map(Fault::MemoryPressure)
            }),
            ("hot_reload_", "s", &|n| Ok(Fault::HotReload(secs(n)))),
            ("long_streams_", "", &|n| count(n).map(Fault::LongStreams)),
            ("batch_jitter_", "ms", &|n| Ok(Fault::BatchJitter(ms(n)))),
            ("slow_health_", "s", &|n| Ok(Fault::SlowHealth(secs(n)))),
            // (Before `long_prefill_`, whose prefix it shares.)
            ("long_prefill_unchunked_", "s", &|n| {
                Ok(Fault::LongPrefillUnchunked(secs(n)))
            }),
            ("long_prefill_", "s", &|n| Ok(Fault::LongPrefill(secs(n)))),
            ("degraded_", "ms", &|n| Ok(Fault::Degraded(ms(n)))),
            ("engine_restart_", "s", &|n| {
                Ok(Fault::EngineRestart(secs(n)))
            }),
            ("agent_outage_", "s", &|n| match n {
                0 => Err(format!("{s:?}: the outage lasts at least 1 s")),
                n => Ok(Fault::AgentOutage(secs(n))),
            }),
            ("burst_", "", &|n| count(n).map(Fault::Burst)),
            ("compile_stall_", "s", &|n| match n {
                1..=600 => Ok(Fault::CompileStall(secs(n))),
                _ => Err(format!("{s:?}: a compile stall lasts 1..=600 s")),
            }),
            ("saturation_", "m", &|n| match n {
                1..=60 => Ok(Fault::Saturation(secs(60 * n))),
                _ => Err(format!("{s:?}: a saturation lasts 1..=60 minutes")),
            }),
        ];
        forms.into_iter().find_map(|(prefix, unit, make)| {
            let n = s.strip_prefix(prefix)?.strip_suffix(unit)?;
            Some(
                n.parse::<u64>()
                    .map_err(|_| format!("{s:?}: {n:?} is not a whole number"))
                    .and_then(make),
            )
        })
    }
}

impl Fault {
    /// A fault of the agent's own process (the engine stays healthy throughout).
    pub fn is_agent_fault(self) -> bool {
        matches!(
            self,
            Fault::AgentRestart | Fault::AgentCrash | Fault::AgentUpgrade | Fault::AgentOutage(_)
        )
    }

    /// A fault of the driver under the engine's NPUs (failed or hung reads), which the agent
    /// reports but the engine does not feel.
    pub fn is_driver_fault(self) -> bool {
        matches!(self, Fault::DriverError | Fault::DriverHang)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::NetworkLatency(d) => write!(f, "network_latency_{}ms", d.as_millis()),
            Fault::CpuStress(p) => write!(f, "cpu_stress_{p}pct"),
            Fault::MemoryPressure(p) => write!(f, "memory_pressure_{p}pct"),
            Fault::HotReload(d) => write!(f, "hot_reload_{}s", d.as_secs()),
            Fault::LongStreams(n) => write!(f, "long_streams_{n}"),
            Fault::BatchJitter(d) => write!(f, "batch_jitter_{}ms", d.as_millis()),
            Fault::SlowHealth(d) => write!(f, "slow_health_{}s", d.as_secs()),
            Fault::EngineHang => f.write_str("engine_hang"),
            Fault::EngineCrash => f.write_str("engine_crash"),
            Fault::EngineStop => f.write_str("engine_stop"),
            Fault::NpuHangIdle => f.write_str("npu_hang_idle"),
            Fault::NpuBusyStuck => f.write_str("npu_busy_stuck"),
            Fault::DriverError => f.write_str("driver_error"),
            Fault::DriverHang => f.write_str("driver_hang"),
            Fault::Http5xx => f.write_str("http_5xx"),
            Fault::EngineSleep => f.write_str("engine_sleep"),
            Fault::LongPrefill(d) => write!(f, "long_prefill_{}s", d.as_secs()),
            Fault::LongPrefillUnchunked(d) => {
                write!(f, "long_prefill_unchunked_{}s", d.as_secs())
            }
            Fault::Burst(n) => write!(f, "burst_{n}"),
            Fault::SlowHealthWithLatency(h, l) => {
                write!(
                    f,
                    "slow_health_{}s_latency_{}ms",
                    h.as_secs(),
                    l.as_millis()
                )
            }
            Fault::EngineRestart(d) => write!(f, "engine_restart_{}s", d.as_secs()),
            Fault::Degraded(d) => write!(f, "degraded_{}ms", d.as_millis()),
            Fault::SlowAnswers(min, max) => {
                write!(f, "slow_answers_{}_{}ms", min.as_millis(), max.as_millis())
            }
            Fault::AgentRestart => f.write_str("agent_restart"),
            Fault::AgentCrash => f.write_str("agent_crash"),
            Fault::AgentUpgrade => f.write_str("agent_upgrade"),
            Fault::AgentOutage(d) => write!(f, "agent_outage_{}s", d.as_secs()),
            Fault::NpuFaultCode => f.write_str("npu_fault_code"),
            Fault::CompileStall(d) => write!(f, "compile_stall_{}s", d.as_secs()),
            Fault::Saturation(d) => write!(f, "saturation_{}m", d.as_secs() / 60),
        }
    }
}

/// A guard, evaluated continuously while the experiment runs. A tripped guard stops (or
/// holds back) the injection and is reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Guard {
    /// Do not inject (or stop injecting) while the engine's queue is deeper than this
    /// (`vllm:num_requests_waiting`).
    SkipIfQueueDepth(u64),
    /// Stop injecting once the agent's QoS score falls below this.
    AbortIfHealth(f64),
    /// Stop injecting once the load has produced this many tokens under the fault.
    LimitAffectedTokens(u64),
}

impl Guard {
    /// Parses `skip_if_queue_depth > 10`, `abort_if_health < 0.5`, `limit_affected_tokens
    /// 4096` (the comparison may be left out; when given it must be the one shown).
    pub fn parse(s: &str) -> Result<Guard, String> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let (name, op, value) = match words.as_slice() {
            [name, value] => (*name, None, *value),
            [name, op, value] => (*name, Some(*op), *value),
            _ => {
                return Err(format!(
                    "guard {s:?}: expected `<name> [<comparison>] <value>`, e.g. `skip_if_queue_depth > 10`"
                ));
            }
        };
        let check_op = |want: &str| -> Result<(), String> {
            match op {
                None => Ok(()),
                Some(o) if o == want => Ok(()),
                Some(o) => Err(format!("guard {s:?}: {name} takes `{want}`, not `{o}`")),
            }
        };
        let whole = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("guard {s:?}: {v:?} is not a whole number"))
        };
        match name {
            "skip_if_queue_depth" => {
                check_op(">")?;
                Ok(Guard::SkipIfQueueDepth(whole(value)?))
            }
            "abort_if_health" => {
                check_op("<")?;
                let x: f64 = value
                    .parse()
                    .map_err(|_| format!("guard {s:?}: {value:?} is not a number"))?;
                if !(0.0..=1.0).contains(&x) {
                    return Err(format!("guard {s:?}: the health score is in [0, 1]"));
                }
                Ok(Guard::AbortIfHealth(x))
            }
            "limit_affected_tokens" => {
                check_op("<=")?;
                Ok(Guard::LimitAffectedTokens(whole(value)?))
            }
            other => Err(format!(
                "guard {s:?}: unknown guard {other:?} (known: skip_if_queue_depth, abort_if_health, limit_affected_tokens)"
            )),
        }
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::SkipIfQueueDepth(n) => write!(f, "skip_if_queue_depth > {n}"),
            Guard::AbortIfHealth(x) => write!(f, "abort_if_health < {x}"),
            Guard::LimitAffectedTokens(n) => write!(f, "limit_affected_tokens {n}"),
        }
    }
}

/// What the agent must conclude.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// No kill, ever (a benign experiment).
    Healthy,
    /// The fault is detected within this long after the injection starts.
    DetectWithin(Duration),
}

/// What the kubelet emulator must do (`kubelet:` in the file; by default `restart` for an
/// engine fault, `not_ready` for the engine's own restart, `no_restart` otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeletExpect {
    /// The liveness probe restarts the engine (or the kubelet restarts a container that
    /// exited) within the detection time.
    Restart,
    /// The readiness probe takes the engine out of its Service (no restart) while the fault
    /// lasts (`detect_within` of a fault; the fault's duration for a benign experiment).
    NotReady,
    /// No restart (readiness may move).
    NoRestart,
}

/// Load run for the whole experiment.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Load {
    /// Concurrent streaming clients, each sending streams back to back.
    #[serde(default = "Load::default_streams")]
    pub streams: u32,
    /// Plain (non-streamed) completions per second, spread evenly.
    #[serde(default = "Load::default_rate")]
    pub rate: f64,
    /// Prompt size of each request, in tokens (the fake engine counts 4 characters a token).
    #[serde(default = "Load::default_prompt_tokens")]
    pub prompt_tokens: u32,
    /// Tokens asked for per request.
    #[serde(default = "Load::default_max_tokens")]
    pub max_tokens: u32,
}

impl Load {
    fn default_streams() -> u32 {
        4
    }
    fn default_rate() -> f64 {
        2.0
    }
    fn default_prompt_tokens() -> u32 {
        256
    }
    fn default_max_tokens() -> u32 {
        64
    }
}

impl Default for Load {
    fn default() -> Self {
        Load {
            streams: Load::default_streams(),
            rate: Load::default_rate(),
            prompt_tokens: Load::default_prompt_tokens(),
            max_tokens: Load::default_max_tokens(),
        }
    }
}

/// One validated experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    pub name: String,
    pub target: Target,
    pub fault: Fault,
    /// How long the fault is injected.
    pub duration: Duration,
    pub load: Load,
    pub guards: Vec<Guard>,
    pub expect: Expect,
    /// Only the agent policy (stall detection, QoS eviction) is expected to detect the
    /// fault; the reference and MindIE's engine server cannot by design (`expect:
    /// {detect_within: …, policy: agent}`).
    pub agent_policy_only: bool,
    /// Node Manager can act on the fault only at this heartbeat or faster (whole seconds;
    /// `expect: {…, max_nm_heartbeat: 1s}`): a slower one needs more consecutive abnormal
    /// time than the fault lasts. At a slower cadence a miss is not detectable by design.
    pub max_nm_heartbeat_s: Option<u64>,
    /// `policy@row` runs whose false kill (or, under the kubelet, false restart) is that
    /// policy's known behaviour, measured and reported, not a failure of the run
    /// (`known_false_kill: [reference@1s, reference@kubelet]`: MindIE V5 takes a hot reload's
    /// 503 `/health` as abnormal at once). The row is a heartbeat (`1s`) or `kubelet`.
    pub known_false_kills: Vec<(String, String)>,
    /// What the kubelet emulator must do.
    pub kubelet: KubeletExpect,
    /// Fault codes the (fake) driver reports on the engine's NPUs while the fault is
    /// injected (`driver_codes: ["80E18402"]`, hex as MindCluster's faultCode.json writes
    /// them); with any fault, and alone with `npu_fault_code`.
    pub driver_codes: Vec<u32>,
    /// How many times the fault comes back (`repeat: 3`, default 1): after each of Node
    /// Manager's kills the runner restarts the engine, waits until it is healthy again and
    /// injects the fault once more. Issue 50's `repeated_hang`, which must escalate as a
    /// restart loop at the agent's `escalate_after`-th episode.
    pub repeat: u32,
}
