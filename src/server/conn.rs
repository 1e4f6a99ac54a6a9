//! Serving one listener with bounded connections: every listener the agent has (an engine's
//! mgmt listener, the admin listener, cleartext or TLS) goes through [`serve`].
//!
//! - **HTTP/1.1 only.** Node Manager, Prometheus and the kubelet all poll over HTTP/1.1, so
//!   the agent does not speak HTTP/2 (neither h2c nor h2 over TLS): one protocol, whose limits
//!   are the ones below.
//! - **Header-read timeout.** A request's head must arrive within `header_read_timeout` of
//!   the accept or of the end of the previous answer, so it also closes keep-alive
//!   connections that wait that long for their next request. A TLS handshake has the same
//!   bound.
//! - **Idle timeout.** A connection on which no byte was read or written for `idle_timeout` is
//!   closed, whatever it is doing (a client that stops reading its answer, a body that drips).
//! - **Stall timeout and a small send buffer.** A peer that stops reading a long answer (an
//!   `/events` stream) does not stop the agent's writes at once: the kernel takes them until
//!   its buffers are full, megabytes with autotuning, which at the stream's rate is half an
//!   hour without a write failing. So each accepted socket gets a fixed send buffer of
//!   [`SEND_BUFFER`] (the unsent data it can hold) and `TCP_USER_TIMEOUT` = `stall_timeout`:
//!   once the peer's receive window has stayed shut (it reads nothing) or sent data has gone
//!   unacknowledged for that long, the kernel closes the connection, and whatever it held
//!   (an `/events` slot) is freed.
//! - **A cap, shared fairly** ([`crate::slots`], shared with HAProxy's agent check). At
//!   most `max_connections` at once, and at most a share of them ([`slots::share`]: a
//!   quarter, at least 8) from one source (an IPv4 address, an IPv6 /64), so a flood from one
//!   address never costs another address a slot (Node Manager's poll comes from its own pod
//!   or host). A connection accepted less than 250 ms ago that has sent no request yet (a
//!   poll in its TLS handshake, or a plain one before its head) goes last within the source
//!   that pays. If every connection that could pay is inside a handler (none of ours waits on
//!   anything), the new one is closed instead.
//! - **Accept errors** (EMFILE: out of file descriptors) close the least recently active idle
//!   connection too, and are logged; identical warnings are rate-limited by the log layer.
//! - **Stopping** (SIGTERM, or a SIGHUP reload that restarts the engine, whose socket the new
//!   server takes over): the request in flight on each connection is finished, then the
//!   connection closes. A connection accepted just before, whose first request has not come
//!   in yet, waits up to 250 ms for it and answers it, rather than closing unanswered (a
//!   Node Manager poll without an answer reads as `abnormal`). An answer that never ends by
//!   itself (an `/events` stream) is told through [`Stopping`] and ends at once, so an open
//!   page or `top` never holds a stop, a reload or a handover for the whole drain.

use crate::config::ListenerLimits;
use crate::slots::{self, Activity, BusyGuard, NO_HEAD, Registry, now_ms};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The listener's stop, in every request's extensions: a handler whose answer never ends by
/// itself (the `/events` stream) ends it when this fires. Without it, the stream counted as a
/// request in flight and every stop, reload and handover waited out the whole drain.
#[derive(Debug, Clone)]
pub(crate) struct Stopping(pub CancellationToken);

/// The send buffer of each accepted socket (`SO_SNDBUF`; the kernel doubles it for its own
/// bookkeeping): the largest answer, `/metrics` with many engines, is ~40 kB, so an answer
/// still goes out in one round trip, while a peer that reads nothing can leave at most this
/// much unsent in the agent's kernel.
pub(crate) const SEND_BUFFER: usize = 64 << 10;

