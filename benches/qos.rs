//! What QoS adds to each probe cycle: scraping the engine's `/metrics`, parsing it, and
//! scoring. Measured as CPU time of the agent-side thread (`CLOCK_THREAD_CPUTIME_ID`), not
//! wall time:
//!
//!     cargo bench --bench qos
//!
//! The engine side is an axum server on loopback (its own thread and runtime, not counted)
//! serving a vLLM-shaped `/metrics` body: the series vLLM exports for one model (gauges,
//! counters, the latency and token histograms) plus the Python process and HTTP
//! instrumentator series it carries, ~100 KB. The agent side runs the production code on a
//! current-thread runtime, so every CPU cycle it spends (HTTP client, parse, scoring) lands
//! on the measured thread. Prints a Markdown report (copied into BENCHMARKS.md).

use npu_health_agent::probe::http::EngineClient;
use npu_health_agent::probe::outcome::Probed;
use npu_health_agent::probe::{MetricsSource, engine_metrics};
use npu_health_agent::qos::{QosConfig, QosState};
use npu_health_wire::{Accounting, ProbeRecord};
use std::time::{Duration, Instant};

const SCRAPES: u32 = 2000;
const PARSES: u32 = 2000;
const EVALUATIONS: u32 = 200_000;

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A vLLM-shaped exposition for one model.
fn vllm_body() -> String {
    use std::fmt::Write;
    let l = r#"engine="0",model_name="Qwen/Qwen2.5-72B-Instruct""#;
    let mut s = String::new();
    let gauge = |s: &mut String, name: &str, v: f64| {
        let _ = writeln!(
            s,
            "# HELP {name} gauge\n# TYPE {name} gauge\n{name}{{{l}}} {v}"
        );
    };
    gauge(&mut s, "vllm:num_requests_running", 12.0);
    gauge(&mut s, "vllm:num_requests_waiting", 3.0);
    gauge(&mut s, "vllm:kv_cache_usage_perc", 0.83);
    let _ = writeln!(
        s,
        "# TYPE vllm:num_requests_waiting_by_reason gauge\nvllm:num_requests_waiting_by_reason{{{l},reason=\"capacity\"}} 2.0\nvllm:num_requests_waiting_by_reason{{{l},reason=\"deferred\"}} 1.0"
    );
    for (name, v) in [
        ("vllm:prompt_tokens_total", 98_765_432.0),
        ("vllm:generation_tokens_total", 12_345_678.0),
        ("vllm:num_preemptions_total", 17.0),
        ("vllm:prefix_cache_queries_total", 55_555_555.0),
        ("vllm:prefix_cache_hits_total", 22_222_222.0),
    ] {
        let _ = writeln!(
            s,
            "# HELP {name} counter\n# TYPE {name} counter\n{name}{{{l}}} {v}"
        );
    }
    for reason in ["stop", "length", "abort"] {
        let _ = writeln!(
            s,
            "vllm:request_success_total{{{l},finished_reason=\"{reason}\"}} 1234.0"
        );
    }
    let latency_buckets: Vec<f64> = vec![
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
    let token_buckets: Vec<f64> = vec![
        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
        20000.0, 50000.0, 100000.0,
    ];
    let hist = |s: &mut String, name: &str, buckets: &[f64]| {
        let _ = writeln!(s, "# HELP {name} histogram\n# TYPE {name} histogram");
        for (i, b) in buckets.iter().enumerate() {
            let _ = writeln!(s, "{name}_bucket{{{l},le=\"{b}\"}} {}", 100 * (i + 1));
        }
        let n = 100 * (buckets.len() + 1);
        let _ = writeln!(
            s,
            "{name}_bucket{{{l},le=\"+Inf\"}} {n}\n{name}_count{{{l}}} {n}\n{name}_sum{{{l}}} 12345.678"
        );
    };
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ] {
        hist(&mut s, name, &latency_buckets);
    }
    for name in [
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
        "vllm:iteration_tokens_total",
    ] {
        hist(&mut s, name, &token_buckets);
    }
    // Python runtime and the HTTP instrumentator.
    for g in 0..3 {
        let _ = writeln!(
            s,
            "python_gc_objects_collected_total{{generation=\"{g}\"}} 12345.0\npython_gc_collections_total{{generation=\"{g}\"}} 678.0"
        );
    }
    for p in [
        "process_virtual_memory_bytes 1.2e+11",
        "process_resident_memory_bytes 8.5e+09",
        "process_start_time_seconds 1.7e+09",
        "process_cpu_seconds_total 123456.7",
        "process_open_fds 321.0",
        "process_max_fds 1.048576e+06",
    ] {
        let _ = writeln!(s, "{p}");
    }
    for handler in [
        "/v1/completions",
        "/v1/chat/completions",
        "/health",
        "/metrics",
        "/v1/models",
    ] {
        for status in ["2xx", "4xx", "5xx"] {
            let _ = writeln!(
                s,
                "http_requests_total{{handler=\"{handler}\",method=\"POST\",status=\"{status}\"}} 999.0"
            );
        }
        for b in &latency_buckets {
            let _ = writeln!(
                s,
                "http_request_duration_highr_seconds_bucket{{le=\"{b}\"}} 1.0\nhttp_request_duration_seconds_bucket{{handler=\"{handler}\",le=\"{b}\",method=\"POST\"}} 1.0\nhttp_request_size_bytes_bucket{{handler=\"{handler}\",le=\"{b}\"}} 1.0\nhttp_response_size_bytes_bucket{{handler=\"{handler}\",le=\"{b}\"}} 1.0"
            );
        }
    }
    s
}

