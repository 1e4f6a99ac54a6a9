//! The running agent's side of a handover ([`crate::continuity::handover`]): offer the
//! listening sockets to a new agent, stop accepting and write the state when it takes them,
//! and stop once it serves; or, if it goes away half-way or misses a deadline, accept again
//! and carry on. The steps race the signals, so a stalled peer never holds up the main
//! loop: a stop request abandons the handover at any step (accepting again first if paused,
//! so the stop drains and writes the state as any stop does), and a reload asked for
//! meanwhile is applied once it ends. And the new agent's last step: tell the old one it
//! serves, and listen for the next.

use super::{AgentError, Running};
use crate::continuity::handover::{HandoverError, Listener, STATE_WRITE_WAIT, Successor};
use crate::service::signals::{Signalled, Signals};
use std::os::fd::OwnedFd;
use tokio::net::UnixStream;
use tokio::time::Instant;

/// The next agent connecting to `listener`; never, without one.
pub(super) async fn accept(listener: Option<&Listener>) -> Result<UnixStream, HandoverError> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// How a handover ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The new agent serves; this one stops.
    HandedOver,
    /// This agent serves on.
    ServingOn,
    /// A stop request came meanwhile (the signal's name): the handover was abandoned.
    Stop(&'static str),
}

/// Waits for `step` while serving the signals: a stop request ends the wait (`Err` with its
/// name); a reload is noted in `reload`, to be applied when the handover ends.
async fn racing<T>(
    signals: &mut Signals,
    reload: &mut bool,
    step: impl std::future::Future<Output = T>,
) -> Result<T, &'static str> {
    tokio::pin!(step);
    loop {
        tokio::select! {
            out = &mut step => return Ok(out),
            req = signals.next() => match req {
                Signalled::Stop(name) => return Err(name),
                Signalled::Reload => {
                    if !*reload {
                        tracing::info!("received SIGHUP during a handover; reloading once it ends");
                    }
                    *reload = true;
                }
            },
        }
    }
}

fn abandoned(name: &'static str, pid: Option<u32>) -> Outcome {
    let to = pid
        .map(|p| format!(" to the agent pid {p}"))
        .unwrap_or_default();
    tracing::info!("received {name} during the handover{to}: abandoned");
    Outcome::Stop(name)
}

impl Running {
    /// After start: tells the agent this one took over from that it serves now, and listens
    /// for the next one (none without a state directory). An error when that agent said it
    /// accepts again instead (this one came too late): this one must not serve beside it.
    pub(super) async fn after_start(&mut self) -> Result<Option<Listener>, AgentError> {
        let took_over = match self.predecessor.take() {
            Some(p) => {
                let pid = p.pid;
                match p.serving().await {
                    Ok(()) => tracing::info!(
                        "serving; the agent this one took over from (pid {pid}) finishes its requests and stops"
                    ),
                    Err(e @ HandoverError::Refused { .. }) => {
                        return Err(AgentError::Runtime(format!(
                            "the agent this one took over from (pid {pid}) accepts again: {e}; this one stops"
                        )));
                    }
                    Err(e) => tracing::warn!(
                        "serving, but the agent this one took over from (pid {pid}) was not told: {e}"
                    ),
                }
                true
            }
            None => false,
        };
        let Some(dir) = self.state_dir.as_ref() else {
            return Ok(None);
        };
        match Listener::bind(&dir.handover_socket(), took_over) {
            Ok(l) => Ok(Some(l)),
            // Another agent with this state directory serves ports of its own: two agents
            // share the directory, and the state file is no longer this one's alone.
            Err(e @ HandoverError::Held { .. }) => {
                tracing::warn!(
                    "{e}: no agent can take over from this one, and both write the state file of this state directory; give each agent its own"
                );
                Ok(None)
            }
            Err(e) => {
                tracing::warn!("{e}: no agent can take over from this one");
                Ok(None)
            }
        }
    }

    /// Duplicates of every listening socket, with the address each is bound to.
    fn socket_dups(&self) -> Result<Vec<(std::net::SocketAddr, OwnedFd)>, HandoverError> {
        self.listeners()
            .map(|l| {
                l.socket
                    .try_clone()
                    .map(|s| (l.bound, OwnedFd::from(s)))
                    .map_err(|source| HandoverError::Duplicate {
                        addr: l.bound,
                        source,
                    })
            })
            .collect()
    }

