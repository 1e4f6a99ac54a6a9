//! Logging: one `tracing` layer that writes every event as human text or JSON on stderr, or
//! natively to journald with structured fields, with repeated identical warnings and errors
//! rate-limited (see [`ratelimit`]).
//!
//! The format is chosen once at start-up: `--log-format` (`auto` by default). `auto` logs to
//! journald when systemd connected stderr to the journal (`JOURNAL_STREAM` names stderr's
//! device and inode, as systemd documents), else text. Levels come from `RUST_LOG` when set,
//! else `[agent] log_level`, else `info` for services; a reload re-applies the config's level.

mod format;

pub use format::{QUOTE_MAX, escape_controls, quote};
pub mod journald;
pub mod ratelimit;

use format::Record;
use ratelimit::{RateLimiter, Verdict};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// Identical warnings and errors are written at most once per this interval.
pub const RATE_LIMIT_INTERVAL: Duration = Duration::from_secs(10);

/// Where and how log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// journald when stderr is the journal (systemd's `JOURNAL_STREAM`), else text.
    Auto,
    /// Human-readable lines on stderr.
    Text,
    /// One JSON object per line on stderr (containers, log shippers).
    Json,
    /// Native journald protocol with structured fields (ENGINE=, DEVICE=, VERDICT=, ...).
    Journald,
}

/// The sink chosen at start-up.
enum Sink {
    Text,
    Json,
    Journald(journald::Journal),
}

/// Handle to the running logger: changes the level filter and flushes suppressed counts.
#[derive(Clone)]
pub struct LogHandle {
    filter: Option<reload::Handle<EnvFilter, Registry>>,
    output: Arc<Output>,
    env_filter: bool,
}

/// Installs the global logger. `default` is the level filter when neither `RUST_LOG` nor
/// the config sets one. Falls back to text (and says why) when journald cannot be reached.
pub fn init(format: LogFormat, default: &str) -> LogHandle {
    let (sink, note) = choose_sink(format);
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    // An invalid RUST_LOG is reported and ignored (the config's level then applies).
    let env_filter = env.as_deref().and_then(|v| EnvFilter::try_new(v).ok());
    let env_invalid = env.is_some() && env_filter.is_none();
    let from_env = env_filter.is_some();
    let filter = env_filter.unwrap_or_else(|| EnvFilter::new(default));
    let (filter_layer, handle) = reload::Layer::new(filter);
    let output = Arc::new(Output {
        sink,
        limiter: Mutex::new(Limiter {
            lines: RateLimiter::new(RATE_LIMIT_INTERVAL),
            swept: Instant::now(),
        }),
    });
    let installed = tracing_subscriber::registry()
        .with(filter_layer)
        .with(OutputLayer(output.clone()))
        .try_init()
        .is_ok();
    if let Some(note) = note {
        tracing::warn!("{note}");
    }
    if env_invalid {
        tracing::warn!("RUST_LOG is not a valid filter; ignored");
    }
    LogHandle {
        filter: installed.then_some(handle),
        output,
        env_filter: from_env,
    }
}

fn choose_sink(format: LogFormat) -> (Sink, Option<String>) {
    match format {
        LogFormat::Text => (Sink::Text, None),
        LogFormat::Json => (Sink::Json, None),
        LogFormat::Journald => match journald::Journal::connect() {
            Ok(j) => (Sink::Journald(j), None),
            Err(e) => (
                Sink::Text,
                Some(format!(
                    "--log-format journald: {e}; logging text on stderr"
                )),
            ),
        },
        LogFormat::Auto => {
            if !journald::stderr_is_journal() {
                return (Sink::Text, None);
            }
            match journald::Journal::connect() {
                Ok(j) => (Sink::Journald(j), None),
                Err(e) => (
                    Sink::Text,
                    Some(format!(
                        "stderr is the journal but {e}; logging text on stderr"
                    )),
                ),
            }
        }
    }
}

