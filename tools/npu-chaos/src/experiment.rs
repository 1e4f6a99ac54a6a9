//! The experiment file of the chaos suite: YAML, a list of experiments (at the top level or
//! under `experiments:`, as in the seed), each naming a fault to inject into a stack of real
//! processes, the load to run meanwhile, optional guards, and what the agent must conclude.
//! Parsing validates everything up front and names the experiment and the key of any error;
//! the format is documented in `docs/chaos.md`.

use serde::Deserialize;
use std::fmt;
use std::time::Duration;

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
    /// One request prefills a long prompt this long, with nothing else decoding.
    LongPrefill(Duration),
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
}

impl Fault {
    /// Parses a fault name; the error lists the known forms.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let known = "known: network_latency_<N>ms, cpu_stress_<N>pct, memory_pressure_<N>pct, hot_reload_<N>s, long_streams_<N>, batch_jitter_<N>ms, slow_health_<N>s, slow_health_<N>s_latency_<M>ms, long_prefill_<N>s, burst_<N>, engine_restart_<N>s, degraded_<N>ms, agent_outage_<N>s, engine_sleep, engine_hang, engine_crash, npu_hang_idle, npu_busy_stuck, driver_error, driver_hang, http_5xx, agent_restart, agent_crash, agent_upgrade, npu_fault_code";
        let fixed = match s {
            "engine_hang" => Some(Fault::EngineHang),
            "engine_crash" => Some(Fault::EngineCrash),
            "npu_hang_idle" => Some(Fault::NpuHangIdle),
            "npu_busy_stuck" => Some(Fault::NpuBusyStuck),
            "driver_error" => Some(Fault::DriverError),
            "driver_hang" => Some(Fault::DriverHang),
            "http_5xx" => Some(Fault::Http5xx),
            "engine_sleep" => Some(Fault::EngineSleep),
            "agent_restart" => Some(Fault::AgentRestart),
            "agent_crash" => Some(Fault::AgentCrash),
            "agent_upgrade" => Some(Fault::AgentUpgrade),
            "npu_fault_code" => Some(Fault::NpuFaultCode),
            _ => None,
        };
        if let Some(f) = fixed {
            return Ok(f);
        }
        let number = |prefix: &str, unit: &str| -> Option<Result<u64, String>> {
            let n = s.strip_prefix(prefix)?.strip_suffix(unit)?;
            Some(
                n.parse::<u64>()
                    .map_err(|_| format!("{s:?}: {n:?} is not a whole number")),
            )
        };
        let pct = |n: u64| -> Result<u8, String> {
            if (1..=100).contains(&n) {
                Ok(n as u8)
            } else {
                Err(format!("{s:?}: the percentage must be 1..=100"))
            }
        };
        let ms = |n: u64| Duration::from_millis(n);
        let secs = |n: u64| Duration::from_secs(n);
        if let Some(n) = number("network_latency_", "ms") {
            return Ok(Fault::NetworkLatency(ms(n?)));
        }
        if let Some(n) = number("cpu_stress_", "pct") {
            return Ok(Fault::CpuStress(pct(n?)?));
        }
        if let Some(n) = number("memory_pressure_", "pct") {
            return Ok(Fault::MemoryPressure(pct(n?)?));
        }
        if let Some(n) = number("hot_reload_", "s") {
            return Ok(Fault::HotReload(secs(n?)));
        }
        if let Some(n) = number("long_streams_", "") {
            let n = n?;
            if n == 0 || n > 10_000 {
                return Err(format!("{s:?}: the stream count must be 1..=10000"));
            }
            return Ok(Fault::LongStreams(n as u32));
        }
        if let Some(n) = number("batch_jitter_", "ms") {
            return Ok(Fault::BatchJitter(ms(n?)));
        }
        if let Some(rest) = s.strip_prefix("slow_health_")
            && let Some((health, latency)) = rest.split_once("s_latency_")
        {
            let whole = |n: &str| {
                n.parse::<u64>()
                    .map_err(|_| format!("{s:?}: {n:?} is not a whole number"))
            };
            let latency = latency
                .strip_suffix("ms")
                .ok_or_else(|| format!("{s:?}: the latency ends in ms"))?;
            return Ok(Fault::SlowHealthWithLatency(
                secs(whole(health)?),
                ms(whole(latency)?),
            ));
        }
        if let Some(n) = number("slow_health_", "s") {
            return Ok(Fault::SlowHealth(secs(n?)));
        }
        if let Some(n) = number("long_prefill_", "s") {
            return Ok(Fault::LongPrefill(secs(n?)));
        }
        if let Some(n) = number("degraded_", "ms") {
            return Ok(Fault::Degraded(ms(n?)));
        }
        if let Some(n) = number("engine_restart_", "s") {
            return Ok(Fault::EngineRestart(secs(n?)));
        }
        if let Some(n) = number("agent_outage_", "s") {
            let n = n?;
            if n == 0 {
                return Err(format!("{s:?}: the outage lasts at least 1 s"));
            }
            return Ok(Fault::AgentOutage(secs(n)));
        }
        if let Some(n) = number("burst_", "") {
            let n = n?;
            if n == 0 || n > 10_000 {
                return Err(format!("{s:?}: the stream count must be 1..=10000"));
            }
            return Ok(Fault::Burst(n as u32));
        }
        Err(format!("unknown fault {s:?} ({known})"))
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
            Fault::NpuHangIdle => f.write_str("npu_hang_idle"),
            Fault::NpuBusyStuck => f.write_str("npu_busy_stuck"),
            Fault::DriverError => f.write_str("driver_error"),
            Fault::DriverHang => f.write_str("driver_hang"),
            Fault::Http5xx => f.write_str("http_5xx"),
            Fault::EngineSleep => f.write_str("engine_sleep"),
            Fault::LongPrefill(d) => write!(f, "long_prefill_{}s", d.as_secs()),
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
            Fault::AgentRestart => f.write_str("agent_restart"),
            Fault::AgentCrash => f.write_str("agent_crash"),
            Fault::AgentUpgrade => f.write_str("agent_upgrade"),
            Fault::AgentOutage(d) => write!(f, "agent_outage_{}s", d.as_secs()),
            Fault::NpuFaultCode => f.write_str("npu_fault_code"),
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
}

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
        let at = |e: String| format!("{file}: experiment {label}: {e}");
        let raw: RawExperiment = serde_yaml_ng::from_value(v).map_err(|e| at(e.to_string()))?;
        // Names become file names and table cells.
        if raw.name.is_empty()
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            || raw.name.starts_with('.')
        {
            return Err(at(
                "name: letters, digits, `_`, `-` and `.` only, not starting with `.`".to_owned(),
            ));
        }
        if out.iter().any(|e| e.name == raw.name) {
            return Err(at("name: used twice in the file".to_owned()));
        }
        let fault = Fault::parse(&raw.fault).map_err(|e| at(format!("fault: {e}")))?;
        let driver_codes = raw
            .driver_codes
            .iter()
            .map(|c| {
                let hex = c
                    .strip_prefix("0x")
                    .or_else(|| c.strip_prefix("0X"))
                    .unwrap_or(c);
                u32::from_str_radix(hex, 16)
                    .ok()
                    .filter(|v| *v != 0)
                    .ok_or_else(|| {
                        at(format!(
                            "driver_codes: {c:?} is not a non-zero 32-bit hex code"
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, String>>()?;
        if driver_codes.len() > 10 {
            return Err(at("driver_codes: at most 10".to_owned()));
        }
        if fault == Fault::NpuFaultCode && driver_codes.is_empty() {
            return Err(at(
                "driver_codes: npu_fault_code needs at least one code".to_owned()
            ));
        }
        let duration = parse_duration("duration", &raw.duration).map_err(at)?;
        let mut known_false_kills = Vec::new();
        for k in &raw.known_false_kill {
            let parsed = k.split_once('@').and_then(|(p, h)| {
                if p.is_empty() {
                    return None;
                }
                if h == "kubelet" {
                    return Some((p.to_owned(), h.to_owned()));
                }
                let h = humantime::parse_duration(h).ok()?;
                (h.subsec_nanos() == 0 && !h.is_zero())
                    .then(|| (p.to_owned(), format!("{}s", h.as_secs())))
            });
            match parsed {
                Some(x) => known_false_kills.push(x),
                None => {
                    return Err(at(format!(
                        "known_false_kill: {k:?}: expected `<policy>@<heartbeat>` or `<policy>@kubelet`, e.g. `reference@1s`"
                    )));
                }
            }
        }
        let guards = match raw.guard {
            None => Vec::new(),
            Some(OneOrMany::One(g)) => vec![g],
            Some(OneOrMany::Many(g)) => g,
        }
        .iter()
        .map(|g| Guard::parse(g).map_err(|e| at(format!("guard: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
        let mut max_nm_heartbeat_s = None;
        let (expect, agent_policy_only) = match raw.expect {
            RawExpect::Word(w) if w == "healthy" => (Expect::Healthy, false),
            RawExpect::Word(w) => {
                return Err(at(format!(
                    "expect: {w:?}: expected `healthy` or `detect_within: <duration>`"
                )));
            }
            RawExpect::Detect(RawDetect {
                detect_within,
                policy,
                max_nm_heartbeat,
            }) => (
                {
                    if let Some(h) = max_nm_heartbeat {
                        let d = parse_duration("expect.max_nm_heartbeat", &h).map_err(at)?;
                        if d.subsec_nanos() != 0 || d.is_zero() {
                            return Err(at(format!(
                                "expect.max_nm_heartbeat: {h:?} is not whole seconds"
                            )));
                        }
                        max_nm_heartbeat_s = Some(d.as_secs());
                    }
                    Expect::DetectWithin(
                        parse_duration("expect.detect_within", &detect_within).map_err(at)?,
                    )
                },
                match policy.as_deref() {
                    None | Some("any") => false,
                    // `full`: this policy's name before it became `agent`.
                    Some("agent" | "full") => true,
                    Some(other) => {
                        return Err(at(format!(
                            "expect.policy: {other:?}: expected `any` (default) or `agent`"
                        )));
                    }
                },
            ),
        };
        let l = &raw.load;
        if !(l.rate.is_finite() && l.rate >= 0.0 && l.rate <= 1000.0) {
            return Err(at(
                "load.rate: must be 0..=1000 requests per second".to_owned()
            ));
        }
        if l.streams > 2000 {
            return Err(at("load.streams: at most 2000".to_owned()));
        }
        if l.max_tokens == 0 || l.max_tokens > 4096 {
            return Err(at("load.max_tokens: must be 1..=4096".to_owned()));
        }
        if l.prompt_tokens > 100_000 {
            return Err(at("load.prompt_tokens: at most 100000".to_owned()));
        }
        let kubelet = raw.kubelet.unwrap_or(match (expect, fault) {
            (Expect::Healthy, _) => KubeletExpect::NoRestart,
            (_, Fault::DriverError | Fault::DriverHang) => KubeletExpect::NoRestart,
            (_, Fault::EngineRestart(_)) => KubeletExpect::NotReady,
            _ => KubeletExpect::Restart,
        });
        if expect == Expect::Healthy && kubelet == KubeletExpect::Restart {
            return Err(at(
                "kubelet: restart: a benign experiment's engine must not be restarted".to_owned(),
            ));
        }
        out.push(Experiment {
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
        });
    }
    Ok(out)
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
            "burst_64",
            "slow_health_3s_latency_100ms",
            "engine_restart_8s",
            "degraded_2500ms",
            "agent_restart",
            "agent_crash",
            "agent_upgrade",
            "agent_outage_8s",
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
