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
//!    processes now hold the *same* sockets: nothing closes, nothing is reset. The new agent
//!    checks each one (a listening TCP socket bound to the address offered with it) and
//!    answers `refused` with the reason if one is not;
//! 3. the new agent starts its sampler and prepares its engines (everything that can fail),
//!    then sends `take`. The old one goes on serving meanwhile. If the new one fails or goes
//!    away before `take`, the old one just keeps serving;
//! 4. the old agent stops accepting, writes its state file, and answers `released`. A
//!    connection arriving now waits in the sockets' backlog;
//! 5. the new agent loads the state file, starts its engines from it, accepts, and sends
//!    `serving`. The old one closes the connection, finishes the requests it had accepted and
//!    stops (or, under Kubernetes, waits for its SIGTERM).
//!
//! Every step has a deadline, so a peer that stalls costs a bounded time, and the agents'
//! main loops serve their signals throughout (they race these steps with them):
//!
//! | Step | Deadline |
//! |---|---|
//! | connecting, `hello`, `offer`, sending any message | [`STEP`] (5 s) |
//! | `take` after the offer (the old agent serves meanwhile) | [`TAKE_WAIT`] (60 s) |
//! | the old agent's state write after its pause | [`STATE_WRITE_WAIT`] (500 ms) |
//! | `serving`, counted from the old agent's pause | [`PAUSE_WINDOW`] (2 s) |
//! | the new agent accepting, counted from its `take` | [`ACCEPT_WITHIN`] (1.5 s) |
//! | the old agent closing after `serving` | [`GOODBYE_WAIT`] (1 s) |
//!
//! Nobody accepts from the old agent's pause until the new one accepts or the old one
//! accepts again: at most [`PAUSE_WINDOW`]. Past it, the old agent says `refused` and
//! accepts again. The new agent accepts only within [`ACCEPT_WITHIN`] of its `take`, which
//! came before the pause, so it is done half a second before the old one gives up; and if
//! the old one said `refused` anyway, the new one stops. So no two processes accept on a
//! socket but for that rare overlap, and the one that answers answers from the latest
//! state.
//!
//! Each side checks the other's user id (`SO_PEERCRED`): only the agent's own user, or root,
//! may take over, and a new agent takes sockets only from its own user or root. The socket
//! file is mode 0600.

mod predecessor;
mod successor;
mod wire;

pub(crate) use predecessor::{Predecessor, connect};
pub(crate) use successor::{Listener, Successor};

use std::io::{self};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The protocol's version: both sides must speak the same.
pub(crate) const PROTOCOL: u32 = 1;
/// The largest message.
const MAX_MESSAGE: usize = 64 * 1024;
/// The most sockets one offer carries (engines' mgmt listeners and the admin listener).
pub(crate) const MAX_SOCKETS: usize = 64;
/// A quick step's limit: connecting, `hello`, `offer`, and sending any message.
pub(crate) const STEP: Duration = Duration::from_secs(5);
/// How long the old agent waits for `take` after its offer: the new one starts its
/// sampler and prepares its engines meanwhile, while the old one serves.
pub(crate) const TAKE_WAIT: Duration = Duration::from_secs(60);
/// The longest time nobody accepts: from the old agent's pause until `serving`. Node
/// Manager's poll times out after 1–2 s, and 5 failures in a row kill the node.
pub(crate) const PAUSE_WINDOW: Duration = Duration::from_secs(2);
/// How long the old agent's last state write may take, of [`PAUSE_WINDOW`].
pub(crate) const STATE_WRITE_WAIT: Duration = Duration::from_millis(500);
/// How long after its `take` the new agent may still start accepting: [`PAUSE_WINDOW`] less
/// a margin, since the old agent counts from its pause, which comes after the `take`.
pub(crate) const ACCEPT_WITHIN: Duration = Duration::from_millis(1500);
/// How long the new agent waits, after `serving`, for the old one to close the connection
/// (or to say `refused`: it gave up waiting and accepts again).
pub(crate) const GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// What went wrong in a handover, by family: the caller decides from the family whether
/// the other agent said no, went quiet, spoke another protocol or was not allowed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandoverError {
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
    /// A socket offered is not a listening TCP socket bound to the address offered with it.
    #[error("the socket offered for {addr} {why}")]
    BadSocket { addr: SocketAddr, why: String },
    /// A socket of this agent could not be duplicated to be offered.
    #[error("cannot duplicate the socket on {addr}: {source}")]
    Duplicate { addr: SocketAddr, source: io::Error },
    /// The peer runs as another user (and not as root).
    #[error("uid {peer} may not take over an agent running as uid {me}")]
    PeerIdentity { peer: u32, me: u32 },
    /// The agent on the handover socket runs as another user (and not as root): its
    /// sockets are not taken.
    #[error("{} is served by uid {peer}, neither this agent's uid {me} nor root: its sockets are not taken", path.display())]
    ForeignAgent { path: PathBuf, peer: u32, me: u32 },
    /// The new agent would start accepting too long after its `take`: the old one may be
    /// accepting again by now.
    #[error("{took:?} after `take`, over {ACCEPT_WITHIN:?}: the running agent may accept again")]
    Late { took: Duration },
    /// Reading, writing or accepting on the handover socket failed (the other agent
    /// went away, or sent something that is not a message).
    #[error("{during}: {source}")]
    Io { during: String, source: io::Error },
}

