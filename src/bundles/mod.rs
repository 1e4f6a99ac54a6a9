//! Evidence kept at every verdict: when an engine's verdict turns `abnormal`, one bounded
//! bundle of what the agent saw is written to `[agent] evidence_dir`, in a task of its own,
//! after the verdict is in force, so `/status` never waits on a disk or on py-spy.
//!
//! A bundle is a directory, `<unix ms>-<engine>-<trigger>`, one plain file per part, so an
//! operator reads it with `cat` and a part that failed says why in its own file:
//! `summary.json` (the verdict: status, cause, rule id, reason; when), `detail.json` (what
//! `/status/detail` said then: the last probes and their timings, `/health`, the NPUs' DCMI
//! health and fault codes), `metrics.txt` (the engine's `/metrics`, scraped once,
//! time-boxed), `processes.txt` (its process tree from `/proc`: state, `wchan`, CPU ticks),
//! `py-spy.txt` (each Python process's stack, when py-spy is on `PATH`), `npu-smi.txt`
//! (`npu-smi info`) and `journal.json` (the journal's tail). The caps and the floor are
//! [`store`]'s; the parts are [`collect`]'s.
//!
//! One entry point, [`request`], for every trigger: the verdict's turn to `abnormal`
//! ([`run`] polls it as the observer does) and, later, a rule in `observe` mode.

pub(crate) mod collect;
pub(crate) mod store;

use crate::clock::unix_ms;
use crate::config::AgentSettings;
use crate::config::evidence::EvidenceSettings;
use crate::monitor::Monitor;
use crate::monitor::verdict::Status;
use crate::probe::http::EngineClient;
use crate::proc_sockets::ProcRoot;
use crate::sampler::Shared;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::{Caps, StoreError};
use tokio_util::sync::CancellationToken;

/// Time between two looks at the verdict (the observer's period): a bundle starts within this
/// of the turn to `abnormal`.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);
/// How long the one scrape of the engine's `/metrics` may take.
pub(crate) const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);

/// What asked for a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The verdict turned `abnormal`.
    Abnormal,
    /// A rule in `observe` mode (or the shadow policy) would have turned the verdict
    /// `abnormal`: its docs/policy.md number, 0 for the reference's own.
    Observe(u8),
}

impl Trigger {
    /// The word in the bundle's name and summary.
    pub(crate) fn word(self) -> String {
        match self {
            Trigger::Abnormal => "abnormal".to_owned(),
            Trigger::Observe(0) => "observe-reference".to_owned(),
            Trigger::Observe(rule) => format!("observe-rule{rule}"),
        }
    }
}

/// The agent's one bundle writer: where, the caps, and what it needs besides the engine.
#[derive(Debug)]
pub(crate) struct Writer {
    dir: PathBuf,
    caps: Caps,
    npu_smi: PathBuf,
    shared: Arc<Shared>,
    warned: Warned,
}

impl Writer {
    /// The writer of `agent`'s `evidence_dir`; `None` when none is set (no bundle is written).
    pub(crate) fn of(agent: &AgentSettings, shared: &Arc<Shared>) -> Option<Arc<Writer>> {
        let EvidenceSettings {
            dir,
            max_bytes,
            max_count,
            min_free,
        } = &agent.evidence;
        Some(Arc::new(Writer {
            dir: dir.clone()?,
            caps: Caps {
                max_bytes: *max_bytes,
                max_count: *max_count,
                min_free: *min_free,
            },
            npu_smi: agent.npu_smi.clone(),
            shared: shared.clone(),
            warned: Warned::default(),
        }))
    }
}

