//! `GET /metrics`: the Prometheus series the profile exports (vLLM's names and types per
//! version), with the faults' effect on them.

use super::{Engine, Faults};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub(super) async fn metrics(State(e): State<Arc<Engine>>) -> Response {
    exposition(&e, metrics_text)
}

/// `/metrics` with the text `text` writes for `e` (a profile of its own passes its writer),
/// or vLLM's 404 for a profile that serves none.
pub(super) fn exposition(e: &Engine, text: fn(&Engine) -> String) -> Response {
    if !e.opts.profile.serves_metrics() {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"detail": "Not Found"})),
        )
            .into_response();
    }
    let text = text(e);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub(super) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `/metrics` as the profile's vLLM writes it: the series the agent reads, with that
/// release's names, HELP texts, labels (`engine` per data-parallel engine, `model_name`) and
/// the `_created` line of every counter. The queue, the tokens and the KV cache live on
/// engine 0; the other engines read 0.
pub(super) fn metrics_text(e: &Engine) -> String {
    let mut w = Writer {
        out: String::new(),
        engines: e.opts.data_parallel.max(1),
        model: &e.opts.model,
    };
    // prometheus_client's process collector, first as it writes it (vLLM 0.32's fixture).
    let started = *e.process_start.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(
        w.out,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started:?}"
    );
    write_gauges(&mut w, e);
    write_counters(&mut w, e);
    write_iterations(&mut w, e);
    w.out
}

/// The upper bounds of `vllm:iteration_tokens_total`'s buckets: vLLM 0.32's default for the
/// `iteration_tokens` family (`vllm/v1/metrics/buckets.py`, as its `/metrics` fixture shows).
const ITERATION_BUCKETS: [u64; 13] = [
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
];

/// `vllm:iteration_tokens_total`, vLLM's histogram of tokens per engine step
/// (`vllm/v1/metrics/loggers.py`: one observation per step, of the prompt tokens computed
/// plus the tokens generated in it). The fake has no shared batch loop: it counts one step
/// per token it emits (a first token's step carries its prompt too), so `_count` runs ahead
/// of a real engine's by the batch size; what a reader of `_count` relies on holds: it moves
/// while the engine produces tokens and stops when no step runs.
#[derive(Debug, Default)]
pub(super) struct Iterations {
    /// Observations at or below each of [`ITERATION_BUCKETS`].
    buckets: [u64; ITERATION_BUCKETS.len()],
    count: u64,
    sum: u64,
}

impl Iterations {
    /// One engine step that computed `tokens` tokens.
    pub(super) fn observe(&mut self, tokens: u64) {
        self.count += 1;
        self.sum += tokens;
        for (b, le) in self.buckets.iter_mut().zip(ITERATION_BUCKETS) {
            if tokens <= le {
                *b += 1;
            }
        }
    }
}

/// `vllm:iteration_tokens_total` as prometheus_client writes a histogram: the buckets, the
/// count, the sum, then the `_created` gauge; engine 0 carries the steps.
fn write_iterations(w: &mut Writer, e: &Engine) {
    let it = e.iterations.lock().unwrap_or_else(|p| p.into_inner());
    let name = "vllm:iteration_tokens_total";
    let help = "Histogram of number of tokens per engine_step.";
    let _ = writeln!(w.out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for i in 0..w.engines {
        let at = |v: u64| if i == 0 { v as f64 } else { 0.0 };
        for (le, n) in ITERATION_BUCKETS.iter().zip(it.buckets) {
            let labels = series_labels(i, w.model, &format!("le=\"{:?}\"", *le as f64));
            let _ = writeln!(w.out, "{name}_bucket{{{labels}}} {:?}", at(n));
        }
        let labels = series_labels(i, w.model, "le=\"+Inf\"");
        let _ = writeln!(w.out, "{name}_bucket{{{labels}}} {:?}", at(it.count));
        let labels = series_labels(i, w.model, "");
        let _ = writeln!(w.out, "{name}_count{{{labels}}} {:?}", at(it.count));
        let _ = writeln!(w.out, "{name}_sum{{{labels}}} {:?}", at(it.sum));
    }
    drop(it);
    let created = e.created;
    w.series(&format!("{name}_created"), "gauge", help, &[("", created)]);
}

/// The text being written, and what every series' labels need.
struct Writer<'a> {
    out: String,
    /// Data-parallel engines: one series each.
    engines: u32,
    model: &'a str,
}

