//! Issue 15 §2: the admin page in a real browser (Debian's `chromium`, headless, driven by
//! `chromedriver` over the W3C WebDriver HTTP API). The agent runs on the fake driver with
//! NPU 0 playing a 100 ms burst every 2 s, behind an admin token typed into the page. The
//! test reads what the page keeps in its `data-` attributes: the chart received samples at
//! the sampling rate, the burst is in the plotted data, and each engine's verdict is the
//! one `/status` serves; the page names the host, the chart has its axes, legend and current
//! value, and the failure count reads against the policy's own limit. Then the agent is
//! killed: the page turns stale (grey cards, "agent unreachable since …"), and live again
//! when an agent is back. It saves two screenshots (`docs/live-page.png` and
//! `docs/live-page-stale.png` with `NPU_HEALTH_SCREENSHOTS=1`).
#![cfg(feature = "fake-driver")]

use crate::support::stack::free_ports;
use crate::support::views::{TOKEN, Views, node_name};
use base64::Engine as _;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

struct Driver {
    child: Child,
    url: String,
    session: Option<String>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = &self.session {
            let _ = webdriver_call(&self.url, "DELETE", &format!("/session/{s}"), None);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start(chromedriver: &Path, chromium: &Path) -> Driver {
        let [port] = free_ports();
        let log = std::env::temp_dir().join(format!("chromedriver-{port}.log"));
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut d = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            session: None,
        };
        let end = Instant::now() + Duration::from_secs(20);
        while d.call("GET", "/status", None).is_none() {
            assert!(
                Instant::now() < end,
                "chromedriver did not answer on {port}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }
        }}});
        let r = d.call("POST", "/session", Some(caps)).expect("a session");
        d.session = Some(
            r["value"]["sessionId"]
                .as_str()
                .unwrap_or_else(|| panic!("no session: {r}"))
                .to_owned(),
        );
        d
    }

    /// One WebDriver call; `None` when chromedriver does not answer (the reason is printed).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Option<Value> {
        match webdriver_call(&self.url, method, path, body) {
            Ok(v) => Some(v),
            Err(e) => {
                println!("webdriver {method} {path}: {e}");
                None
            }
        }
    }

    /// A call on the session; a `null` body sends none (GET).
    fn session(&self, method: &str, path: &str, body: Value) -> Value {
        let s = self.session.as_ref().unwrap();
        let r = self
            .call(
                method,
                &format!("/session/{s}{path}"),
                (!body.is_null()).then_some(body),
            )
            .unwrap_or_else(|| panic!("{method} {path}: no answer"));
        assert!(r["value"].get("error").is_none(), "{method} {path}: {r}");
        r["value"].clone()
    }

    fn js(&self, script: &str) -> Value {
        self.session(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
    }

    fn element(&self, css: &str) -> String {
        let v = self.session(
            "POST",
            "/element",
            json!({"using": "css selector", "value": css}),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap()
            .to_owned()
    }
}

/// A WebDriver request over a plain socket (`Connection: close`), its JSON answer.
fn webdriver_call(
    base: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    use std::io::{Read, Write};
    let authority = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(authority).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    // Read the head, then Content-Length bytes: chromedriver may keep the socket open after
    // its answer, whatever `Connection: close` says.
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if let Some(len) = len
                && raw.len() >= end + 4 + len
            {
                let payload = String::from_utf8_lossy(&raw[end + 4..end + 4 + len]).into_owned();
                return serde_json::from_str(&payload)
                    .map_err(|e| format!("not JSON ({e}): {payload}"));
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return Err(format!("closed after {} bytes", raw.len())),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read ({} bytes so far): {e}", raw.len())),
        }
    }
}

