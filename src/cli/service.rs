//! `check-config` and `doctor`: what the agent will do, before it does it.

use super::CliError;
use crate::config::AgentConfig;
use crate::driver::fault_levels::FaultTable;
use crate::monitor::Monitor;
use crate::monitor::gates::{self, Condition};
use crate::probe::health::HealthCollector;
use crate::probe::http::EngineClient;
use crate::sampler::{Sampler, SamplerConfig, StartError};
use anyhow::Context;
use serde_json::json;
use std::time::Duration;

/// Checks what `run` checks before it serves, then prints the effective configuration
/// (defaults filled in) as JSON.
///
/// `run` starts the sampler and checks the TLS files and every engine's NPUs against those
/// the driver reports ([`crate::agent::preflight::host`]); this starts the same sampler for
/// that, and stops it. Without a driver backend `run` starts anyway (without NPU figures),
/// so this does not fail either: it says on stderr that the NPUs were not checked.
pub fn check_config(cfg: &AgentConfig) -> Result<(), CliError> {
    let sampler = match Sampler::start(
        &crate::agent::driver_config(&cfg.agent),
        &crate::agent::sampler_config(cfg),
    ) {
        Ok(s) => Some(s),
        Err(e @ StartError::NoBackend { .. }) => {
            eprintln!("{}: NPUs not checked: {e}", cfg.source);
            None
        }
        Err(e) => return Err(e.into()),
    };
    let npus = sampler.as_ref().and_then(crate::agent::npu_ids);
    if let Some(s) = sampler {
        s.shutdown();
    }
    crate::agent::preflight::host(cfg, npus.as_deref())?;
    for note in crate::agent::preflight::listeners(cfg)? {
        eprintln!("{}: {note}", cfg.source);
    }
    // A bad table fails the check; the running agent logs it and keeps the built-in one.
    let faults = FaultTable::configured(cfg.agent.fault_code_file.as_deref()).map_err(|e| {
        crate::config::ConfigError::new(&cfg.source, "[agent] fault_code_file", e.to_string())
    })?;
    let text = serde_json::to_string_pretty(cfg).context("rendering the configuration")?;
    println!("{text}");
    for spec in &cfg.engines {
        for a in crate::integrations::active(spec, &cfg.agent) {
            eprintln!(
                "{}: engine {} {}: {}",
                cfg.source, spec.name, a.integration, a.action
            );
        }
    }
    eprintln!(
        "{}: fault-code levels from {}",
        cfg.source,
        faults.describe()
    );
    match crate::continuity::StateDir::resolve(cfg.agent.state_dir.as_deref()) {
        Some(d) => eprintln!(
            "{}: state directory {} ({}): each engine's state survives a restart of the agent, and a new agent started with it takes over from a running one",
            cfg.source,
            d.path().display(),
            d.from
        ),
        None => eprintln!(
            "{}: no state directory ([agent] state_dir, or systemd's RuntimeDirectory=): a restart of the agent forgets what it saw, and no agent can take over from a running one",
            cfg.source
        ),
    }
    eprintln!(
        "{}: configuration is valid ({} engine(s))",
        cfg.source,
        cfg.engines.len()
    );
    Ok(())
}

