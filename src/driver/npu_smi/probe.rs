//! Short `npu-smi` runs with a deadline: the AI Cube capability probe
//! (`npu-smi info watch -h`, exactly as the reference decides it) and `npu-smi info -m`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Marker the reference looks for in `npu-smi info watch -h`.
pub(crate) const CUBE_MARKER: &str = "u - AI Cube Usage";

/// The reference's probe timeout.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Result of the capability probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchSupport {
    Supported,
    /// Unsupported, with the warning the reference logs.
    Unsupported(String),
}

/// Output of a finished short run.
#[derive(Debug)]
pub(crate) struct RunOutput {
    pub status: ExitStatus,
    /// stdout followed by stderr.
    pub text: String,
}

/// Why a short run did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Runs `program args…` (argv only, no shell) with stdin closed; kills it at `timeout`.
pub(crate) fn run(program: &Path, args: &[&str], timeout: Duration) -> Result<RunOutput, RunError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run_command(cmd, timeout)
}

/// [`run`] for a command built by the caller (its environment set, e.g. the evidence
/// bundle's py-spy without the agent's `RUST_LOG`).
pub(crate) fn run_command(mut cmd: Command, timeout: Duration) -> Result<RunOutput, RunError> {
    let program = Path::new(cmd.get_program()).to_owned();
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RunError::Spawn {
            program: program.display().to_string(),
            source,
        })?;
    let (tx, rx) = crossbeam_channel::bounded::<(usize, Vec<u8>)>(2);
    let streams: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    let n_streams = streams.len();
    for (i, mut r) in streams.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            // Bounded: a misbehaving tool cannot make the agent buffer without limit.
            let _ = (&mut r).take(1 << 20).read_to_end(&mut buf);
            let _ = tx.send((i, buf));
        });
    }
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let pid = rustix::process::Pid::from_child(&child);
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Timeout(timeout));
            }
        }
    };
    // A grandchild could keep a pipe open after the tool exits: wait for the output only
    // briefly, then go on with what arrived.
    let mut parts = vec![Vec::new(); n_streams];
    let output_deadline = Instant::now() + Duration::from_secs(1);
    for _ in 0..n_streams {
        match rx.recv_deadline(output_deadline) {
            Ok((i, buf)) => parts[i] = buf,
            Err(_) => break,
        }
    }
    let text = parts.iter().map(|b| String::from_utf8_lossy(b)).collect();
    Ok(RunOutput { status, text })
}

/// `npu-smi info watch -h`: supported only if it exits 0 and prints [`CUBE_MARKER`].
pub(crate) fn watch_support(npu_smi: &Path, timeout: Duration) -> WatchSupport {
    match run(npu_smi, &["info", "watch", "-h"], timeout) {
        Err(RunError::Spawn { .. }) => WatchSupport::Unsupported(
            "npu-smi is not available when checking AI Cube Usage watch support".to_owned(),
        ),
        Err(RunError::Timeout(_)) => WatchSupport::Unsupported(
            "npu-smi info watch -h timed out when checking AI Cube Usage watch support".to_owned(),
        ),
        Ok(out) if !out.status.success() => {
            let code = out
                .status
                .code()
                .map_or_else(|| "none (killed by a signal)".to_owned(), |c| c.to_string());
            WatchSupport::Unsupported(format!(
                "npu-smi info watch -h failed with exit code {code} when checking AI Cube Usage watch support: {}",
                out.text.trim()
            ))
        }
        Ok(out) if out.text.contains(CUBE_MARKER) => WatchSupport::Supported,
        Ok(_) => WatchSupport::Unsupported(
            "HDK does not support npu-smi info watch -s u (AI Cube Usage)".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("npu-smi");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    // virtual-inference-reference §2.5, the support matrix.
    #[test]
    fn supported_when_marker_and_exit_zero() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "echo 'Usage: npu-smi info watch [Options...]'\necho '                          u - AI Cube Usage'",
        );
        assert_eq!(watch_support(&p, PROBE_TIMEOUT), WatchSupport::Supported);
    }

    #[test]
    fn marker_on_stderr_counts() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "echo '                          u - AI Cube Usage' >&2",
        );
        assert_eq!(watch_support(&p, PROBE_TIMEOUT), WatchSupport::Supported);
    }

    #[test]
    fn unsupported_help_text() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "echo 'Usage: npu-smi info watch [Options...]'\necho '                          a - AI Core Usage'\necho '                          n - NPU Utilization'",
        );
        assert_eq!(
            watch_support(&p, PROBE_TIMEOUT),
            WatchSupport::Unsupported(
                "HDK does not support npu-smi info watch -s u (AI Cube Usage)".into()
            )
        );
    }

    #[test]
    fn nonzero_exit_fails_even_with_marker() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "echo '                          u - AI Cube Usage'\nexit 1",
        );
        let WatchSupport::Unsupported(w) = watch_support(&p, PROBE_TIMEOUT) else {
            panic!("must be unsupported");
        };
        assert!(
            w.starts_with("npu-smi info watch -h failed with exit code 1"),
            "{w}"
        );
        assert!(!w.contains("HDK does not support"), "{w}");
    }

    #[test]
    fn driver_not_ready() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "echo 'error: driver not ready'\nexit 1");
        let WatchSupport::Unsupported(w) = watch_support(&p, PROBE_TIMEOUT) else {
            panic!("must be unsupported");
        };
        assert!(
            w.contains("exit code 1") && w.contains("driver not ready"),
            "{w}"
        );
    }

    #[test]
    fn missing_binary() {
        assert_eq!(
            watch_support(Path::new("/nonexistent/npu-smi"), PROBE_TIMEOUT),
            WatchSupport::Unsupported(
                "npu-smi is not available when checking AI Cube Usage watch support".into()
            )
        );
    }

    #[test]
    fn timeout_kills_the_child() {
        let d = tempfile::tempdir().unwrap();
        let p = script(d.path(), "exec sleep 30");
        let started = Instant::now();
        assert_eq!(
            watch_support(&p, Duration::from_millis(200)),
            WatchSupport::Unsupported(
                "npu-smi info watch -h timed out when checking AI Cube Usage watch support".into()
            )
        );
        // Not a timing assertion on the probe itself: only that we did not wait for sleep 30.
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
