//! A private, real systemd to run units under, beside whatever is PID 1: systemd's user
//! manager (`systemd --user`) in a mount namespace and a cgroup subtree of its own, stopped
//! with everything it started. The chaos runner restarts and crashes the agent through it, and
//! the agent's own integration tests can use it as well (`npu-chaos` as a dev-dependency).
//! Also [`user_unit`]: the shipped unit file (`deploy/systemd/npu-health-agent.service`) turned
//! into a unit such a manager runs, so that the tests follow the unit operators install.
//!
//! How [`UserManager::start`] sets it up (root only; what was verified on this host is in
//! docs/chaos.md, "A private systemd"):
//! - `unshare --mount` gives the manager a mount namespace of its own, where a tmpfs covers
//!   `/run/systemd` and `/run/systemd/system` is made: `systemd --user` refuses to run unless
//!   that directory says systemd booted the machine. The host's `/run/systemd` is not touched
//!   (other tools take `/run/systemd/system` as "systemd is PID 1").
//! - `XDG_RUNTIME_DIR` is a fresh 0700 directory on a tmpfs (`/dev/shm`), as `/run/user/<uid>`
//!   is on a real host: systemd removes a unit's `RuntimeDirectory=` only from a tmpfs. The
//!   manager's control socket is there, where `systemctl --user` finds it from the host's
//!   namespace. `XDG_CONFIG_HOME` and friends point inside it too, so nothing lands in root's
//!   home.
//! - A manager takes its own cgroup, less a trailing `/init.scope`, as the root of its tree.
//!   Started from this host's `/init.scope`, where every process runs, it would take the root
//!   of the hierarchy, join the host's processes in `/init.scope`, and share `/app.slice`
//!   with any other manager started so. So it is first moved into a cgroup of its own,
//!   `/npu-chaos-sd.<pid>.<n>`, in each hierarchy systemd tracks processes in (`name=systemd`
//!   and `unified` on a hybrid host, the one cgroup2 tree on a unified one); its units go
//!   below it. Two managers never share a cgroup, whatever their units are named.
//! - It starts an empty target of ours instead of `default.target`, and [`user_unit`] sets
//!   `DefaultDependencies=no`: the default dependencies pull in `basic.target`, whose
//!   `sockets.target` would start the host's user sockets (dbus, gpg-agent).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod unit;
pub use unit::{DroppedKey, UserUnit, environment_value, exec_line, parse_timespan, user_unit};

/// What `systemctl --user <args>` answered: its stdout, or an error with its exit status and
/// stderr (the blocking and the async caller alike).
pub fn systemctl_answer(args: &[&str], out: &std::process::Output) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "systemctl --user {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The systemd binary.
pub const SYSTEMD: &str = "/usr/lib/systemd/systemd";

/// The shipped unit file, as this crate was built (cargo rebuilds when it changes).
pub const SHIPPED_UNIT: &str = include_str!("../../../../deploy/systemd/npu-health-agent.service");

/// Where [`SHIPPED_UNIT`] lives in the repository.
pub const SHIPPED_UNIT_PATH: &str = "deploy/systemd/npu-health-agent.service";

/// The shipped unit's name, kept in the manager: each manager has its own unit namespace and
/// cgroup tree.
pub const AGENT_UNIT: &str = "npu-health-agent.service";

/// The target the manager starts instead of `default.target`.
const IDLE_TARGET: &str = "npu-chaos-idle.target";

/// How long one `systemctl` call may take (a stop waits for `TimeoutStopSec=`, 20 s in the
/// shipped unit).
const SYSTEMCTL_LIMIT: Duration = Duration::from_secs(60);

/// A running private user manager. [`UserManager::stop`] (or dropping it) stops every unit
/// it started, the manager, and any process left in its cgroups, and removes its cgroups and
/// its runtime directory.
#[derive(Debug)]
pub struct UserManager {
    child: Option<std::process::Child>,
    runtime_dir: PathBuf,
    cgroup: String,
    /// The cgroup hierarchies the manager was moved into (mount points).
    hierarchies: Vec<PathBuf>,
    log: PathBuf,
    units: Vec<String>,
}

