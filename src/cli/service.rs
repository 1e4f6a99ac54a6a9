//! `check-config` and `doctor`: what the agent will do, before it does it.

use super::CliError;
use crate::agent::account::Account;
use crate::config::policy::Policy;
use crate::config::{AgentConfig, EngineSpec};
use crate::continuity::StateDir;
use crate::continuity::trust::Checked;
use crate::driver::Backend;
use crate::driver::fault_levels::FaultTable;
use crate::integrations::kubernetes::config::KubernetesConfig;
use crate::monitor::gates::Condition;
use crate::monitor::verdict::HealthState;
use crate::monitor::{HealthDetail, Monitor};
use crate::probe::health::{HealthCollector, HealthOutcome};
use crate::probe::http::EngineClient;
use crate::sampler::{Sampler, SamplerConfig, StartError};
use anyhow::Context;
use npu_health_wire::DeviceFault;
use serde_json::json;
use std::time::Duration;

/// Checks what `run` checks before it serves, then prints the effective configuration
/// (defaults filled in) as JSON.
///
/// `run` starts the sampler and checks the TLS files and every engine's NPUs against those
/// the driver reports ([`crate::agent::preflight::host`]); this starts the same sampler for
/// that, and stops it. Without a driver backend `run` starts anyway (without NPU figures),
/// so this does not fail either: it says on stderr that the NPUs were not checked.
///
/// `user` (`--user`): check as the agent running as that user would (the unit's `User=`): the
/// state directory must be that user's, and every file the agent cannot start without must
/// be one it can open ([`crate::agent::account`]).
///
/// A valid configuration that may not do what was meant is said last, before the verdict: a
/// `WARNING` per engine with virtual inference off, a note per `/status` on loopback.
pub(super) fn check_config(cfg: &AgentConfig, user: Option<&str>) -> Result<(), CliError> {
    let account = user
        .map(Account::lookup)
        .transpose()
        .map_err(|e| crate::config::ConfigError::new(&cfg.source, "", e))?;
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
    let state_dir = crate::agent::preflight::state_dir_as(cfg, account.as_ref())?;
    match &account {
        Some(a) => reachable_as(cfg, a)?,
        None => root_note(cfg),
    }
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
    print_state_dir(cfg, state_dir);
    for note in cfg.loopback_status() {
        eprintln!("{}: note: {note}", cfg.source);
    }
    for warning in cfg.virtual_inference_off() {
        eprintln!("{}: WARNING: {warning}", cfg.source);
    }
    eprintln!(
        "{}: configuration is valid ({} engine(s))",
        cfg.source,
        cfg.engines.len()
    );
    Ok(())
}

/// `--user`: fails when `account` cannot open a file the agent cannot start without, naming
/// each; a file it starts without is a `WARNING`.
fn reachable_as(cfg: &AgentConfig, account: &Account) -> Result<(), CliError> {
    let found = crate::agent::account::unreachable_files(cfg, account);
    for w in &found.warnings {
        eprintln!("{}: WARNING: {w}", cfg.source);
    }
    match found.error(&cfg.source) {
        Some(e) => Err(CliError::usage(e)),
        None => Ok(()),
    }
}

/// Without `--user`, as root: root reads every file, and the package's service user may not.
fn root_note(cfg: &AgentConfig) {
    let tokens = cfg.agent.admin_auth.token_file.is_some()
        || KubernetesConfig::of(&cfg.agent).is_some_and(|k| k.token_file.is_some());
    if rustix::process::geteuid().is_root() && tokens && Account::lookup("npu-health-agent").is_ok()
    {
        eprintln!(
            "{}: note: checked as root, who reads every token file; the package's unit runs the agent as npu-health-agent: `check-config --user npu-health-agent` checks as it",
            cfg.source
        );
    }
}

/// What survives the agent's own restarts, and whether a new agent can take over.
fn print_state_dir(cfg: &AgentConfig, state_dir: Option<(StateDir, Checked)>) {
    match state_dir {
        Some((d, checked)) => eprintln!(
            "{}: state directory {} ({}{}): each engine's state survives a restart of the agent, and a new agent started with it takes over from a running one",
            cfg.source,
            d.path().display(),
            d.from,
            match checked {
                Checked::Exists => "",
                Checked::Missing { .. } => ", created mode 0700 at start",
            }
        ),
        None => eprintln!(
            "{}: no state directory ([agent] state_dir, or systemd's RuntimeDirectory=): a restart of the agent forgets what it saw, and no agent can take over from a running one",
            cfg.source
        ),
    }
}

