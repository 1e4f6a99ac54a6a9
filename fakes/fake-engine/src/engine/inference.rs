//! The OpenAI-compatible surface the agent and the load use: `/health` as the profile answers
//! it, and `/v1/completions`, plain and streamed, with the faults' effects (latency, stalls,
//! errors, a hang).

use super::{Engine, Faults, Gauge};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A response with `status`, `body` and, if given, its content type (vLLM's empty `/health`
/// has none).
pub(super) fn raw(status: u16, body: &'static str, content_type: Option<&'static str>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (code, body).into_response();
    match content_type {
        Some(ct) => {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
        }
        None => {
            r.headers_mut().remove(header::CONTENT_TYPE);
        }
    }
    r
}

pub(super) async fn health(State(e): State<Arc<Engine>>) -> Response {
    e.stats.lock().unwrap_or_else(|p| p.into_inner()).health += 1;
    let f = e.faults();
    let profile = e.opts.profile;
    if e.paused().is_some() {
        return raw(503, "", None);
    }
    if f.slow_health_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.slow_health_ms)).await;
    }
    if let Some(s) = f.health_status {
        return raw(s, "", None);
    }
    if f.engine_dead || f.health_false || !ping(&e).await {
        let (status, body, ct) = profile.health_dead();
        return raw(status, body, ct);
    }
    let (status, body, ct) = profile.health_ok();
    raw(status, body, ct)
}

/// How often an unanswered ping looks whether the engine core is between steps again.
const PING_LOOK: Duration = Duration::from_millis(5);

/// vllm-ascend PR #14240's health ping, when the engine runs with one
/// ([`EngineOptions::health_ping_timeout`](super::EngineOptions)): the engine core answers
/// between two steps, so a hang, a stuck step or one long unchunked step leaves it
/// unanswered while a saturated engine answers at its next step. Unanswered within the
/// timeout, the engine is dead for good (the patch sets `engine_dead`, and every later
/// `/health` raises `EngineDeadError`). The wait is a task of its own: a prober that gives
/// up first (a kubelet's 1 s timeout against the ping's 10 s) does not end it, as uvicorn
/// runs a handler to its end after its client has gone. True: answered, or no ping.
async fn ping(e: &Arc<Engine>) -> bool {
    let Some(timeout) = e.opts.health_ping_timeout else {
        return true;
    };
    if e.ping_dead.load(Ordering::Acquire) {
        return false;
    }
    let e = e.clone();
    let waited = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if e.between_steps(&e.faults()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                e.ping_dead.store(true, Ordering::Release);
                return false;
            }
            // Looked at again every few milliseconds: a fault may clear, a step end.
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + PING_LOOK)).await;
        }
    });
    waited.await.unwrap_or(false)
}

#[derive(Debug, Deserialize)]
pub(super) struct CompletionRequest {
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) prompt: Value,
    pub(super) max_tokens: Option<u64>,
    #[serde(default)]
    pub(super) stream: bool,
    /// SGLang's request id (`rid`), which it takes instead of `X-Request-Id`.
    pub(super) rid: Option<String>,
}

/// SGLang's native `/generate` body (`GenerateReqInput`): the fields the fake reads.
#[derive(Debug, Deserialize)]
struct GenerateRequest {
    #[serde(default)]
    text: Value,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(default)]
    stream: bool,
    rid: Option<String>,
}

/// `sampling_params` of a `/generate` body.
#[derive(Debug, Default, Deserialize)]
struct SamplingParams {
    max_new_tokens: Option<u64>,
}

/// The API a request came in by, which shapes its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    /// OpenAI's `POST /v1/completions` (every profile).
    Completions,
    /// SGLang's native `POST /generate` (profile `sglang`).
    Generate,
}

impl Api {
    /// The body, as a completion request.
    fn parse(self, body: &[u8]) -> Result<CompletionRequest, serde_json::Error> {
        match self {
            Api::Completions => serde_json::from_slice(body),
            Api::Generate => {
                serde_json::from_slice::<GenerateRequest>(body).map(|g| CompletionRequest {
                    model: None,
                    prompt: g.text,
                    max_tokens: g.sampling_params.max_new_tokens,
                    stream: g.stream,
                    rid: g.rid,
                })
            }
        }
    }

    /// One streamed event: token `i` (from 0) of `max_tokens`.
    fn event(self, id: &str, model: &str, i: u64, max_tokens: u64) -> Value {
        let last = i + 1 == max_tokens;
        match self {
            Api::Completions => {
                let finish = if last { json!("length") } else { Value::Null };
                json!({"id": format!("cmpl-{id}"), "object": "text_completion", "model": model, "choices": [{"index": 0, "text": " x", "finish_reason": finish}]})
            }
            // SGLang's /generate streams the whole text so far.
            Api::Generate => {
                let finish = if last {
                    json!({"type": "length", "length": max_tokens})
                } else {
                    Value::Null
                };
                json!({"text": " x".repeat(i as usize + 1), "meta_info": {"id": id, "completion_tokens": i + 1, "finish_reason": finish}})
            }
        }
    }

