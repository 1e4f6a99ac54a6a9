//! HAProxy's agent-check listener (`[agent] haproxy_agent_listen`): one for every engine.
//! HAProxy connects, sends the engine's name (`agent-send "<name>\n"`), reads one line and
//! closes; the line is [`super::agent_check`] of that engine now.
//!
//! Bounds, so garbage, slow senders and floods never block it or the other listeners (each
//! listener is a task of its own):
//! - **The name** must arrive within [`NAME_WAIT`] of the accept (HAProxy sends it with the
//!   connection), and is at most [`MAX_NAME`] bytes up to the first newline. Past the wait,
//!   what arrived is the name; nothing is a missing name. A missing, unknown, non-UTF-8 or
//!   too long name is answered `down` with a fixed phrase for its kind ([`BadPoll`]), so a
//!   server line that names no engine here is out of rotation and says why on HAProxy's
//!   stats page, while a stranger probing the port learns no engine's name. Each is logged
//!   as a warning naming its kind, never what the client sent, so the log layer's rate
//!   limit ([`crate::logging::ratelimit`]) holds a flood of them to a line per kind.
//! - **The answer** is written within [`WRITE_WAIT`], then the connection is closed.
//! - **A cap, shared fairly**: at most `max_connections` at once (`[agent] max_connections`),
//!   and at most a share of them from one source, as on the HTTP listeners: the same slots
//!   ([`crate::slots`]). Two local flooders once left 17 % of HAProxy-like polls unanswered
//!   (issue 48), when the oldest connection was closed at the cap whoever held it. Now a
//!   source at its share pays with its own connection, and the cap is paid by the source
//!   holding the most; a connection waiting for its name is spared the longest. A connection
//!   lives at most [`NAME_WAIT`] plus [`WRITE_WAIT`]. HAProxy keeps a server's state when an
//!   agent check gets no answer, so nothing it routes changes for one lost poll.
//! - **Stopping** (SIGTERM, a handover, a reload that moves the listener) stops accepting;
//!   the answers in progress finish.

use super::config::HaproxyMap;
use super::{AgentCheck, agent_check};
use crate::integrations::facts::ActionInputs;
use crate::integrations::seam::Engines;
use crate::monitor::Monitor;
use crate::monitor::journal::Told;
use crate::slots::{self, Activity, BusyGuard, Registry};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long after the accept the engine's name may take to arrive.
pub(crate) const NAME_WAIT: Duration = Duration::from_millis(250);
/// Longest engine name read, in bytes (an engine name is at most 128 characters).
pub(crate) const MAX_NAME: usize = 512;
/// How long the answer may take to write.
pub(crate) const WRITE_WAIT: Duration = Duration::from_secs(1);

/// What was read where HAProxy sends the engine's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A name (trimmed of spaces and the newline).
    Name(String),
    /// Nothing, or only spaces, within [`NAME_WAIT`].
    Nothing,
    /// More than [`MAX_NAME`] bytes without a newline.
    TooLong,
    /// Bytes that are not UTF-8.
    NotText,
}

/// What `bytes` (all that arrived) ask for.
pub(crate) fn asked(bytes: &[u8]) -> Asked {
    let line = match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => &bytes[..i],
        None if bytes.len() > MAX_NAME => return Asked::TooLong,
        None => bytes,
    };
    match std::str::from_utf8(line) {
        Err(_) => Asked::NotText,
        Ok(s) => match s.trim() {
            "" => Asked::Nothing,
            name => Asked::Name(name.to_owned()),
        },
    }
}

/// A poll that names no engine here, by kind: what it is answered and logged as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadPoll {
    /// Nothing, or only spaces (no `agent-send` on the server line).
    NoName,
    /// More than [`MAX_NAME`] bytes without a newline.
    TooLong,
    /// Bytes that are not UTF-8.
    NotText,
    /// A name no engine of this agent has.
    UnknownName,
}

impl BadPoll {
    /// The answer's text after `#`: fixed, so it names no engine and echoes nothing.
    pub(crate) fn shown(self) -> &'static str {
        match self {
            BadPoll::NoName => {
                "no engine name: set agent-send \"<engine name>\\n\" on the server line"
            }
            BadPoll::TooLong => "no engine name: more than 512 bytes without a newline",
            BadPoll::NotText => "no engine name: not UTF-8 text",
            BadPoll::UnknownName => "no engine of that name here",
        }
    }

    /// The kind, as the log line's `kind` field.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            BadPoll::NoName => "no name",
            BadPoll::TooLong => "over-long line",
            BadPoll::NotText => "not UTF-8",
            BadPoll::UnknownName => "unknown name",
        }
    }
}

