//! Issue 11 §6: who may call the admin listener. A bearer token, a client certificate
//! (mTLS), or both; `/healthz` stays open for the kubelet's probes. The real agent binary,
//! real TLS.

#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::stack::{free_ports, http_with};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "s3cr3t-admin-token-0123456789";

struct Agent(std::process::Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent with `agent_extra` in `[agent]` and its admin listener on the returned port.
fn start(dir: &Path, agent_extra: &str) -> (Agent, u16) {
    let scenario = support::one_npu_scenario(dir);
    let [engine, mgmt, admin] = free_ports();
    let toml = dir.join("agent.toml");
    std::fs::write(
        &toml,
        format!(
            "[agent]\nadmin_listen = \"127.0.0.1:{admin}\"\n{agent_extra}\n\n[[engine]]\nname = \"a\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {engine}\nmgmt_port = {mgmt}\ndevices = [0]\nengine_env = {{}}\n"
        ),
    )
    .unwrap();
    (Agent(support::spawn_agent(dir, &toml, &scenario)), admin)
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
}

/// Status code of `GET path` over TLS, presenting `client` (cert, key) if given.
fn https_get(
    port: u16,
    path: &str,
    ca: &rcgen::Certificate,
    client: Option<&(rcgen::Certificate, rcgen::KeyPair)>,
    token: Option<&str>,
) -> Option<u16> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap(),
    };
    let tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        rustls::pki_types::ServerName::try_from("localhost").unwrap(),
    )
    .ok()?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .ok()?;
    // The status line is all that is needed; a stream (`/events`) never ends.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&raw)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A CA and the admin listener's certificate for `localhost` signed by it, written as
/// `server.crt` and `server.key` in `dir`; [`Pki::sign`] makes more (clients).
struct Pki {
    ca: rcgen::Certificate,
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let pki = Pki { ca, params, key };
        let (server, server_key) = pki.sign("localhost");
        std::fs::write(dir.join("server.crt"), server.pem()).unwrap();
        std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
        pki
    }

    /// A certificate for `name` signed by the CA, with its key.
    fn sign(&self, name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert, key)
    }
}

fn wait_for(what: &str, dir: &Path, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "{what}\n{}", log(dir));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn admin_token_guards_everything_but_healthz() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
    let (_agent, admin) = start(dir.path(), "admin_token_file = \"admin.token\"");
    let get = |path: &str, token: Option<&str>| {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        http_with(
            "GET",
            &format!("http://127.0.0.1:{admin}{path}"),
            None,
            &headers,
        )
        .map(|(c, _)| c)
    };
    wait_for("admin listener up", dir.path(), || {
        get("/healthz", None).is_some()
    });
    assert_eq!(get("/healthz", None), Some(200), "/healthz stays open");
    assert_eq!(get("/", None), Some(200), "the live page is open");
    assert_eq!(get("/events", None), Some(401), "its stream is not");
    for path in ["/metrics", "/status/detail", "/qos"] {
        assert_eq!(get(path, None), Some(401), "{path} without a token");
        assert_eq!(
            get(path, Some("wrong-token-wrong-token")),
            Some(401),
            "{path}"
        );
        assert_eq!(get(path, Some(TOKEN)), Some(200), "{path} with the token");
    }
    assert!(
        log(dir.path()).contains("/qos: bearer token; /healthz: open"),
        "{}",
        log(dir.path())
    );
}

// Hardening round 2, case 3: the open routes (the kubelet's probes carry no credentials)
// leak nothing the token guards. An unknown name is a 404 that names no other engine (it
// listed them all); a reason names no address (it quoted the engine's /health URL).
#[test]
fn the_open_engine_probes_name_no_other_engine_and_no_address() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).unwrap();
    let (_agent, admin) = start(dir.path(), "admin_token_file = \"admin.token\"");
    let get = |path: &str| http_with("GET", &format!("http://127.0.0.1:{admin}{path}"), None, &[]);
    wait_for("the engine's /health refused", dir.path(), || {
        get("/engines/a/readyz").is_some_and(|(_, b)| b.contains("refused"))
    });
    let (code, body) = get("/engines/a/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        !body.contains("127.0.0.1") && !body.contains("http://"),
        "an address in an open answer: {body}"
    );
    let (code, body) = get("/engines/a/livez").unwrap();
    assert!(!body.contains("127.0.0.1"), "{code} {body}");
    // Issue 48, R10: the answer to an unknown name is fixed (it echoed the name); the
    // operator's log names what was asked.
    let (code, body) = get("/engines/nope/readyz").unwrap();
    assert_eq!(code, 404, "{body}");
    assert_eq!(body, "no engine of that name here\n");
    wait_for("the log names the name asked", dir.path(), || {
        log(dir.path()).contains(
            "GET /engines/<name>/readyz asked for \"nope\", which no engine here has (engines: a)",
        )
    });
}

