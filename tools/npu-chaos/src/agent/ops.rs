//! The operations on the agent, per supervisor: a restart, a crash and an outage done by
//! hand (direct) or through `systemctl --user` (systemd), and the rolling upgrade's
//! handover; each timed to the first `/status` answer after the old process was gone.

use super::{
    ANSWER_LIMIT, Agent, AgentOp, DEFAULT_RESTART_SEC, DEFAULT_STOP_TIMEOUT, HANDOVER_LIMIT,
    Process, Supervisor,
};
use crate::experiment::Fault;
use crate::priority;
use crate::systemd::{self, UserManager};
use crate::timescale::scaled;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Milliseconds from `t0` to `t` (negative before).
pub(super) fn rel(t0: Instant, t: Instant) -> i64 {
    if t >= t0 {
        (t - t0).as_millis() as i64
    } else {
        -((t0 - t).as_millis() as i64)
    }
}

pub(super) async fn act(
    a: &mut Agent,
    fault: Fault,
    s: f64,
    status_url: &str,
    t0: Instant,
) -> AgentOp {
    let started = Instant::now();
    let supervisor = if fault == Fault::AgentUpgrade {
        Supervisor::Direct
    } else {
        a.supervisor
    };
    let mut op = AgentOp {
        fault: fault.to_string(),
        supervisor,
        how: String::new(),
        started_ms: rel(t0, started),
        old_pid: a.pid(),
        old_exit: None,
        new_pid: None,
        new_running_ms: None,
        answered_ms: None,
        log: "agent.log".to_owned(),
        error: None,
    };
    let result = match (fault, a.supervisor) {
        (Fault::AgentUpgrade, _) => upgrade(a, &mut op).await,
        (_, Supervisor::Direct) => direct(a, fault, s, &mut op).await,
        (_, Supervisor::Systemd) => under_systemd(a, fault, s, &mut op).await,
    };
    let running = Instant::now();
    match result {
        Ok(()) => {
            op.new_running_ms = Some(rel(t0, running));
            op.new_pid = a.pid();
            match first_answer(status_url).await {
                Some(at) => op.answered_ms = Some(rel(t0, at)),
                None => {
                    op.error = Some(format!(
                        "{fault}: the new agent (pid {}) did not answer /status within {ANSWER_LIMIT:?}",
                        op.new_pid.map_or("?".to_owned(), |p| p.to_string())
                    ));
                }
            }
        }
        Err(e) => op.error = Some(format!("{fault}: {e}")),
    }
    op
}

/// A restart, crash or outage of a directly started agent.
pub(super) async fn direct(
    a: &mut Agent,
    fault: Fault,
    s: f64,
    op: &mut AgentOp,
) -> Result<(), String> {
    let launch = a
        .launch
        .clone()
        .ok_or("this health service cannot be restarted")?;
    let Process::Direct(mut child) = std::mem::replace(&mut a.process, Process::Gone) else {
        return Err("no agent process to act on".to_owned());
    };
    let pid = child.id();
    let pid_text = pid.map_or("?".to_owned(), |p| p.to_string());
    let (how, after) = match fault {
        Fault::AgentRestart => (
            format!("SIGTERM to pid {pid_text}, its exit awaited, a new agent at once"),
            Duration::ZERO,
        ),
        Fault::AgentCrash => (
            format!(
                "SIGKILL to pid {pid_text}, a new agent after the unit's RestartSec= ({:?}, scaled)",
                a.restart_sec
            ),
            a.restart_sec,
        ),
        Fault::AgentOutage(d) => {
            let d = scaled(d, s);
            (
                format!(
                    "SIGTERM to pid {pid_text}, its exit awaited, no agent for {d:?}, a new agent"
                ),
                d,
            )
        }
        other => return Err(format!("{other} is not an agent restart")),
    };
    op.how = how.clone();
    a.note(&format!("{fault} (direct): {how}"));
    let status = if fault == Fault::AgentCrash {
        let _ = child.kill().await;
        child.wait().await
    } else {
        terminate(&mut child, a.stop_timeout).await
    };
    op.old_exit = Some(match status {
        Ok(st) => st.to_string(),
        Err(e) => format!("not awaited: {e}"),
    });
    tokio::time::sleep(after).await;
    let new = launch.spawn(&launch.log, true).await?;
    a.process = Process::Direct(new);
    Ok(())
}

/// SIGTERM, then the exit within `limit`, else SIGKILL.
pub(super) async fn terminate(
    child: &mut Child,
    limit: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(st) => st,
        Err(_) => {
            let _ = child.kill().await;
            child.wait().await
        }
    }
}

