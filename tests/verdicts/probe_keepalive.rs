//! The keep-alive race: uvicorn (vLLM, MindIE's engine server) closes a keep-alive connection
//! idle for 5 s, the same as the probe interval, so a probe can be written on a connection
//! the server is closing. The agent's real probe client against the fake engine's uvicorn-like
//! idle close, at the probe interval equal to the idle timeout (scaled: 25 ms for 5 s, with
//! a sweep of a few milliseconds either side so the send lands on the close): no probe fails.
//! The race is at the moment of the close, whatever the idle timeout: a shorter one gives
//! the same number of sends landing on a close in less time.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::fake_engine::FakeEngine;
use fake_engine::engine::EngineOptions;
use npu_health_agent::probe::Prober;
use std::time::Duration;

/// 5 s scaled by 0.005.
const IDLE: Duration = Duration::from_millis(25);
/// Probes sent: 300 at a 5 s interval is 25 minutes of unscaled time.
const PROBES: u32 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_at_the_idle_timeout_never_fail_on_a_closed_keep_alive_connection() {
    let engine = FakeEngine::start(EngineOptions {
        model: "m".into(),
        ttft: Duration::from_millis(1),
        keep_alive: IDLE,
        ..EngineOptions::default()
    })
    .await;
    let prober = support::agent_prober(&support::engine_spec("127.0.0.1", engine.port, "m", ""));
    // Wait for the engine.
    for _ in 0..200 {
        if prober.send(Duration::from_secs(1)).await.outcome.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut failures = Vec::new();
    for i in 0..PROBES {
        // The probe loop sleeps the interval after each answer; the server's idle timer
        // starts at the same moment. Sweep -3..=+3 ms around it.
        let offset = i64::from(i % 7) - 3;
        let pause = IDLE.as_millis() as i64 + offset;
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        let r = prober.send(Duration::from_secs(2)).await;
        if let Err(e) = r.outcome {
            failures.push(format!("probe {i} (+{offset} ms): {e}"));
        }
    }
    drop(engine);
    assert!(
        failures.is_empty(),
        "{} of {PROBES} probes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