impl Writer<'_> {
    /// One series for every engine: `value` on engine 0, 0 elsewhere (a `_created` timestamp
    /// on all). `extra` is one `key="value"` label.
    fn series(&mut self, name: &str, kind: &str, help: &str, rows: &[(&str, f64)]) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let everywhere = name.ends_with("_created");
        for i in 0..self.engines {
            for (extra, v) in rows {
                let v = if i == 0 || everywhere { *v } else { 0.0 };
                let labels = series_labels(i, self.model, extra);
                let _ = writeln!(self.out, "{name}{{{labels}}} {v:?}");
            }
        }
    }
}

/// The labels of engine `i`'s series: `extra` placed in name order among `engine` and
/// `model_name`, as prometheus_client writes vLLM's labels.
fn series_labels(i: u32, model: &str, extra: &str) -> String {
    match extra {
        "" => format!("engine=\"{i}\",model_name=\"{model}\""),
        x if x < "model_name" => format!("engine=\"{i}\",{x},model_name=\"{model}\""),
        x => format!("engine=\"{i}\",model_name=\"{model}\",{x}"),
    }
}

/// The KV-cache usage shown: the forced figure, else the share of the running slots taken,
/// plus the injected pressure, within 0..1.
pub(super) fn kv_cache_usage(f: &Faults, running: f64, max_running: usize) -> f64 {
    (f.kv_cache_usage
        .unwrap_or_else(|| running / max_running.max(1) as f64)
        + f.kv_cache_pressure)
        .clamp(0.0, 1.0)
}

/// The scheduler's gauges the profile exports: the queue, the sleep state, the KV cache.
fn write_gauges(w: &mut Writer, e: &Engine) {
    let f = e.faults();
    let p = e.opts.profile;
    let s = e.scheduler(&f);
    let (running, waiting, kv) = (s.running, s.waiting, s.kv);
    w.series(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &[("", running)],
    );
    w.series(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &[("", waiting)],
    );
    if p.waiting_by_reason() {
        w.series(
            "vllm:num_requests_waiting_by_reason",
            "gauge",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            &[
                ("reason=\"capacity\"", waiting),
                ("reason=\"deferred\"", 0.0),
            ],
        );
    }
    if p.sleep_state() {
        let asleep = f.asleep;
        w.series(
            "vllm:engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            &[
                ("sleep_state=\"awake\"", f64::from(u8::from(!asleep))),
                (
                    "sleep_state=\"weights_offloaded\"",
                    f64::from(u8::from(asleep)),
                ),
                ("sleep_state=\"discard_all\"", 0.0),
            ],
        );
    }
    for name in p.kv_cache_names() {
        let help = if *name == "vllm:gpu_cache_usage_perc" {
            "GPU KV-cache usage. 1 means 100 percent usage."
        } else {
            "KV-cache usage. 1 means 100 percent usage."
        };
        w.series(name, "gauge", help, &[("", kv)]);
    }
}

/// The token and request counters, each with its `_created` gauge.
fn write_counters(w: &mut Writer, e: &Engine) {
    let created = e.created;
    let prompt = e.prompt_tokens.load(Ordering::Relaxed) as f64;
    let generation = e.generation_tokens.load(Ordering::Relaxed) as f64;
    let finished = e.finished.load(Ordering::Relaxed) as f64;
    let success: Vec<(&str, f64)> = [
        ("finished_reason=\"stop\"", 0.0),
        ("finished_reason=\"length\"", finished),
        ("finished_reason=\"abort\"", 0.0),
        ("finished_reason=\"error\"", 0.0),
        ("finished_reason=\"repetition\"", 0.0),
    ]
    .to_vec();
    for (base, help, rows) in [
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            vec![("", prompt)],
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            vec![("", generation)],
        ),
        (
            "vllm:request_success",
            "Count of successfully processed requests.",
            success,
        ),
    ] {
        w.series(&format!("{base}_total"), "counter", help, &rows);
        let created_rows: Vec<(&str, f64)> = rows.iter().map(|(l, _)| (*l, created)).collect();
        w.series(&format!("{base}_created"), "gauge", help, &created_rows);
    }
}