impl UserManager {
    /// Starts a manager whose log goes to `dir/systemd-manager.log`. A clear error when this
    /// is not root, or `unshare`, systemd or a usable cgroup hierarchy is missing, or the
    /// manager does not answer within 10 s.
    pub fn start(dir: &Path) -> Result<UserManager, String> {
        preflight()?;
        let hierarchies = hierarchies()?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let id = format!(
            "npu-chaos-sd.{}.{}.{nanos:x}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        // On a tmpfs, as /run/user/<uid> is (RuntimeDirectory= is removed from a tmpfs only),
        // and short: a unix socket path holds at most 107 bytes.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let runtime_dir = base.join(&id);
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&runtime_dir)
                .map_err(|e| format!("{}: {e}", runtime_dir.display()))?;
        }
        let mut m = UserManager {
            child: None,
            runtime_dir,
            cgroup: id,
            hierarchies,
            log: dir.join("systemd-manager.log"),
            units: Vec::new(),
        };
        m.spawn()?;
        Ok(m)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let units = self.unit_dir();
        for d in [units.clone(), self.runtime_dir.join("config")] {
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::write(
            units.join(IDLE_TARGET),
            "[Unit]\nDescription=npu-chaos: a manager that starts nothing by itself\nDefaultDependencies=no\n",
        )
        .map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(&self.log).map_err(|e| format!("{}: {e}", self.log.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        // In the new mount namespace: the tmpfs over /run/systemd (made first if this host
        // has none: an empty /run/systemd says nothing), then into the cgroups, then exec.
        let script = format!(
            r#"set -e
[ -d /run/systemd ] || mkdir /run/systemd
mount -t tmpfs -o mode=0755,size=64m npu-chaos-systemd /run/systemd
mkdir /run/systemd/system
for d do mkdir -p "$d"; echo $$ > "$d/cgroup.procs"; done
exec {SYSTEMD} --user --unit={IDLE_TARGET} --log-target=console --log-level=info"#
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(&script)
            .arg("sh")
            .args(self.hierarchies.iter().map(|h| h.join(&self.cgroup)));
        self.env(&mut cmd);
        // daemon-reload refuses with less than 16 MiB free on /run/systemd: the tmpfs above
        // has 64 (a limit, not an allocation).
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("starting `unshare` for the user manager: {e}"))?,
        );
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                let tail = tail(&self.log, 8);
                let _ = self.cleanup();
                return Err(format!(
                    "the private systemd user manager exited at start ({st}): {tail}"
                ));
            }
            if self
                .systemctl(&["is-active", IDLE_TARGET])
                .is_ok_and(|s| s.trim() == "active")
            {
                return Ok(());
            }
            if Instant::now() > end {
                let tail = tail(&self.log, 8);
                self.stop_quietly();
                return Err(format!(
                    "the private systemd user manager did not answer within 10 s: {tail}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The environment the manager and `systemctl` share: everything per user points inside
    /// the runtime directory.
    fn env(&self, cmd: &mut Command) {
        let rt = &self.runtime_dir;
        cmd.env("XDG_RUNTIME_DIR", rt)
            .env("XDG_CONFIG_HOME", rt.join("config"))
            .env("XDG_STATE_HOME", rt.join("state"))
            .env("XDG_CACHE_HOME", rt.join("cache"))
            .env("XDG_DATA_HOME", rt.join("data"))
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID");
    }

    /// Where units are installed: the manager's runtime unit directory
    /// (`$XDG_RUNTIME_DIR/systemd/user`).
    pub fn unit_dir(&self) -> PathBuf {
        self.runtime_dir.join("systemd/user")
    }

    /// The manager's `XDG_RUNTIME_DIR` (a unit's `RuntimeDirectory=` is made below it).
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// The manager's log (its own messages: units started, stopped, failed).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The manager's cgroup, relative to each hierarchy's root (`npu-chaos-sd.<pid>.<n>…`).
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// `systemctl --user`, talking to this manager, as a command to complete and run (from
    /// async code: `tokio::process::Command::from`).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("systemctl");
        cmd.args(["--user", "--no-pager", "--no-ask-password"])
            .stdin(Stdio::null());
        self.env(&mut cmd);
        cmd
    }

    /// Runs `systemctl --user <args>` (at most 60 s); its stdout, or an error with its
    /// stderr.
    pub fn systemctl(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = self.command();
        cmd.args(args);
        let out = run_with_limit(cmd, SYSTEMCTL_LIMIT)
            .map_err(|e| format!("systemctl --user {}: {e}", args.join(" ")))?;
        systemctl_answer(args, &out)
    }

    /// Writes the unit `name` into the manager's unit directory and reloads the manager.
    pub fn install_unit(&mut self, name: &str, text: &str) -> Result<(), String> {
        if name.is_empty() || name.contains('/') || !name.contains('.') {
            return Err(format!("{name:?} is not a unit name"));
        }
        let path = self.unit_dir().join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !self.units.iter().any(|u| u == name) {
            self.units.push(name.to_owned());
        }
        self.systemctl(&["daemon-reload"]).map(|_| ())
    }

    /// One property of `unit` (`systemctl --user show -p <property> --value`).
    pub fn show(&self, unit: &str, property: &str) -> Result<String, String> {
        self.systemctl(&["show", "-p", property, "--value", unit])
            .map(|s| s.trim_end_matches('\n').to_owned())
    }

    /// The unit's main process (`None` while it has none).
    pub fn main_pid(&self, unit: &str) -> Result<Option<u32>, String> {
        let v = self.show(unit, "MainPID")?;
        let pid: u32 = v
            .trim()
            .parse()
            .map_err(|_| format!("MainPID of {unit} is {v:?}"))?;
        Ok((pid != 0).then_some(pid))
    }

    /// Every process in the manager's cgroups (the manager itself among them while it runs).
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        // Never the hierarchy's root: only a cgroup this type made.
        if !self.owns_cgroup() {
            return pids;
        }
        for h in &self.hierarchies {
            collect_procs(&h.join(&self.cgroup), &mut pids);
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Stops every unit installed here, then the manager; kills whatever is left in its
    /// cgroups; removes the cgroups and the runtime directory. An error names what was left.
    pub fn stop(&mut self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.child.is_some() {
            for unit in self.units.clone().iter().rev() {
                if let Err(e) = self.systemctl(&["stop", unit]) {
                    problems.push(e);
                }
            }
            // The manager exits (exit.target); a manager that does not is killed.
            let _ = self.systemctl(&["exit"]);
            if let Some(mut child) = self.child.take() {
                let end = Instant::now() + Duration::from_secs(10);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if matches!(child.try_wait(), Ok(None)) {
                    problems.push("the manager did not exit within 10 s: killed".to_owned());
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
        if let Err(e) = self.cleanup() {
            problems.push(e);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    fn owns_cgroup(&self) -> bool {
        self.cgroup.starts_with("npu-chaos-sd.") && !self.cgroup.contains('/')
    }

    fn stop_quietly(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("npu-chaos: stopping the private systemd user manager: {e}");
        }
    }

    /// Kills what is left in the manager's cgroups, removes them (deepest first, in every
    /// hierarchy where the manager made one), and removes the runtime directory.
    fn cleanup(&mut self) -> Result<(), String> {
        let mut left = Vec::new();
        for _ in 0..50 {
            left = self.processes();
            if left.is_empty() {
                break;
            }
            for pid in &left {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut problems = Vec::new();
        if !left.is_empty() {
            problems.push(format!("processes left in its cgroups: {left:?}"));
        }
        // systemd makes the cgroup in every hierarchy it realizes for a unit, not only in
        // those the manager was moved into.
        let roots: Vec<PathBuf> = if !self.owns_cgroup() {
            Vec::new()
        } else {
            std::fs::read_dir("/sys/fs/cgroup")
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.path().join(&self.cgroup)))
                        .chain(std::iter::once(
                            Path::new("/sys/fs/cgroup").join(&self.cgroup),
                        ))
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_default()
        };
        for root in roots {
            if let Err(e) = remove_cgroup_tree(&root) {
                problems.push(format!("{}: {e}", root.display()));
            }
        }
        if self.runtime_dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.runtime_dir)
        {
            problems.push(format!("{}: {e}", self.runtime_dir.display()));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

impl Drop for UserManager {
    fn drop(&mut self) {
        if self.child.is_some() || self.runtime_dir.exists() {
            self.stop_quietly();
        }
    }
}

/// Why a private user manager cannot start here (`Ok` when it can try).
pub fn preflight() -> Result<(), String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    if uid != "0" {
        return Err(format!(
            "a private systemd user manager needs root (a mount namespace with a tmpfs over /run/systemd, cgroups of its own); this runs as uid {uid}"
        ));
    }
    if !Path::new(SYSTEMD).is_file() {
        return Err(format!("{SYSTEMD} not found: systemd is not installed"));
    }
    for tool in ["unshare", "systemctl"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            return Err(format!("`{tool}` not found in PATH"));
        }
    }
    hierarchies().map(|_| ())
}

/// The cgroup hierarchies systemd tracks processes in here: the cgroup2 tree on a unified
/// host; `name=systemd` and, when mounted, `unified` on a hybrid one.
fn hierarchies() -> Result<Vec<PathBuf>, String> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").is_file() {
        return Ok(vec![root.to_path_buf()]);
    }
    let legacy = root.join("systemd");
    if !legacy.join("cgroup.procs").is_file() {
        return Err(
            "no cgroup hierarchy systemd can track processes in (neither a cgroup2 /sys/fs/cgroup nor /sys/fs/cgroup/systemd)"
                .to_owned(),
        );
    }
    let mut v = vec![legacy];
    let unified = root.join("unified");
    if unified.join("cgroup.procs").is_file() {
        v.push(unified);
    }
    Ok(v)
}

fn collect_procs(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&e.path(), pids);
            }
        }
    }
}

/// Removes a cgroup and its children, deepest first (a cgroup directory is removed with
/// rmdir, its control files go with it).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path())?;
            }
        }
    }
    // A cgroup just emptied can be busy for a moment.
    let mut last = Ok(());
    for _ in 0..20 {
        last = std::fs::remove_dir(dir);
        if last.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    last
}

/// Runs `cmd` to its end, killed after `limit`.
fn run_with_limit(mut cmd: Command, limit: Duration) -> Result<std::process::Output, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let end = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {limit:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The last `n` lines of a file, on one line.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(n);
    if lines.is_empty() {
        format!("(nothing in {})", path.display())
    } else {
        lines[from..].join(" | ")
    }
}
