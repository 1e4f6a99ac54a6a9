//! The agent's life: what a start takes over ([`Startup`]: the state directory, systemd's
//! sockets, a running agent handing over), and [`run`]: start, serve, reload on SIGHUP, hand
//! over or stop on SIGTERM.

use super::start::Startup;
use super::{AgentError, Running, handover, preflight, start, summary};

use crate::config::AgentConfig;
use crate::continuity::handover::{HandoverError, Listener};
use crate::continuity::sockets::{Inherited, Origin};
use crate::continuity::trust::Checked;
use crate::continuity::{self, HoldError, StateDir};
use crate::service::signals::{Signalled, Signals};
use crate::service::systemd::{Probe, Systemd};
use std::time::Duration;

/// What the agent does once it has handed over to a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AfterHandover {
    /// Exit 0 (systemd, or by hand).
    #[default]
    Exit,
    /// Stop everything and wait for SIGTERM (Kubernetes: an exit would restart the
    /// container, which would then take over back).
    Wait,
}

/// How `run` treats the agent's own restarts.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub after_handover: AfterHandover,
    /// How long to wait for a port another process holds (an agent that cannot hand over,
    /// such as an older version, during the first rolling update): 0 fails at once.
    pub wait_for_ports: Duration,
}

/// Re-reads the configuration for a reload.
pub type Reloader = Box<dyn Fn() -> Result<AgentConfig, String> + Send + Sync>;

/// What `run` takes over at start: the state directory, systemd's sockets, and a running
/// agent (through the state directory's handover socket).
async fn startup(cfg: &AgentConfig, opts: &RunOptions) -> Result<Startup, AgentError> {
    let state_dir = state_dir(cfg)?;
    match &state_dir {
        Some(d) => tracing::info!(
            "state directory {} ({}): the state survives a restart; a new agent started with it takes over from this one",
            d.path().display(),
            d.from
        ),
        None if cfg.agent.state_dir.is_none() => tracing::warn!(
            "no state directory ([agent] state_dir, or systemd's RuntimeDirectory=): a restart of the agent forgets what it saw, and no agent can take over from this one"
        ),
        None => {}
    }
    let mut inherited = Inherited::from_systemd();
    for r in &inherited.rejected {
        tracing::warn!("{r}: not used");
    }
    if !inherited.is_empty() {
        tracing::info!(
            "{} listening socket(s) passed back by systemd",
            inherited.len()
        );
    }
    let mut predecessor = None;
    // An agent that listens there and did not hand over may still write there.
    let mut sole_writer = true;
    if let Some(d) = &state_dir {
        match continuity::handover::connect(&d.handover_socket()).await {
            Ok(None) => {}
            Ok(Some((p, sockets))) => {
                tracing::info!(
                    "taking over from the running agent (pid {}, {}): {} listening socket(s)",
                    p.pid,
                    p.agent,
                    sockets.len()
                );
                for (_, socket) in sockets {
                    inherited.add(socket, Origin::Handover);
                }
                predecessor = Some(p);
            }
            // Whatever listens there did not hand over: start as if nothing ran (a port it
            // still holds then fails to bind, with the reason).
            Err(e @ HandoverError::Protocol { .. }) => {
                sole_writer = false;
                tracing::warn!(
                    "no handover: {e}; stop it first (its ports stay its own until it stops)"
                )
            }
            Err(e @ HandoverError::ForeignAgent { .. }) => {
                sole_writer = false;
                tracing::warn!(
                    "no handover: {e} (whoever can write the state directory can put a socket there; give the agent a directory only its user can write)"
                )
            }
            Err(e) => {
                sole_writer = false;
                tracing::warn!(
                    "no handover from the agent at {}: {e}",
                    d.handover_socket().display()
                )
            }
        }
    }
    Ok(Startup {
        state_dir,
        sole_writer,
        inherited,
        predecessor,
        wait_for_ports: opts.wait_for_ports,
    })
}