/// Applies [`SEND_BUFFER`] and `stall_timeout` to an accepted socket; a failure is logged
/// (the connection is served with the kernel's defaults).
fn bound_socket(stream: &TcpStream, limits: &ListenerLimits) {
    use rustix::net::sockopt;
    let ms = u32::try_from(limits.stall_timeout.as_millis()).unwrap_or(u32::MAX);
    if let Err(e) = sockopt::set_socket_send_buffer_size(stream, SEND_BUFFER) {
        tracing::debug!("could not set an accepted socket's send buffer (SO_SNDBUF): {e}");
    }
    if let Err(e) = sockopt::set_tcp_user_timeout(stream, ms) {
        tracing::debug!("could not set an accepted socket's stall timeout (TCP_USER_TIMEOUT): {e}");
    }
}

/// A stream that stamps its [`Activity`] on every byte moved.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.heard();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether an accept error means the process is out of descriptors.
fn out_of_descriptors(e: &io::Error) -> bool {
    use rustix::io::Errno;
    Errno::from_io_error(e).is_some_and(|x| x == Errno::MFILE || x == Errno::NFILE)
}

/// Serves `router` on `listener` (TLS when `tls` is set) under `limits` until `cancel`; then
/// lets every connection finish its request in flight (the caller bounds the wait). `name`
/// names the listener in log lines.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ListenerLimits,
    name: String,
    cancel: CancellationToken,
) {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    let freed = out_of_descriptors(&e) && slots::lock(&registry).shed_one();
                    tracing::warn!(
                        listener = %name,
                        "accept failed: {e}{}",
                        if freed { "; closed the least recently active idle connection" } else { "" }
                    );
                    tokio::time::sleep(Duration::from_millis(if freed { 1 } else { 50 })).await;
                    continue;
                }
            },
        };
        bound_socket(&stream, &limits);
        let activity = Arc::new(Activity::default());
        let shed = CancellationToken::new();
        let (cap, from) = (limits.max_connections, slots::source(peer.ip()));
        let id = {
            let mut reg = slots::lock(&registry);
            if !reg.admit(from, cap).keeps_new(&name, cap) {
                drop(stream);
                continue;
            }
            reg.insert(from, Arc::clone(&activity), shed.clone())
        };
        let conn = Connection {
            router: router.clone(),
            acceptor: acceptor.clone(),
            limits,
            activity,
            shed,
            cancel: cancel.clone(),
        };
        let registry = Arc::clone(&registry);
        conns.spawn(async move {
            conn.run(stream, peer).await;
            slots::lock(&registry).remove(id);
        });
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// One accepted connection and what bounds it.
struct Connection {
    router: Router,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    limits: ListenerLimits,
    activity: Arc<Activity>,
    shed: CancellationToken,
    cancel: CancellationToken,
}