    fn pause_listeners(&self) {
        for l in self.listeners() {
            l.pause();
        }
    }

    fn resume_listeners(&mut self) {
        let listeners = self
            .engines
            .iter_mut()
            .map(|e| &mut e.listener)
            .chain(self.admin.iter_mut())
            .chain(self.integration_listeners.iter_mut());
        for l in listeners {
            if let Err(e) = l.resume() {
                tracing::error!("cannot accept again on {}: {e}", l.bound);
            }
        }
    }

    /// Accepts again and writes the state file again (a handover that did not complete).
    fn accept_again(&mut self) {
        self.resume_listeners();
        self.start_persister();
    }

    /// Hands over to the agent on `conn`, serving `signals` meanwhile (a reload asked for
    /// is noted in `reload`).
    pub(super) async fn hand_over(
        &mut self,
        conn: Result<UnixStream, HandoverError>,
        signals: &mut Signals,
        reload: &mut bool,
    ) -> Outcome {
        let sock = match conn {
            Ok(s) => s,
            Err(e @ HandoverError::PeerIdentity { .. }) => {
                tracing::warn!("an agent connected to take over, and was turned away: {e}");
                return Outcome::ServingOn;
            }
            // Nobody was turned away: this agent's own socket failed.
            Err(e) => {
                tracing::error!("an agent connected to take over, and could not be accepted: {e}");
                return Outcome::ServingOn;
            }
        };
        let sockets = match self.socket_dups() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot hand over: {e}");
                return Outcome::ServingOn;
            }
        };
        let count = sockets.len();
        let succ = match racing(signals, reload, Successor::offer(sock, sockets)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!("an agent connected to take over and did not: {e}; serving on");
                return Outcome::ServingOn;
            }
            Err(name) => return abandoned(name, None),
        };
        tracing::info!(
            "the agent pid {} ({}) is taking over: offered {count} listening socket(s); serving until it is ready",
            succ.pid,
            succ.agent
        );
        match racing(signals, reload, succ.wait_take()).await {
            Ok(Ok(())) => {}
            // The new agent went away or said no before it took anything (its start
            // failed, or it was stopped): the handover's normal way out.
            Ok(Err(e @ (HandoverError::Closed { .. } | HandoverError::Refused { .. }))) => {
                tracing::info!(
                    "the agent pid {} did not take over: {e}; serving on",
                    succ.pid
                );
                return Outcome::ServingOn;
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    "the agent pid {} did not take over: {e}; serving on",
                    succ.pid
                );
                return Outcome::ServingOn;
            }
            Err(name) => return abandoned(name, Some(succ.pid)),
        }
        // From here until the new agent accepts, connections wait in the backlog.
        let paused = Instant::now();
        self.pause_listeners();
        let pid = succ.pid;
        match racing(signals, reload, self.release(&succ, paused)).await {
            Ok(Ok(())) => {
                tracing::info!("handed over to the agent pid {pid}: it serves now; this one stops");
                if *reload {
                    tracing::warn!(
                        "the SIGHUP received during the handover is not applied: the agent pid {pid} serves now, with the configuration it read at its start (send it SIGHUP if the file changed since)"
                    );
                }
                Outcome::HandedOver
            }
            Ok(Err(why)) => {
                self.accept_again();
                tracing::warn!(
                    "the handover to the agent pid {pid} failed after this agent stopped accepting: {why}; accepting again after {:?}",
                    paused.elapsed()
                );
                match racing(signals, reload, succ.refuse(&why)).await {
                    Ok(()) => Outcome::ServingOn,
                    Err(name) => abandoned(name, Some(pid)),
                }
            }
            Err(name) => {
                self.accept_again();
                abandoned(name, Some(pid))
            }
        }
    }

    /// While paused: writes the state file (within [`STATE_WRITE_WAIT`]), says `released`,
    /// and waits for `serving` (by the window's end, counted from `paused`). The reason why
    /// not, to tell the new agent.
    async fn release(&mut self, succ: &Successor, paused: Instant) -> Result<(), String> {
        if tokio::time::timeout(STATE_WRITE_WAIT, self.finish_persister())
            .await
            .is_err()
        {
            return Err(format!(
                "the state file was not written within {STATE_WRITE_WAIT:?}"
            ));
        }
        succ.released().await.map_err(|e| e.to_string())?;
        succ.wait_serving(paused).await.map_err(|e| e.to_string())
    }
}
