//! Fault injection: what each fault does to the engine, the proxy, the fake NPUs or the agent,
//! and how it is taken back.

use super::outcome::Outcome;
use super::stack::Stack;
use crate::agent::{self, AgentOp};
use crate::experiment::Fault;
use crate::load::LoadGen;
use crate::real_engine;
use crate::stress::CpuStress;
use crate::timescale::scaled;
use npu_health_wire::EngineDetail;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What applying a fault needs to undo it.
#[derive(Default)]
pub(super) struct Injected {
    pub(super) stress: Option<CpuStress>,
    pub(super) long_streams: Option<CancellationToken>,
    /// An operation on the agent under way (aborted if the experiment ends first).
    pub(super) agent_op: Option<agent::OpTask>,
}

/// How long the end of an experiment waits for an agent operation still under way.
pub(super) const AGENT_OP_LIMIT: Duration = Duration::from_secs(180);

/// Records a finished agent operation and prints what it did.
pub(super) fn record_op(out: &mut Outcome, op: Result<AgentOp, String>, s: f64) {
    let op = op.unwrap_or_else(|e| AgentOp {
        error: Some(e),
        ..AgentOp::unfinished(
            Fault::parse(&out.fault).unwrap_or(Fault::AgentRestart),
            out.agent_supervisor,
        )
    });
    let secs = |ms: Option<i64>| {
        ms.map_or_else(
            || "—".to_owned(),
            |ms| format!("{:.2} s", (ms - op.started_ms) as f64 / 1000.0 / s),
        )
    };
    eprintln!(
        "npu-chaos:   {} ({}): pid {} -> {}, running after {}, answered /status after {} (unscaled){}",
        op.fault,
        op.supervisor.as_str(),
        op.old_pid.map_or("?".to_owned(), |p| p.to_string()),
        op.new_pid.map_or("?".to_owned(), |p| p.to_string()),
        secs(op.new_running_ms),
        secs(op.answered_ms),
        op.error
            .as_deref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default()
    );
    out.agent_ops.push(op);
}

/// Fault-API patches that set and clear a fault on the fake engine (`None`: not an engine
/// fault). Clearing sends the inverse patch, never a reset, so nothing else is touched.
pub(super) fn engine_patches(fault: Fault, s: f64) -> Option<(Value, Value)> {
    // Tokio timers have millisecond granularity: a scaled time is at least 1 ms.
    let ms = |d: Duration| (scaled(d, s).as_millis() as u64).max(1);
    Some(match fault {
        Fault::MemoryPressure(p) => (
            json!({"kv_cache_pressure": f64::from(p) / 100.0}),
            json!({"kv_cache_pressure": 0.0}),
        ),
        Fault::HotReload(d) => (json!({"pause_ms": ms(d)}), json!({"pause_ms": 0})),
        Fault::BatchJitter(d) => (json!({"jitter_ms": ms(d)}), json!({"jitter_ms": 0})),
        Fault::SlowHealth(d) => (
            json!({"slow_health_ms": ms(d)}),
            json!({"slow_health_ms": 0}),
        ),
        Fault::EngineHang => (json!({"hang": true}), json!({"hang": false})),
        Fault::EngineSleep => (json!({"asleep": true}), json!({"asleep": false})),
        Fault::LongPrefill(d) => (json!({"long_prefill_ms": ms(d)}), json!({})),
        Fault::LongPrefillUnchunked(d) => (json!({"long_prefill_unchunked_ms": ms(d)}), json!({})),
        // The KV cache near full while the burst queues.
        Fault::Burst(_) => (
            json!({"kv_cache_usage": 0.95}),
            json!({"kv_cache_usage": null}),
        ),
        Fault::SlowHealthWithLatency(h, _) => (
            json!({"slow_health_ms": ms(h)}),
            json!({"slow_health_ms": 0}),
        ),
        Fault::EngineRestart(d) => (json!({"restart_ms": ms(d)}), json!({})),
        // It ends by itself, as a compile does.
        Fault::CompileStall(d) => (json!({"compile_stall_ms": ms(d)}), json!({})),
        // Tokens slower at a full batch: up to 50 ms more per token (the fake's 5 ms a token
        // is one request's pace, not 256's).
        Fault::Saturation(_) => (
            json!({"jitter_ms": ms(SATURATED_TOKEN_JITTER)}),
            json!({"jitter_ms": 0}),
        ),
        Fault::Degraded(d) => (
            json!({"latency_ms": ms(d), "kv_cache_usage": 0.97}),
            json!({"latency_ms": 0, "kv_cache_usage": null}),
        ),
        Fault::SlowAnswers(min, max) => (
            json!({"latency_ms": ms(min), "latency_spread_ms": ms(max) - ms(min)}),
            json!({"latency_ms": 0, "latency_spread_ms": 0}),
        ),
        Fault::NpuHangIdle => (
            json!({"hang": true, "hbm_used_mb": 65536}),
            json!({"hang": false, "hbm_used_mb": null}),
        ),
        Fault::NpuBusyStuck => (
            json!({"npu_busy_stuck": true}),
            json!({"npu_busy_stuck": false}),
        ),
        Fault::DriverError => (
            json!({"driver_error": -8005}),
            json!({"driver_error": null}),
        ),
        Fault::DriverHang => (json!({"driver_hang": true}), json!({"driver_hang": false})),
        Fault::Http5xx => (json!({"http_5xx": true}), json!({"http_5xx": false})),
        // The codes themselves are the experiment's (`driver_codes`, [`codes_patch`]).
        Fault::NpuFaultCode => (json!({}), json!({})),
        Fault::NetworkLatency(_)
        | Fault::CpuStress(_)
        | Fault::LongStreams(_)
        | Fault::EngineCrash
        | Fault::EngineStop
        | Fault::AgentRestart
        | Fault::AgentCrash
        | Fault::AgentUpgrade
        | Fault::AgentOutage(_) => return None,
    })
}