impl HandoverError {
    fn io(during: impl Into<String>) -> impl FnOnce(io::Error) -> HandoverError {
        let during = during.into();
        move |source| HandoverError::Io { during, source }
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{Message, expect, recv, refuse, say, trusted};
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::OwnedFd;
    use std::path::Path;
    use tokio::net::UnixStream;
    use tokio::time::Instant;

    /// A running agent's side on a fresh handover socket: offers `sockets` to the first agent
    /// that connects, and waits for `take`.
    fn offering(
        path: &Path,
        sockets: Vec<(SocketAddr, OwnedFd)>,
    ) -> tokio::task::JoinHandle<(Successor, Result<(), HandoverError>)> {
        let listener = Listener::bind(path, false).unwrap();
        tokio::spawn(async move {
            let s = listener.accept().await.unwrap();
            let succ = Successor::offer(s, sockets).await.unwrap();
            let took = succ.wait_take().await;
            (succ, took)
        })
    }

    // The whole exchange over a real unix socket, the listening sockets riding along: the
    // successor gets the same socket (a connection made to it before the handover is
    // accepted by the successor), and `serving` returns once the old agent has closed.
    #[tokio::test]
    async fn an_offer_carries_the_listening_sockets_and_the_steps_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let old = offering(&path, vec![(addr, tcp.try_clone().unwrap().into())]);
        let old = tokio::spawn(async move {
            let (succ, took) = old.await.unwrap();
            took.unwrap();
            let paused = Instant::now();
            succ.released().await.unwrap();
            succ.wait_serving(paused).await.unwrap();
            succ.pid
        });
        // A client connects before the handover: it waits in the shared backlog.
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (mut pred, sockets) = connect(&path).await.unwrap().expect("a running agent");
        assert_eq!(sockets.len(), 1);
        assert_eq!(sockets[0].0, addr);
        assert_eq!(sockets[0].1.local_addr().unwrap(), addr);
        pred.take().await.unwrap();
        pred.in_time().unwrap();
        let (accepted, peer) = sockets[0].1.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        drop(accepted);
        pred.serving().await.unwrap();
        assert_eq!(old.await.unwrap(), std::process::id());
    }

