//! The parts of one bundle, each gathered under its own deadline and cut at [`PART_MAX`]: the
//! engine's process tree from `/proc` (state, `wchan`, CPU ticks), the stacks of its Python
//! processes by `py-spy dump` when py-spy is on `PATH`, and `npu-smi info`. A part that cannot
//! be had is a note in its file, never an error: the bundle is written with what there is.

use crate::driver::npu_smi::probe::{RunError, run, run_command};
use crate::probe::process::{Lookup, ProcState, lookup};
use crate::proc_sockets::ProcRoot;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most one part of a bundle holds; past it the part is cut, and says so.
pub(crate) const PART_MAX: usize = 1 << 20;
/// How long one `py-spy dump` may take before it is killed.
pub(crate) const PY_SPY_DEADLINE: Duration = Duration::from_secs(5);
/// At most this many Python processes are dumped per bundle (a deadline each).
pub(crate) const PY_SPY_MAX_PROCESSES: usize = 8;
/// How long `npu-smi info` may take.
pub(crate) const NPU_SMI_DEADLINE: Duration = Duration::from_secs(5);

/// `body` cut at [`PART_MAX`], with a last line saying how much was cut.
pub(crate) fn capped(mut body: Vec<u8>) -> Vec<u8> {
    if body.len() > PART_MAX {
        let cut = body.len() - PART_MAX;
        body.truncate(PART_MAX);
        body.extend_from_slice(format!("\n[cut: {cut} more bytes]\n").as_bytes());
    }
    body
}

/// One process of the engine's tree as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub pid: u32,
    /// `R`, `S`, `D`, `T`, `Z`, …
    pub state: char,
    pub cpu_ticks: u64,
    /// The kernel function it sleeps in (`0` or empty when running).
    pub wchan: String,
    pub comm: String,
    pub cmdline: String,
    /// Its executable's file name (`python3.11`), when readable.
    pub exe: String,
}

impl Proc {
    /// Whether it runs a Python interpreter (vLLM renames its processes, e.g.
    /// `VLLM::EngineCore`, so the executable decides, then the command line).
    pub(crate) fn is_python(&self) -> bool {
        let first = self.cmdline.split(' ').next().unwrap_or_default();
        let base = first.rsplit('/').next().unwrap_or_default();
        self.exe.starts_with("python") || base.starts_with("python")
    }
}

/// The engine's processes (the holder of `host:port` and its descendants), or why none.
pub(crate) fn processes(root: &ProcRoot, host: &str, port: u16) -> Result<Vec<Proc>, String> {
    let (_, states) = match lookup(root, host, port) {
        Lookup::Found { pid, states } => (pid, states),
        Lookup::NotFound(why) => return Err(why),
    };
    let read = |pid: u32, f: &str| {
        std::fs::read(root.pid(pid).join(f))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default()
    };
    Ok(states
        .into_iter()
        .map(|(pid, s, cpu_ticks)| Proc {
            pid,
            state: match s {
                ProcState::Live(c) => c,
                ProcState::Stopped => 'T',
                ProcState::Dead => 'Z',
            },
            cpu_ticks,
            wchan: read(pid, "wchan"),
            comm: read(pid, "comm"),
            cmdline: read(pid, "cmdline"),
            exe: std::fs::read_link(root.pid(pid).join("exe"))
                .ok()
                .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
                .unwrap_or_default(),
        })
        .collect())
}

/// `processes.txt`: one line per process, the socket's holder first.
pub(crate) fn processes_text(found: &Result<Vec<Proc>, String>) -> String {
    let mut out = String::from("pid\tstate\tcpu_ticks\twchan\tcomm\tcmdline\n");
    match found {
        Ok(all) => {
            for p in all {
                let _ = writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    p.pid, p.state, p.cpu_ticks, p.wchan, p.comm, p.cmdline
                );
            }
        }
        Err(why) => {
            let _ = writeln!(out, "# no process of the engine in sight: {why}");
        }
    }
    out
}

/// `py-spy` on `PATH`, if there.
pub(crate) fn py_spy_on(path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|d| d.join("py-spy"))
        .find(|p| p.is_file())
}

/// `py-spy.txt`: `py-spy dump --pid P` of each Python process (each killed at
/// [`PY_SPY_DEADLINE`]), or the note saying why there is none.
pub(crate) fn stacks(py_spy: Option<&Path>, procs: &[Proc]) -> String {
    let Some(py_spy) = py_spy else {
        return "# py-spy is not on PATH: no Python stacks (pip install py-spy)\n".to_owned();
    };
    let python: Vec<&Proc> = procs.iter().filter(|p| p.is_python()).collect();
    if python.is_empty() {
        return "# no Python process among the engine's processes\n".to_owned();
    }
    let mut out = String::new();
    for p in python.iter().take(PY_SPY_MAX_PROCESSES) {
        let pid = p.pid.to_string();
        let _ = writeln!(out, "## py-spy dump --pid {pid} ({})", p.comm);
        match run_command(py_spy_dump(py_spy, &pid), PY_SPY_DEADLINE) {
            Ok(o) if o.status.success() => out.push_str(&o.text),
            Ok(o) => {
                let _ = writeln!(out, "# py-spy exited with {}:\n{}", o.status, o.text);
            }
            Err(e) => {
                let _ = writeln!(out, "# {}", ran_not(&e));
            }
        }
        out.push('\n');
    }
    if python.len() > PY_SPY_MAX_PROCESSES {
        let _ = writeln!(
            out,
            "# {} more Python processes not dumped (at most {PY_SPY_MAX_PROCESSES})",
            python.len() - PY_SPY_MAX_PROCESSES
        );
    }
    out
}

