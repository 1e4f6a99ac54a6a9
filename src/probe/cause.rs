//! A failed request to the engine in words for an operator: the cause first, then the raw
//! error last (`connection refused: nothing listens on the engine's port: <the client's
//! error>`). The class of a client error ([`classify`]) and the words of every failure
//! ([`ProbeFailure`]'s `Display`) live here, so the virtual request, `/health` and the
//! `/metrics` scrape say the same thing the same way wherever it shows: `/status/detail`,
//! the journal, the live page, `top`, the log.
//!
//! No reason names the engine's address: the open routes (`/readyz`,
//! `/engines/<name>/readyz`) serve reasons to anyone, so the raw error is the client's
//! without the request's URL ([`raw`]); `/status/detail` and the log name the engine.

use super::health::Transport;
use super::outcome::ProbeFailure;
use std::fmt;

/// The cause of a request without a usable answer, in words.
pub(crate) fn words(class: Transport) -> &'static str {
    match class {
        Transport::Refused => "connection refused: nothing listens on the engine's port",
        Transport::Reset => "connection reset: the engine closed it before a whole answer",
        Transport::Protocol => "the engine's answer was not HTTP",
        Transport::BodyTooLarge => "the engine's answer was larger than the agent reads",
        Transport::Tls => "the TLS handshake with the engine failed",
        Transport::Local => {
            "the agent is out of file descriptors (this says nothing of the engine)"
        }
        Transport::Connect => "cannot connect to the engine's address",
        Transport::Other => "the request to the engine failed",
    }
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeFailure::Timeout(after) => write!(f, "timed out after {after:?}"),
            ProbeFailure::Transport(class, raw) => write!(f, "{}: {raw}", words(*class)),
            ProbeFailure::Status(code) => {
                let phrase = http::StatusCode::from_u16(*code)
                    .ok()
                    .and_then(|s| s.canonical_reason());
                match phrase {
                    Some(p) => write!(f, "the engine answered HTTP {code} {p}"),
                    None => write!(f, "the engine answered HTTP {code}"),
                }
            }
            ProbeFailure::BadBody(raw) => write!(f, "the engine's answer was not JSON: {raw}"),
            ProbeFailure::BadStream(raw) => {
                write!(f, "the engine's stream was not a whole answer: {raw}")
            }
        }
    }
}

/// A client error as a failure: its class and its raw text.
pub(crate) fn of(e: &reqwest::Error) -> ProbeFailure {
    ProbeFailure::Transport(classify(e), raw(e))
}

/// The class of a transport error, from its source chain: the first I/O error, hyper error
/// or TLS error found decides.
pub(crate) fn classify(e: &(dyn std::error::Error + 'static)) -> Transport {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use rustix::io::Errno;
            let io = innermost(io);
            if io.get_ref().is_some_and(|i| i.is::<rustls::Error>()) {
                return Transport::Tls;
            }
            if Errno::from_io_error(io).is_some_and(|x| x == Errno::MFILE || x == Errno::NFILE) {
                return Transport::Local;
            }
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return Transport::Refused,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => return Transport::Reset,
                std::io::ErrorKind::InvalidData => return Transport::Protocol,
                _ => {}
            }
        }
        if c.downcast_ref::<rustls::Error>().is_some() {
            return Transport::Tls;
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() {
                return Transport::Protocol;
            }
            if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
                return Transport::Reset;
            }
        }
        cur = c.source();
    }
    match e.downcast_ref::<reqwest::Error>() {
        Some(r) if r.is_connect() => Transport::Connect,
        Some(r) if r.is_decode() => Transport::Protocol,
        Some(r) if r.is_body() => Transport::Reset,
        _ => Transport::Other,
    }
}

/// The io::Error that `io` wraps, through every layer. An io::Error's `source()` skips the
/// error it wraps, and hyper-rustls wraps tokio-rustls's (which wraps the TLS error) in
/// another (`io::Error::other`), so a failed handshake is found only this way.
fn innermost(mut io: &std::io::Error) -> &std::io::Error {
    while let Some(inner) = io
        .get_ref()
        .and_then(|i| i.downcast_ref::<std::io::Error>())
    {
        io = inner;
    }
    io
}

