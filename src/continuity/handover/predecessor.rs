//! The new agent's side of a hand-over: it connects to the running agent, checks the sockets
//! offered, asks it to `take`, and says `serving` once it accepts on them.

use super::wire::{Message, expect, peer_uid, recv, refuse, say, trusted};
use super::{ACCEPT_WITHIN, GOODBYE_WAIT, HandoverError, PROTOCOL, STEP};
use std::io::{self};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::path::Path;
use tokio::net::UnixStream;
use tokio::time::Instant;

// --- The new agent's side ------------------------------------------------------------------

/// The running agent being taken over.
#[derive(Debug)]
pub struct Predecessor {
    sock: UnixStream,
    /// Its process id and version, for the logs.
    pub pid: u32,
    pub agent: String,
    /// When this agent said `take` ([`ACCEPT_WITHIN`] counts from it).
    taken_at: Option<Instant>,
}

/// The listening sockets an offer carried, with the address each is bound to.
pub(super) type Offered = Vec<(SocketAddr, TcpListener)>;

/// Connects to the agent running with the state directory whose socket is `path`, and takes
/// its offer: `Ok(None)` when none runs there (no socket, or a stale one nobody listens on).
/// An agent of another user is refused before a word is said; an offer with a socket that
/// is not fit to serve is answered `refused`, with the reason.
pub(crate) async fn connect(path: &Path) -> Result<Option<(Predecessor, Offered)>, HandoverError> {
    let connect_error = |source| HandoverError::Connect {
        path: path.to_owned(),
        source,
    };
    let sock = match tokio::time::timeout(STEP, UnixStream::connect(path)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e))
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Ok(Err(source)) => return Err(connect_error(source)),
        Err(_) => {
            return Err(connect_error(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("not accepted within {STEP:?}"),
            )));
        }
    };
    let (peer, me) = peer_uid(&sock)?;
    if !trusted(peer, me) {
        return Err(HandoverError::ForeignAgent {
            path: path.to_owned(),
            peer,
            me,
        });
    }
    say(
        &sock,
        &Message::Hello {
            protocol: PROTOCOL,
            pid: std::process::id(),
            agent: crate::VERSION.to_owned(),
        },
        &[],
    )
    .await?;
    let (offer, fds) = expect(&sock, "offer", STEP).await?;
    let Message::Offer {
        protocol,
        pid,
        agent,
        listeners,
    } = offer
    else {
        return Err(HandoverError::Unexpected {
            want: "offer",
            got: offer.name(),
        });
    };
    let checked = if protocol != PROTOCOL {
        Err(HandoverError::Protocol {
            peer: format!("the running agent (pid {pid}, {agent})"),
            theirs: protocol,
        })
    } else {
        check_offer(listeners, fds)
    };
    match checked {
        Ok(sockets) => Ok(Some((
            Predecessor {
                sock,
                pid,
                agent,
                taken_at: None,
            },
            sockets,
        ))),
        Err(e) => {
            refuse(&sock, &e.to_string()).await;
            Err(e)
        }
    }
}

/// The sockets of an offer, each checked against the address offered with it.
fn check_offer(listeners: Vec<SocketAddr>, fds: Vec<OwnedFd>) -> Result<Offered, HandoverError> {
    if fds.len() != listeners.len() {
        return Err(HandoverError::Sockets(format!(
            "the running agent offered {} addresses and {} sockets",
            listeners.len(),
            fds.len()
        )));
    }
    listeners
        .into_iter()
        .zip(fds)
        .map(|(addr, fd)| Ok((addr, check_socket(addr, fd)?)))
        .collect()
}

/// `fd` if it is a listening TCP socket bound to `addr`, the address it was offered for.
fn check_socket(addr: SocketAddr, fd: OwnedFd) -> Result<TcpListener, HandoverError> {
    use rustix::net::sockopt;
    let bad = |why: String| HandoverError::BadSocket { addr, why };
    let kind = sockopt::socket_type(&fd).map_err(|e| bad(format!("cannot be inspected: {e}")))?;
    if kind != rustix::net::SocketType::STREAM {
        return Err(bad("is not a stream socket".to_owned()));
    }
    let bound = rustix::net::getsockname(&fd)
        .ok()
        .and_then(|a| SocketAddr::try_from(a).ok());
    match bound {
        None => return Err(bad("is not a TCP socket".to_owned())),
        Some(b) if b != addr => return Err(bad(format!("is bound to {b}"))),
        Some(_) => {}
    }
    if !sockopt::socket_acceptconn(&fd).map_err(|e| bad(format!("cannot be inspected: {e}")))? {
        return Err(bad("is not listening".to_owned()));
    }
    Ok(TcpListener::from(fd))
}

impl Predecessor {
    /// Asks the running agent to stop accepting and write its state; returns once it has.
    pub(crate) async fn take(&mut self) -> Result<(), HandoverError> {
        self.taken_at = Some(Instant::now());
        say(&self.sock, &Message::Take, &[]).await?;
        expect(&self.sock, "released", ACCEPT_WITHIN)
            .await
            .map(|_| ())
    }

    /// Whether this agent may still start accepting ([`ACCEPT_WITHIN`] of its `take`).
    pub(crate) fn in_time(&self) -> Result<(), HandoverError> {
        match self.taken_at.map(|t| t.elapsed()) {
            Some(took) if took > ACCEPT_WITHIN => Err(HandoverError::Late { took }),
            _ => Ok(()),
        }
    }

    /// Tells it this agent serves now, and waits for it to close the connection: `Refused`
    /// when it said it accepts again instead (it gave up waiting), another error when it
    /// could not be told or did not close.
    pub(crate) async fn serving(self) -> Result<(), HandoverError> {
        let told = say(&self.sock, &Message::Serving, &[]).await;
        // A `refused` sent before it closed is still there to read, even if the send failed.
        let during = "waiting for the running agent to close the connection";
        match tokio::time::timeout(GOODBYE_WAIT, recv(&self.sock)).await {
            Ok(Ok((Message::Refused { why }, _))) => Err(HandoverError::Refused { why }),
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => told,
            Ok(Ok((m, _))) => told.and(Err(HandoverError::Unexpected {
                want: "the connection closed",
                got: m.name(),
            })),
            Ok(Err(e)) => told.and(Err(HandoverError::io(during)(e))),
            Err(_) => told.and(Err(HandoverError::io(during)(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("still open {GOODBYE_WAIT:?} after `serving`"),
            )))),
        }
    }
}
