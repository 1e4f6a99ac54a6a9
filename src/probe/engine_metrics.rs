//! The engine's `/metrics` mapped into one neutral set of figures ([`EngineMetrics`]) that the
//! QoS score, stall detection and the agent policy's "no sign of life" rule read, whatever
//! the engine's kind: each kind names its own series ([`MetricNames`], in its file of
//! `src/engines/`), and [`parse_as`] reads those names.
//!
//! Only the few series the agent uses are read. Counts (requests, tokens) are summed over
//! their label sets (one vLLM process exposes one `engine` label value per data-parallel
//! engine; SGLang splits its token counters by `is_streaming`); KV-cache usage is a ratio, so
//! the fullest engine's is taken. Where a series has several names, the first name present
//! wins (a release exposing both vLLM names is not counted twice), and [`Sources`] records
//! which one was read, so `/qos` and `/status/detail` name the series actually read. A
//! series that is absent stays unknown, and a value that is not a finite, non-negative
//! number makes the series unknown rather than wrong. `_created` lines (prometheus_client
//! exports one per counter) are other names and never read. The parser never panics on any
//! text (property test).

use crate::config::engine_type::EngineType;
use crate::engines::{self, MetricNames};
use serde::Serialize;

/// The process start time prometheus_client's process collector exports (vLLM's API server,
/// SGLang's): every kind's.
const PROCESS_START: &str = "process_start_time_seconds";

/// One scrape of the engine's metrics; `None` is unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    /// Requests in the running batch.
    pub running: Option<f64>,
    /// Requests waiting to be scheduled.
    pub waiting: Option<f64>,
    /// Requests waiting because KV-cache capacity is short (`reason="capacity"`).
    pub waiting_for_capacity: Option<f64>,
    /// Prefill tokens processed since start.
    pub prompt_tokens: Option<f64>,
    /// Generated tokens since start.
    pub generation_tokens: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_cache_usage: Option<f64>,
    /// The engine is asleep (`vllm:engine_sleep_state` at 1 for a state other than
    /// `awake`, on any engine); `None` when the series is not exported (before vLLM 0.18).
    pub asleep: Option<bool>,
    /// When the engine's process started (`process_start_time_seconds`, Unix seconds, which
    /// prometheus_client exports by default and vLLM keeps): tells one engine process from
    /// the next on the same address.
    pub process_start_time: Option<f64>,
    /// The metric name each figure was read from (`None`: no sample of any of its names).
    pub sources: Sources,
}

/// The metric name each [`EngineMetrics`] figure was read from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sources {
    pub running: Option<&'static str>,
    pub waiting: Option<&'static str>,
    pub waiting_for_capacity: Option<&'static str>,
    pub prompt_tokens: Option<&'static str>,
    pub generation_tokens: Option<&'static str>,
    pub kv_cache_usage: Option<&'static str>,
}

/// Samples of one metric name: their sum and their maximum.
#[derive(Default, Clone, Copy)]
struct Agg {
    total: f64,
    max: f64,
    seen: bool,
    bad: bool,
}

impl Agg {
    fn add(&mut self, v: f64) {
        if v.is_finite() && v >= 0.0 {
            self.total += v;
            self.max = self.max.max(v);
            self.seen = true;
        } else {
            self.bad = true;
        }
    }
    fn present(&self) -> bool {
        self.seen || self.bad
    }
}

/// The series the agent reads, in [`EngineMetrics`] order: the capacity one is index 2.
const SERIES: usize = 6;
const CAPACITY: usize = 2;