/// The Kubernetes handover: a second agent beside the first; the first must exit by itself.
pub(super) async fn upgrade(a: &mut Agent, op: &mut AgentOp) -> Result<(), String> {
    let launch = a
        .launch
        .clone()
        .ok_or("this health service cannot be upgraded")?;
    if a.supervisor == Supervisor::Systemd {
        return Err("agent_upgrade runs two direct processes".to_owned());
    }
    let log = a.dir.join("agent-upgrade.log");
    op.log = "agent-upgrade.log".to_owned();
    op.how = format!(
        "a second agent (same config, RUNTIME_DIRECTORY {}) beside pid {}; the first must exit by itself",
        launch.state_dir.display(),
        op.old_pid.map_or("?".to_owned(), |p| p.to_string())
    );
    a.note(&format!(
        "agent_upgrade (direct): {}; its log: agent-upgrade.log",
        op.how
    ));
    let mut second = launch.spawn(&log, false).await?;
    let Process::Direct(first) = &mut a.process else {
        return Err("no first agent".to_owned());
    };
    let end = Instant::now() + HANDOVER_LIMIT;
    loop {
        if let Ok(Some(st)) = first.try_wait() {
            op.old_exit = Some(st.to_string());
            a.note(&format!(
                "agent_upgrade: the first agent exited ({st}); the second (pid {}) is the agent now",
                second.id().map_or("?".to_owned(), |p| p.to_string())
            ));
            a.process = Process::Direct(second);
            return Ok(());
        }
        if let Ok(Some(st)) = second.try_wait() {
            let why = last_lines(&log, 3);
            a.note(&format!(
                "agent_upgrade: the second agent exited ({st}) without taking over"
            ));
            return Err(format!(
                "the second agent exited ({st}) without taking over; the first keeps running. agent-upgrade.log: {why}"
            ));
        }
        if Instant::now() >= end {
            let _ = terminate(&mut second, Duration::from_secs(5)).await;
            return Err(format!(
                "no handover within {HANDOVER_LIMIT:?}: the first agent did not exit; the second was stopped"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A restart, crash or outage of the agent's unit.
pub(super) async fn under_systemd(
    a: &mut Agent,
    fault: Fault,
    s: f64,
    op: &mut AgentOp,
) -> Result<(), String> {
    let unit = match &a.process {
        Process::Systemd { unit, .. } => unit.clone(),
        _ => return Err("the agent's unit is gone".to_owned()),
    };
    let old = a.pid();
    let u = unit.as_str();
    match fault {
        Fault::AgentRestart => {
            op.how = format!("systemctl --user restart {u}");
            a.note(&format!("agent_restart (systemd): {}", op.how));
            a.systemctl(&["restart", u]).await?;
        }
        Fault::AgentCrash => {
            op.how = format!(
                "systemctl --user kill -s SIGKILL --kill-whom=main {u}; the manager restarts it (Restart=, RestartSec={:?})",
                a.restart_sec
            );
            a.note(&format!("agent_crash (systemd): {}", op.how));
            a.systemctl(&["kill", "-s", "SIGKILL", "--kill-whom=main", u])
                .await?;
            // The unit's new main process, once active.
            let end = Instant::now() + a.restart_sec + ANSWER_LIMIT;
            loop {
                let out = a
                    .systemctl(&["show", "-p", "MainPID", "-p", "ActiveState", u])
                    .await?;
                let pid = out
                    .lines()
                    .find_map(|l| l.strip_prefix("MainPID="))
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .filter(|p| *p != 0);
                if out.contains("ActiveState=active") && pid.is_some() && pid != old {
                    break;
                }
                if Instant::now() >= end {
                    return Err(format!(
                        "the manager did not restart {u} within {:?} ({})",
                        a.restart_sec + ANSWER_LIMIT,
                        out.trim().replace('\n', ", ")
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Fault::AgentOutage(d) => {
            let d = scaled(d, s);
            op.how = format!(
                "systemctl --user stop {u}; no agent for {d:?}; systemctl --user start {u}"
            );
            a.note(&format!("{fault} (systemd): {}", op.how));
            a.systemctl(&["stop", u]).await?;
            tokio::time::sleep(d).await;
            a.systemctl(&["start", u]).await?;
        }
        other => return Err(format!("{other} is not an agent restart")),
    }
    let pid = a.refresh_main_pid().await?;
    if pid.is_none() || pid == old {
        return Err(format!("{u} has no new main process (MainPID {pid:?})"));
    }
    priority::raise_group(pid).await;
    Ok(())
}

/// `systemctl --user <args>` of `m`, from async code (at most 60 s).
pub(super) async fn run_systemctl(m: &UserManager, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::from(m.command());
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .map_err(|_| format!("systemctl --user {}: no answer within 60 s", args.join(" ")))?
        .map_err(|e| format!("systemctl: {e}"))?;
    crate::systemd::systemctl_answer(args, &out)
}

/// When `/status` first answers (any readable status), polling every 10 ms on fresh
/// connections (a pooled one could be the old process's).
pub(super) async fn first_answer(url: &str) -> Option<Instant> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2))
        .build()
        .ok()?;
    let end = Instant::now() + ANSWER_LIMIT;
    while Instant::now() < end {
        if let Ok(r) = client.get(url).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && v["status"].is_string()
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Whether `pid` runs (not a zombie).
pub(super) fn alive(pid: u32) -> bool {
    crate::procfs::stat_field::<String>(pid, 3).is_some_and(|s| s != "Z")
}

pub(super) fn restart_sec(u: &systemd::UserUnit) -> Duration {
    u.service_value("RestartSec")
        .and_then(systemd::parse_timespan)
        .unwrap_or(DEFAULT_RESTART_SEC)
}

pub(super) fn stop_timeout(u: &systemd::UserUnit) -> Duration {
    u.service_value("TimeoutStopSec")
        .or_else(|| u.service_value("TimeoutSec"))
        .and_then(systemd::parse_timespan)
        .unwrap_or(DEFAULT_STOP_TIMEOUT)
}

pub(super) fn parent(p: &Path) -> PathBuf {
    p.parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The last `n` non-empty lines of a file, on one line.
pub(super) fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