/// Evaluates every condition for every engine, probing `/health` once; fails with
/// [`super::EXIT_VIRTUAL_INFERENCE_BLOCKED`] when virtual inference will not run for one.
pub(super) async fn doctor(cfg: AgentConfig, json_out: bool) -> Result<(), CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sampler = start_sampler(&cfg).await?;
    let table_note = fault_levels(&cfg, &sampler);
    let devices = device_rows(&sampler);
    let mut reports = Vec::new();
    for spec in &cfg.engines {
        reports.push(examine(spec, &sampler).await);
    }
    if let Ok(s) = sampler {
        tokio::task::spawn_blocking(move || s.shutdown()).await.ok();
    }
    if json_out {
        print_json(&cfg, &reports, &devices, &table_note);
    } else {
        print_text(&cfg, &reports, &devices, &table_note);
    }
    blocked(&reports)
}

/// `doctor`'s exit: [`super::EXIT_VIRTUAL_INFERENCE_BLOCKED`] when a condition blocks virtual
/// inference for an engine, naming each such engine and its conditions; one that only waits
/// for a condition still to come (`/health` not answered yet) is no failure.
fn blocked(reports: &[Report]) -> Result<(), CliError> {
    let engines: Vec<String> = reports
        .iter()
        .filter(|r| !r.will_run)
        .filter_map(|r| {
            let by = names_where(&r.conditions, Some(false));
            (!by.is_empty()).then(|| format!("{} (blocked by {})", r.spec.name, by.join(", ")))
        })
        .collect();
    if engines.is_empty() {
        return Ok(());
    }
    Err(CliError {
        code: super::EXIT_VIRTUAL_INFERENCE_BLOCKED,
        error: anyhow::anyhow!(
            "virtual inference will not run for engine {}",
            engines.join(", engine ")
        ),
    })
}

/// What `doctor` found for one engine.
struct Report<'a> {
    spec: &'a EngineSpec,
    conditions: Vec<Condition>,
    will_run: bool,
    /// The driver's faults on the engine's NPUs, with what each does under its policy.
    faults: Vec<(u32, DeviceFault)>,
}

/// Starts the sampler the agent would, and waits for its first readings.
async fn start_sampler(cfg: &AgentConfig) -> Result<Result<Sampler, StartError>, CliError> {
    let driver = crate::agent::driver_config(&cfg.agent);
    let sampler = tokio::task::spawn_blocking(move || {
        let s = Sampler::start(&driver, &SamplerConfig::default());
        if let Ok(s) = &s {
            s.wait_settled(Duration::from_secs(10));
        }
        s
    })
    .await
    .context("sampler start-up")?;
    Ok(sampler)
}

/// The fault-code levels the agent would use, handed to the sampler; a bad table is
/// reported, the built-in used.
fn fault_levels(cfg: &AgentConfig, sampler: &Result<Sampler, StartError>) -> String {
    match FaultTable::configured(cfg.agent.fault_code_file.as_deref()) {
        Ok(t) => {
            let described = t.describe();
            if let Ok(s) = sampler {
                s.shared().fault_levels.set_table(t);
            }
            format!("levels from {described}")
        }
        Err(e) => format!("[agent] fault_code_file: {e}; levels from the built-in table"),
    }
}

/// Every NPU's source and why, as `devices --json` shows it.
fn device_rows(sampler: &Result<Sampler, StartError>) -> Vec<serde_json::Value> {
    let Ok(sampler) = sampler else {
        return Vec::new();
    };
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

/// Whether `id` is one of the engine's NPUs (all of them when it names none).
fn engine_has(spec: &EngineSpec, id: u32) -> bool {
    spec.devices
        .value
        .as_ref()
        .is_none_or(|ids| ids.contains(&id))
}

/// Gathers one engine's facts (its NPUs, one `/health` probe) and reads its conditions.
async fn examine<'a>(spec: &'a EngineSpec, sampler: &Result<Sampler, StartError>) -> Report<'a> {
    let agent = spec.agent_policy_in_force().is_some();
    let (faults, cube) = match sampler {
        Ok(sampler) => {
            let faults = (0..sampler.devices().len() as u16)
                .filter(|&i| engine_has(spec, sampler.devices()[usize::from(i)].info.id))
                .flat_map(|i| sampler.shared().faults_of(i))
                .map(|f| (f.npu, crate::monitor::snapshot::device_fault(f, agent)))
                .collect();
            let cube = sampler
                .devices()
                .iter()
                .filter(|d| engine_has(spec, d.info.id))
                .map(|d| (d.info.id, d.source().backend()))
                .collect();
            (faults, Ok(cube))
        }
        Err(e) => (Vec::new(), Err(e.to_string())),
    };
    let health = probe_health(spec).await;
    let conditions = conditions(spec, &cube, &health);
    let will_run = conditions.iter().all(|c| c.ok == Some(true));
    Report {
        spec,
        conditions,
        will_run,
        faults,
    }
}

