//! The running agent's side of a hand-over: it listens on `handover.sock`, offers its
//! listening sockets to the agent that connects, and on `take` pauses, writes its state and
//! releases them.

use super::wire::{Message, expect, expect_by, peer_uid, refuse, say, trusted};
use super::{HandoverError, PAUSE_WINDOW, PROTOCOL, STEP, TAKE_WAIT};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use tokio::net::UnixStream;
use tokio::time::Instant;

// --- The running agent's side --------------------------------------------------------------

/// The handover socket of a running agent.
#[derive(Debug)]
pub(crate) struct Listener {
    inner: tokio::net::UnixListener,
    path: PathBuf,
    /// The socket file's inode, to remove it on exit only if it is still ours.
    ino: u64,
}

impl Listener {
    /// Listens at `path`. A stale socket file there (nobody listening) is replaced; so is
    /// a live one when `replace` (the agent this one took over from still holds it).
    pub(crate) fn bind(path: &Path, replace: bool) -> Result<Listener, HandoverError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let failed = |what: &'static str| {
            move |source| HandoverError::Listen {
                what,
                path: path.to_owned(),
                source,
            }
        };
        if std::fs::symlink_metadata(path).is_ok() {
            if !replace && std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(HandoverError::Held {
                    path: path.to_owned(),
                });
            }
            std::fs::remove_file(path).map_err(failed("remove the stale"))?;
        }
        let std = std::os::unix::net::UnixListener::bind(path).map_err(failed("listen on"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(failed("set mode 0600 on"))?;
        std.set_nonblocking(true)
            .map_err(failed("make non-blocking the listener on"))?;
        let ino = std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0);
        let inner = tokio::net::UnixListener::from_std(std)
            .map_err(failed("register with the runtime the listener on"))?;
        Ok(Listener {
            inner,
            path: path.to_owned(),
            ino,
        })
    }

    /// The next agent that connects, if it runs as this agent's user or root.
    pub(crate) async fn accept(&self) -> Result<UnixStream, HandoverError> {
        let (s, _) = self
            .inner
            .accept()
            .await
            .map_err(HandoverError::io("accepting on the handover socket"))?;
        let (peer, me) = peer_uid(&s)?;
        if !trusted(peer, me) {
            let e = HandoverError::PeerIdentity { peer, me };
            refuse(&s, &e.to_string()).await;
            return Err(e);
        }
        Ok(s)
    }

    /// Removes the socket file if it is still this listener's (a successor that took over
    /// has bound its own there).
    pub(crate) fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// An agent taking over from this one.
#[derive(Debug)]
pub(crate) struct Successor {
    sock: UnixStream,
    pub pid: u32,
    pub agent: String,
}

impl Successor {
    /// Reads the `hello` on `sock` and offers `sockets`.
    pub(crate) async fn offer(
        sock: UnixStream,
        sockets: Vec<(SocketAddr, OwnedFd)>,
    ) -> Result<Successor, HandoverError> {
        let (hello, _) = expect(&sock, "hello", STEP).await?;
        let Message::Hello {
            protocol,
            pid,
            agent,
        } = hello
        else {
            return Err(HandoverError::Unexpected {
                want: "hello",
                got: hello.name(),
            });
        };
        if protocol != PROTOCOL {
            let e = HandoverError::Protocol {
                peer: format!("the new agent (pid {pid}, {agent})"),
                theirs: protocol,
            };
            refuse(&sock, &e.to_string()).await;
            return Err(e);
        }
        let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| fd.as_fd()).collect();
        say(
            &sock,
            &Message::Offer {
                protocol: PROTOCOL,
                pid: std::process::id(),
                agent: crate::VERSION.to_owned(),
                listeners: sockets.iter().map(|(a, _)| *a).collect(),
            },
            &fds,
        )
        .await?;
        Ok(Successor { sock, pid, agent })
    }

    /// Waits for `take` ([`TAKE_WAIT`]).
    pub(crate) async fn wait_take(&self) -> Result<(), HandoverError> {
        expect(&self.sock, "take", TAKE_WAIT).await.map(|_| ())
    }

    /// Says the sockets are released and the state written.
    pub(crate) async fn released(&self) -> Result<(), HandoverError> {
        say(&self.sock, &Message::Released, &[]).await
    }

    /// Waits for `serving` until [`PAUSE_WINDOW`] after `paused` (when this agent stopped
    /// accepting).
    pub(crate) async fn wait_serving(&self, paused: Instant) -> Result<(), HandoverError> {
        expect_by(&self.sock, "serving", paused + PAUSE_WINDOW, PAUSE_WINDOW)
            .await
            .map(|_| ())
    }

    /// Tells it this agent goes on serving, with why.
    pub(crate) async fn refuse(self, why: &str) {
        refuse(&self.sock, why).await;
    }
}
