//! Logging: `tracing-subscriber`'s fmt layer for human text or JSON on stderr, or our
//! [`journald`] layer writing natively to the journal with structured fields; whichever it
//! is, [`ratelimit::RateLimited`] around it holds back repeated identical warnings and errors.
//!
//! The format is chosen once at start-up: `--log-format` (`auto` by default). `auto` logs to
//! journald when systemd connected stderr to the journal (`JOURNAL_STREAM` names stderr's
//! device and inode, as systemd documents), else text. Levels come from `RUST_LOG` when set,
//! else `[agent] log_level`, else `info` for services; a reload re-applies the config's level.

mod format;

pub use format::{QUOTE_MAX, clip, escape_controls, quote};
pub mod journald;
pub(crate) mod ratelimit;

use ratelimit::RateLimited;
use std::sync::OnceLock;
use std::time::Duration;
use tracing_subscriber::layer::{Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// Identical warnings and errors are written at most once per this interval.
pub(crate) const RATE_LIMIT_INTERVAL: Duration = Duration::from_secs(10);

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

/// The subscriber the output layer sits on: the registry and the reloadable level filter.
type Filtered = Layered<reload::Layer<EnvFilter, Registry>, Registry>;

/// The output layer chosen at start-up.
type Output = Box<dyn Layer<Filtered> + Send + Sync>;

/// Handle to the running logger: changes the level filter and flushes suppressed counts.
#[derive(Clone)]
pub(crate) struct LogHandle {
    filter: Option<reload::Handle<EnvFilter, Registry>>,
    structured: bool,
    env_filter: bool,
}

/// Installs the global logger. `default` is the level filter when neither `RUST_LOG` nor
/// the config sets one. Falls back to text (and says why) when journald cannot be reached.
pub(crate) fn init(format: LogFormat, default: &str) -> LogHandle {
    let (output, structured, note) = choose_output(format);
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    // An invalid RUST_LOG is reported and ignored (the config's level then applies).
    let env_filter = env
        .as_deref()
        .and_then(|v| EnvFilter::try_new(quiet_dependencies(v)).ok());
    let env_invalid = env.is_some() && env_filter.is_none();
    let from_env = env_filter.is_some();
    let filter = env_filter.unwrap_or_else(|| EnvFilter::new(quiet_dependencies(default)));
    let (filter_layer, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter_layer)
        .with(RateLimited::new(output, RATE_LIMIT_INTERVAL))
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
        structured,
        env_filter: from_env,
    }
}

/// Dependencies' own lines that only repeat, without context, a failure the agent logs
/// itself: kube's HTTP trace layer writes `ERROR failed with status 500 Internal Server
/// Error` for every 5xx answer of the Kubernetes API, beside the agent's WARN naming the
/// call and the pod. Turned off unless the directives name the target themselves (an
/// operator debugging the client asks for it by name: `kube_client=debug`).
const QUIET_TARGETS: &[&str] = &["kube_client::client::builder"];

/// `directives` with each of [`QUIET_TARGETS`] turned off, unless they name it.
fn quiet_dependencies(directives: &str) -> String {
    let mut out = directives.trim().to_string();
    for target in QUIET_TARGETS {
        let crate_name = target.split("::").next().unwrap_or(target);
        if !out.contains(crate_name) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(target);
            out.push_str("=off");
        }
    }
    out
}

/// The text format: `2026-11-30T00:23:05.123456Z  WARN message key=value ...`.
fn text_layer<S>() -> tracing_subscriber::fmt::Layer<S, format::TextFields>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_target(false)
        .fmt_fields(format::TextFields)
}

/// The output layer, whether it is structured (JSON, journald), and a note when the format
/// asked for could not be had.
fn choose_output(format: LogFormat) -> (Output, bool, Option<String>) {
    let text = || -> Output { text_layer().with_writer(std::io::stderr).boxed() };
    let journal = |why: &dyn Fn(String) -> String| match journald::Journald::connect() {
        Ok(j) => (j.boxed(), true, None),
        Err(e) => (text(), false, Some(why(e))),
    };
    match format {
        LogFormat::Text => (text(), false, None),
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_writer(std::io::stderr);
            (json.boxed(), true, None)
        }
        LogFormat::Journald => {
            journal(&|e| format!("--log-format journald: {e}; logging text on stderr"))
        }
        LogFormat::Auto if journald::stderr_is_journal() => {
            journal(&|e| format!("stderr is the journal but {e}; logging text on stderr"))
        }
        LogFormat::Auto => (text(), false, None),
    }
}

impl LogHandle {
    /// Applies the config's `log_level` unless `RUST_LOG` set the filter (the environment
    /// wins, so an operator can raise the level without editing the file).
    pub(crate) fn apply_config_level(
        &self,
        level: Option<&str>,
        default: &str,
    ) -> Result<(), String> {
        if self.env_filter {
            return Ok(());
        }
        let directives = level.unwrap_or(default);
        let filter = EnvFilter::try_new(quiet_dependencies(directives))
            .map_err(|e| format!("log_level {directives:?} is not a valid filter: {e}"))?;
        if let Some(h) = &self.filter {
            h.reload(filter)
                .map_err(|e| format!("cannot change the log level: {e}"))?;
        }
        Ok(())
    }

    /// Writes the counts of suppressed lines not yet reported (at shutdown).
    pub(crate) fn flush(&self) {
        ratelimit::flush();
    }

    /// Whether lines go to journald or as JSON (a fatal error must then be a log line too,
    /// not only plain text on stderr).
    pub(crate) fn structured(&self) -> bool {
        self.structured
    }
}

/// The process-wide handle, for code that has no handle passed to it (reload, shutdown).
static HANDLE: OnceLock<LogHandle> = OnceLock::new();

/// Remembers the handle for [`global`].
pub(crate) fn set_global(h: LogHandle) {
    let _ = HANDLE.set(h);
}

/// The handle set by [`set_global`], if any.
pub(crate) fn global() -> Option<&'static LogHandle> {
    HANDLE.get()
}

#[cfg(test)]
mod tests {
    use super::quiet_dependencies;

    #[test]
    fn kube_clients_own_failure_lines_are_off_unless_named() {
        assert_eq!(
            quiet_dependencies("info"),
            "info,kube_client::client::builder=off"
        );
        assert_eq!(
            quiet_dependencies(" debug "),
            "debug,kube_client::client::builder=off"
        );
        assert_eq!(quiet_dependencies(""), "kube_client::client::builder=off");
        assert_eq!(
            quiet_dependencies("info,kube_client=debug"),
            "info,kube_client=debug"
        );
    }
}