    /// The answer of a request run to its end.
    fn answer(self, id: &str, model: &str, n_prompt: u64, max_tokens: u64) -> Value {
        let text = " x".repeat(max_tokens as usize);
        match self {
            Api::Completions => json!({
                "id": format!("cmpl-{id}"),
                "object": "text_completion",
                "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": max_tokens, "total_tokens": n_prompt + max_tokens},
            }),
            Api::Generate => json!({
                "text": text,
                "meta_info": {"id": id, "prompt_tokens": n_prompt, "completion_tokens": max_tokens,
                              "finish_reason": {"type": "length", "length": max_tokens}},
            }),
        }
    }
}

pub(super) fn prompt_tokens(p: &Value) -> u64 {
    let chars = match p {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(|v| v.as_str().map_or(1, str::len)).sum(),
        _ => 1,
    };
    (chars as u64 / 4).max(1)
}

pub(super) async fn completions(
    State(e): State<Arc<Engine>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    serve(e, headers, body, Api::Completions).await
}

/// SGLang's native `POST /generate`.
pub(super) async fn generate(
    State(e): State<Arc<Engine>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    serve(e, headers, body, Api::Generate).await
}

/// Runs one request that came in by `api`, with the faults' effects.
async fn serve(e: Arc<Engine>, headers: HeaderMap, body: axum::body::Bytes, api: Api) -> Response {
    let parsed = api.parse(&body);
    // vLLM takes the caller's id from `X-Request-Id`, SGLang from the body's `rid`.
    let id = if e.opts.profile.is_sglang() {
        parsed.as_ref().ok().and_then(|r| r.rid.clone())
    } else {
        headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    record_request(&e, &headers, &body, id.as_deref());
    let refuses = e.opts.profile.refuses_other_models();
    let req = match accepted(parsed, &e.opts.model, &e.opts.aliases, refuses) {
        Ok(r) => r,
        Err(refused) => return refused.answer(),
    };
    let f = wait_to_run(&e).await;
    if let Some(failed) = injected_failure(&f) {
        return failed;
    }
    // vLLM echoes the caller's id; without one it makes a random one.
    let id = id.unwrap_or_else(|| format!("{:016x}", e.rng_u64()));
    let waiting = Gauge::enter(&e.waiting);
    let Ok(permit) = e.slots.clone().acquire_owned().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    drop(waiting);
    let n_prompt = prompt_tokens(&req.prompt);
    let max_tokens = req.max_tokens.unwrap_or(16).clamp(1, 4096);
    if req.stream {
        let stream = async_stream(e.clone(), permit, (n_prompt, max_tokens), &f, id, api);
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    decode(&e, permit, n_prompt, max_tokens, &f).await;
    if f.garbage_body {
        return (StatusCode::OK, "<html>upstream error</html>").into_response();
    }
    axum::Json(api.answer(&id, &e.opts.model, n_prompt, max_tokens)).into_response()
}

/// Counts the request in `/fake/stats` and keeps what it carried, parsed or not.
fn record_request(e: &Engine, headers: &HeaderMap, body: &[u8], id: Option<&str>) {
    let mut s = e.stats.lock().unwrap_or_else(|p| p.into_inner());
    s.completions += 1;
    if id.is_some_and(|i| i.contains("_virtual")) {
        s.virtual_completions += 1;
    }
    s.last_request_id = id.map(str::to_owned);
    s.last_content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.last_body = serde_json::from_slice(body).ok();
}

/// Why vLLM refuses a completion request before running it.
#[derive(Debug)]
enum Refused {
    /// The body does not parse (400), with serde's message.
    BadBody(String),
    /// A model it does not serve (404), as named.
    UnknownModel(String),
}

impl Refused {
    /// vLLM's answer.
    fn answer(self) -> Response {
        match self {
            Refused::BadBody(message) => (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"object": "error", "message": message})),
            )
                .into_response(),
            Refused::UnknownModel(model) => (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"object": "error", "message": format!("The model `{model}` does not exist.")})),
            )
                .into_response(),
        }
    }
}

/// The request, or why vLLM refuses it: a missing or empty model is the served one; another
/// model is refused only where `refuses_others`.
fn accepted(
    parsed: Result<CompletionRequest, serde_json::Error>,
    model: &str,
    aliases: &[String],
    refuses_others: bool,
) -> Result<CompletionRequest, Refused> {
    let req = parsed.map_err(|err| Refused::BadBody(err.to_string()))?;
    if refuses_others
        && req
            .model
            .as_deref()
            .is_some_and(|m| !m.is_empty() && m != model && !aliases.iter().any(|a| a == m))
    {
        return Err(Refused::UnknownModel(req.model.unwrap_or_default()));
    }
    Ok(req)
}