/// Each series' names over `kinds`, in their order (one kind's names, current first, then
/// the next kind's).
fn names_of(kinds: &[&'static MetricNames]) -> [Vec<&'static str>; SERIES] {
    let mut out: [Vec<&'static str>; SERIES] = Default::default();
    for k in kinds {
        out[0].extend(k.running);
        out[1].extend(k.waiting);
        out[CAPACITY].extend(k.waiting_for_capacity.iter().map(|l| l.name));
        out[3].extend(k.prompt_tokens);
        out[4].extend(k.generation_tokens);
        out[5].extend(k.kv_cache_usage);
    }
    out
}

/// Byte offset of the `}` closing a label set that starts after `{`, skipping quoted
/// values (which may hold `}`, `,` and escaped quotes).
fn label_set_end(s: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The metric name of a sample line and the rest of it. `None` for comments and blanks.
fn sample_name(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    Some((&line[..name_end], &line[name_end..]))
}

/// Splits what follows the name into (labels, value text).
fn labels_and_value(rest: &str) -> Option<(&str, &str)> {
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(body) => {
            let close = label_set_end(body)?;
            (&body[..close], &body[close + 1..])
        }
        None => ("", rest),
    };
    let value = rest.split_whitespace().next()?;
    Some((labels, value))
}

/// The value of label `key` (quoted, escapes kept as written; the agent compares it only
/// with plain words such as `capacity`).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ', '\t']);
        let eq = rest.find('=')?;
        let k = rest[..eq].trim();
        let after = rest[eq + 1..].trim_start();
        let body = after.strip_prefix('"')?;
        // End of the quoted value: the first unescaped quote.
        let (mut escaped, mut end) = (false, None);
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        if k == key {
            return Some(&body[..end]);
        }
        rest = &body[end + 1..];
    }
}

/// Parses Prometheus text exposition with the names of every kind, in the list's order
/// (vLLM's, then SGLang's): for a text whose kind is not known (the chaos runner, tests).
pub fn parse(text: &str) -> EngineMetrics {
    use strum::IntoEnumIterator;
    let kinds: Vec<&'static MetricNames> = EngineType::iter()
        .map(|t| engines::of(t).metric_names())
        .collect();
    parse_as(text, &kinds)
}