fn serve(body: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let b = body.clone();
                    async move { b }
                }),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body = vllm_body();
    let lines = body.lines().count();
    let port = serve(body.clone());
    let text = format!(
        "[[engine]]\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = {port}\nmgmt_port = 9001\n"
    );
    let spec = npu_health_agent::config::file::parse(&text, std::path::Path::new("bench.toml"))
        .unwrap()
        .engines
        .remove(0);
    let client = EngineClient::new(&spec).unwrap();
    let metrics = client.metrics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // Parse alone.
    let m = engine_metrics::parse(&body);
    assert_eq!(m.running, Some(12.0));
    assert_eq!(m.waiting_for_capacity, Some(2.0));
    let c0 = thread_cpu();
    for _ in 0..PARSES {
        std::hint::black_box(engine_metrics::parse(std::hint::black_box(&body)));
    }
    let parse_us = (thread_cpu() - c0).as_secs_f64() * 1e6 / f64::from(PARSES);

    // Scrape over loopback HTTP (keep-alive, as in production), parse included.
    let (scrape_us, scrape_wall_us) = rt.block_on(async {
        for _ in 0..100 {
            metrics.scrape(Duration::from_secs(5)).await.unwrap();
        }
        let (c0, w0) = (thread_cpu(), Instant::now());
        for _ in 0..SCRAPES {
            let m = metrics.scrape(Duration::from_secs(5)).await.unwrap();
            std::hint::black_box(m);
        }
        (
            (thread_cpu() - c0).as_secs_f64() * 1e6 / f64::from(SCRAPES),
            w0.elapsed().as_secs_f64() * 1e6 / f64::from(SCRAPES),
        )
    });

    // Recording a scrape and evaluating the score.
    let (record_us, eval_us) = rt.block_on(async {
        let cfg = QosConfig::default();
        let q = QosState::new(&cfg);
        let probe = Probed {
            at: tokio::time::Instant::now(),
            record: ProbeRecord {
                at_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64,
                warmup: false,
                latency_ms: 180.0,
                outcome: "success".into(),
                success: true,
                ttft_ms: Some(180.0),
                tpot_ms: None,
                peak: Some(70.0),
                accounting: Accounting::Reset,
                failure_count: 0,
            },
        };
        let c0 = thread_cpu();
        for i in 0..EVALUATIONS {
            let mut m = m;
            m.generation_tokens = Some(f64::from(i));
            q.record_scrape(Ok(m));
        }
        let record = (thread_cpu() - c0).as_secs_f64() * 1e6 / f64::from(EVALUATIONS);
        let c0 = thread_cpu();
        for _ in 0..EVALUATIONS {
            std::hint::black_box(q.evaluate(&cfg, Some(&probe), None));
        }
        let eval = (thread_cpu() - c0).as_secs_f64() * 1e6 / f64::from(EVALUATIONS);
        (record, eval)
    });

    let per_cycle = scrape_us + record_us + eval_us;
    let period = QosConfig::default().metrics_period.as_secs_f64();
    println!("## QoS cost per probe cycle (`cargo bench --bench qos`)\n");
    println!(
        "Machine: {} cores. Engine `/metrics` body: {} KB, {lines} lines (vLLM-shaped, one model). CPU time of the agent-side thread (`CLOCK_THREAD_CPUTIME_ID`).\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        body.len() / 1024
    );
    println!("| Step | CPU µs | Runs |");
    println!("|---|---:|---:|");
    println!("| parse the body | {parse_us:.1} | {PARSES} |");
    println!(
        "| scrape over loopback HTTP, keep-alive, parse included | {scrape_us:.1} (wall {scrape_wall_us:.1}) | {SCRAPES} |"
    );
    println!("| record the scrape (progress tracking) | {record_us:.2} | {EVALUATIONS} |");
    println!("| evaluate score and level | {eval_us:.2} | {EVALUATIONS} |");
    println!(
        "| **added per probe cycle** (1 scrape + 1 record + 1 evaluation) | **{per_cycle:.1}** | |"
    );
    println!(
        "\nAt the default periods (scrape and evaluation every {period} s) that is {:.4} % of one core.",
        per_cycle / (period * 1e6) * 100.0
    );
}
