//! MindIE PyMotor 3.0.0b2's own code in the loop, from the venv `scripts/pymotor install`
//! makes under `target/pymotor/`:
//! - [`NodeManager`]: its real `HeartbeatManager`, run alone by
//!   `tools/npu-chaos/pymotor/node_manager.py`, polling the `/status` under test in real time
//!   (`--node-manager pymotor`). The driver prints one JSON line per event: `started`,
//!   `grace_over`, `heartbeat`, `suicide` (its `should_suicide()` turned true), `error`.
//! - the `mindie-3.0.0b2` peer: its released engine server's virtual inference and `/status`
//!   (`tools/npu-chaos/pymotor/engine_server.py`), in place of the agent.
//!
//! What each driver adds to the real code, and what that replaces, is written at the top of
//! the driver; the facts it relies on are in `../shared/reference/mindie-motor-pypi.md`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Where the drivers are, from the repository root.
pub const NODE_MANAGER_PY: &str = "tools/npu-chaos/pymotor/node_manager.py";
pub const ENGINE_SERVER_PY: &str = "tools/npu-chaos/pymotor/engine_server.py";

/// The PyMotor installation: `scripts/pymotor` and the repository root it belongs to.
#[derive(Debug, Clone)]
pub struct Pymotor {
    pub script: PathBuf,
    pub root: PathBuf,
}

impl Pymotor {
    /// `scripts/pymotor` of the repository at `root`, checked with `scripts/pymotor status`.
    pub async fn find(root: &Path) -> Result<Pymotor, String> {
        let script = root.join("scripts/pymotor");
        let out = Command::new(&script)
            .arg("status")
            .output()
            .await
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "MindIE PyMotor is not installed: {} (run `scripts/pymotor install`)",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Pymotor {
            script,
            root: root.to_owned(),
        })
    }

    /// `scripts/pymotor python <driver> <args>`, stdout piped, stderr into `log`.
    pub fn command(&self, driver: &str, args: &[String], log: &Path) -> Result<Command, String> {
        self.command_from(Command::new(&self.script), driver, args, log)
    }

    /// [`Self::command`] for a driver that serves `/status` (the engine server): in its own
    /// session at the health service's CPU priority ([`super::priority`]).
    pub fn health_service_command(
        &self,
        driver: &str,
        args: &[String],
        log: &Path,
    ) -> Result<Command, String> {
        self.command_from(super::priority::command(&self.script), driver, args, log)
    }

    fn command_from(
        &self,
        mut c: Command,
        driver: &str,
        args: &[String],
        log: &Path,
    ) -> Result<Command, String> {
        let stderr = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        c.arg("python")
            .arg(self.root.join(driver))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        Ok(c)
    }
}

/// The real Node Manager heartbeat, running.
pub struct NodeManager {
    child: Child,
    /// When its grace period ended (`grace_over`).
    pub grace_over: tokio::sync::watch::Receiver<Option<Instant>>,
    /// Every heartbeat as read (its line's arrival), and whether no endpoint in it was
    /// abnormal.
    heartbeats: std::sync::Arc<std::sync::Mutex<Vec<(Instant, bool)>>>,
}

impl NodeManager {
    /// Starts the driver against the endpoint whose `/status` is on `mgmt_port`; `on_kill` is
    /// called once, with the time, when its `should_suicide()` turns true. Every event line
    /// is kept in `events.jsonl` beside `log`.
    pub fn start(
        pymotor: &Pymotor,
        mgmt_port: u16,
        business_port: u16,
        dir: &Path,
        on_kill: impl FnOnce(Instant) + Send + 'static,
    ) -> Result<NodeManager, String> {
        let args = vec![
            "--mgmt-port".to_owned(),
            mgmt_port.to_string(),
            "--business-port".to_owned(),
            business_port.to_string(),
        ];
        let mut child = pymotor
            .command(NODE_MANAGER_PY, &args, &dir.join("node-manager.log"))?
            .spawn()
            .map_err(|e| format!("starting PyMotor's Node Manager: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (grace_tx, grace_over) = tokio::sync::watch::channel(None);
        let events = dir.join("node-manager-events.jsonl");
        let heartbeats = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heartbeats.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut on_kill = Some(on_kill);
            let mut kept = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                kept.push_str(&line);
                kept.push('\n');
                let _ = std::fs::write(&events, &kept);
                let value = serde_json::from_str::<Value>(&line).ok();
                let event = value
                    .as_ref()
                    .and_then(|v| v["event"].as_str().map(str::to_owned));
                match event.as_deref() {
                    Some("heartbeat") => {
                        // `status` maps each endpoint to what its last poll read; a failed
                        // poll reads `abnormal`.
                        let ok = value
                            .as_ref()
                            .and_then(|v| v["status"].as_object())
                            .is_some_and(|m| !m.values().any(|s| s == "abnormal"));
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((Instant::now(), ok));
                    }
                    Some("grace_over") => {
                        grace_tx.send_replace(Some(Instant::now()));
                    }
                    Some("suicide") => {
                        if let Some(k) = on_kill.take() {
                            k(Instant::now());
                        }
                    }
                    _ => {}
                }
            }
        });
        Ok(NodeManager {
            child,
            grace_over,
            heartbeats,
        })
    }

    /// The heartbeats so far: when each was read, and whether no endpoint was abnormal.
    pub fn heartbeats(&self) -> Vec<(Instant, bool)> {
        self.heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until its grace period is over, at most `limit`; an error when it exited or
    /// took longer (its log names why).
    pub async fn wait_grace(&mut self, limit: std::time::Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        loop {
            if self.grace_over.borrow().is_some() {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(format!(
                    "PyMotor's Node Manager exited ({st}) before its grace period ended; see node-manager.log"
                ));
            }
            if Instant::now() >= end {
                return Err(format!(
                    "PyMotor's Node Manager did not end its grace period within {limit:?}"
                ));
            }
            let _ = tokio::time::timeout(
                std::time::Duration::from_millis(200),
                self.grace_over.changed(),
            )
            .await;
        }
    }

    /// Stops it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
