//! Taking over from a running agent, as a Kubernetes rolling update does when it starts the
//! new agent pod before it stops the old (`maxSurge: 1`), and as a second `run` with the
//! same state directory does by hand.
//!
//! The running agent listens on `handover.sock` in the state directory. A new agent
//! connects, and the two exchange framed JSON messages (a 4-byte big-endian length, then
//! the JSON), the listening sockets riding along the offer (`SCM_RIGHTS`):
//!
//! 1. new → old `hello`;
//! 2. old → new `offer`: the addresses of its listening sockets, and the sockets. Both
//!    processes now hold the *same* sockets: nothing closes, nothing is reset;
//! 3. the new agent starts its sampler and prepares its engines (everything that can fail),
//!    then sends `take`. The old one goes on serving meanwhile. If the new one fails or goes
//!    away before `take`, the old one just keeps serving;
//! 4. the old agent stops accepting, writes its state file, and answers `released`. A
//!    connection arriving now waits in the sockets' backlog;
//! 5. the new agent loads the state file, starts its engines from it, accepts, and sends
//!    `serving`. The old one finishes the requests it had accepted, stops and exits (or,
//!    under Kubernetes, waits for its SIGTERM). If `serving` does not come within
//!    [`SERVING_WAIT`], the old agent accepts again and carries on.
//!
//! So at no moment do two processes accept on the same socket, and the one that answers
//! always answers from the latest state. Only a peer with the agent's own user id (or root)
//! may connect; the socket file is mode 0600.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The protocol's version: both sides must speak the same.
pub const PROTOCOL: u32 = 1;
/// The largest message.
const MAX_MESSAGE: usize = 64 * 1024;
/// The most sockets one offer carries (engines' mgmt listeners and the admin listener).
pub const MAX_SOCKETS: usize = 64;
/// How long the old agent waits for `take` after its offer: the new one starts its
/// sampler and prepares its engines meanwhile.
pub const TAKE_WAIT: Duration = Duration::from_secs(60);
/// How long the old agent waits for `serving` after `released` before it accepts again.
pub const SERVING_WAIT: Duration = Duration::from_secs(10);
/// A quick step's limit (`hello`, `offer`, `released`).
const STEP: Duration = Duration::from_secs(10);

/// One message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Message {
    Hello {
        protocol: u32,
        pid: u32,
        agent: String,
    },
    Offer {
        protocol: u32,
        pid: u32,
        agent: String,
        /// The address of each socket attached, in order.
        listeners: Vec<SocketAddr>,
    },
    Take,
    Released,
    Serving,
    Refused {
        why: String,
    },
}

impl Message {
    fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Offer { .. } => "offer",
            Message::Take => "take",
            Message::Released => "released",
            Message::Serving => "serving",
            Message::Refused { .. } => "refused",
        }
    }
}

/// Sends `m` with `fds` attached.
fn send(sock: &UnixStream, m: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(m).map_err(io::Error::other)?;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(rustix::net::SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many sockets for one message"));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[io::IoSlice::new(&frame)],
        &mut control,
        rustix::net::SendFlags::NOSIGNAL,
    )?;
    // The descriptors went with the first byte; the rest of a long frame follows plainly.
    let mut rest = &frame[sent..];
    let mut w = sock;
    while !rest.is_empty() {
        let n = w.write(rest)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        rest = &rest[n..];
    }
    Ok(())
}

/// Receives one message and the descriptors that came with it.
fn recv(sock: &UnixStream) -> io::Result<(Message, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    // The descriptors come with the frame's first bytes: read the header with recvmsg.
    while got < head.len() {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            sock,
            &mut [io::IoSliceMut::new(&mut head[got..])],
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        )?;
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        if r.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other agent closed the connection",
            ));
        }
        got += r.bytes;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {len} bytes (at most {MAX_MESSAGE})"),
        ));
    }
    let mut body = vec![0u8; len];
    let mut r = sock;
    r.read_exact(&mut body)?;
    let m =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((m, fds))
}

/// Receives the message `want` (by name) within `limit`; a `refused` or any other message
/// is an error naming it.
fn expect(
    sock: &UnixStream,
    want: &str,
    limit: Duration,
) -> Result<(Message, Vec<OwnedFd>), String> {
    sock.set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    match recv(sock) {
        Ok((m, fds)) if m.name() == want => Ok((m, fds)),
        Ok((Message::Refused { why }, _)) => Err(format!("the other agent refused: {why}")),
        Ok((m, _)) => Err(format!("expected `{want}`, got `{}`", m.name())),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(format!("no `{want}` within {limit:?}"))
        }
        Err(e) => Err(format!("waiting for `{want}`: {e}")),
    }
}

