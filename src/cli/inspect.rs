//! `devices` and `sample`: look at the NPUs and the driver backends without an engine.

use super::{CliError, EXIT_USAGE};
use crate::driver::DriverConfig;
use crate::sampler::{DeviceSnapshot, Sampler, SamplerConfig};
use anyhow::Context;
use std::time::Duration;

/// Longest `sample --window`.
const MAX_WINDOW: Duration = Duration::from_secs(600);

/// `devices [--json]`.
pub fn devices(driver: &DriverConfig, json: bool) -> Result<(), CliError> {
    let sampler =
        Sampler::start(driver, &SamplerConfig::default()).context("starting the sampler")?;
    if !sampler.wait_settled(Duration::from_secs(10)) {
        tracing::warn!("some devices did not settle on a backend within 10s");
    }
    let usable = sampler.require_cube_source();
    let now = sampler.shared().ring.now_ns();
    let snaps: Vec<DeviceSnapshot> = sampler.devices().iter().map(|d| d.snapshot(now)).collect();
    sampler.shutdown();
    if json {
        let devices: Vec<serde_json::Value> = snaps
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).expect("snapshot serialises");
                v["capabilities"] = serde_json::json!({
                    "aicube": s.source.backend().reads_cube(),
                    "hbm": s.hbm_total_mb.is_some(),
                    "health": s.health.is_some(),
                });
                v
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return usable.map_err(CliError::from);
    }
    println!(
        "{:<4} {:<5} {:<5} {:<14} {:<8} {:<28} {:<14} {:<15} WHY",
        "ID", "CARD", "CHIP", "NAME", "BACKEND", "AI CUBE", "HBM MB", "HEALTH"
    );
    for s in &snaps {
        let chip = s.chip.map_or_else(|| "-".to_owned(), |c| c.to_string());
        let hbm = match (s.hbm_used_mb, s.hbm_total_mb) {
            (Some(u), Some(t)) => format!("{u}/{t}"),
            _ => "n/a".to_owned(),
        };
        let health = match s.health {
            _ if s.device_gone => "device gone".to_owned(),
            Some(0) => "ok".to_owned(),
            Some(1) => "minor alarm".to_owned(),
            Some(2) => "major alarm".to_owned(),
            Some(3) => "critical alarm".to_owned(),
            Some(h) => h.to_string(),
            None => "n/a".to_owned(),
        };
        let name = if s.name.is_empty() { "-" } else { &s.name };
        println!(
            "{:<4} {:<5} {:<5} {:<14} {:<8} {:<28} {:<14} {:<15} {}",
            s.id, s.card, chip, name, s.backend, s.method, hbm, health, s.source_note
        );
    }
    // Exit 3 when the NPUs were found but none has a source of AI Cube figures.
    usable.map_err(CliError::from)
}

/// `sample [--window] [--period] [--devices] [--json]`.
pub fn sample(
    driver: &DriverConfig,
    window: Duration,
    period: Duration,
    ids: Option<Vec<u32>>,
    json: bool,
) -> Result<(), CliError> {
    if window.is_zero() || window > MAX_WINDOW {
        return Err(CliError {
            code: EXIT_USAGE,
            error: anyhow::anyhow!("--window {window:?} is outside 1ns..=10m"),
        });
    }
    let cfg = SamplerConfig {
        period,
        retention: window.max(Duration::from_secs(1)) + Duration::from_secs(1),
        devices: ids,
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(driver, &cfg).context("starting the sampler")?;
    sampler.wait_settled(Duration::from_secs(10));
    sampler.require_cube_source()?;
    std::thread::sleep(window);
    let ids: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
    let report = sampler.window(&ids, window)?;
    let backends: Vec<crate::driver::Backend> = sampler
        .devices()
        .iter()
        .map(|d| d.source().backend())
        .collect();
    sampler.shutdown();
    if report.truncated {
        tracing::warn!("the ring did not hold the whole window; figures cover its newest part");
    }
    if json {
        let devices: Vec<serde_json::Value> = ids
            .iter()
            .zip(&report.devices)
            .zip(&backends)
            .map(|((id, st), backend)| {
                serde_json::json!({
                    "id": id,
                    "backend": backend,
                    "peak": st.peak,
                    "mean": st.mean.map(|m| (m * 100.0).round() / 100.0),
                    "valid": st.valid,
                    "invalid": st.invalid,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return Ok(());
    }
    println!(
        "{:<4} {:<8} {:>5} {:>7} {:>6} {:>8}",
        "ID", "BACKEND", "PEAK", "MEAN", "VALID", "INVALID"
    );
    for ((id, st), backend) in ids.iter().zip(&report.devices).zip(&backends) {
        let peak = st.peak.map_or_else(|| "n/a".to_owned(), |p| p.to_string());
        let mean = st
            .mean
            .map_or_else(|| "n/a".to_owned(), |m| format!("{m:.1}"));
        println!(
            "{:<4} {:<8} {:>5} {:>7} {:>6} {:>8}",
            id, backend, peak, mean, st.valid, st.invalid
        );
    }
    Ok(())
}