/// The state directory, created (mode 0700) if missing, and held open from now on
/// ([`StateDir::hold`]); `None` without one, or when it cannot be created or opened. One that
/// another user could change is refused, with the line `check-config` gives
/// ([`preflight::state_dir`]).
fn state_dir(cfg: &AgentConfig) -> Result<Option<StateDir>, AgentError> {
    let refuse = |e: crate::config::ConfigError| AgentError::Config(e.to_string());
    let Some((mut d, checked)) = preflight::state_dir(cfg).map_err(refuse)? else {
        return Ok(None);
    };
    if let Checked::Missing { .. } = checked {
        if let Err(e) = d.create() {
            tracing::warn!(
                "{e}: the agent's state will not survive a restart, and no agent can take over from this one"
            );
            return Ok(None);
        }
        // Again: what was created, and whatever appeared on the path meanwhile.
        d.check()
            .map_err(|e| refuse(preflight::untrusted(cfg, &d, e)))?;
    }
    match d.hold() {
        Ok(()) => Ok(Some(d)),
        Err(HoldError::Untrusted(e)) => Err(refuse(preflight::untrusted(cfg, &d, e))),
        Err(e @ HoldError::Open { .. }) => {
            tracing::warn!(
                "{e}: the agent's state will not survive a restart, and no agent can take over from this one"
            );
            Ok(None)
        }
    }
}

/// How the serving phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// SIGTERM or SIGINT.
    Stopped,
    /// A new agent took the sockets and the state.
    HandedOver,
}

/// Runs until SIGTERM or SIGINT; SIGHUP applies `reload()`'s config. systemd is told when
/// the agent is ready, reloading and stopping, and its watchdog is pinged while the sampler
/// lives. A new agent started with the same state directory takes over ([`continuity`]).
/// Its phases: starting (a stop request cancels it), serving (signals and hand-overs),
/// stopping (a second stop request exits at once), and, after a hand-over under
/// `--after-handover wait`, idle until SIGTERM.
pub async fn run(cfg: AgentConfig, reload: Reloader, opts: RunOptions) -> Result<(), AgentError> {
    // Handlers first: a SIGHUP during start-up must not kill the agent.
    let mut signals = Signals::install()
        .map_err(|e| AgentError::Runtime(format!("cannot install signal handlers: {e}")))?;
    let mut systemd = Systemd::from_env();
    let Some((mut running, reload_pending)) = starting(cfg, &opts, &mut signals).await? else {
        return Ok(());
    };
    let mut handover = match running.after_start().await {
        Ok(h) => h,
        Err(e) => {
            systemd.stopping();
            stopping(running, &mut signals).await;
            return Err(e);
        }
    };
    systemd.store_sockets(&running.sockets());
    announce_ready(&running, &mut systemd);
    let ended = running
        .serving(
            &mut signals,
            &mut systemd,
            &reload,
            &handover,
            reload_pending,
        )
        .await;
    systemd.stopping();
    if ended == Ended::Stopped
        && let Some(h) = handover.take()
    {
        h.remove();
    }
    stopping(running, &mut signals).await;
    if ended == Ended::HandedOver && opts.after_handover == AfterHandover::Wait {
        idle_after_handover(&mut signals).await;
    }
    tracing::info!("stopped");
    if let Some(l) = crate::logging::global() {
        l.flush();
    }
    Ok(())
}

/// Starts the agent, or `None` when a stop request came first; with whether a reload was
/// asked for meanwhile (it is applied right after the start). Signals from before this
/// point (caught since the first line of main) count the same.
async fn starting(
    cfg: AgentConfig,
    opts: &RunOptions,
    signals: &mut Signals,
) -> Result<Option<(Running, bool)>, AgentError> {
    let mut reload_pending = false;
    match signals.early() {
        Some(Signalled::Stop(name)) => {
            tracing::info!("received {name} while starting; not starting");
            return Ok(None);
        }
        Some(Signalled::Reload) => reload_pending = true,
        None => {}
    }
    // Taking over from a running agent is part of the start: a stop request ends it too.
    let starting = async move {
        let boot = startup(&cfg, opts).await?;
        start(cfg, boot).await
    };
    tokio::pin!(starting);
    loop {
        tokio::select! {
            r = &mut starting => return Ok(Some((r?, reload_pending))),
            req = signals.next() => match req {
                Signalled::Stop(name) => {
                    tracing::info!("received {name} while starting; not starting");
                    return Ok(None);
                }
                Signalled::Reload => reload_pending = true,
            },
        }
    }
}

/// Tells systemd the agent is ready, with its status line and its liveness check.
fn announce_ready(running: &Running, systemd: &mut Systemd) {
    let (roster, shared) = (running.roster(), running.shared().clone());
    let status = Box::new(move || summary(&roster, &shared));
    systemd.ready(Probe {
        status,
        alive: running.liveness_probe(),
        runtime: tokio::runtime::Handle::current(),
    });
    tracing::info!("ready: {}", running.summary());
}

