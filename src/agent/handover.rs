//! The running agent's side of a handover ([`crate::continuity::handover`]): offer the
//! listening sockets to a new agent, stop accepting and write the state when it takes them,
//! and stop once it serves; or, if it goes away half-way, accept again and carry on. And the
//! new agent's last step: tell the old one it serves, and listen for the next.

use super::Running;
use crate::continuity::handover::{HandoverError, Listener, Successor};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

/// The next agent connecting to `listener`; never, without one.
pub(super) async fn accept(listener: Option<&Listener>) -> Result<UnixStream, HandoverError> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

impl Running {
    /// After start: tells the agent this one took over from that it serves now, and listens
    /// for the next one (none without a state directory).
    pub(super) async fn after_start(&mut self) -> Option<Listener> {
        let took_over = match self.predecessor.take() {
            Some(p) => {
                let pid = p.pid;
                match p.serving() {
                    Ok(()) => tracing::info!(
                        "serving; the agent this one took over from (pid {pid}) finishes its requests and stops"
                    ),
                    Err(e) => tracing::warn!(
                        "serving, but the agent this one took over from (pid {pid}) was not told: {e}"
                    ),
                }
                true
            }
            None => false,
        };
        let dir = self.state_dir.as_ref()?;
        match Listener::bind(&dir.handover_socket(), took_over) {
            Ok(l) => Some(l),
            // Another agent with this state directory serves ports of its own: two agents
            // share the directory, and the state file is no longer this one's alone.
            Err(e @ HandoverError::Held { .. }) => {
                tracing::warn!(
                    "{e}: no agent can take over from this one, and both write the state file of this state directory; give each agent its own"
                );
                None
            }
            Err(e) => {
                tracing::warn!("{e}: no agent can take over from this one");
                None
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

    /// Hands over to the agent on `conn`; true when it took over and this one must stop.
    pub(super) async fn hand_over(&mut self, conn: Result<UnixStream, HandoverError>) -> bool {
        let sock = match conn {
            Ok(s) => s,
            Err(e @ HandoverError::PeerIdentity { .. }) => {
                tracing::warn!("an agent connected to take over, and was turned away: {e}");
                return false;
            }
            // Nobody was turned away: this agent's own socket failed.
            Err(e) => {
                tracing::error!("an agent connected to take over, and could not be accepted: {e}");
                return false;
            }
        };
        let sockets = match self.socket_dups() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("cannot hand over: {e}");
                return false;
            }
        };
        let count = sockets.len();
        let succ = match Successor::offer(sock, sockets).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("an agent connected to take over and did not: {e}; serving on");
                return false;
            }
        };
        tracing::info!(
            "the agent pid {} ({}) is taking over: offered {count} listening socket(s); serving until it is ready",
            succ.pid,
            succ.agent
        );
        match succ.wait_take().await {
            Ok(()) => {}
            // The new agent went away or said no before it took anything (its start
            // failed, or it was stopped): the handover's normal way out.
            Err(e @ (HandoverError::Closed { .. } | HandoverError::Refused { .. })) => {
                tracing::info!(
                    "the agent pid {} did not take over: {e}; serving on",
                    succ.pid
                );
                return false;
            }
            Err(e) => {
                tracing::warn!(
                    "the agent pid {} did not take over: {e}; serving on",
                    succ.pid
                );
                return false;
            }
        }
        // From here until the new agent accepts, connections wait in the backlog.
        self.pause_listeners();
        self.finish_persister().await;
        let done = match succ.released().await {
            Ok(()) => succ.wait_serving().await,
            Err(e) => Err(e),
        };
        match done {
            Ok(()) => {
                tracing::info!(
                    "handed over to the agent pid {}: it serves now; this one stops",
                    succ.pid
                );
                true
            }
            Err(e) => {
                tracing::warn!(
                    "the handover to the agent pid {} failed after the sockets were released: {e}; accepting again",
                    succ.pid
                );
                self.resume_listeners();
                self.start_persister();
                false
            }
        }
    }
}