/// One `/health` probe as the agent makes it: the outcome and whether it connected, or why
/// there is no client.
async fn probe_health(spec: &EngineSpec) -> Result<(HealthOutcome, bool), String> {
    let client = EngineClient::new(spec).map_err(|e| e.to_string())?;
    let hc = &spec.health_check_config;
    let mut collector = HealthCollector::new(
        client.health(),
        Duration::from_secs(hc.health_collector_timeout),
        hc.health_collector_timeout_retry_attempts,
    );
    let outcome = collector.probe().await;
    Ok((outcome, collector.has_connected()))
}

/// The engine's conditions as its monitor evaluates them, from the facts `doctor` gathered:
/// the NPUs' backends (or why there are none) and one `/health` probe (or why there is no
/// client). Where `doctor` knows more than the running monitor, it says so: why there is
/// no driver backend, configured NPUs the driver does not report (the running agent refuses
/// to start then), and a failed probe (one probe has no grace to wait out).
fn conditions(
    spec: &EngineSpec,
    cube: &Result<Vec<(u32, Backend)>, String>,
    health: &Result<(HealthOutcome, bool), String>,
) -> Vec<Condition> {
    let monitor = Monitor::new(spec.clone(), Vec::new());
    monitor.evaluate_gates(cube.as_deref().unwrap_or_default());
    if let Ok((outcome, has_connected)) = health {
        monitor.record_health(outcome, *has_connected);
    }
    let mut conditions = monitor.conditions();
    let find = |all: &[Condition], name: &str| all.iter().position(|c| c.name == name);
    if let Some(i) = find(&conditions, "ai_cube") {
        match cube {
            Ok(cube) => missing_npus(&mut conditions[i], spec, cube),
            Err(e) => {
                conditions[i] = blocking("ai_cube", "no driver backend", e);
            }
        }
    }
    match health {
        Ok(_) => {
            if let Some(i) = find(&conditions, "health") {
                one_probe(&mut conditions[i], &monitor.health_detail());
            }
        }
        Err(e) => conditions.push(blocking("health", "no client", e)),
    }
    conditions
}

/// A condition that blocks for a reason of `doctor`'s own.
fn blocking(name: &'static str, value: &str, note: &str) -> Condition {
    Condition {
        name: name.into(),
        value: value.to_owned(),
        ok: Some(false),
        note: note.to_owned(),
    }
}

/// Blocks `ai_cube` when the engine names NPUs the driver does not report.
fn missing_npus(c: &mut Condition, spec: &EngineSpec, cube: &[(u32, Backend)]) {
    let Some(ids) = &spec.devices.value else {
        return;
    };
    let missing: Vec<u32> = ids
        .iter()
        .filter(|id| !cube.iter().any(|(c, _)| c == *id))
        .copied()
        .collect();
    if !missing.is_empty() {
        c.ok = Some(false);
        c.note = format!("NPUs {missing:?} ({}) were not found", spec.devices.source);
    }
}

/// Blocks `health` when the one probe failed, even within the agent policy's grace.
fn one_probe(c: &mut Condition, d: &HealthDetail) {
    if matches!(d.state, HealthState::Unhealthy | HealthState::Failing) {
        c.ok = Some(false);
        c.value = "answers unhealthy".to_owned();
        c.note = d.last_error.clone().unwrap_or_default();
    }
}

/// `doctor --json`.
fn print_json(
    cfg: &AgentConfig,
    reports: &[Report],
    devices: &[serde_json::Value],
    table_note: &str,
) {
    let engines: Vec<_> = reports
        .iter()
        .map(|r| {
            let spec = r.spec;
            let faults: Vec<serde_json::Value> = r
                .faults
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
                "conditions": r.conditions,
                "virtual_inference_will_run": r.will_run,
                "virtual_inference_blocked_by": names_where(&r.conditions, Some(false)),
                "virtual_inference_waits_for": names_where(&r.conditions, None),
                "driver_faults": faults,
            })
        })
        .collect();
    println!(
        "{}",
        json!({ "engines": engines, "devices": devices, "fault_levels": table_note })
    );
}