/// Stops the agent; a second stop request meanwhile exits at once.
async fn stopping(running: Running, signals: &mut Signals) {
    let stopping = running.stop();
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            _ = &mut stopping => return,
            req = signals.next() => match req {
                // A second stop request: the operator wants out now.
                Signalled::Stop(name) => {
                    tracing::warn!("received {name} again while stopping; exiting now");
                    if let Some(l) = crate::logging::global() {
                        l.flush();
                    }
                    std::process::exit(0);
                }
                Signalled::Reload => tracing::info!("received SIGHUP while stopping; ignored"),
            },
        }
    }
}

/// After a hand-over under `--after-handover wait`: idle until SIGTERM (an exit would
/// restart the container).
async fn idle_after_handover(signals: &mut Signals) {
    tracing::info!(
        "handed over; idle until SIGTERM (--after-handover wait: an exit would restart this container)"
    );
    loop {
        match signals.next().await {
            Signalled::Stop(name) => {
                tracing::info!("received {name}; exiting");
                return;
            }
            Signalled::Reload => tracing::info!("received SIGHUP after handing over; ignored"),
        }
    }
}

impl Running {
    /// Serves until a stop request or a hand-over: each SIGHUP reloads (`reload_pending`: one
    /// came while starting), each connection on the hand-over socket may take over.
    async fn serving(
        &mut self,
        signals: &mut Signals,
        systemd: &mut Systemd,
        reload: &Reloader,
        handover: &Option<Listener>,
        mut reload_pending: bool,
    ) -> Ended {
        loop {
            let req = if std::mem::take(&mut reload_pending) {
                Signalled::Reload
            } else {
                let conn = tokio::select! {
                    req = signals.next() => Ok(req),
                    conn = handover::accept(handover.as_ref()) => Err(conn),
                };
                match conn {
                    Ok(req) => req,
                    Err(conn) => match self.hand_over(conn, signals, &mut reload_pending).await {
                        handover::Outcome::HandedOver => return Ended::HandedOver,
                        handover::Outcome::ServingOn => continue,
                        handover::Outcome::Stop(name) => Signalled::Stop(name),
                    },
                }
            };
            match req {
                Signalled::Stop(name) => {
                    tracing::info!("received {name}; shutting down");
                    return Ended::Stopped;
                }
                Signalled::Reload => self.on_sighup(systemd, reload).await,
            }
        }
    }

    /// SIGHUP: reloads the configuration `reload` reads, keeps systemd's store of sockets
    /// to what the agent listens on now, and says how it went.
    async fn on_sighup(&mut self, systemd: &mut Systemd, reload: &Reloader) {
        tracing::info!("received SIGHUP; reloading the configuration");
        systemd.reloading();
        let before: Vec<String> = self.sockets().into_iter().map(|(n, _)| n).collect();
        let outcome = match reload() {
            Err(e) => Err(e),
            Ok(new) => self.reload(new).await,
        };
        // systemd keeps what the agent listens on now, and nothing it closed.
        let now = self.sockets();
        let gone: Vec<String> = before
            .into_iter()
            .filter(|n| now.iter().all(|(m, _)| m != n))
            .collect();
        systemd.forget_sockets(&gone);
        systemd.store_sockets(&now);
        match outcome {
            Ok(s) if s.failed.is_empty() => {
                tracing::info!("configuration reloaded: {s}");
                systemd.reloaded(&self.summary());
            }
            Ok(s) => {
                tracing::error!("configuration reloaded in part: {s}");
                systemd.reloaded(&format!(
                    "{} (last reload in part: {} did not start)",
                    self.summary(),
                    s.failed.join(", ")
                ));
            }
            Err(e) => {
                tracing::error!("configuration rejected, the previous one keeps running: {e}");
                systemd.reloaded(&format!("{} (last reload rejected: {e})", self.summary()));
            }
        }
    }
}

impl Running {
    /// A liveness check that outlives `self` (for the systemd thread).
    fn liveness_probe(&self) -> Box<dyn Fn() -> Result<(), String> + Send> {
        let shared = self.shared.clone();
        let cfg = self.liveness_cfg.clone();
        Box::new(move || shared.liveness(cfg.get()))
    }
}
