//! The agent's listening sockets: what each serves, the server task on it, and how a socket
//! is acquired (taken over from systemd or a handing-over agent, else bound, waiting for a
//! port another process holds) and handed to a new server on a reload.

use super::{AgentError, DRAIN, Roster};

use crate::config::ListenerLimits;
use crate::continuity::sockets::Inherited;
use crate::integrations::Integration;
use crate::server;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What a listener serves.
#[derive(Clone)]
pub(super) enum Service {
    /// HTTP: an engine's mgmt listener or the admin listener (TLS when set).
    Http {
        router: axum::Router,
        tls: Option<Arc<rustls::ServerConfig>>,
    },
    /// An integration's own listener (HAProxy's agent check), over the engines of the moment.
    Integration(&'static dyn Integration, Roster),
}

/// A listening socket and the server task on it.
pub(super) struct ListenerRun {
    /// Address from the config (reused on reload when unchanged).
    pub(super) configured: SocketAddr,
    /// Address actually bound.
    pub(super) bound: SocketAddr,
    /// A duplicate of the socket, so a new server can take it over on reload, and a new
    /// agent on a handover.
    pub(super) socket: std::net::TcpListener,
    /// What the server needs to start again on the same socket (a handover that failed).
    pub(super) service: Service,
    pub(super) limits: ListenerLimits,
    pub(super) name: String,
    pub(super) cancel: CancellationToken,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Service::Http { .. } => f.write_str("Http"),
            Service::Integration(i, _) => write!(f, "Integration({})", i.id().as_str()),
        }
    }
}

impl ListenerRun {
    /// The integration this listener serves, if it is an integration's own.
    pub(super) fn integration(&self) -> Option<&'static dyn Integration> {
        match self.service {
            Service::Integration(i, _) => Some(i),
            Service::Http { .. } => None,
        }
    }

    pub(super) fn start(
        configured: SocketAddr,
        socket: std::net::TcpListener,
        service: Service,
        limits: ListenerLimits,
        name: String,
    ) -> Result<ListenerRun, String> {
        let bound = socket.local_addr().unwrap_or(configured);
        let (cancel, task) = Self::serve(&socket, &service, limits, &name)?;
        Ok(ListenerRun {
            configured,
            bound,
            socket,
            service,
            limits,
            name,
            cancel,
            task,
        })
    }

    pub(super) fn serve(
        socket: &std::net::TcpListener,
        service: &Service,
        limits: ListenerLimits,
        name: &str,
    ) -> Result<(CancellationToken, tokio::task::JoinHandle<()>), String> {
        let listener = server::listener_on(socket)?;
        let cancel = CancellationToken::new();
        let task = match service {
            Service::Http { router, tls } => tokio::spawn(server::serve(
                listener,
                router.clone(),
                tls.clone(),
                limits,
                name.to_owned(),
                cancel.clone(),
            )),
            Service::Integration(i, roster) => tokio::spawn(i.serve(
                listener,
                roster.clone(),
                limits,
                name.to_owned(),
                cancel.clone(),
            )),
        };
        Ok((cancel, task))
    }

    /// Stops accepting at once; requests in flight finish in the background. Connections
    /// arriving now wait in the socket's backlog for whoever accepts next.
    pub(super) fn pause(&self) {
        self.cancel.cancel();
    }

    /// Accepts again on the same socket (a handover that did not complete).
    pub(super) fn resume(&mut self) -> Result<(), String> {
        let (cancel, task) = Self::serve(&self.socket, &self.service, self.limits, &self.name)?;
        self.cancel = cancel;
        // The paused server finishes its requests on its own.
        self.task = task;
        Ok(())
    }

    /// Stops accepting and lets in-flight requests finish, for at most [`DRAIN`]; says so
    /// when that ran out (the stop waited the whole drain).
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        let mut task = self.task;
        if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(
                listener = %self.name,
                "requests still in flight {DRAIN:?} after the stop; their connections were closed"
            );
        }
    }
}

/// A listening socket for `addr`: one taken over (systemd, a handing-over agent), else a new
/// one; a port held by another process is waited for up to `wait`.
pub(super) async fn acquire(
    addr: SocketAddr,
    inherited: &mut Inherited,
    wait: Duration,
    what: &str,
) -> Result<std::net::TcpListener, AgentError> {
    if let Some((socket, origin)) = inherited.take(addr) {
        tracing::info!(
            "{what}: listening on {addr} with the socket from {}",
            origin.as_str()
        );
        return Ok(socket);
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match server::bind(addr) {
            Ok(s) => return Ok(s),
            Err(e) if e.contains("in use") && tokio::time::Instant::now() < deadline => {
                if !said {
                    tracing::warn!(
                        "{what}: {addr} is held by another process; waiting up to {wait:?} for it (--wait-for-ports)"
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                let hint = if e.contains("in use") {
                    " (another agent? start this one with the same state directory to take over from it: docs/deploy.md, \"Upgrading and restarting the agent\")".to_owned()
                } else if e.contains("Cannot assign requested address") {
                    format!(" ({} is not an address of this host)", addr.ip())
                } else {
                    String::new()
                };
                return Err(AgentError::Runtime(format!("{what}: {e}{hint}")));
            }
        }
    }
}