/// Waits out what holds a request back (a pause, sleep mode, the injected latency) and
/// never returns under a hang; the faults in force then.
async fn wait_to_run(e: &Engine) -> Faults {
    if let Some(until) = e.paused() {
        tokio::time::sleep_until(until.into()).await;
    }
    // The scheduler sees a new request only between steps.
    e.after_step().await;
    while e.faults().asleep {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let f = e.faults();
    let delay = e.delay_before_run(&f);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if f.npu_busy_stuck {
        // Requests are running (scheduled) but produce nothing, with the NPU spinning.
        let _running = Gauge::enter(&e.running);
        e.freeze();
        std::future::pending::<()>().await;
    }
    if f.hang {
        // Accepted and never answered, nothing scheduled: the NPU stays idle.
        std::future::pending::<()>().await;
    }
    f
}

/// The error answer an injected failure gives instead of a completion, if any.
fn injected_failure(f: &Faults) -> Option<Response> {
    if f.http_5xx {
        return Some(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"object": "error", "message": "injected failure"})),
            )
                .into_response(),
        );
    }
    if f.engine_dead {
        return Some(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"error": {"message": "The server had an error while processing your request.", "type": "InternalServerError", "param": null, "code": 500}})),
            )
                .into_response(),
        );
    }
    None
}

/// Runs a plain (not streamed) request to its end: the first token after the TTFT, the
/// others one TPOT (plus jitter) apart, counted as they come out. The slot is freed before
/// the request leaves the running count.
async fn decode(
    e: &Engine,
    permit: tokio::sync::OwnedSemaphorePermit,
    n_prompt: u64,
    max_tokens: u64,
    f: &Faults,
) {
    let _running = Gauge::enter(&e.running);
    tokio::time::sleep(e.opts.ttft).await;
    // vLLM reports no partial prefill: the prompt counts when its first token comes out.
    e.prompt_tokens.fetch_add(n_prompt, Ordering::Relaxed);
    e.generation_tokens.fetch_add(1, Ordering::Relaxed);
    e.step(n_prompt + 1);
    for _ in 1..max_tokens {
        tokio::time::sleep(e.opts.tpot + e.jitter(f.jitter_ms)).await;
        e.next_token().await;
        e.generation_tokens.fetch_add(1, Ordering::Relaxed);
        e.step(1);
    }
    e.finished.fetch_add(1, Ordering::Relaxed);
    drop(permit);
}

/// A streamed request, its events shaped by `api`; `(n_prompt, max_tokens)` its size.
fn async_stream(
    e: Arc<Engine>,
    permit: tokio::sync::OwnedSemaphorePermit,
    (n_prompt, max_tokens): (u64, u64),
    f: &Faults,
    id: String,
    api: Api,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> + Send + 'static {
    let model = e.opts.model.clone();
    let (garbage, jitter_ms, error_after_first) = (f.garbage_body, f.jitter_ms, f.stream_error);
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
    tokio::spawn(async move {
        let _permit = permit;
        let _running = RunningOwned::enter(e.clone());
        tokio::time::sleep(e.opts.ttft).await;
        // vLLM reports no partial prefill: the prompt counts when its first token comes out.
        e.prompt_tokens.fetch_add(n_prompt, Ordering::Relaxed);
        for i in 0..max_tokens {
            if i > 0 {
                tokio::time::sleep(e.opts.tpot + e.jitter(jitter_ms)).await;
                e.next_token().await;
            }
            e.generation_tokens.fetch_add(1, Ordering::Relaxed);
            e.step(if i == 0 { n_prompt + 1 } else { 1 });
            if i == 1 && error_after_first {
                let err = e
                    .opts
                    .profile
                    .stream_error("injected failure after the first token");
                let _ = tx.send(format!("data: {err}\n\n")).await;
                let _ = tx.send("data: [DONE]\n\n".to_owned()).await;
                return;
            }
            let chunk = if garbage {
                "data: not json\n\n".to_owned()
            } else {
                format!("data: {}\n\n", api.event(&id, &model, i, max_tokens))
            };
            if tx.send(chunk).await.is_err() {
                return; // client gone: vLLM aborts the request
            }
        }
        e.finished.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send("data: [DONE]\n\n".to_owned()).await;
    });
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) },
    )
}

/// `running` gauge held by an owned engine handle.
pub(super) struct RunningOwned(Arc<Engine>);
impl RunningOwned {
    pub(super) fn enter(e: Arc<Engine>) -> RunningOwned {
        e.running.fetch_add(1, Ordering::AcqRel);
        RunningOwned(e)
    }
}
impl Drop for RunningOwned {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::{CompletionRequest, Refused, accepted};

    #[test]
    fn a_missing_empty_served_or_aliased_model_is_accepted_another_or_a_bad_body_refused() {
        let aliases = ["alias".to_owned()];
        let check = |body: &str| {
            let parsed = serde_json::from_str::<CompletionRequest>(body);
            accepted(parsed, "m", &aliases, true)
        };
        for ok in [
            r#"{"prompt":"x"}"#,
            r#"{"model":"","prompt":"x"}"#,
            r#"{"model":"m"}"#,
            r#"{"model":"alias"}"#,
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        assert!(matches!(
            check(r#"{"model":"other"}"#),
            Err(Refused::UnknownModel(m)) if m == "other"
        ));
        assert!(matches!(check("not json"), Err(Refused::BadBody(_))));
        let any = serde_json::from_str::<CompletionRequest>(r#"{"model":"other"}"#);
        assert!(accepted(any, "m", &aliases, false).is_ok(), "SGLang's");
    }
}