impl LogHandle {
    /// Applies the config's `log_level` unless `RUST_LOG` set the filter (the environment
    /// wins, so an operator can raise the level without editing the file).
    pub fn apply_config_level(&self, level: Option<&str>, default: &str) -> Result<(), String> {
        if self.env_filter {
            return Ok(());
        }
        let directives = level.unwrap_or(default);
        let filter = EnvFilter::try_new(directives)
            .map_err(|e| format!("log_level {directives:?} is not a valid filter: {e}"))?;
        if let Some(h) = &self.filter {
            h.reload(filter)
                .map_err(|e| format!("cannot change the log level: {e}"))?;
        }
        Ok(())
    }

    /// Writes the counts of suppressed lines not yet reported (at shutdown).
    pub fn flush(&self) {
        self.output.flush(true);
    }

    /// Whether lines go to journald or as JSON (a fatal error must then be a log line too,
    /// not only plain text on stderr).
    pub fn structured(&self) -> bool {
        !matches!(self.output.sink, Sink::Text)
    }
}

/// Whether `directives` is a valid level filter (config validation).
pub fn check_filter(directives: &str) -> Result<(), String> {
    EnvFilter::try_new(directives)
        .map(|_| ())
        .map_err(|e| format!("{directives:?} is not a valid filter like \"info\" or \"warn,npu_health_agent=debug\": {e}"))
}

struct Output {
    sink: Sink,
    limiter: Mutex<Limiter>,
}

/// The rate limiter and when it was last swept for counts no later line will carry.
struct Limiter {
    lines: RateLimiter<Record>,
    swept: Instant,
}

/// How often the suppressed counts are swept (not on every event: the sweep walks them all).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Output {
    fn handle(&self, record: Record) {
        let now = Instant::now();
        let limited = record.level <= Level::WARN;
        let (verdict, pending) = {
            let mut l = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
            let v = if limited {
                l.lines.check(&record, now)
            } else {
                Verdict::Write { suppressed: 0 }
            };
            let pending = if now.saturating_duration_since(l.swept) >= SWEEP_EVERY {
                l.swept = now;
                l.lines.expired(now, false)
            } else {
                Vec::new()
            };
            (v, pending)
        };
        for p in pending {
            self.write(&p.key.summary(p.suppressed, p.over));
        }
        if let Verdict::Write { suppressed } = verdict {
            if suppressed > 0 {
                self.write(&record.with_suppressed(suppressed));
            } else {
                self.write(&record);
            }
        }
    }

    fn flush(&self, all: bool) {
        let pending = {
            let mut l = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
            l.lines.expired(Instant::now(), all)
        };
        for p in pending {
            self.write(&p.key.summary(p.suppressed, p.over));
        }
    }

    fn write(&self, r: &Record) {
        match &self.sink {
            Sink::Text => write_stderr(&format::text(r)),
            Sink::Json => write_stderr(&format::json(r)),
            Sink::Journald(j) => {
                if let Err(e) = j.send(r) {
                    // journald went away: the line still reaches stderr (the journal stream).
                    write_stderr(&format!("{} (journald: {e})", format::text(r).trim_end()));
                }
            }
        }
    }
}

fn write_stderr(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    if !line.ends_with('\n') {
        let _ = err.write_all(b"\n");
    }
}

struct OutputLayer(Arc<Output>);

impl<S: Subscriber> Layer<S> for OutputLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut v = format::Visitor::default();
        event.record(&mut v);
        self.0.handle(Record {
            time: SystemTime::now(),
            level: *meta.level(),
            target: meta.target().to_owned(),
            file: meta.file(),
            line: meta.line(),
            message: v.message,
            fields: v.fields,
        });
    }
}

/// The process-wide handle, for code that has no handle passed to it (reload, shutdown).
static HANDLE: OnceLock<LogHandle> = OnceLock::new();

/// Remembers the handle for [`global`].
pub fn set_global(h: LogHandle) {
    let _ = HANDLE.set(h);
}

/// The handle set by [`set_global`], if any.
pub fn global() -> Option<&'static LogHandle> {
    HANDLE.get()
}