fn say(sock: &UnixStream, m: &Message, fds: &[BorrowedFd<'_>]) -> Result<(), String> {
    sock.set_write_timeout(Some(STEP))
        .map_err(|e| e.to_string())?;
    send(sock, m, fds).map_err(|e| format!("sending `{}`: {e}", m.name()))
}

/// Runs `f` on a blocking thread with a clone of `sock`.
async fn blocking<T: Send + 'static>(
    sock: &UnixStream,
    f: impl FnOnce(&UnixStream) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let s = sock.try_clone().map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || f(&s))
        .await
        .map_err(|e| format!("the handover thread panicked: {e}"))?
}

// --- The new agent's side ------------------------------------------------------------------

/// The running agent being taken over.
#[derive(Debug)]
pub struct Predecessor {
    sock: UnixStream,
    /// Its process id and version, for the logs.
    pub pid: u32,
    pub agent: String,
}

/// The listening sockets an offer carried, with the address each is bound to.
pub type Offered = Vec<(SocketAddr, TcpListener)>;

/// Connects to the agent running with the state directory whose socket is `path`, and takes
/// its offer: `Ok(None)` when none runs there (no socket, or a stale one nobody listens on).
pub fn connect(path: &Path) -> Result<Option<(Predecessor, Offered)>, String> {
    let sock = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(format!("cannot connect to {}: {e}", path.display())),
    };
    say(
        &sock,
        &Message::Hello {
            protocol: PROTOCOL,
            pid: std::process::id(),
            agent: crate::VERSION.to_owned(),
        },
        &[],
    )?;
    let (offer, fds) = expect(&sock, "offer", STEP)
        .map_err(|e| format!("the running agent at {}: {e}", path.display()))?;
    let Message::Offer {
        protocol,
        pid,
        agent,
        listeners,
    } = offer
    else {
        return Err("expected an offer".to_owned());
    };
    if protocol != PROTOCOL {
        return Err(format!(
            "the running agent (pid {pid}, {agent}) speaks handover protocol {protocol}, this one {PROTOCOL}"
        ));
    }
    if fds.len() != listeners.len() {
        return Err(format!(
            "the running agent offered {} addresses and {} sockets",
            listeners.len(),
            fds.len()
        ));
    }
    let sockets = listeners
        .into_iter()
        .zip(fds)
        .map(|(a, fd)| (a, TcpListener::from(fd)))
        .collect();
    Ok(Some((Predecessor { sock, pid, agent }, sockets)))
}

impl Predecessor {
    /// Asks the running agent to stop accepting and write its state; returns once it has.
    pub async fn take(&self) -> Result<(), String> {
        blocking(&self.sock, |s| {
            say(s, &Message::Take, &[])?;
            expect(s, "released", STEP).map(|_| ())
        })
        .await
    }

    /// Tells it this agent serves now: it finishes what it accepted and stops.
    pub fn serving(self) -> Result<(), String> {
        say(&self.sock, &Message::Serving, &[])
    }

    /// Tells it this agent will not take over (it keeps serving).
    pub fn refuse(self, why: &str) {
        let _ = say(
            &self.sock,
            &Message::Refused {
                why: why.to_owned(),
            },
            &[],
        );
    }
}

// --- The running agent's side --------------------------------------------------------------

/// The handover socket of a running agent.
#[derive(Debug)]
pub struct Listener {
    inner: tokio::net::UnixListener,
    path: PathBuf,
    /// The socket file's inode, to remove it on exit only if it is still ours.
    ino: u64,
}

impl Listener {
    /// Listens at `path`. A stale socket file there (nobody listening) is replaced; so is
    /// a live one when `replace` (the agent this one took over from still holds it).
    pub fn bind(path: &Path, replace: bool) -> Result<Listener, String> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if std::fs::symlink_metadata(path).is_ok() {
            if !replace && UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "{} is held by a running agent that did not hand over",
                    path.display()
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("cannot remove the stale {}: {e}", path.display()))?;
        }
        let std = std::os::unix::net::UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std.set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let ino = std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0);
        let inner = tokio::net::UnixListener::from_std(std)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Listener {
            inner,
            path: path.to_owned(),
            ino,
        })
    }

    /// The next agent that connects, if it runs as this agent's user or root.
    pub async fn accept(&self) -> Result<UnixStream, String> {
        let (s, _) = self.inner.accept().await.map_err(|e| e.to_string())?;
        let s = s.into_std().map_err(|e| e.to_string())?;
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        let cred = rustix::net::sockopt::socket_peercred(&s).map_err(|e| e.to_string())?;
        let me = rustix::process::geteuid();
        if cred.uid != me && !cred.uid.is_root() {
            let why = format!(
                "uid {} may not take over an agent running as uid {}",
                cred.uid.as_raw(),
                me.as_raw()
            );
            let _ = say(&s, &Message::Refused { why: why.clone() }, &[]);
            return Err(why);
        }
        Ok(s)
    }

    /// Removes the socket file if it is still this listener's (a successor that took over
    /// has bound its own there).
    pub fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// An agent taking over from this one.
