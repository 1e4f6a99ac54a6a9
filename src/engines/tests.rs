//! The engines wing's tests: every kind's names start with its prefix, the fake engine's
//! profiles name the same kinds, and the seam seen from a new kind: one written here,
//! test-only, with metric names, a request and a `/health` of its own that no kind in the
//! list shares, is talked to by the agent's own HTTP client through [`EngineKind`] alone,
//! against a real server on a real socket. It needs no line in any other file.

use super::{EngineKind, MetricNames, VirtualRequest, of};
use crate::config::EngineSpec;
use crate::config::engine_type::EngineType;
use crate::probe::health::{HealthCollector, HealthOutcome};
use crate::probe::http::EngineClient;
use crate::probe::{MetricsSource, Prober};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strum::IntoEnumIterator;

/// A kind whose engine speaks a dialect of its own: `seam:` metrics, `POST /seam/generate`
/// with the id in `request_id`, and a `/health` that says `ok`.
struct Seam;

static NAMES: MetricNames = MetricNames {
    prefix: "seam:",
    running: &["seam:active"],
    waiting: &["seam:queued"],
    waiting_for_capacity: None,
    prompt_tokens: &["seam:in_tokens"],
    generation_tokens: &["seam:out_tokens"],
    kv_cache_usage: &["seam:kv"],
    asleep: None,
};

impl EngineKind for Seam {
    fn metric_names(&self) -> &'static MetricNames {
        &NAMES
    }

    fn virtual_request(&self, _spec: &EngineSpec) -> VirtualRequest {
        VirtualRequest {
            path: "/seam/generate",
            body: json!({"inputs": "1", "parameters": {"max_new_tokens": 1}}),
            stream: false,
            id_field: Some("request_id"),
        }
    }

    fn virtual_inference(&self, _spec: &EngineSpec) -> Result<(), &'static str> {
        Ok(())
    }

    fn healthy_body(&self, body: &str) -> bool {
        body == "ok"
    }
}

/// What the seam's engine received and what its `/health` says.
#[derive(Default)]
struct Seen {
    requests: Vec<(String, Value)>,
    health: &'static str,
}

/// The seam's engine on a real socket; returns its port.
async fn engine(seen: Arc<Mutex<Seen>>) -> u16 {
    async fn generate(
        State(s): State<Arc<Mutex<Seen>>>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> axum::Json<Value> {
        let id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        s.lock().unwrap().requests.push((id, body));
        axum::Json(json!({"generated_text": "x"}))
    }
    async fn health(State(s): State<Arc<Mutex<Seen>>>) -> &'static str {
        s.lock().unwrap().health
    }
    async fn metrics() -> &'static str {
        "seam:active{shard=\"0\"} 2\nseam:active{shard=\"1\"} 1\nseam:queued 4\nseam:kv 0.25\n\
         seam:in_tokens 10\nseam:out_tokens 7\nvllm:num_requests_running 9\n"
    }
    let router = axum::Router::new()
        .route("/seam/generate", post(generate))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(seen);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(l, router).await });
    port
}

/// An inline engine at `port` (its `engine_type` is another kind's: the client is given the
/// seam's kind, as the list would give it).
fn spec(port: u16) -> EngineSpec {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = format!(
        "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = 9001\n"
    );
    crate::config::file::parse(&text, std::path::Path::new("/x/a.toml"))
        .unwrap()
        .engines
        .remove(0)
}

// The agent's client sends the kind's request (its path, its body, the id where the kind
// takes it), reads the kind's metric names into the neutral figures (another kind's name in
// the same text is not read), and reads /health the kind's way.
#[tokio::test]
async fn the_agent_talks_to_a_new_kind_through_the_trait_alone() {
    let seen = Arc::new(Mutex::new(Seen {
        health: "ok",
        ..Seen::default()
    }));
    let port = engine(seen.clone()).await;
    let spec = spec(port);
    let client = EngineClient::of_kind(&spec, &Seam).unwrap();

    let r = client.prober(&spec).send(Duration::from_secs(5)).await;
    assert_eq!(r.outcome, Ok(()), "{r:?}");
    let (header_id, body) = seen.lock().unwrap().requests.pop().expect("one request");
    assert!(header_id.ends_with("_virtual"), "{header_id}");
    assert_eq!(body["inputs"], "1");
    assert_eq!(body["parameters"]["max_new_tokens"], 1);
    assert_eq!(body["request_id"], header_id.as_str(), "the id in the body");

    let m = client
        .metrics()
        .scrape(Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        m.running,
        Some(3.0),
        "seam:active summed; vLLM's 9 not read"
    );
    assert_eq!(
        (
            m.waiting,
            m.kv_cache_usage,
            m.prompt_tokens,
            m.generation_tokens
        ),
        (Some(4.0), Some(0.25), Some(10.0), Some(7.0))
    );
    assert_eq!(m.sources.running, Some("seam:active"));
    assert_eq!(m.sources.generation_tokens, Some("seam:out_tokens"));

    let mut health = HealthCollector::new(client.health(), Duration::from_secs(5), 1);
    assert_eq!(health.probe().await, HealthOutcome::Healthy);
    // `down` is healthy to the reference's rule (only `false` is not); not to this kind.
    seen.lock().unwrap().health = "down";
    assert!(matches!(
        health.probe().await,
        HealthOutcome::Unhealthy { .. }
    ));
}

// Every name of a kind starts with its prefix (a line is skipped on the prefix alone).
#[test]
fn every_kinds_names_start_with_its_prefix() {
    for t in EngineType::iter() {
        let n = of(t).metric_names();
        let mut all: Vec<&str> = [
            n.running,
            n.waiting,
            n.prompt_tokens,
            n.generation_tokens,
            n.kv_cache_usage,
        ]
        .concat();
        all.extend(n.waiting_for_capacity.iter().map(|l| l.name));
        all.extend(n.asleep.iter().map(|l| l.name));
        assert!(!all.is_empty(), "{t}");
        for name in all {
            assert!(name.starts_with(n.prefix), "{t}: {name}");
        }
    }
}

// The fake engine's profiles name the agent's kinds: each profile is one kind, and each
// kind has a profile.
#[cfg(feature = "fake-driver")]
#[test]
fn the_fake_engines_profiles_name_the_same_kinds() {
    use fake_engine::profile::Profile;
    let mut kinds: Vec<EngineType> = Profile::iter()
        .map(|p| EngineType::parse(p.kind()).unwrap_or_else(|| panic!("{p}: {}", p.kind())))
        .collect();
    kinds.sort_by_key(|t| t.as_str());
    kinds.dedup();
    let mut all: Vec<EngineType> = EngineType::iter().collect();
    all.sort_by_key(|t| t.as_str());
    assert_eq!(kinds, all);
}