impl Connection {
    async fn run(self, stream: TcpStream, peer: std::net::SocketAddr) {
        let io = Tracked {
            inner: stream,
            activity: Arc::clone(&self.activity),
        };
        match self.acceptor.clone() {
            None => self.http(io, false).await,
            Some(acceptor) => {
                let accept =
                    tokio::time::timeout(self.limits.header_read_timeout, acceptor.accept(io));
                tokio::pin!(accept);
                let handshake = tokio::select! {
                    _ = self.shed.cancelled() => return,
                    r = &mut accept => r,
                    _ = self.cancel.cancelled() => {
                        // A poll still in its handshake when the listener stops (a handover,
                        // a reload) gets the grace a plain connection's first request gets:
                        // dropped now, its client would get no answer.
                        let grace = FIRST_REQUEST_GRACE.min(self.limits.header_read_timeout);
                        match tokio::time::timeout(grace, &mut accept).await {
                            Ok(r) => r,
                            Err(_) => return,
                        }
                    }
                };
                match handshake {
                    Ok(Ok(tls)) => {
                        let cert = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .is_some_and(|c| !c.is_empty());
                        self.http(tls, cert).await
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }

    /// HTTP/1.1 on `io` until the client closes, a limit closes it, or the listener stops.
    /// `client_cert`: the TLS layer verified a client certificate (told to every request).
    async fn http<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self,
        io: S,
        client_cert: bool,
    ) {
        let router = self.router.clone();
        let activity = Arc::clone(&self.activity);
        let stopping = self.cancel.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut()
                .insert(super::auth::ClientCert(client_cert));
            req.extensions_mut().insert(Stopping(stopping.clone()));
            let busy = BusyGuard::enter(&activity);
            let router = router.clone();
            async move {
                let answer = router.oneshot(req).await;
                drop(busy);
                answer
            }
        });
        // The header-read timeout is this loop's, not hyper's timer: hyper arms a timer for
        // every request head, which cost 13 % of /status's requests/s (BENCHMARKS.md); this
        // loop wakes once per timeout, whatever the request rate.
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let (idle, head) = (self.limits.idle_timeout, self.limits.header_read_timeout);
        loop {
            let now = now_ms();
            let quiet = Duration::from_millis(
                now.saturating_sub(self.activity.last_ms.load(Ordering::Relaxed)),
            );
            let since = self.activity.head_since_ms.load(Ordering::Relaxed);
            let waited =
                (since != NO_HEAD).then(|| Duration::from_millis(now.saturating_sub(since)));
            if quiet >= idle {
                tracing::debug!("closed a connection idle for {quiet:?}");
                return;
            }
            if let Some(w) = waited
                && w >= head
            {
                tracing::debug!("closed a connection whose request head did not come in {w:?}");
                return;
            }
            let wake = waited.map_or(idle - quiet, |w| (idle - quiet).min(head - w));
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = self.shed.cancelled() => return,
                _ = tokio::time::sleep(wake) => {}
                _ = self.cancel.cancelled() => {
                    // A connection accepted just before the listener stopped (a reload
                    // that restarts its engine) may not have sent its request yet: closed
                    // now, its client would get no answer, and Node Manager reads a poll
                    // without one as `abnormal`. Its first request gets a short grace.
                    let grace = tokio::time::Instant::now() + FIRST_REQUEST_GRACE.min(head);
                    while self.activity.requests.load(Ordering::Relaxed) == 0
                        && tokio::time::Instant::now() < grace
                    {
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                        }
                    }
                    // Finish the request in flight, then close (keep-alive ends).
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                    return;
                }
            }
        }
    }
}

/// How long a connection that has not sent its first request yet is kept when its listener
/// stops: a client that connected just before sends its request at once.
const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(250);

/// Descriptors kept for the agent's own use whatever clients hold: the engines' HTTP
/// clients (`/health`, probes, `/metrics`), `npu-smi` pipes, the driver, logs, the listening
/// sockets themselves.
pub(crate) fn reserved_fds(engines: usize) -> u64 {
    256 + 16 * engines as u64
}

/// How the per-listener cap was sized against the file-descriptor limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FdBudget {
    /// Soft limit after raising it (when the hard limit allowed).
    pub soft: Option<u64>,
    pub hard: Option<u64>,
    /// The cap each listener gets.
    pub max_connections: usize,
    /// The cap from the config, when the limit forced a lower one.
    pub lowered_from: Option<usize>,
    pub reserved: u64,
}

/// The cap per listener so that `listeners` full listeners plus [`reserved_fds`] fit in
/// `soft` (no limit: the configured cap). Never below 4.
pub(crate) fn size_cap(
    configured: usize,
    soft: Option<u64>,
    listeners: usize,
    engines: usize,
) -> FdBudget {
    let reserved = reserved_fds(engines);
    let fit = soft.map(|s| s.saturating_sub(reserved) / (listeners.max(1) as u64));
    let max_connections = match fit {
        Some(f) if f < configured as u64 => usize::try_from(f).unwrap_or(usize::MAX).max(4),
        _ => configured,
    };
    FdBudget {
        soft,
        hard: None,
        max_connections,
        lowered_from: (max_connections != configured).then_some(configured),
        reserved,
    }
}