pub(super) async fn inject(
    stack: &mut Stack,
    load: &LoadGen,
    fault: Fault,
    s: f64,
    held: &mut Injected,
) -> Result<(), String> {
    match fault {
        Fault::NetworkLatency(d) => stack.proxy.set_latency(scaled(d, s)),
        Fault::CpuStress(p) => {
            let st = CpuStress::start();
            st.set(p);
            held.stress = Some(st);
        }
        Fault::LongStreams(n) => {
            held.long_streams = Some(load.long_streams(n, long_stream_tokens(stack)))
        }
        Fault::Burst(_) | Fault::Saturation(_) => {
            let n = match fault {
                Fault::Burst(n) => n,
                _ => SATURATION_STREAMS,
            };
            held.long_streams = Some(load.burst(n, scaled(Duration::from_secs(1), s)));
            if stack.real.is_none()
                && let Some((on, _)) = engine_patches(fault, s)
            {
                stack.faults(on).await?;
            }
        }
        Fault::SlowHealthWithLatency(_, latency) => {
            stack.proxy.set_latency(scaled(latency, s));
            if let Some((on, _)) = engine_patches(fault, s) {
                stack.faults(on).await?;
            }
        }
        Fault::EngineCrash if stack.real.is_some() => stack.signal_real("KILL").await?,
        Fault::EngineCrash => stack.kill_engine().await,
        Fault::EngineStop => stack.signal_engine("STOP").await?,
        other if stack.real.is_some() => inject_real(stack, other, s).await?,
        other => {
            if let Some((on, _)) = engine_patches(other, s) {
                stack.faults(on).await?;
            }
        }
    }
    load.set_under_fault(true);
    Ok(())
}

/// Streams a saturation keeps open: the fake engine's 256 slots (`max_num_seqs`, as the runner
/// starts it) full, and 32 more waiting.
pub(super) const SATURATION_STREAMS: u32 = 256 + 32;

/// The most a token is delayed beyond the fake's pace while the engine is saturated.
const SATURATED_TOKEN_JITTER: Duration = Duration::from_millis(50);

/// Tokens asked for by each `long_streams_<N>` stream: 4096, or what a real engine's
/// context (1024 tokens for the test model) leaves after the prompt.
pub(super) fn long_stream_tokens(stack: &Stack) -> u32 {
    if stack.real.is_some() { 512 } else { 4096 }
}

/// The faults of a real engine: signals to its EngineCore, the fake NPUs' figure, the proxy.
pub(super) async fn inject_real(stack: &mut Stack, fault: Fault, s: f64) -> Result<(), String> {
    match fault {
        Fault::EngineHang => stack.signal_real("STOP").await?,
        // The engine stopped, the NPU spinning on a stuck kernel.
        Fault::NpuBusyStuck => {
            stack.npu_override(Some("95"));
            stack.signal_real("STOP").await?;
        }
        // The engine stopped, the NPU idle with its memory full.
        Fault::NpuHangIdle => {
            stack.npu_override(Some("0 hbm_used_mb=65536"));
            stack.signal_real("STOP").await?;
        }
        Fault::DriverError => stack.npu_override(Some("error:-8005")),
        Fault::DriverHang => stack.npu_override(Some("hang")),
        Fault::BatchJitter(d) => stack.proxy.set_jitter(scaled(d, s)),
        other => {
            return Err(format!(
                "{other} cannot be injected into a real engine: {}",
                real_engine::not_applicable(other).unwrap_or("no injection defined")
            ));
        }
    }
    Ok(())
}

pub(super) async fn remove(
    stack: &mut Stack,
    load: &LoadGen,
    fault: Fault,
    s: f64,
    held: &mut Injected,
) {
    load.set_under_fault(false);
    stack.proxy.set_latency(Duration::ZERO);
    stack.proxy.set_jitter(Duration::ZERO);
    if stack.real.is_some() {
        stack.npu_override(None);
        if matches!(
            fault,
            Fault::EngineHang | Fault::NpuBusyStuck | Fault::NpuHangIdle
        ) {
            let _ = stack.signal_real("CONT").await;
        }
    }
    if fault == Fault::EngineStop {
        let _ = stack.signal_engine("CONT").await;
    }
    if let Some(st) = held.stress.take() {
        tokio::task::spawn_blocking(move || st.stop()).await.ok();
    }
    if let Some(t) = held.long_streams.take() {
        t.cancel();
    }
    if let Some((_, off)) = engine_patches(fault, s) {
        // The engine may be gone (killed by Node Manager): nothing to clear then.
        let _ = stack.faults(off).await;
    }
}

/// The fake engine's patch that makes the fake driver report `codes` on its NPUs (empty:
/// none).
pub(super) fn codes_patch(codes: &[u32]) -> Value {
    json!({ "npu_fault_codes": codes })
}

/// Whether the agent reports one of the engine's NPUs as failing right now: a hung or stale
/// reading, or failed reads in the current window.
pub(super) fn driver_flagged(detail: &EngineDetail) -> bool {
    detail
        .window
        .devices
        .iter()
        .any(|d| d.stale || d.hung || d.invalid > 0)
}
