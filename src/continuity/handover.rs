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

/// What went wrong in a handover, by family: the caller decides from the family whether
/// the other agent said no, went quiet, spoke another protocol or was not allowed.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The handover socket of a running agent exists but could not be connected to.
    #[error("cannot connect to {}: {source}", path.display())]
    Connect { path: PathBuf, source: io::Error },
    /// This agent's handover socket could not be set up.
    #[error("cannot {what} {}: {source}", path.display())]
    Listen {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A live agent listens on the socket and did not hand over to this one.
    #[error("{} is held by a running agent that did not hand over", path.display())]
    Held { path: PathBuf },
    /// The other agent answered `refused`.
    #[error("the other agent refused: {why}")]
    Refused { why: String },
    /// The other agent closed the connection (it went away, or stopped trying).
    #[error("the other agent closed the connection while this one waited for `{want}`")]
    Closed { want: &'static str },
    /// The other agent sent nothing within the step's limit.
    #[error("no `{want}` within {limit:?}")]
    Timeout { want: &'static str, limit: Duration },
    /// The other agent sent a message out of turn.
    #[error("expected `{want}`, got `{got}`")]
    Unexpected {
        want: &'static str,
        got: &'static str,
    },
    /// The other agent speaks another version of the protocol.
    #[error("{peer} speaks handover protocol {theirs}, this one {PROTOCOL}")]
    Protocol { peer: String, theirs: u32 },
    /// The sockets of an offer do not match its addresses, or are too many for one.
    #[error("{0}")]
    Sockets(String),
    /// A socket of this agent could not be duplicated to be offered.
    #[error("cannot duplicate the socket on {addr}: {source}")]
    Duplicate { addr: SocketAddr, source: io::Error },
    /// The peer runs as another user (and not as root).
    #[error("uid {peer} may not take over an agent running as uid {me}")]
    PeerIdentity { peer: u32, me: u32 },
    /// Reading, writing or accepting on the handover socket failed (the other agent
    /// went away, or sent something that is not a message).
    #[error("{during}: {source}")]
    Io { during: String, source: io::Error },
    /// The thread that does the blocking steps panicked.
    #[error("the handover thread panicked: {0}")]
    Panicked(String),
}

impl HandoverError {
    fn io(during: impl Into<String>) -> impl FnOnce(io::Error) -> HandoverError {
        let during = during.into();
        move |source| HandoverError::Io { during, source }
    }
}

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
    want: &'static str,
    limit: Duration,
) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
    sock.set_read_timeout(Some(limit))
        .map_err(HandoverError::io("setting the read timeout"))?;
    match recv(sock) {
        Ok((m, fds)) if m.name() == want => Ok((m, fds)),
        Ok((Message::Refused { why }, _)) => Err(HandoverError::Refused { why }),
        Ok((m, _)) => Err(HandoverError::Unexpected {
            want,
            got: m.name(),
        }),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(HandoverError::Timeout { want, limit })
        }
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(HandoverError::Closed { want }),
        Err(e) => Err(HandoverError::Io {
            during: format!("waiting for `{want}`"),
            source: e,
        }),
    }
}