#[test]
fn admin_mtls_and_token_together() {
    let dir = tempfile::tempdir().unwrap();
    // A CA, the server's certificate and a client's, both signed by it.
    let pki = Pki::new(dir.path());
    let ca = pki.ca.clone();
    let (client, client_key) = pki.sign("prometheus");
    // A client certificate from another CA.
    let stranger_key = rcgen::KeyPair::generate().unwrap();
    let stranger = rcgen::CertificateParams::new(vec!["x".to_owned()])
        .unwrap()
        .self_signed(&stranger_key)
        .unwrap();
    for (name, pem) in [("ca.crt", ca.pem()), ("admin.token", TOKEN.to_owned())] {
        std::fs::write(dir.path().join(name), pem).unwrap();
    }
    let (_agent, admin) = start(
        dir.path(),
        "admin_token_file = \"admin.token\"\nadmin_tls = { cert_file = \"server.crt\", key_file = \"server.key\", client_ca_file = \"ca.crt\" }",
    );
    let good = (client, client_key);
    let bad = (stranger, stranger_key);
    wait_for("admin listener up", dir.path(), || {
        https_get(admin, "/healthz", &ca, None, None).is_some()
    });
    assert_eq!(
        https_get(admin, "/healthz", &ca, None, None),
        Some(200),
        "/healthz open without a certificate or token"
    );
    assert_eq!(
        https_get(admin, "/metrics", &ca, None, Some(TOKEN)),
        Some(403)
    );
    assert_eq!(
        https_get(admin, "/metrics", &ca, Some(&good), None),
        Some(401)
    );
    assert_eq!(
        https_get(admin, "/metrics", &ca, Some(&good), Some(TOKEN)),
        Some(200)
    );
    assert_eq!(
        https_get(admin, "/metrics", &ca, Some(&bad), Some(TOKEN)),
        None,
        "a certificate from another CA fails the handshake"
    );
    // The live views: the page is open like /healthz; its stream is guarded like /metrics.
    assert_eq!(https_get(admin, "/", &ca, None, None), Some(200));
    assert_eq!(
        https_get(admin, "/events", &ca, None, Some(TOKEN)),
        Some(403)
    );
    assert_eq!(
        https_get(admin, "/events", &ca, Some(&good), None),
        Some(401)
    );
    assert_eq!(
        https_get(admin, "/events", &ca, Some(&good), Some(TOKEN)),
        Some(200)
    );
    // Plain HTTP on the TLS port gets nothing.
    assert!(
        http_with(
            "GET",
            &format!("http://127.0.0.1:{admin}/healthz"),
            None,
            &[]
        )
        .is_none_or(|(c, _)| c != 200)
    );
    assert!(
        log(dir.path()).contains("https://")
            && log(dir.path()).contains("bearer token and client certificate"),
        "{}",
        log(dir.path())
    );
}

// Issue 24, point 1: a TLS listener (the admin port here) stays open through a handover
// like every other: a `/healthz` over TLS every 50 ms while a second agent takes over never
// fails, and the new agent serves the same certificate.
#[test]
fn a_tls_listener_stays_open_through_a_handover() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Pki::new(dir.path()).ca;
    let state = dir.path().join("state");
    let (mut first, admin) = start(
        dir.path(),
        &format!(
            "state_dir = \"{}\"\nadmin_tls = {{ cert_file = \"server.crt\", key_file = \"server.key\" }}",
            state.display()
        ),
    );
    wait_for("the TLS admin listener up", dir.path(), || {
        https_get(admin, "/healthz", &ca, None, None) == Some(200)
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (stop, ca) = (stop.clone(), ca.clone());
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                got.push(https_get(admin, "/healthz", &ca, None, None));
                std::thread::sleep(Duration::from_millis(50));
            }
            got
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let scenario = support::one_npu_scenario(dir.path());
    let second = Agent(support::spawn_agent_logged(
        &dir.path().join("agent.toml"),
        &scenario,
        &[],
        &dir.path().join("agent-2.log"),
    ));
    let end = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        if let Some(st) = first.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < end,
            "the first agent never handed over\n{}",
            log(dir.path())
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exited.success(), "{exited}");
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Release);
    let got = poller.join().unwrap();
    assert!(got.len() >= 20, "{} polls", got.len());
    assert!(
        got.iter().all(|c| *c == Some(200)),
        "a TLS poll without its answer: {got:?}\n{}",
        log(dir.path())
    );
    let second_log = std::fs::read_to_string(dir.path().join("agent-2.log")).unwrap();
    assert!(
        second_log.contains("taking over from the running agent"),
        "{second_log}"
    );
    drop(second);
}

#[test]
fn admin_auth_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("short.token"), "abc").unwrap();
    for (extra, want) in [
        (
            "admin_token_file = \"absent.token\"",
            "[agent] admin_token_file",
        ),
        ("admin_token_file = \"short.token\"", "at least 16"),
        (
            "admin_tls = { cert_file = \"absent.crt\", key_file = \"absent.key\" }",
            "admin_tls",
        ),
    ] {
        let (mut agent, _) = start(dir.path(), extra);
        let end = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = agent.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < end,
                "{extra}: still running\n{}",
                log(dir.path())
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(2), "{extra}: a configuration error");
        let text = log(dir.path());
        assert!(text.contains(want), "{extra}: {text}");
    }
}
