//! The chaos suite's real engine (`npu-chaos run --engine vllm`): a vLLM started through the
//! project's `scripts/real-vllm` (docs/real-vllm.md), its faults injected for real — SIGSTOP of
//! the `VLLM::EngineCore` for a silent hang, SIGKILL for a crash — and the fake NPU's AI Cube
//! figure following the `VLLM::Worker`'s CPU use ([`npu_fake::follow`]).
//!
//! One engine serves the experiments one after another (a start costs 30–60 s); an experiment
//! that killed it (a crash fault, or Node Manager's kill) leaves it down, and the next one
//! starts a new one.

use super::experiment::Fault;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// The name of the `scripts/real-vllm` instance the runner uses.
const INSTANCE: &str = "npu-chaos";

/// Why `fault` cannot be injected into a real vLLM (`None`: it can).
pub fn not_applicable(fault: Fault) -> Option<&'static str> {
    match fault {
        Fault::NetworkLatency(_)
        | Fault::CpuStress(_)
        | Fault::LongStreams(_)
        | Fault::BatchJitter(_)
        | Fault::EngineHang
        | Fault::EngineCrash
        | Fault::NpuHangIdle
        | Fault::NpuBusyStuck
        | Fault::DriverError
        | Fault::DriverHang => None,
        // The agent's own faults leave the engine alone.
        Fault::AgentRestart | Fault::AgentCrash | Fault::AgentUpgrade | Fault::AgentOutage(_) => {
            None
        }
        Fault::EngineStop => Some(
            "the real rows emulate hangs by stopping the EngineCore, so they run with the stopped-process rule off; a real vLLM stopped is tests/real_engine's (real_vllm::a_stopped_engine_is_abnormal_in_seconds)",
        ),
        Fault::MemoryPressure(_) => Some(
            "a real vLLM's KV-cache usage cannot be raised on demand without changing the load itself",
        ),
        Fault::HotReload(_) => Some(
            "vLLM's pause for a weight switch (/sleep, /wake_up) needs its GPU memory allocator; the CPU build has none",
        ),
        Fault::SlowHealth(_) => Some(
            "a real vLLM's /health cannot be slowed alone: it answers from the API server, which also serves the load",
        ),
        Fault::Http5xx => {
            Some("a real vLLM cannot be made to answer 500 to completions while staying up")
        }
        Fault::EngineSleep => {
            Some("vLLM's sleep mode needs its device memory allocator; the CPU build has none")
        }
        Fault::LongPrefill(_) | Fault::LongPrefillUnchunked(_) => Some(
            "the test model's 1024-token context prefills in well under a second on the CPU build",
        ),
        Fault::SlowHealthWithLatency(..) => Some(
            "a real vLLM's /health cannot be slowed alone: it answers from the API server, which also serves the load",
        ),
        Fault::EngineRestart(_) => Some(
            "a real vLLM takes longer than the restart's outage to start on the CPU build (scripts/real-vllm up)",
        ),
        Fault::Burst(_) => None,
        Fault::NpuFaultCode => Some(
            "the runner writes no fault codes into a real engine's NPU files (the fake engine does)",
        ),
        Fault::Degraded(_) => Some(
            "a real vLLM's KV-cache usage cannot be raised on demand without changing the load itself",
        ),
        Fault::CompileStall(_) => Some(
            "not wired yet: plugins/vllm-fault-inject's `spin` mode held for N s is the injection (the Worker's step does not return, a core burns, /health 200, /metrics as last published), but the runner does not start its real engine with the plugin",
        ),
        Fault::Saturation(_) => Some(
            "the CPU build decodes a few tokens a second at a full batch: ten minutes of it are burst_to_saturation's case drawn out, at a cost CI cannot pay",
        ),
        Fault::SlowAnswers(..) => Some(
            "a real vLLM's completions cannot be slowed alone: the proxy's latency slows its /health and /metrics too",
        ),
    }
}