    #[tokio::test]
    async fn no_agent_running_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        assert!(connect(&path).await.unwrap().is_none());
        // A stale socket file: nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(connect(&path).await.unwrap().is_none());
    }

    // The caller tells these apart (a new agent that went away is expected; one that is
    // silent is not), so each family must come out as its own variant.
    #[tokio::test(start_paused = true)]
    async fn each_way_a_step_fails_is_its_own_variant() {
        let (a, b) = UnixStream::pair().unwrap();
        let why = "its engines did not start";
        refuse(&a, why).await;
        let e = expect(&b, "take", STEP).await.unwrap_err();
        assert!(
            matches!(&e, HandoverError::Refused { why: w } if w == why),
            "{e}"
        );
        say(&a, &Message::Serving, &[]).await.unwrap();
        let e = expect(&b, "take", STEP).await.unwrap_err();
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
        let e = expect(&b, "take", TAKE_WAIT).await.unwrap_err();
        assert!(
            matches!(e, HandoverError::Timeout { want: "take", limit } if limit == TAKE_WAIT),
            "{e}"
        );
        drop(a);
        let e = expect(&b, "take", STEP).await.unwrap_err();
        assert!(matches!(e, HandoverError::Closed { want: "take" }), "{e}");
        assert_eq!(
            e.to_string(),
            "the other agent closed the connection while this one waited for `take`"
        );
    }

    #[tokio::test]
    async fn an_offer_in_another_protocol_is_refused_naming_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let old = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            expect(&s, "hello", STEP).await.unwrap();
            let offer = Message::Offer {
                protocol: PROTOCOL + 1,
                pid: 7,
                agent: "0.9".to_owned(),
                listeners: Vec::new(),
            };
            say(&s, &offer, &[]).await.unwrap();
            expect(&s, "take", STEP).await.unwrap_err()
        });
        let e = connect(&path).await.unwrap_err();
        assert!(
            matches!(&e, HandoverError::Protocol { theirs, .. } if *theirs == PROTOCOL + 1),
            "{e}"
        );
        assert!(e.to_string().contains("pid 7, 0.9"), "{e}");
        let told = old.await.unwrap();
        assert!(
            matches!(&told, HandoverError::Refused { why } if *why == e.to_string()),
            "{told}"
        );
    }

    fn bound(kind: rustix::net::SocketType) -> (SocketAddr, OwnedFd) {
        let fd = rustix::net::socket(rustix::net::AddressFamily::INET, kind, None).unwrap();
        rustix::net::bind(&fd, &"127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
        let addr = SocketAddr::try_from(rustix::net::getsockname(&fd).unwrap()).unwrap();
        (addr, fd)
    }

    // Issue 41: an offered socket that did not listen left the new agent "ready" while its
    // /status was refused for good. Each unfit socket is refused, naming its address and
    // what is wrong, and the running agent is told the same.
    #[tokio::test]
    async fn each_unfit_socket_of_an_offer_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        let elsewhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let unix = dir.path().join("unix.sock");
        let cases: Vec<(&str, SocketAddr, OwnedFd, String)> = vec![
            {
                let (addr, fd) = bound(rustix::net::SocketType::STREAM);
                (
                    "bound, not listening",
                    addr,
                    fd,
                    "is not listening".to_owned(),
                )
            },
            {
                let (addr, fd) = bound(rustix::net::SocketType::DGRAM);
                ("UDP", addr, fd, "is not a stream socket".to_owned())
            },
            (
                "listening elsewhere",
                elsewhere,
                listening.try_clone().unwrap().into(),
                format!("is bound to {}", listening.local_addr().unwrap()),
            ),
            (
                "a unix socket",
                elsewhere,
                std::os::unix::net::UnixListener::bind(&unix)
                    .unwrap()
                    .into(),
                "is not a TCP socket".to_owned(),
            ),
        ];
        for (i, (what, addr, fd, wrong)) in cases.into_iter().enumerate() {
            let path = dir.path().join(format!("handover-{i}.sock"));
            let old = offering(&path, vec![(addr, fd)]);
            let e = connect(&path).await.unwrap_err();
            assert!(matches!(e, HandoverError::BadSocket { .. }), "{what}: {e}");
            assert_eq!(
                e.to_string(),
                format!("the socket offered for {addr} {wrong}"),
                "{what}"
            );
            let (_, told) = old.await.unwrap();
            assert!(
                matches!(&told, Err(HandoverError::Refused { why }) if *why == e.to_string()),
                "{what}: {told:?}"
            );
        }
    }

    #[test]
    fn only_the_same_user_or_root_is_trusted() {
        for (peer, me, ok) in [
            (1000, 1000, true),
            (0, 1000, true),
            (0, 0, true),
            (1000, 0, false),
            (1001, 1000, false),
        ] {
            assert_eq!(trusted(peer, me), ok, "peer {peer}, me {me}");
        }
    }

    // Issue 41: a new agent that said `take` and hung left nobody accepting for 10 s. The
    // running agent waits for `serving` [`PAUSE_WINDOW`] from its pause and says `refused`;
    // a new agent that comes to serve after that is late by its own count, and stops when
    // it reads the refusal.
    #[tokio::test(start_paused = true)]
    async fn a_new_agent_that_takes_and_hangs_is_refused_when_the_window_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let old = offering(&path, vec![(addr, tcp.into())]);
        let old = tokio::spawn(async move {
            let (succ, took) = old.await.unwrap();
            took.unwrap();
            let paused = Instant::now();
            succ.released().await.unwrap();
            let e = succ.wait_serving(paused).await.unwrap_err();
            let waited = paused.elapsed();
            succ.refuse(&e.to_string()).await;
            (e, waited)
        });
        let (mut pred, _sockets) = connect(&path).await.unwrap().unwrap();
        pred.take().await.unwrap();
        let (e, waited) = old.await.unwrap();
        assert!(
            matches!(
                e,
                HandoverError::Timeout {
                    want: "serving",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(waited, PAUSE_WINDOW);
        let late = pred.in_time().unwrap_err();
        assert!(matches!(late, HandoverError::Late { .. }), "{late}");
        let told = pred.serving().await.unwrap_err();
        assert!(
            matches!(&told, HandoverError::Refused { why } if why.contains("no `serving` within 2s")),
            "{told}"
        );
    }

    // The window's arithmetic: the new agent is done half a second before the old one gives
    // up, even if the old one paused the moment the `take` left.
    #[test]
    fn the_new_agent_accepts_inside_the_old_agents_window() {
        assert!(STATE_WRITE_WAIT < ACCEPT_WITHIN);
        assert_eq!(PAUSE_WINDOW - ACCEPT_WITHIN, Duration::from_millis(500));
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

    #[tokio::test]
    async fn garbage_and_oversized_messages_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        let write = |bytes: &[u8]| {
            let n = a.try_write(bytes).unwrap();
            assert_eq!(n, bytes.len());
        };
        write(&8u32.to_be_bytes());
        write(b"not json");
        assert!(recv(&b).await.is_err());
        write(&(MAX_MESSAGE as u32 + 1).to_be_bytes());
        let e = recv(&b).await.unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
    }
}