/// Evaluates every condition for every engine, probing `/health` once.
pub async fn doctor(cfg: AgentConfig, json_out: bool) -> Result<(), CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let driver = crate::agent::driver_config(&cfg.agent);
    let sampler_result = tokio::task::spawn_blocking(move || {
        let s = Sampler::start(&driver, &SamplerConfig::default());
        if let Ok(s) = &s {
            s.wait_settled(Duration::from_secs(10));
        }
        s
    })
    .await
    .context("sampler start-up")?;
    // The fault-code levels the agent would use; a bad table is reported, the built-in used.
    let table_note = match FaultTable::configured(cfg.agent.fault_code_file.as_deref()) {
        Ok(t) => {
            let origin = t.origin.clone();
            if let Ok(s) = &sampler_result {
                s.shared().fault_levels.set_table(t);
            }
            format!("levels from {origin}")
        }
        Err(e) => format!("[agent] fault_code_file: {e}; levels from the built-in table"),
    };
    // Every NPU's source and why, as `devices --json` shows it.
    let devices: Vec<serde_json::Value> = match &sampler_result {
        Ok(sampler) => {
            let now = sampler.shared().ring.now_ns();
            sampler
                .devices()
                .iter()
                .map(|d| {
                    let s = d.snapshot(now);
                    json!({
                        "id": s.id,
                        "backend": s.backend,
                        "method": s.method,
                        "source": s.source,
                        "source_reason": s.source_reason,
                        "source_note": s.source_note,
                        "device_gone": s.device_gone,
                        "health": s.health,
                    })
                })
                .collect()
        }
        Err(_) => Vec::new(),
    };
    let mut reports = Vec::new();
    for spec in &cfg.engines {
        // The driver's faults on the engine's NPUs and what each does under its policy.
        let agent = spec.agent_policy_in_force().is_some();
        let faults: Vec<(u32, crate::server::wire::DeviceFault)> = match &sampler_result {
            Ok(sampler) => (0..sampler.devices().len() as u16)
                .filter(|&i| {
                    let id = sampler.devices()[usize::from(i)].info.id;
                    spec.devices
                        .value
                        .as_ref()
                        .is_none_or(|ids| ids.contains(&id))
                })
                .flat_map(|i| sampler.shared().faults_of(i))
                .map(|f| (f.npu, crate::server::wire::DeviceFault::of(f, agent)))
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut conditions = gates::static_conditions(spec);
        match &sampler_result {
            Ok(sampler) => {
                let cube: Vec<(u32, crate::driver::Backend)> = sampler
                    .devices()
                    .iter()
                    .filter(|d| {
                        spec.devices
                            .value
                            .as_ref()
                            .is_none_or(|ids| ids.contains(&d.info.id))
                    })
                    .map(|d| (d.info.id, d.source().backend()))
                    .collect();
                let mut c = gates::cube_condition(&cube);
                if let Some(ids) = &spec.devices.value {
                    let missing: Vec<u32> = ids
                        .iter()
                        .filter(|id| !cube.iter().any(|(c, _)| c == *id))
                        .copied()
                        .collect();
                    if !missing.is_empty() {
                        c.ok = Some(false);
                        c.note =
                            format!("NPUs {missing:?} ({}) were not found", spec.devices.source);
                    }
                }
                conditions.push(c);
            }
            Err(e) => conditions.push(Condition {
                name: "ai_cube".into(),
                value: "no driver backend".to_owned(),
                ok: Some(false),
                note: e.to_string(),
            }),
        }
        let health = match EngineClient::new(spec) {
            Ok(client) => {
                let hc = &spec.health_check_config;
                let mut collector = HealthCollector::new(
                    client.health(),
                    Duration::from_secs(hc.health_collector_timeout),
                    hc.health_collector_timeout_retry_attempts,
                );
                let outcome = collector.probe().await;
                let state = Monitor::new(spec.clone(), Vec::new());
                state.record_health(&outcome, collector.has_connected());
                let d = state.health_detail();
                let mut c =
                    gates::health_condition(collector.has_connected(), d.last_error.as_deref());
                use crate::monitor::verdict::HealthState;
                // One probe: a failure within the agent policy's grace fails here too.
                if matches!(d.state, HealthState::Unhealthy | HealthState::Failing) {
                    c.ok = Some(false);
                    c.value = "answers unhealthy".to_owned();
                    c.note = d.last_error.unwrap_or_default();
                }
                c
            }
            Err(e) => Condition {
                name: "health".into(),
                value: "no client".to_owned(),
                ok: Some(false),
                note: e.to_string(),
            },
        };
        conditions.push(health);
        let will_run = conditions.iter().all(|c| c.ok == Some(true));
        reports.push((spec, conditions, will_run, faults));
    }
    if let Ok(s) = sampler_result {
        tokio::task::spawn_blocking(move || s.shutdown()).await.ok();
    }
    if json_out {
        let engines: Vec<_> = reports
            .iter()
            .map(|(spec, conditions, will_run, faults)| {
                let faults: Vec<serde_json::Value> = faults
                    .iter()
                    .map(|(npu, f)| {
                        let mut v = json!(f);
                        v["npu"] = json!(npu);
                        v
                    })
                    .collect();
                json!({
                    "engine": spec.name,
                    "inference": spec.infer_authority(),
                    "mgmt_listen": spec.mgmt_listen,
                    "policy": spec.policy.value,
                    "policy_source": spec.policy.source,
                    "actions": crate::integrations::active(spec, &cfg.agent),
                    "conditions": conditions,
                    "virtual_inference_will_run": will_run,
                    "virtual_inference_blocked_by": names_where(conditions, Some(false)),
                    "virtual_inference_waits_for": names_where(conditions, None),
                    "driver_faults": faults,
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "engines": engines, "devices": devices, "fault_levels": table_note })
        );
        return Ok(());
    }
    if !devices.is_empty() {
        println!("NPUs");
        for d in &devices {
            let gone = if d["device_gone"] == true {
                " (device gone: the driver reports it does not exist)"
            } else {
                ""
            };
            println!(
                "  {:<4} {:<8} {:<28} {}{gone}",
                d["id"],
                d["backend"].as_str().unwrap_or(""),
                d["method"].as_str().unwrap_or(""),
                d["source_note"].as_str().unwrap_or("")
            );
        }
        println!();
    }
    for (spec, conditions, will_run, faults) in &reports {
        println!(
            "engine {} ({} role, inference {}, /status on {})",
            spec.name,
            spec.role.as_str(),
            spec.infer_authority(),
            spec.mgmt_listen
        );
        println!(
            "  policy {} (from {}){}",
            spec.policy.value.as_str(),
            spec.policy.source,
            match spec.policy.value {
                crate::config::policy::Policy::Reference => "",
                crate::config::policy::Policy::Agent => {
                    "; `policy = \"reference\"` in [agent] restores MindIE V5's detection exactly (docs/policy.md)"
                }
            }
        );
        println!("  actions:");
        for a in crate::integrations::active(spec, &cfg.agent) {
            println!("    {:<15} {}", a.integration, a.action);
        }
        println!("  {:<26} {:<44} VERDICT", "CONDITION", "VALUE");
        for c in conditions {
            let verdict = match c.ok {
                Some(true) => "ok".to_owned(),
                Some(false) => format!("blocks: {}", c.note),
                None => format!("pending: {}", c.note),
            };
            println!("  {:<26} {:<44} {verdict}", c.name, c.value);
        }
        if faults.is_empty() {
            println!("  driver faults: none reported ({table_note})");
        } else {
            println!("  driver faults ({table_note}):");
            for (npu, f) in faults {
                println!(
                    "    NPU {npu} {} {}level {}: {}",
                    f.hex,
                    f.text
                        .as_deref()
                        .map(|t| format!("({t}) "))
                        .unwrap_or_default(),
                    f.level,
                    f.note
                );
            }
        }
        let (blocked, waits) = (
            names_where(conditions, Some(false)),
            names_where(conditions, None),
        );
        println!(
            "  => virtual inference {}\n",
            if *will_run {
                "will run (it starts at the first /status after /health answers)".to_owned()
            } else if !blocked.is_empty() {
                format!("will NOT run: blocked by {}", blocked.join(", "))
            } else {
                format!(
                    "waits for {} (it runs once they are met, from the first /status after /health answers)",
                    waits.join(", ")
                )
            }
        );
    }
    Ok(())
}

/// The names of the conditions whose verdict is `ok` (`Some(false)`: blocking; `None`:
/// pending).
fn names_where(conditions: &[Condition], ok: Option<bool>) -> Vec<String> {
    conditions
        .iter()
        .filter(|c| c.ok == ok)
        .map(|c| c.name.to_string())
        .collect()
}