/// The kind of the last problem warned about: each is warned once, until a bundle is written
/// again (the directory's state does not change between two verdicts, and every engine
/// shares it); the verdict is unaffected.
#[derive(Debug, Default)]
pub(crate) struct Warned(Mutex<Option<&'static str>>);

impl Warned {
    /// Warns of `e` unless its kind was the last warned of; whether it warned.
    pub(crate) fn warn_once(&self, e: &StoreError) -> bool {
        let mut warned = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let new = *warned != Some(e.kind());
        if new {
            tracing::warn!("no evidence bundle is written: {e} (the verdicts are unaffected)");
            *warned = Some(e.kind());
        }
        new
    }

    /// A bundle was written: the next problem is warned of again.
    pub(crate) fn clear(&self, dir: &std::path::Path) {
        let mut warned = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if warned.take().is_some() {
            tracing::info!(dir = %dir.display(), "evidence bundles are written again");
        }
    }
}

/// Starts writing one bundle of `m`'s evidence for `trigger`, in a task of its own.
pub(crate) fn request(
    m: &Arc<Monitor>,
    client: &EngineClient,
    w: &Arc<Writer>,
    trigger: Trigger,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(write(m.clone(), client.clone(), w.clone(), trigger))
}

/// Gathers and writes one bundle, and notes the outcome in the monitor, the log and so the
/// metrics.
async fn write(m: Arc<Monitor>, client: EngineClient, w: Arc<Writer>, trigger: Trigger) {
    let began = Instant::now();
    let at = unix_ms();
    let verdict = m.verdict();
    let spec = m.spec();
    let detail = m.snapshot(&w.shared, spec.timing.window, None);
    let scrape = Instant::now();
    let metrics = match client.metrics_text(SCRAPE_DEADLINE).await {
        Ok(text) => text,
        Err(why) => format!("# {why}\n"),
    };
    let summary = serde_json::json!({
        "engine": spec.name,
        "trigger": trigger.word(),
        "status": verdict.status,
        "reason": verdict.reason,
        "cause": verdict.cause.map(|c| serde_json::json!({
            "source": c.source,
            "kind": format!("{:?}", c.kind),
            "rule": c.rule.map(|r| r.0),
        })),
        "verdict_seen_at_unix_ms": at,
        "agent_version": crate::VERSION,
        "took_ms": { "metrics": millis(scrape.elapsed()) },
    });
    let parts = vec![
        ("detail.json".to_owned(), json(&detail)),
        ("metrics.txt".to_owned(), metrics.into_bytes()),
        ("journal.json".to_owned(), json(&m.actions())),
    ];
    let (host, port) = (spec.host.clone(), spec.port);
    let name = format!("{at:013}-{}-{}", file_safe(&spec.name), trigger.word());
    let w2 = w.clone();
    let done = tokio::task::spawn_blocking(move || {
        store::ready(&w2.dir, w2.caps.min_free)?;
        let parts = gather_local(&w2.npu_smi, &host, port, parts, summary);
        let (path, bytes) = store::write(&w2.dir, &name, &parts)?;
        let removed = store::prune(&w2.dir, w2.caps, &path);
        Ok::<_, StoreError>((path, bytes, removed.len()))
    })
    .await;
    let done = done.unwrap_or_else(|joined| {
        Err(StoreError::Write {
            path: w.dir.clone(),
            source: std::io::Error::other(format!("the bundle's task failed: {joined}")),
        })
    });
    settle(&m, &w.dir, &w.warned, done, began.elapsed());
}

/// The parts read on this host (the process tree, the Python stacks, `npu-smi info`) added to
/// `parts`, each part cut at its cap, and `summary.json` last, with how long each took
/// (`took_ms`, so a slow py-spy shows in the bundle itself) and when gathering finished.
fn gather_local(
    npu_smi: &std::path::Path,
    host: &str,
    port: u16,
    mut parts: Vec<(String, Vec<u8>)>,
    mut summary: serde_json::Value,
) -> Vec<(String, Vec<u8>)> {
    let mut timed = |part: &str, key: &str, f: &mut dyn FnMut() -> String| {
        let t = Instant::now();
        let body = f();
        summary["took_ms"][key] = millis(t.elapsed()).into();
        parts.push((part.to_owned(), body.into_bytes()));
    };
    let mut procs = Err(String::new());
    timed("processes.txt", "processes", &mut || {
        procs = collect::processes(&ProcRoot::default(), host, port);
        collect::processes_text(&procs)
    });
    timed("py-spy.txt", "py_spy", &mut || {
        let py_spy = collect::py_spy_on(std::env::var_os("PATH").as_deref());
        collect::stacks(py_spy.as_deref(), procs.as_deref().unwrap_or_default())
    });
    timed("npu-smi.txt", "npu_smi", &mut || {
        collect::npu_smi_info(npu_smi)
    });
    summary["finished_at_unix_ms"] = unix_ms().into();
    parts.push(("summary.json".to_owned(), json(&summary)));
    parts
        .into_iter()
        .map(|(n, b)| (n, collect::capped(b)))
        .collect()
}

/// `d` in whole milliseconds, for the summary.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Notes a bundle's outcome: in the monitor's record (`/status/detail`, the metrics) and the
/// log. Touches nothing the verdict reads.
pub(crate) fn settle(
    m: &Monitor,
    dir: &std::path::Path,
    warned: &Warned,
    done: Result<(PathBuf, u64, usize), StoreError>,
    took: Duration,
) {
    match done {
        Ok((path, bytes, removed)) => {
            warned.clear(dir);
            tracing::info!(
                engine = %m.spec().name,
                "evidence bundle written: {} ({bytes} bytes in {:.1} s; {removed} old removed)",
                path.display(),
                took.as_secs_f64()
            );
            m.note_evidence(|r| {
                r.written += 1;
                r.last_path = Some(path.display().to_string());
                r.last_bytes = bytes;
                r.last_error = None;
            });
        }
        Err(e) => {
            warned.warn_once(&e);
            let below = matches!(e, StoreError::BelowFloor { .. });
            m.note_evidence(|r| {
                if below {
                    r.skipped += 1;
                } else {
                    r.failed += 1;
                }
                r.last_error = Some(e.to_string());
            });
        }
    }
}

/// A part in JSON; a value that cannot be written says so in its place.
fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(v)
        .unwrap_or_else(|e| format!("cannot write as JSON: {e}").into_bytes())
}

/// `name` with every character but `[A-Za-z0-9._-]` as `_`: a file name of its own.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Watches `m`'s verdict every [`PERIOD`] until `cancel`, and writes one bundle at each turn
/// to `abnormal` (one at a time: a verdict that flaps while one is written gets the next).
pub(crate) async fn run(
    m: Arc<Monitor>,
    client: EngineClient,
    w: Arc<Writer>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was = None;
    let mut observed = m.observed().0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = m.peek_status();
        if now == Status::Abnormal && was.is_some_and(|b| b != Status::Abnormal) {
            let _ = request(&m, &client, &w, Trigger::Abnormal).await;
        }
        was = Some(now);
        // A rule in `observe` (or the shadow policy) would have turned the engine abnormal.
        let (n, rule) = m.observed();
        if n != observed {
            observed = n;
            let _ = request(&m, &client, &w, Trigger::Observe(rule)).await;
        }
    }
}

#[cfg(test)]
mod tests;