/// The answer to `asked` among `engines`, or what kind of bad poll it is; a poll of a known
/// engine counts as a poll of its verdict (the first healthy one starts virtual inference, as
/// Node Manager's does) and is recorded in the engine's router state.
pub(crate) fn answer(engines: &[Arc<Monitor>], asked: &Asked) -> Result<AgentCheck, BadPoll> {
    let name = match asked {
        Asked::Name(n) => n,
        Asked::Nothing => return Err(BadPoll::NoName),
        Asked::TooLong => return Err(BadPoll::TooLong),
        Asked::NotText => return Err(BadPoll::NotText),
    };
    let e = engines
        .iter()
        .find(|e| &e.spec().name == name)
        .ok_or(BadPoll::UnknownName)?;
    e.status();
    let a = agent_check(&ActionInputs::of(e), &HaproxyMap::of(e.spec()));
    e.told_router(Told::from(a.state), &a.reason);
    Ok(a)
}

/// Reads what HAProxy sends: up to the first newline, [`MAX_NAME`] + 1 bytes, the peer's
/// close, or [`NAME_WAIT`], whichever comes first; each byte stamps `activity`.
async fn read_name(stream: &mut TcpStream, activity: &Activity) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    let deadline = tokio::time::Instant::now() + NAME_WAIT;
    let mut chunk = [0u8; MAX_NAME + 1];
    loop {
        let room = MAX_NAME + 1 - buf.len();
        let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk[..room])).await;
        match read {
            Ok(Ok(n)) if n > 0 => {
                activity.heard();
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') || buf.len() > MAX_NAME {
                    return buf;
                }
            }
            // Closed, failed, or the wait is over: what arrived is all there is.
            _ => return buf,
        }
    }
}