/// A running vLLM started by `scripts/real-vllm up`.
#[derive(Debug, Clone)]
pub struct RealEngine {
    script: PathBuf,
    /// The `scripts/real-vllm` instance name.
    pub name: String,
    pub port: u16,
    pub api_pid: u32,
    pub engine_core_pid: u32,
    pub worker_pid: u32,
    /// The instance's directory (its `worker_pid` file follows restarts).
    pub state: PathBuf,
}

impl RealEngine {
    /// Starts the runner's instance with `script` (`scripts/real-vllm`), after stopping
    /// whatever an earlier run left of it (a run that was killed cannot have stopped it).
    pub async fn up(script: &Path) -> Result<RealEngine, String> {
        let _ = Command::new(script)
            .args(["down", "--name", INSTANCE])
            .output()
            .await;
        let out = Command::new(script)
            .args(["up", "--name", INSTANCE])
            .output()
            .await
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        RealEngine::from_up(script, INSTANCE, &out)
    }

    /// The engine `script up --name <name>` reported in `out` (its `key=value` lines), or why
    /// it did not start.
    pub fn from_up(
        script: &Path,
        name: &str,
        out: &std::process::Output,
    ) -> Result<RealEngine, String> {
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "{} up failed ({}): {}{}",
                script.display(),
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let kv: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
        let num = |k: &str| -> Result<u32, String> {
            kv.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{} up printed no {k}: {stdout}", script.display()))
        };
        Ok(RealEngine {
            script: script.to_owned(),
            name: name.to_owned(),
            port: u16::try_from(num("port")?).map_err(|e| e.to_string())?,
            api_pid: num("api_pid")?,
            engine_core_pid: num("engine_core_pid")?,
            worker_pid: num("worker_pid")?,
            state: PathBuf::from(kv.get("state").copied().unwrap_or_default()),
        })
    }

    /// The engine's log (rewritten by the instance's next start).
    pub fn log(&self) -> PathBuf {
        self.state.join("vllm.log")
    }

    /// Copies the engine's log, as it is now, to `to` (the experiment's directory keeps the
    /// log of the engine that served it; the instance's own log is rewritten by the next
    /// start).
    pub fn save_log(&self, to: &Path) {
        let _ = std::fs::copy(self.log(), to);
    }

    /// The file holding the Worker's PID.
    pub fn worker_pid_file(&self) -> PathBuf {
        self.state.join("worker_pid")
    }

    /// Whether the API server runs (not a zombie) and its EngineCore too.
    pub fn alive(&self) -> bool {
        running(self.api_pid) && running(self.engine_core_pid)
    }

    /// Sends a signal to the EngineCore (`STOP`, `CONT`, `KILL`).
    pub async fn signal_core(&self, sig: &str) -> Result<(), String> {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.engine_core_pid.to_string())
            .status()
            .await
            .map_err(|e| format!("kill: {e}"))?;
        if st.success() {
            Ok(())
        } else {
            Err(format!("kill -{sig} {} failed", self.engine_core_pid))
        }
    }

    /// Stops every process of the instance (`scripts/real-vllm down`).
    pub async fn down(&self) {
        let _ = Command::new(&self.script)
            .args(["down", "--name", &self.name])
            .output()
            .await;
    }
}

/// Whether process `pid` is alive and not a zombie (an exited API server can stay a zombie
/// until its reaper gets to it).
pub fn running(pid: u32) -> bool {
    super::procfs::stat_field::<String>(pid, 3).is_some_and(|state| state != "Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_faults_a_real_engine_takes() {
        for f in [
            "engine_hang",
            "engine_crash",
            "network_latency_50ms",
            "cpu_stress_30pct",
            "long_streams_10",
            "batch_jitter_20ms",
            "driver_error",
        ] {
            assert_eq!(not_applicable(Fault::parse(f).unwrap()), None, "{f}");
        }
        for f in [
            "memory_pressure_20pct",
            "hot_reload_5s",
            "slow_health_30s",
            "http_5xx",
        ] {
            assert!(not_applicable(Fault::parse(f).unwrap()).is_some(), "{f}");
        }
    }

    #[test]
    fn a_zombie_or_a_missing_process_is_not_running() {
        assert!(running(std::process::id()));
        assert!(!running(u32::MAX));
    }
}