#[derive(Debug)]
pub struct Successor {
    sock: UnixStream,
    pub pid: u32,
    pub agent: String,
}

impl Successor {
    /// Reads the `hello` on `sock` and offers `sockets`.
    pub async fn offer(
        sock: UnixStream,
        sockets: Vec<(SocketAddr, OwnedFd)>,
    ) -> Result<Successor, String> {
        blocking(&sock, move |s| {
            let (hello, _) = expect(s, "hello", STEP)?;
            let Message::Hello {
                protocol,
                pid,
                agent,
            } = hello
            else {
                return Err("expected a hello".to_owned());
            };
            if protocol != PROTOCOL {
                let why = format!("this agent speaks handover protocol {PROTOCOL}, not {protocol}");
                let _ = say(s, &Message::Refused { why: why.clone() }, &[]);
                return Err(why);
            }
            let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| fd.as_fd()).collect();
            say(
                s,
                &Message::Offer {
                    protocol: PROTOCOL,
                    pid: std::process::id(),
                    agent: crate::VERSION.to_owned(),
                    listeners: sockets.iter().map(|(a, _)| *a).collect(),
                },
                &fds,
            )?;
            Ok((pid, agent))
        })
        .await
        .map(|(pid, agent)| Successor { sock, pid, agent })
    }

    /// Waits for `take` ([`TAKE_WAIT`]).
    pub async fn wait_take(&self) -> Result<(), String> {
        blocking(&self.sock, |s| expect(s, "take", TAKE_WAIT).map(|_| ())).await
    }

    /// Says the sockets are released and the state written.
    pub async fn released(&self) -> Result<(), String> {
        blocking(&self.sock, |s| say(s, &Message::Released, &[])).await
    }

    /// Waits for `serving` ([`SERVING_WAIT`]).
    pub async fn wait_serving(&self) -> Result<(), String> {
        blocking(&self.sock, |s| {
            expect(s, "serving", SERVING_WAIT).map(|_| ())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The whole exchange over a real unix socket, the listening sockets riding along: the
    // successor gets the same socket (a connection made to it before the handover is
    // accepted by the successor).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_offer_carries_the_listening_sockets_and_the_steps_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let listener = Listener::bind(&path, false).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let old = tokio::spawn(async move {
            let s = listener.accept().await.unwrap();
            let fd: OwnedFd = tcp.try_clone().unwrap().into();
            let succ = Successor::offer(s, vec![(addr, fd)]).await.unwrap();
            succ.wait_take().await.unwrap();
            succ.released().await.unwrap();
            succ.wait_serving().await.unwrap();
            (succ.pid, listener)
        });
        // A client connects before the handover: it waits in the shared backlog.
        let client = std::net::TcpStream::connect(addr).unwrap();
        let p = path.clone();
        let (pred, sockets) = tokio::task::spawn_blocking(move || connect(&p))
            .await
            .unwrap()
            .unwrap()
            .expect("a running agent");
        assert_eq!(sockets.len(), 1);
        assert_eq!(sockets[0].0, addr);
        assert_eq!(sockets[0].1.local_addr().unwrap(), addr);
        pred.take().await.unwrap();
        let (accepted, peer) = sockets[0].1.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        drop(accepted);
        pred.serving().unwrap();
        let (pid, listener) = old.await.unwrap();
        assert_eq!(pid, std::process::id());
        listener.remove();
        assert!(!path.exists());
    }

    #[test]
    fn no_agent_running_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        assert!(connect(&path).unwrap().is_none());
        // A stale socket file: nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(connect(&path).unwrap().is_none());
    }

    #[test]
    fn garbage_and_oversized_messages_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = &a;
        w.write_all(&8u32.to_be_bytes()).unwrap();
        w.write_all(b"not json").unwrap();
        assert!(recv(&b).is_err());
        w.write_all(&(MAX_MESSAGE as u32 + 1).to_be_bytes())
            .unwrap();
        let e = recv(&b).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
    }
}