/// `doctor`'s table: the NPUs, then each engine.
fn print_text(
    cfg: &AgentConfig,
    reports: &[Report],
    devices: &[serde_json::Value],
    table_note: &str,
) {
    if !devices.is_empty() {
        println!("NPUs");
        for d in devices {
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
    for r in reports {
        print_engine(cfg, r, table_note);
    }
}

/// One engine in `doctor`'s table: what it is, its conditions, its faults, the verdict.
fn print_engine(cfg: &AgentConfig, r: &Report, table_note: &str) {
    let spec = r.spec;
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
            Policy::Reference => "",
            Policy::Agent => {
                "; `policy = \"reference\"` in [agent] restores MindIE V5's detection exactly (docs/policy.md)"
            }
        }
    );
    println!("  actions:");
    for a in crate::integrations::active(spec, &cfg.agent) {
        println!("    {:<15} {}", a.integration, a.action);
    }
    println!("  {:<26} {:<44} VERDICT", "CONDITION", "VALUE");
    for c in &r.conditions {
        let verdict = match c.ok {
            Some(true) => "ok".to_owned(),
            Some(false) => format!("blocks: {}", c.note),
            None => format!("pending: {}", c.note),
        };
        println!("  {:<26} {:<44} {verdict}", c.name, c.value);
    }
    if r.faults.is_empty() {
        println!("  driver faults: none reported ({table_note})");
    } else {
        println!("  driver faults ({table_note}):");
        for (npu, f) in &r.faults {
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
        names_where(&r.conditions, Some(false)),
        names_where(&r.conditions, None),
    );
    println!(
        "  => virtual inference {}\n",
        if r.will_run {
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

/// The names of the conditions whose verdict is `ok` (`Some(false)`: blocking; `None`:
/// pending).
fn names_where(conditions: &[Condition], ok: Option<bool>) -> Vec<String> {
    conditions
        .iter()
        .filter(|c| c.ok == ok)
        .map(|c| c.name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Backend, Condition, EngineSpec, HealthOutcome, conditions};
    use crate::config::file;
    use crate::monitor::Monitor;
    use std::path::Path;

    fn spec(extra: &str) -> EngineSpec {
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9001\n{extra}\n[engine.health_check_config]\nenable_virtual_inference = true\n"
        );
        file::parse(&text, Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0)
    }

    fn named<'a>(all: &'a [Condition], name: &str) -> &'a Condition {
        all.iter().find(|c| c.name == name).unwrap()
    }

    // doctor reads the monitor's own conditions: for the same facts, the monitor's start
    // decision sees what doctor prints (in doctor's order: the gates, then /health).
    #[tokio::test(start_paused = true)]
    async fn doctor_reads_the_monitors_conditions() {
        let s = spec("");
        let cube = vec![(0, Backend::Dcmi)];
        let got = conditions(&s, &Ok(cube.clone()), &Ok((HealthOutcome::Healthy, true)));
        let names: Vec<&str> = got.iter().map(|c| c.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "engine_type",
                "enable_virtual_inference",
                "dp_rank",
                "headless",
                "ASCEND_GLOBAL_LOG_LEVEL",
                "npu_usage_threshold",
                "ai_cube",
                "health"
            ]
        );
        let m = Monitor::new(s.clone(), Vec::new());
        m.record_health(&HealthOutcome::Healthy, true);
        assert!(m.decide_start(&cube));
        let mut seen = m.conditions();
        seen.sort_by(|a, b| a.name.cmp(&b.name));
        let mut mine = got.clone();
        mine.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(mine, seen);
        assert!(got.iter().all(|c| c.ok == Some(true)));
    }

    // What doctor knows beyond the running monitor: why there is no driver backend, NPUs the
    // driver does not report, no client, and one failed probe (no grace to wait out).
    #[tokio::test(start_paused = true)]
    async fn doctor_adds_what_it_alone_knows() {
        let s = spec("");
        let healthy = Ok((HealthOutcome::Healthy, true));
        let got = conditions(&s, &Err("no backend: dcmi missing".into()), &healthy);
        let c = named(&got, "ai_cube");
        assert_eq!(
            (c.value.as_str(), c.ok, c.note.as_str()),
            ("no driver backend", Some(false), "no backend: dcmi missing")
        );
        let s2 = spec("devices = [0, 7]");
        let got = conditions(&s2, &Ok(vec![(0, Backend::Dcmi)]), &healthy);
        let c = named(&got, "ai_cube");
        assert_eq!(c.ok, Some(false));
        assert!(c.note.starts_with("NPUs [7] ("), "{}", c.note);
        let got = conditions(&s, &Ok(vec![(0, Backend::Dcmi)]), &Err("bad TLS".into()));
        let c = got.last().unwrap();
        assert_eq!(
            (c.name.as_ref(), c.value.as_str(), c.ok),
            ("health", "no client", Some(false))
        );
        let unhealthy = HealthOutcome::Unhealthy {
            reason: "/health answered false".into(),
            unreachable: false,
            timed_out: false,
            transport: None,
        };
        let got = conditions(&s, &Ok(vec![(0, Backend::Dcmi)]), &Ok((unhealthy, true)));
        let c = named(&got, "health");
        assert_eq!(
            (c.value.as_str(), c.ok, c.note.as_str()),
            ("answers unhealthy", Some(false), "/health answered false")
        );
        let never = HealthOutcome::NeverConnected("connection refused".into());
        let got = conditions(&s, &Ok(vec![(0, Backend::Dcmi)]), &Ok((never, false)));
        assert_eq!(named(&got, "health").ok, None, "pending, not blocking");
    }
}