/// The error and its causes on one line, without the request's URL (see the module doc).
pub(crate) fn raw(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(&format!(" for url ({u})"), "");
    }
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mindie::TlsConfig;
    use crate::probe::Prober;
    use crate::probe::http::EngineClient;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn local_and_tls_errors_are_classed_by_their_source() {
        let emfile = std::io::Error::from_raw_os_error(24);
        assert_eq!(classify(&emfile), Transport::Local);
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::General("bad certificate".into()),
        );
        assert_eq!(classify(&tls), Transport::Tls);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&refused), Transport::Refused);
        assert_eq!(classify(&std::fmt::Error), Transport::Other);
    }

    /// How the test engine treats each connection.
    #[derive(Clone, Copy)]
    enum Engine {
        /// Bound, never listening: a connection is refused.
        Absent,
        /// Reads the request, then closes with a reset (SO_LINGER 0).
        Resets,
        /// Reads the request and never answers.
        Silent,
        /// Reads the request and answers these bytes.
        Answers(&'static str),
    }

    /// A test engine on a real socket; returns its port. Its task ends with the test's runtime.
    async fn engine(how: Engine) -> u16 {
        if let Engine::Absent = how {
            let held = tokio::net::TcpSocket::new_v4().unwrap();
            held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let port = held.local_addr().unwrap().port();
            // Kept bound (never listening) for the test's life, so no other test takes it.
            std::mem::forget(held);
            return port;
        }
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                match how {
                    Engine::Resets => {
                        rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
                        drop(s);
                    }
                    Engine::Silent => {
                        tokio::spawn(async move {
                            let _ = s.read(&mut buf).await;
                        });
                    }
                    Engine::Answers(raw) => {
                        let _ = s.write_all(raw.as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    Engine::Absent => unreachable!(),
                }
            }
        });
        port
    }

    /// One virtual request to `port`, over HTTPS trusting `ca` when given.
    async fn probe(port: u16, ca: Option<&std::path::Path>, timeout: Duration) -> ProbeFailure {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let text = format!(
            "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = 9001\n"
        );
        let mut spec = crate::config::file::parse(&text, std::path::Path::new("/x/a.toml"))
            .unwrap()
            .engines
            .remove(0);
        if let Some(ca) = ca {
            spec.infer_tls_config = TlsConfig {
                enable_tls: true,
                ca_file: ca.to_owned(),
                ..Default::default()
            };
        }
        let client = EngineClient::new(&spec).unwrap();
        let r = client.prober(&spec).send(timeout).await;
        r.outcome.expect_err("the probe must fail")
    }

    /// A certificate for 127.0.0.1 signed by nobody the client trusts, served over TLS.
    async fn tls_engine(dir: &std::path::Path) -> u16 {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        let tls = TlsConfig {
            enable_tls: true,
            ca_file: dir.join("server.crt"),
            cert_file: dir.join("server.crt"),
            key_file: dir.join("server.key"),
            ..Default::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(crate::server::serve(
            listener,
            axum::Router::new(),
            Some(crate::tls::server_config(&tls).unwrap()),
            crate::config::ListenerLimits::default(),
            "test".to_owned(),
            tokio_util::sync::CancellationToken::new(),
        ));
        port
    }

    /// A CA file the client trusts, which signed nothing the engine serves.
    fn other_ca(dir: &std::path::Path) -> std::path::PathBuf {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let path = dir.join("other-ca.crt");
        std::fs::write(&path, cert.pem()).unwrap();
        path
    }

    // Issue 48: a reason opens with the cause in words and ends with the raw error, for
    // each way a real engine's socket fails a probe.
    #[tokio::test]
    async fn a_failed_probe_says_its_cause_in_words_then_the_raw_error() {
        let dir = tempfile::tempdir().unwrap();
        let ca = other_ca(dir.path());
        let long = Duration::from_secs(10);
        let cases: Vec<(&str, ProbeFailure, &str, &str)> = vec![
            (
                "a refused port",
                probe(engine(Engine::Absent).await, None, long).await,
                "connection refused: nothing listens on the engine's port: ",
                "Connection refused",
            ),
            (
                "a reset",
                probe(engine(Engine::Resets).await, None, long).await,
                "connection reset: the engine closed it before a whole answer: ",
                "reset",
            ),
            (
                "a timeout",
                probe(
                    engine(Engine::Silent).await,
                    None,
                    Duration::from_millis(300),
                )
                .await,
                "timed out after 300ms",
                "",
            ),
            (
                "TLS spoken to a plain HTTP engine",
                probe(
                    engine(Engine::Answers("HTTP/1.1 400 Bad Request\r\n\r\n")).await,
                    Some(&ca),
                    long,
                )
                .await,
                "the TLS handshake with the engine failed: ",
                "corrupt message",
            ),
            (
                "an engine certificate the agent does not trust",
                probe(tls_engine(dir.path()).await, Some(&ca), long).await,
                "the TLS handshake with the engine failed: ",
                "invalid peer certificate",
            ),
            (
                "an answer that is not HTTP",
                probe(
                    engine(Engine::Answers("\x00\x01 not http\r\n\r\n")).await,
                    None,
                    long,
                )
                .await,
                "the engine's answer was not HTTP: ",
                "invalid HTTP",
            ),
            (
                "HTTP 503",
                probe(
                    engine(Engine::Answers(
                        "HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                    ))
                    .await,
                    None,
                    long,
                )
                .await,
                "the engine answered HTTP 503 Service Unavailable",
                "",
            ),
            (
                "a body that is not JSON",
                probe(
                    engine(Engine::Answers(
                        "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops",
                    ))
                    .await,
                    None,
                    long,
                )
                .await,
                "the engine's answer was not JSON: ",
                "expected value at line 1 column 1",
            ),
        ];
        for (what, failure, cause, raw) in cases {
            let reason = failure.to_string();
            println!("{what}: {reason}");
            let tail = reason.strip_prefix(cause);
            assert!(
                tail.is_some(),
                "{what}: {reason:?} does not open with {cause:?}"
            );
            let tail = tail.unwrap_or_default();
            assert!(
                tail.contains(raw),
                "{what}: the raw error is last: {reason:?}"
            );
            assert!(
                !reason.contains("127.0.0.1"),
                "{what}: no address: {reason}"
            );
        }
    }
}