/// One connection: its name read, its line answered, until `shed` (the slots made room).
async fn one(
    mut stream: TcpStream,
    engines: Engines,
    shed: CancellationToken,
    activity: Arc<Activity>,
    name: Arc<str>,
) {
    let work = async {
        let bytes = read_name(&mut stream, &activity).await;
        // Answering: not a connection to close to make room.
        let _busy = BusyGuard::enter(&activity);
        let asked = asked(&bytes);
        let list: Vec<Arc<Monitor>> = engines.read().unwrap_or_else(|p| p.into_inner()).clone();
        let line = match answer(&list, &asked) {
            Ok(a) => a.line(),
            Err(bad) => {
                // The kind only: the same line for every such poll, so the log layer's
                // rate limit holds a flood of them to one line (and a count) per interval.
                tracing::warn!(
                    listener = %name,
                    kind = bad.kind(),
                    "agent check answered down: the poll names no engine here"
                );
                AgentCheck::unknown(bad.shown()).line()
            }
        };
        let _ = tokio::time::timeout(WRITE_WAIT, async {
            stream.write_all(line.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    };
    tokio::select! {
        _ = shed.cancelled() => {}
        () = work => {}
    }
}

/// Serves the agent check on `listener` until `cancel`, at most `max_connections` at once
/// and a share of them per source ([`crate::slots`]); then lets the answers in progress
/// finish. `name` names the listener in log lines.
pub(crate) async fn serve(
    listener: TcpListener,
    engines: Engines,
    max_connections: usize,
    name: String,
    cancel: CancellationToken,
) {
    let name: Arc<str> = name.into();
    let registry = Arc::new(Mutex::new(Registry::default()));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(listener = %name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let activity = Arc::new(Activity::default());
        let shed = CancellationToken::new();
        let (cap, from) = (max_connections, slots::source(peer.ip()));
        let id = {
            let mut reg = slots::lock(&registry);
            if !reg.admit(from, cap).keeps_new(&name, cap) {
                continue;
            }
            reg.insert(from, Arc::clone(&activity), shed.clone())
        };
        let (registry, engines, name) = (registry.clone(), engines.clone(), name.clone());
        conns.spawn(async move {
            one(stream, engines, shed, activity, name).await;
            slots::lock(&registry).remove(id);
        });
    }
    while conns.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_haproxy_sends_is_read_as_a_name() {
        assert_eq!(asked(b"main\n"), Asked::Name("main".into()));
        assert_eq!(asked(b" main \r\n"), Asked::Name("main".into()));
        assert_eq!(asked(b"main"), Asked::Name("main".into()), "no newline");
        assert_eq!(asked(b"main\nextra"), Asked::Name("main".into()));
        assert_eq!(asked(b""), Asked::Nothing);
        assert_eq!(asked(b"  \n"), Asked::Nothing);
        assert_eq!(asked(&[b'x'; MAX_NAME]), Asked::Name("x".repeat(MAX_NAME)));
        assert_eq!(asked(&[b'x'; MAX_NAME + 1]), Asked::TooLong);
        assert_eq!(asked(b"\xff\xfe\n"), Asked::NotText);
    }

    fn monitor(name: &str) -> Arc<Monitor> {
        let toml = format!(
            "[[engine]]\nname = \"{name}\"\nhost = \"127.0.0.1\"\nport = 8000\nmgmt_port = 9000\nengine_type = \"vllm\"\nserved_model_name = \"m\"\n"
        );
        let spec = crate::config::file::parse(&toml, std::path::Path::new("agent.toml"))
            .unwrap()
            .engines
            .remove(0);
        Arc::new(Monitor::new(spec, vec![0]))
    }

    // An unknown name is answered without the names of the engines here and without the
    // name asked; each kind of bad poll has one fixed answer.
    #[test]
    fn an_unknown_or_missing_name_is_down_and_names_nothing() {
        let engines = [monitor("prefill-main")];
        let asked_for = Asked::Name("draft-secret".into());
        assert_eq!(answer(&engines, &asked_for), Err(BadPoll::UnknownName));
        assert_eq!(
            AgentCheck::unknown(BadPoll::UnknownName.shown()).line(),
            "down ready 100% maxconn:100000 #no engine of that name here\n"
        );
        assert!(answer(&engines, &Asked::Name("prefill-main".into())).is_ok());
        let kinds = [
            (Asked::Nothing, BadPoll::NoName),
            (Asked::TooLong, BadPoll::TooLong),
            (Asked::NotText, BadPoll::NotText),
        ];
        for (asked, kind) in kinds {
            assert_eq!(answer(&engines, &asked), Err(kind));
        }
        for kind in [
            BadPoll::NoName,
            BadPoll::TooLong,
            BadPoll::NotText,
            BadPoll::UnknownName,
        ] {
            let line = AgentCheck::unknown(kind.shown()).line();
            assert!(line.starts_with("down ready 100% "), "{line}");
            assert!(
                !line.contains("prefill") && !line.contains("secret"),
                "{line}"
            );
            assert!(kind.shown().len() <= super::super::MAX_REASON, "{line}");
        }
        assert!(BadPoll::NoName.shown().contains("agent-send"));
        assert!(
            BadPoll::TooLong
                .shown()
                .contains(&format!("{MAX_NAME} bytes"))
        );
    }
    /// A connection to `addr` from `from` (any of 127/8 reaches a loopback listener on Linux).
    async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((from, 0).into()).unwrap();
        sock.connect(addr).await.unwrap()
    }

    // Issue 48, R7: one source flooding the agent-check listener (cap 32, share 8) cannot
    // close the connection of a poll from another source that waits for its answer: before,
    // the oldest connection was closed at the cap, whoever held it, and two local flooders
    // left 17 % of HAProxy-like polls unanswered. The poll sends its name without a newline,
    // so it waits NAME_WAIT for more while the flood arrives, then is answered.
    #[tokio::test]
    async fn a_flood_from_one_source_never_closes_another_sources_poll() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let engines: Engines = Arc::new(std::sync::RwLock::new(vec![monitor("main")]));
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve(l, engines, 32, "test".into(), cancel.clone()));
        let mut poll = connect_from([127, 0, 0, 2], addr).await;
        poll.write_all(b"main").await.unwrap();
        let mut flood = Vec::new();
        // Each flood connection sends a byte too, as a poll does: only the source tells
        // them apart.
        for _ in 0..64 {
            let mut s = connect_from([127, 0, 0, 1], addr).await;
            s.write_all(b"x").await.unwrap();
            flood.push(s);
        }
        let mut line = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), poll.read_to_string(&mut line)).await;
        assert!(
            line.ends_with('\n') && !line.contains("no engine"),
            "the poll was closed unanswered: {line:?}"
        );
        cancel.cancel();
        drop(flood);
        server.await.unwrap();
    }
}