/// Raises the soft descriptor limit to the hard one (at most 65,536), then sizes the cap.
pub(crate) fn fd_budget(configured: usize, listeners: usize, engines: usize) -> FdBudget {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if let (Some(cur), max) = (lim.current, lim.maximum) {
        let want = max.unwrap_or(u64::MAX).min(65_536);
        if want > cur {
            let raised = rustix::process::Rlimit {
                current: Some(want),
                maximum: lim.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                lim = raised;
            }
        }
    }
    FdBudget {
        hard: lim.maximum,
        ..size_cap(configured, lim.current, listeners, engines)
    }
}

impl std::fmt::Display for FdBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
        write!(
            f,
            "file descriptors: limit {} (hard {}); {} connections per listener",
            show(self.soft),
            show(self.hard),
            self.max_connections
        )?;
        if let Some(c) = self.lowered_from {
            write!(f, " (max_connections = {c} lowered to fit the limit)")?;
        }
        write!(
            f,
            ", {} kept for the agent's own connections",
            self.reserved
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_descriptor_limit() {
        // One engine and the admin listener under systemd's default soft limit: fits.
        let b = size_cap(256, Some(1024), 2, 1);
        assert_eq!(
            (b.max_connections, b.lowered_from, b.reserved),
            (256, None, 272)
        );
        // Sixteen engines and the admin listener: (1024 - 512) / 17.
        let b = size_cap(256, Some(1024), 17, 16);
        assert_eq!((b.max_connections, b.lowered_from), (30, Some(256)));
        assert!(b.to_string().contains("lowered"), "{b}");
        // Never below 4, and no limit keeps the configured cap.
        assert_eq!(size_cap(256, Some(100), 2, 1).max_connections, 4);
        assert_eq!(size_cap(256, None, 2, 1).max_connections, 256);
    }

    fn limits(max_connections: usize, header: Duration, idle: Duration) -> ListenerLimits {
        ListenerLimits {
            max_connections,
            header_read_timeout: header,
            idle_timeout: idle,
            stall_timeout: Duration::from_secs(600),
        }
    }

    /// A listener on a free port serving `/status` under `limits`.
    async fn listen(limits: ListenerLimits) -> (std::net::SocketAddr, CancellationToken) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let router = Router::new()
            .route("/status", axum::routing::get(|| async { "ok" }))
            .route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }));
        let cancel = CancellationToken::new();
        tokio::spawn(serve(
            l,
            router,
            None,
            limits,
            "test".into(),
            cancel.clone(),
        ));
        (addr, cancel)
    }

    /// Reads until EOF or error (true), or `limit` passes (false).
    async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        let end = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(end, s.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    async fn get_status(addr: std::net::SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
        out
    }

    #[tokio::test]
    async fn a_dripping_request_head_is_cut_at_the_header_read_timeout() {
        use tokio::io::AsyncWriteExt;
        let (addr, _cancel) = listen(limits(
            8,
            Duration::from_millis(300),
            Duration::from_secs(3600),
        ))
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /status HTTP/1.1\r\nHo").await.unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(10)).await);
        // An idle keep-alive connection (no request yet) is cut the same way.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut idle, Duration::from_secs(10)).await);
    }

    // A client that connected just before the listener stopped (a SIGHUP reload restarting
    // its engine) still gets its answer: the request it sends right after is served, then
    // the connection closes. A connection that sends nothing is closed after the grace.
    #[tokio::test]
    async fn a_request_sent_just_after_the_listener_stops_is_answered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, cancel) =
            listen(limits(8, Duration::from_secs(5), Duration::from_secs(60))).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        // Both accepted (the accept loop runs on this runtime's other tasks meanwhile).
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
        assert!(out.ends_with("ok"), "{out:?}");
        assert!(closed_within(&mut silent, Duration::from_secs(2)).await);
    }

    /// Larger than any socket buffer pair on loopback.
    const BIG: usize = 64 << 20;

    // The header-read timeout bounds each head, not the connection: a keep-alive client
    // polling faster than it stays connected well past it.
    #[tokio::test]
    async fn a_keep_alive_client_polling_within_the_timeout_stays_connected() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _cancel) = listen(limits(
            8,
            Duration::from_millis(300),
            Duration::from_secs(3600),
        ))
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1024];
        for i in 0..12 {
            s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            let answer = String::from_utf8_lossy(&buf[..n]);
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
                "{i}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Then quiet: cut at the timeout.
        assert!(closed_within(&mut s, Duration::from_secs(10)).await);
    }

    /// Reads what the agent sent until it closes; panics if it is still open after 20 s.
    async fn read_until_closed(s: &mut TcpStream) -> usize {
        use tokio::io::AsyncReadExt;
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let end = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout_at(end, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return got,
                Ok(Ok(n)) => got += n,
                Err(_) => panic!("still open after 20 s, {got} bytes read"),
            }
        }
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_cut_at_the_idle_timeout() {
        use tokio::io::AsyncWriteExt;
        let (addr, _cancel) =
            listen(limits(8, Duration::from_secs(3600), Duration::from_secs(1))).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // Not reading: the agent's writes stall once the buffers are full, nothing moves.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let got = read_until_closed(&mut s).await;
        assert!(
            got < BIG,
            "closed before the whole answer: {got} of {BIG} bytes"
        );
    }

    // A peer that reads nothing (its receive window shuts) is cut at the stall timeout, long
    // before the idle timeout: the agent's socket keeps taking writes into its buffers, so
    // the connection never counts as idle while they last.
    #[tokio::test]
    async fn a_peer_that_reads_nothing_is_cut_at_the_stall_timeout() {
        use tokio::io::AsyncWriteExt;
        let mut l = limits(8, Duration::from_secs(3600), Duration::from_secs(3600));
        l.stall_timeout = Duration::from_secs(1);
        let (addr, _cancel) = listen(l).await;
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // Not reading: the window shuts within a few kilobytes, then the stall timeout runs.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let got = read_until_closed(&mut s).await;
        assert!(
            got < BIG,
            "cut before the whole answer: {got} of {BIG} bytes"
        );
    }

    /// A connection to `addr` from `from` (any of 127/8 reaches a loopback listener on Linux).
    async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((from, 0).into()).unwrap();
        sock.connect(addr).await.unwrap()
    }

    // Issue 41: one source flooding a listener (cap 16, share 8) with young silent
    // connections cannot take the slot of a connection from another source that has not sent
    // its request yet (as a poll in its TLS handshake): that one is answered after the
    // flood, and the flooder holds at most its share.
    #[tokio::test]
    async fn a_flood_from_one_source_never_closes_another_sources_waiting_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _cancel) = listen(limits(
            16,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        ))
        .await;
        let mut poll = connect_from([127, 0, 0, 2], addr).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut flood = Vec::new();
        for _ in 0..40 {
            flood.push(connect_from([127, 0, 0, 1], addr).await);
        }
        // Every flood connection accepted (the last ones close the flood's own).
        tokio::time::sleep(Duration::from_millis(100)).await;
        poll.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), poll.read_to_string(&mut out)).await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("ok"),
            "the other source's connection was closed: {out:?}"
        );
        let mut open = 0;
        for s in &mut flood {
            if !closed_within(s, Duration::from_millis(20)).await {
                open += 1;
            }
        }
        assert_eq!(open, slots::share(16), "the flooder holds its share");
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_makes_room_for_a_fresh_poll() {
        let (addr, _cancel) = listen(limits(
            4,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        ))
        .await;
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(TcpStream::connect(addr).await.unwrap());
            // Distinct activity stamps, so "oldest" is well defined.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let answer = get_status(addr).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "{answer:?}"
        );
        assert!(
            closed_within(&mut held[0], Duration::from_secs(10)).await,
            "the oldest idle connection was closed"
        );
        for s in &mut held[1..] {
            assert!(
                !closed_within(s, Duration::from_millis(50)).await,
                "the others stay"
            );
        }
    }
}