/// Parses Prometheus text exposition into the series the agent reads, under the names of
/// `kinds` (the engine's own kind, in the agent).
pub(crate) fn parse_as(text: &str, kinds: &[&'static MetricNames]) -> EngineMetrics {
    let names = names_of(kinds);
    let mut aggs: [Vec<Agg>; SERIES] = names.clone().map(|n| vec![Agg::default(); n.len()]);
    let mut asleep = None;
    let mut process_start_time = None;
    for line in text.lines() {
        let Some((name, rest)) = sample_name(line) else {
            continue;
        };
        if name == PROCESS_START {
            process_start_time = labels_and_value(rest)
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0);
            continue;
        }
        // Most lines are other series: decided on the name alone.
        if !kinds.iter().any(|k| name.starts_with(k.prefix)) {
            continue;
        }
        if let Some(sleep) = kinds
            .iter()
            .filter_map(|k| k.asleep.as_ref())
            .find(|s| s.name == name)
        {
            if let Some((labels, value)) = labels_and_value(rest) {
                let on = value.parse::<f64>().is_ok_and(|v| v > 0.0);
                let other = label(labels, sleep.label).is_some_and(|s| s != sleep.value);
                asleep = Some(asleep.unwrap_or(false) || (on && other));
            }
            continue;
        }
        let Some((series, alias)) = names
            .iter()
            .enumerate()
            .find_map(|(i, ns)| ns.iter().position(|n| *n == name).map(|a| (i, a)))
        else {
            continue;
        };
        let Some((labels, value)) = labels_and_value(rest) else {
            continue;
        };
        if series == CAPACITY {
            let only = kinds
                .iter()
                .filter_map(|k| k.waiting_for_capacity.as_ref())
                .find(|l| l.name == name);
            if only.is_some_and(|l| label(labels, l.label) != Some(l.value)) {
                continue;
            }
        }
        let agg = &mut aggs[series][alias];
        match value.parse::<f64>() {
            Ok(v) => agg.add(v),
            Err(_) => agg.bad = true,
        }
    }
    // The first name present wins; a bad sample makes the series unknown (its name is
    // still the one read).
    let first = |series: usize| -> Option<(Agg, &'static str)> {
        aggs[series]
            .iter()
            .zip(&names[series])
            .find(|(a, _)| a.present())
            .map(|(a, n)| (*a, *n))
    };
    let good = |series: usize| first(series).map(|(a, _)| a).filter(|a| !a.bad);
    let sum = |series: usize| good(series).map(|a| a.total);
    let name = |series: usize| first(series).map(|(_, n)| n);
    EngineMetrics {
        running: sum(0),
        waiting: sum(1),
        waiting_for_capacity: sum(CAPACITY),
        prompt_tokens: sum(3),
        generation_tokens: sum(4),
        kv_cache_usage: good(5).map(|a| a.max.min(1.0)),
        asleep,
        process_start_time,
        sources: Sources {
            running: name(0),
            waiting: name(1),
            waiting_for_capacity: name(CAPACITY),
            prompt_tokens: name(3),
            generation_tokens: name(4),
            kv_cache_usage: name(5),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VLLM: &str = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen",reason="capacity"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen",reason="deferred"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.95
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 12345.0
vllm:generation_tokens_total{engine="0",model_name="qwen"} 678.0
vllm:request_success_total{finished_reason="stop"} 9.0
"#;

    #[test]
    fn reads_the_process_start_time_of_real_vllm() {
        let text = include_str!("../../tests/fixtures/vllm-0.32.0-metrics.txt");
        assert_eq!(parse(text).process_start_time, Some(1.79611296615e9));
        assert_eq!(parse(VLLM).process_start_time, None);
        let bad = parse("process_start_time_seconds NaN\n");
        assert_eq!(bad.process_start_time, None);
    }

    #[test]
    fn reads_the_vllm_series_and_sums_engines() {
        let m = parse(VLLM);
        assert_eq!(m.running, Some(5.0));
        assert_eq!(m.waiting, Some(4.0));
        assert_eq!(m.waiting_for_capacity, Some(1.0));
        assert_eq!(m.kv_cache_usage, Some(0.95));
        assert_eq!(m.prompt_tokens, Some(12345.0));
        assert_eq!(m.generation_tokens, Some(678.0));
    }

    // KV-cache usage is a ratio: two data-parallel engines at 60 % are 60 %, not 120 %; a
    // release exposing the old name next to the new one is read once.
    #[test]
    fn kv_cache_is_the_fullest_engine_and_names_are_not_doubled() {
        let m = parse(concat!(
            "vllm:kv_cache_usage_perc{engine=\"0\"} 0.6\n",
            "vllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n",
            "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.6\n",
            "vllm:prompt_tokens_total{engine=\"0\"} 10\n",
            "vllm:prompt_tokens_total{engine=\"1\"} 5\n",
            "vllm:prompt_tokens{engine=\"0\"} 10\n",
        ));
        assert_eq!(m.kv_cache_usage, Some(0.7));
        assert_eq!(
            m.prompt_tokens,
            Some(15.0),
            "summed over engines, old name ignored"
        );
    }

    #[test]
    fn sleep_state_is_read_from_the_gauge() {
        let state = |awake: u8, offloaded: u8| {
            format!(
                "vllm:engine_sleep_state{{engine=\"0\",sleep_state=\"awake\"}} {awake}.0\n\
                 vllm:engine_sleep_state{{engine=\"0\",sleep_state=\"weights_offloaded\"}} {offloaded}.0\n\
                 vllm:engine_sleep_state{{engine=\"0\",sleep_state=\"discard_all\"}} 0.0\n"
            )
        };
        assert_eq!(parse(&state(1, 0)).asleep, Some(false));
        assert_eq!(parse(&state(0, 1)).asleep, Some(true));
        assert_eq!(parse(VLLM).asleep, None, "not exported: unknown");
    }

    #[test]
    fn older_names_and_missing_series() {
        let m = parse("vllm:gpu_cache_usage_perc 0.5\nvllm:prompt_tokens 10\n");
        assert_eq!(m.kv_cache_usage, Some(0.5));
        assert_eq!(m.prompt_tokens, Some(10.0));
        assert_eq!(m.running, None);
        assert_eq!(m.waiting_for_capacity, None, "absent, not 0");
    }

    #[test]
    fn bad_values_make_the_series_unknown() {
        for v in ["NaN", "-1", "+Inf", "abc"] {
            let m = parse(&format!("vllm:num_requests_running{{a=\"b\"}} {v}\n"));
            assert_eq!(m.running, None, "{v}");
            assert_eq!(
                m.sources.running,
                Some("vllm:num_requests_running"),
                "present but unreadable: {v}"
            );
        }
        assert_eq!(parse("garbage {{{ \n}}} 1\n"), EngineMetrics::default());
    }

    // A text whose kind is unknown is read with every kind's names, in the list's order.
    #[test]
    fn parse_reads_every_kinds_names() {
        let m = parse("sglang:num_running_reqs{tp_rank=\"0\"} 3\nsglang:token_usage 0.5\n");
        assert_eq!(m.running, Some(3.0));
        assert_eq!(m.sources.kv_cache_usage, Some("sglang:token_usage"));
        let both = parse("sglang:num_running_reqs 3\nvllm:num_requests_running 2\n");
        assert_eq!(
            both.running,
            Some(2.0),
            "vLLM's name comes first in the list"
        );
    }

    // What vLLM 0.32 exports beside the counters: `_created` lines, which must not be read
    // as the counter; the sources name what was read, per release.
    #[test]
    fn created_lines_are_not_counters_and_sources_name_the_series_read() {
        let m = parse(concat!(
            "vllm:prompt_tokens_total{engine=\"0\",model_name=\"tiny\"} 42.0\n",
            "vllm:prompt_tokens_created{engine=\"0\",model_name=\"tiny\"} 1.7330000000e+09\n",
            "vllm:generation_tokens_created{engine=\"0\",model_name=\"tiny\"} 1.7330000000e+09\n",
            "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.25\n",
        ));
        assert_eq!(m.prompt_tokens, Some(42.0));
        assert_eq!(m.generation_tokens, None, "only its _created line: absent");
        assert_eq!(m.sources.prompt_tokens, Some("vllm:prompt_tokens_total"));
        assert_eq!(m.sources.generation_tokens, None);
        assert_eq!(m.sources.kv_cache_usage, Some("vllm:gpu_cache_usage_perc"));
        let both = parse(VLLM);
        assert_eq!(
            both.sources.kv_cache_usage,
            Some("vllm:kv_cache_usage_perc")
        );
        assert_eq!(
            both.sources.waiting_for_capacity,
            Some("vllm:num_requests_waiting_by_reason")
        );
    }

    // Label values may hold commas, braces and escaped quotes (model names do).
    #[test]
    fn quoted_label_values() {
        let m = parse(concat!(
            "vllm:num_requests_waiting_by_reason{model_name=\"a,reason=\\\"capacity\\\"}\",reason=\"deferred\"} 7\n",
            "vllm:num_requests_waiting_by_reason{model_name=\"x}y\",reason=\"capacity\"} 2\n",
            "vllm:num_requests_running{model_name=\"q{1}\"} 3 1700000000000\n",
        ));
        assert_eq!(m.waiting_for_capacity, Some(2.0));
        assert_eq!(
            m.running,
            Some(3.0),
            "a timestamp after the value is ignored"
        );
        assert_eq!(label(r#"a="1", b="2""#, "b"), Some("2"));
        assert_eq!(label(r#"a="1"#, "a"), None, "unterminated");
        assert_eq!(label("a=1", "a"), None, "unquoted");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC*") {
            let _ = parse(&s);
        }

        #[test]
        fn parse_never_panics_on_metric_like_lines(lines in proptest::collection::vec("(vllm|sglang):[a-z_]{0,30}(\\{[a-z=\",]{0,30}\\}?)? ?[-0-9.eE+a-zA-Z]{0,12}", 0..20)) {
            let _ = parse(&lines.join("\n"));
        }
    }
}