#[test]
fn the_live_page_in_chromium_plots_every_sample_and_the_verdict() {
    let (Some(chromium), Some(chromedriver)) = (
        which(&["chromium", "chromium-browser"]),
        which(&["chromedriver"]),
    ) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs the browser test: .ci/run installs chromium and chromium-driver"
        );
        println!(
            "skipped: chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };
    let mut v = Views::start(true, false);
    let d = Driver::start(&chromedriver, &chromium);
    d.session(
        "POST",
        "/url",
        json!({"url": format!("{}/", v.admin_url())}),
    );
    // No token yet: the page asks for one; typing it connects the stream.
    let wait_js = |v: &Views, what: &str, script: &str, limit: Duration| -> Value {
        let end = Instant::now() + limit;
        loop {
            let r = d.js(script);
            if r.as_bool() != Some(false) && !r.is_null() {
                return r;
            }
            assert!(
                Instant::now() < end,
                "{what}: {}\n{}",
                d.js("return document.body.outerHTML"),
                v.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_js(
        &v,
        "the token form",
        "return document.getElementById('auth').classList.contains('show')",
        Duration::from_secs(10),
    );
    let input = d.element("#token");
    d.session(
        "POST",
        &format!("/element/{input}/value"),
        json!({"text": TOKEN}),
    );
    let button = d.element("#authf button");
    d.session("POST", &format!("/element/{button}/click"), json!({}));
    wait_js(
        &v,
        "connected, 5 s of frames",
        "return document.body.dataset.connected === 'true' && Number(document.body.dataset.frames) >= 20",
        Duration::from_secs(20),
    );
    let npu = |attr: &str| -> String {
        d.js(&format!(
            "return document.getElementById('npu-0').dataset['{attr}']"
        ))
        .as_str()
        .unwrap_or_default()
        .to_owned()
    };
    // At least 2 bursts have gone by (one every 2 s): the chart holds one.
    wait_js(
        &v,
        "the burst in the plotted data",
        "return Number(document.getElementById('npu-0').dataset.max) >= 90",
        Duration::from_secs(10),
    );
    let interval: f64 = npu("intervalMs").parse().unwrap();
    let samples: u64 = npu("samples").parse().unwrap();
    let points: u64 = npu("points").parse().unwrap();
    assert!(
        (40.0..=60.0).contains(&interval),
        "median interval {interval} ms"
    );
    assert!(samples >= 100, "{samples} samples received");
    assert!(points >= 100, "{points} points plotted");
    let max = npu("max");
    // NPU 1 reads a steady 20 %.
    assert_eq!(
        d.js("return document.getElementById('npu-1').dataset.max")
            .as_str(),
        Some("20")
    );
    // Each engine's card shows the verdict /status serves (both steady: normal).
    for (name, m) in ["a", "b"].into_iter().zip(v.mgmt) {
        let shown = d.js(&format!(
            "const e = document.querySelector('[data-engine=\"{name}\"]'); return e && e.dataset.status"
        ));
        assert_eq!(
            shown.as_str().map(str::to_owned),
            v.status(m),
            "engine {name}"
        );
    }
    // HAProxy polls engine a's agent check: the card shows what the router was told, and the
    // actions table has the change, in the record's one shape.
    let answer = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", v.haproxy)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"a\n").unwrap();
        let mut line = String::new();
        s.read_to_string(&mut line).unwrap();
        line
    };
    assert!(answer.starts_with("up ready "), "{answer}");
    wait_js(
        &v,
        "engine a's card shows haproxy ready",
        "const e = document.querySelector('[data-engine=\"a\"]'); return !!e && e.textContent.includes('haproxy ready')",
        Duration::from_secs(10),
    );
    let row = wait_js(
        &v,
        "the haproxy action in the table",
        "const r = [...document.querySelectorAll('#recent tr')].find(r => r.textContent.includes('haproxy')); return r ? r.textContent : false",
        Duration::from_secs(10),
    );
    let row = row.as_str().unwrap_or_default();
    assert!(
        row.contains("start") && row.contains("ready") && row.contains("normal"),
        "{row}"
    );
    page_names_the_host_and_reads_its_chart_and_limits(&d);
    if std::env::var("NPU_HEALTH_SCREENSHOTS").as_deref() == Ok("1") {
        // For the docs' picture: a minute of history, and engine b made slow, then failing,
        // so the page shows levels and actions moving (engine_dead: /health 503, past the
        // agent policy's 15 s grace).
        std::thread::sleep(Duration::from_secs(20));
        v.fault(1, r#"{"latency_ms": 1500}"#);
        std::thread::sleep(Duration::from_secs(15));
        v.fault(1, r#"{"latency_ms": 0, "engine_dead": true}"#);
        wait_js(
            &v,
            "b abnormal on the page",
            "const e = document.querySelector('[data-engine=\"b\"]'); return e && e.dataset.status === 'abnormal'",
            Duration::from_secs(90),
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    let out = screenshot(&d, "live-page.png");
    println!(
        "page: median interval {interval} ms, {samples} samples, {points} plotted, max {max}; screenshot {}",
        out.display(),
    );

    // Issue 48: the agent dies. The page stayed green with a small grey "disconnected"; now
    // it turns stale: the banner says since when, the cards are grey, the tab says so.
    let frames_before = d.js("return Number(document.body.dataset.frames)");
    Views::signal(&v.agent, "KILL");
    let _ = v.agent.wait();
    wait_js(
        &v,
        "the page turns stale",
        "return document.body.dataset.stale === 'true'",
        Duration::from_secs(15),
    );
    let banner = d.js("return document.getElementById('stale').textContent");
    let banner = banner.as_str().unwrap_or_default();
    assert!(
        banner.starts_with("agent unreachable since ") && banner.contains("not live"),
        "{banner}"
    );
    assert_eq!(
        d.js("return document.getElementById('stale').offsetHeight > 0"),
        json!(true),
        "the banner is shown"
    );
    let borders = d.js(
        "return [...document.querySelectorAll('.engine')].map(e => getComputedStyle(e).borderLeftColor)",
    );
    assert_eq!(
        borders,
        json!([GREY, GREY]),
        "the cards are grey, whatever their last verdict"
    );
    let title = d.js("return document.title");
    assert!(
        title
            .as_str()
            .unwrap_or_default()
            .starts_with("(unreachable)"),
        "{title}"
    );
    let nodata = d.js(
        "const n = document.getElementById('npu-0'); return [n.querySelector('.nodata').textContent, n.querySelector('.now').textContent]",
    );
    assert!(
        nodata[0]
            .as_str()
            .unwrap_or_default()
            .starts_with("no data since ")
            && nodata[1].as_str().unwrap_or_default().starts_with("last"),
        "{nodata}"
    );
    let out = screenshot(&d, "live-page-stale.png");
    println!("stale: {banner}; screenshot {}", out.display());

    // An agent is back on the same ports: the page reconnects by itself and is live again,
    // each card with the verdict /status serves.
    v.agent = v.spawn_agent();
    wait_js(
        &v,
        "the page live again",
        &format!(
            "return document.body.dataset.stale === 'false' && document.body.dataset.connected === 'true' && Number(document.body.dataset.frames) > {frames_before}"
        ),
        Duration::from_secs(30),
    );
    for (name, m) in ["a", "b"].into_iter().zip(v.mgmt) {
        v.wait(
            &format!("engine {name}'s card shows /status"),
            Duration::from_secs(30),
            || {
                let shown = d.js(&format!(
                    "const e = document.querySelector('[data-engine=\"{name}\"]'); return e && e.dataset.status"
                ));
                shown.as_str().map(str::to_owned) == v.status(m)
            },
        );
    }
    let border = d.js(
        "return getComputedStyle(document.querySelector('[data-engine=\"a\"]')).borderLeftColor",
    );
    assert_ne!(border, json!(GREY), "engine a's card is live again");
    assert_eq!(
        d.js("return document.getElementById('stale').offsetHeight"),
        json!(0)
    );
}

/// The stale cards' border (`#adb5bd`), as the browser computes it.
const GREY: &str = "rgb(173, 181, 189)";

/// Issue 48: the title and heading name the host; the chart has its axes, its legend and
/// the current value; the failure count reads against the agent policy's limit (2), not the
/// reference's (6).
fn page_names_the_host_and_reads_its_chart_and_limits(d: &Driver) {
    let node = node_name();
    assert_eq!(
        d.js("return document.title"),
        json!(format!("{node} · npu-health-agent"))
    );
    assert_eq!(
        d.js("return document.getElementById('node').textContent"),
        json!(node)
    );
    assert_eq!(
        d.js("return document.querySelector('[data-engine=\"a\"] .failures').textContent"),
        json!("failures 0/2 (6 unconfirmed)")
    );
    assert_eq!(
        d.js(
            "return [...document.querySelectorAll('#npu-0 .yaxis span, #npu-0 .xaxis span')].map(s => s.textContent).join(' ')"
        ),
        json!("100 % 75 50 25 0 −60 s −45 s −30 s −15 s now")
    );
    let legend = d.js("return document.getElementById('legend').textContent");
    let legend = legend.as_str().unwrap_or_default();
    assert!(
        legend.contains("80 % and over") && legend.contains("failed reading"),
        "{legend}"
    );
    // NPU 1 reads 20 %, with a failed read every 2 s.
    let now = d.js(
        "const n = document.getElementById('npu-1'); return [n.dataset.now, n.querySelector('.now').textContent]",
    );
    assert!(
        now == json!(["20", "now 20 %"]) || now == json!(["", "now: failed reading"]),
        "{now}"
    );
}

/// Saves a screenshot of the page as `name` in the test's directory (and in `docs/` with
/// `NPU_HEALTH_SCREENSHOTS=1`); its path.
fn screenshot(d: &Driver, name: &str) -> PathBuf {
    let shot = d.session("GET", "/screenshot", json!(null));
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot.as_str().unwrap())
        .unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&out, &png).unwrap();
    if std::env::var("NPU_HEALTH_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs")
                .join(name),
            &png,
        )
        .unwrap();
    }
    out
}