/// What py-spy (a Rust program) reads that the agent's own environment may hold, and that
/// would put py-spy's internals into the bundle (both seen on real vLLM): `RUST_LOG` turns on
/// its `env_logger` log (some 30 lines after every stack with the agent's `info`), and
/// `RUST_BACKTRACE`/`RUST_LIB_BACKTRACE` append py-spy's own backtrace to each error.
const PY_SPY_ENV_REMOVED: [&str; 3] = ["RUST_LOG", "RUST_BACKTRACE", "RUST_LIB_BACKTRACE"];

/// `py-spy dump --pid <pid>` without [`PY_SPY_ENV_REMOVED`]. Blocking (py-spy's default: the
/// process is paused while it is read, about 20 ms for a real vLLM Worker here) gives a
/// consistent stack.
fn py_spy_dump(py_spy: &Path, pid: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(py_spy);
    cmd.args(["dump", "--pid", pid]);
    for var in PY_SPY_ENV_REMOVED {
        cmd.env_remove(var);
    }
    cmd
}

fn ran_not(e: &RunError) -> String {
    match e {
        RunError::Timeout(d) => format!("killed at its deadline ({d:?})"),
        e => e.to_string(),
    }
}

/// `npu-smi.txt`: `npu-smi info` through the configured `npu-smi`, or why not.
pub(crate) fn npu_smi_info(npu_smi: &Path) -> String {
    match run(npu_smi, &["info"], NPU_SMI_DEADLINE) {
        Ok(o) if o.status.success() => o.text,
        Ok(o) => format!("# npu-smi info exited with {}:\n{}", o.status, o.text),
        Err(e) => format!("# npu-smi info: {}\n", ran_not(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn python(pid: u32) -> Proc {
        Proc {
            pid,
            state: 'S',
            cpu_ticks: 1,
            wchan: "futex_wait_queue".into(),
            comm: "VLLM::EngineCore".into(),
            cmdline: "/usr/bin/python3 -m vllm".into(),
            exe: String::new(),
        }
    }

    #[test]
    fn a_missing_py_spy_is_a_note_not_an_error() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(py_spy_on(Some(d.path().as_os_str())), None);
        assert!(stacks(None, &[python(1)]).contains("py-spy is not on PATH"));
        let found = script(d.path(), "py-spy", "true");
        assert_eq!(py_spy_on(Some(d.path().as_os_str())), Some(found));
    }

    #[test]
    fn a_py_spy_that_hangs_is_killed_at_its_deadline_and_noted() {
        let d = tempfile::tempdir().unwrap();
        // `exec` so the sleep is the process killed (its group is killed either way).
        let hang = script(d.path(), "py-spy", "exec sleep 600");
        let out = stacks(Some(&hang), &[python(4242)]);
        assert!(out.contains("killed at its deadline"), "{out}");
    }

    #[test]
    fn py_spy_dumps_each_python_process_only() {
        let d = tempfile::tempdir().unwrap();
        let echo = script(d.path(), "py-spy", "echo \"Thread 1: $3\"");
        let mut shell = python(7);
        shell.cmdline = "/bin/sh".into();
        let out = stacks(Some(&echo), &[python(5), shell]);
        assert!(out.contains("Thread 1: 5"), "{out}");
        assert!(!out.contains("--pid 7"), "{out}");
    }

    // py-spy reads RUST_LOG and RUST_BACKTRACE: the agent's own settings must not put
    // py-spy's log or backtraces in the bundle.
    #[test]
    fn py_spy_runs_without_the_agents_rust_log_or_backtrace() {
        let cmd = py_spy_dump(Path::new("/x/py-spy"), "5");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["dump", "--pid", "5"]);
        // Removed whatever the agent's own environment holds (`None`: removed).
        let mut removed: Vec<_> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        removed.sort();
        assert_eq!(
            removed,
            ["RUST_BACKTRACE", "RUST_LIB_BACKTRACE", "RUST_LOG"]
        );
    }

    #[test]
    fn a_part_past_its_cap_is_cut_and_says_so() {
        let out = capped(vec![b'x'; PART_MAX + 10]);
        assert!(out.len() < PART_MAX + 40);
        assert!(String::from_utf8_lossy(&out).ends_with("[cut: 10 more bytes]\n"));
        assert_eq!(capped(b"small".to_vec()), b"small");
    }

    #[test]
    fn the_process_tree_lists_state_wchan_and_ticks_or_why_none() {
        let me = Proc {
            pid: 9,
            state: 'D',
            cpu_ticks: 77,
            wchan: "io_schedule".into(),
            comm: "worker".into(),
            cmdline: "python3 w.py".into(),
            exe: "python3.11".into(),
        };
        let t = processes_text(&Ok(vec![me]));
        assert!(
            t.contains("9\tD\t77\tio_schedule\tworker\tpython3 w.py"),
            "{t}"
        );
        let none = processes_text(&Err("nothing listens".into()));
        assert!(none.contains("nothing listens"), "{none}");
    }
}