fn say(sock: &UnixStream, m: &Message, fds: &[BorrowedFd<'_>]) -> Result<(), HandoverError> {
    if fds.len() > MAX_SOCKETS {
        return Err(HandoverError::Sockets(format!(
            "{} sockets, and one offer carries at most {MAX_SOCKETS}",
            fds.len()
        )));
    }
    sock.set_write_timeout(Some(STEP))
        .map_err(HandoverError::io("setting the write timeout"))?;
    send(sock, m, fds).map_err(HandoverError::io(format!("sending `{}`", m.name())))
}

/// Runs `f` on a blocking thread with a clone of `sock`.
async fn blocking<T: Send + 'static>(
    sock: &UnixStream,
    f: impl FnOnce(&UnixStream) -> Result<T, HandoverError> + Send + 'static,
) -> Result<T, HandoverError> {
    let s = sock
        .try_clone()
        .map_err(HandoverError::io("duplicating the handover socket"))?;
    tokio::task::spawn_blocking(move || f(&s))
        .await
        .map_err(|e| HandoverError::Panicked(e.to_string()))?
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
pub fn connect(path: &Path) -> Result<Option<(Predecessor, Offered)>, HandoverError> {
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
        Err(source) => {
            return Err(HandoverError::Connect {
                path: path.to_owned(),
                source,
            });
        }
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
    let (offer, fds) = expect(&sock, "offer", STEP)?;
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
    if protocol != PROTOCOL {
        return Err(HandoverError::Protocol {
            peer: format!("the running agent (pid {pid}, {agent})"),
            theirs: protocol,
        });
    }
    if fds.len() != listeners.len() {
        return Err(HandoverError::Sockets(format!(
            "the running agent offered {} addresses and {} sockets",
            listeners.len(),
            fds.len()
        )));
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
    pub async fn take(&self) -> Result<(), HandoverError> {
        blocking(&self.sock, |s| {
            say(s, &Message::Take, &[])?;
            expect(s, "released", STEP).map(|_| ())
        })
        .await
    }

    /// Tells it this agent serves now: it finishes what it accepted and stops.
    pub fn serving(self) -> Result<(), HandoverError> {
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
    pub fn bind(path: &Path, replace: bool) -> Result<Listener, HandoverError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let failed = |what: &'static str| {
            move |source| HandoverError::Listen {
                what,
                path: path.to_owned(),
                source,
            }
        };
        if std::fs::symlink_metadata(path).is_ok() {
            if !replace && UnixStream::connect(path).is_ok() {
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
    pub async fn accept(&self) -> Result<UnixStream, HandoverError> {
        let during = || HandoverError::io("accepting on the handover socket");
        let (s, _) = self.inner.accept().await.map_err(during())?;
        let s = s.into_std().map_err(during())?;
        s.set_nonblocking(false).map_err(during())?;
        let cred = rustix::net::sockopt::socket_peercred(&s)
            .map_err(|e| HandoverError::io("reading the peer's credentials")(e.into()))?;
        let me = rustix::process::geteuid();
        if cred.uid != me && !cred.uid.is_root() {
            let e = HandoverError::PeerIdentity {
                peer: cred.uid.as_raw(),
                me: me.as_raw(),
            };
            let _ = say(&s, &Message::Refused { why: e.to_string() }, &[]);
            return Err(e);
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
    ) -> Result<Successor, HandoverError> {
        blocking(&sock, move |s| {
            let (hello, _) = expect(s, "hello", STEP)?;
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
                let _ = say(s, &Message::Refused { why: e.to_string() }, &[]);
                return Err(e);
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
    pub async fn wait_take(&self) -> Result<(), HandoverError> {
        blocking(&self.sock, |s| expect(s, "take", TAKE_WAIT).map(|_| ())).await
    }

    /// Says the sockets are released and the state written.
    pub async fn released(&self) -> Result<(), HandoverError> {
        blocking(&self.sock, |s| say(s, &Message::Released, &[])).await
    }

    /// Waits for `serving` ([`SERVING_WAIT`]).
    pub async fn wait_serving(&self) -> Result<(), HandoverError> {
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

    // The caller tells these apart (a new agent that went away is expected; one that is
    // silent is not), so each family must come out as its own variant.
    #[test]
    fn each_way_a_step_fails_is_its_own_variant() {
        let (a, b) = UnixStream::pair().unwrap();
        let why = "its engines did not start".to_owned();
        say(&a, &Message::Refused { why: why.clone() }, &[]).unwrap();
        assert!(
            matches!(expect(&b, "take", STEP), Err(HandoverError::Refused { why: w }) if w == why)
        );
        say(&a, &Message::Serving, &[]).unwrap();
        let e = expect(&b, "take", STEP).unwrap_err();
        assert!(
            matches!(
                e,
                HandoverError::Unexpected {
                    want: "take",
                    got: "serving"
                }
            ),
            "{e}"
        );
        let limit = Duration::from_millis(20);
        let e = expect(&b, "take", limit).unwrap_err();
        assert!(
            matches!(e, HandoverError::Timeout { want: "take", .. }),
            "{e}"
        );
        drop(a);
        let e = expect(&b, "take", STEP).unwrap_err();
        assert!(matches!(e, HandoverError::Closed { want: "take" }), "{e}");
        assert_eq!(
            e.to_string(),
            "the other agent closed the connection while this one waited for `take`"
        );
    }

    #[test]
    fn an_offer_in_another_protocol_is_a_protocol_error_naming_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let old = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            expect(&s, "hello", STEP).unwrap();
            let offer = Message::Offer {
                protocol: PROTOCOL + 1,
                pid: 7,
                agent: "0.9".to_owned(),
                listeners: Vec::new(),
            };
            say(&s, &offer, &[]).unwrap();
        });
        let e = connect(&path).unwrap_err();
        old.join().unwrap();
        assert!(
            matches!(&e, HandoverError::Protocol { theirs, .. } if *theirs == PROTOCOL + 1),
            "{e}"
        );
        assert!(e.to_string().contains("pid 7, 0.9"), "{e}");
    }

    #[test]
    fn a_live_socket_is_held_unless_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let _live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let _guard = rt.enter();
        assert!(matches!(
            Listener::bind(&path, false),
            Err(HandoverError::Held { .. })
        ));
        assert!(Listener::bind(&path, true).is_ok());
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
