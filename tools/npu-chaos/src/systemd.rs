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

/// The systemd binary.
pub const SYSTEMD: &str = "/usr/lib/systemd/systemd";

/// The shipped unit file, as this crate was built (cargo rebuilds when it changes).
pub const SHIPPED_UNIT: &str = include_str!("../../../deploy/systemd/npu-health-agent.service");

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

// ---------------------------------------------------------------------------------------
// The user unit derived from the shipped one.

/// `[Service]` keys kept as shipped: a user manager applies them (or accepts them: see the
/// notes in docs/chaos.md on the cgroup limits on this host), and they shape how the agent
/// starts, stops, restarts, keeps its sockets and runs.
const KEPT_SERVICE: &[&str] = &[
    "Type",
    "NotifyAccess",
    "ExecReload",
    "ExecStop",
    "ExecStartPre",
    "ExecStartPost",
    "ExecStopPost",
    "KillMode",
    "KillSignal",
    "SendSIGKILL",
    "TimeoutSec",
    "TimeoutStartSec",
    "TimeoutStopSec",
    "WatchdogSec",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "RestartForceExitStatus",
    "SuccessExitStatus",
    "FileDescriptorStoreMax",
    "FileDescriptorStorePreserve",
    "RuntimeDirectory",
    "RuntimeDirectoryMode",
    "RuntimeDirectoryPreserve",
    "StateDirectory",
    "Nice",
    "CPUWeight",
    "CPUSchedulingPolicy",
    "CPUSchedulingPriority",
    "OOMScoreAdjust",
    "StartLimitIntervalSec",
    "StartLimitBurst",
    "StartLimitAction",
    "Environment",
    "EnvironmentFile",
    "UMask",
    "LimitNOFILE",
    "LimitRTPRIO",
    "LimitMEMLOCK",
    "MemoryMax",
    "MemoryHigh",
    "TasksMax",
    // Process attributes and seccomp filters: a user manager applies them (verified here:
    // NoNewPrivs 1, Seccomp 2, CapBnd 0 in the agent's /proc/<pid>/status), so the agent
    // runs under the shipped restrictions.
    "NoNewPrivileges",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "SystemCallErrorNumber",
];

/// `[Unit]` keys kept as shipped.
const KEPT_UNIT: &[&str] = &[
    "Description",
    "Documentation",
    "StartLimitIntervalSec",
    "StartLimitBurst",
    "StartLimitAction",
];

/// Keys left out, by section, with the reason.
const DROPPED: &[(&str, &[&str], &str)] = &[
    (
        "Service",
        &["User", "Group", "SupplementaryGroups", "DynamicUser"],
        "a user manager runs its units as its own user (root here); asked to switch, it fails the start (status 217/USER: the user does not exist here)",
    ),
    (
        "Service",
        &["DevicePolicy", "DeviceAllow"],
        "device access is a cgroup (the v1 devices controller, or BPF on cgroup2) only the system manager sets up; a user manager's unit stays in the devices cgroup it was started in",
    ),
    (
        "Service",
        &["RemoveIPC"],
        "acts only on the User= of a system service",
    ),
    (
        "Service",
        &["LogsDirectory", "CacheDirectory", "ConfigurationDirectory"],
        "a user manager makes these under $XDG_CONFIG_HOME, not /var; the agent writes nothing there",
    ),
    (
        "Service",
        &[
            "ProtectSystem",
            "ProtectHome",
            "PrivateTmp",
            "PrivateDevices",
            "PrivateNetwork",
            "PrivateUsers",
            "PrivateMounts",
            "ProtectKernelTunables",
            "ProtectKernelModules",
            "ProtectKernelLogs",
            "ProtectControlGroups",
            "ProtectClock",
            "ProtectHostname",
            "ProtectProc",
            "ReadWritePaths",
            "ReadOnlyPaths",
            "InaccessiblePaths",
        ],
        "mount-namespace sandboxing: the manager already runs in a private mount namespace here, and the shipped unit avoids these on purpose (the Ascend driver's per-namespace device table)",
    ),
    (
        "Service",
        &["ExecStart"],
        "replaced by the command under test",
    ),
    (
        "Unit",
        &["After", "Wants", "Requires", "Before", "BindsTo", "PartOf"],
        "ordering against system units (network-online.target): a user manager has none of them",
    ),
];

/// The `[Install]` section's reason.
const INSTALL_DROPPED: &str = "nothing enables the unit: it is started by name";

/// A key left out of the derived unit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DroppedKey {
    pub section: String,
    pub key: String,
    pub value: String,
    pub reason: String,
}

/// A user unit derived from a shipped system unit ([`user_unit`]).
#[derive(Debug, Clone)]
pub struct UserUnit {
    unit: Vec<(String, String)>,
    service: Vec<(String, String)>,
    /// What was left out of the shipped unit, and why.
    pub dropped: Vec<DroppedKey>,
    /// What was set here beside the shipped keys (`Key=value: why`).
    pub changes: Vec<String>,
}

impl UserUnit {
    /// The last value of a `[Service]` key.
    pub fn service_value(&self, key: &str) -> Option<&str> {
        self.service
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `[Service]` keys, in order.
    pub fn service_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.service.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The `[Unit]` keys, in order.
    pub fn unit_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.unit.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Sets a `[Service]` key, replacing every shipped value of it; `why` is recorded.
    pub fn set(&mut self, key: &str, value: &str, why: &str) {
        let at = self.service.iter().position(|(k, _)| k == key);
        self.service.retain(|(k, _)| k != key);
        let entry = (key.to_owned(), value.to_owned());
        match at {
            Some(i) => self.service.insert(i.min(self.service.len()), entry),
            None => self.service.push(entry),
        }
        self.changes.push(format!("{key}={value}: {why}"));
    }

    /// Adds a `[Service]` line (another `Environment=`, say); `why` is recorded.
    pub fn add(&mut self, key: &str, value: &str, why: &str) {
        self.service.push((key.to_owned(), value.to_owned()));
        self.changes.push(format!("{key}={value}: {why}"));
    }

    /// The unit file, with a header naming its source, what was left out and what changed.
    pub fn text(&self) -> String {
        let mut s = format!(
            "# Derived by npu-chaos (tools/npu-chaos/src/systemd.rs) from {SHIPPED_UNIT_PATH}\n# for a private systemd user manager.\n"
        );
        if !self.dropped.is_empty() {
            s.push_str("# Left out:\n");
            for d in &self.dropped {
                s.push_str(&format!(
                    "#   [{}] {}={}: {}\n",
                    d.section,
                    d.key,
                    d.value.replace('\n', " "),
                    d.reason
                ));
            }
        }
        if !self.changes.is_empty() {
            s.push_str("# Set here:\n");
            for c in &self.changes {
                s.push_str(&format!("#   {c}\n"));
            }
        }
        s.push_str("[Unit]\n");
        for (k, v) in &self.unit {
            s.push_str(&format!("{k}={v}\n"));
        }
        s.push_str("\n[Service]\n");
        for (k, v) in &self.service {
            s.push_str(&format!("{k}={v}\n"));
        }
        s
    }
}

/// The shipped unit (`shipped`, the text of a system unit file) as a user manager runs it:
/// the `[Service]` keys such a manager applies kept as written, the others dropped with the
/// reason, `ExecStart=` replaced by `exec_start` (quoted for systemd), `[Unit]`
/// `DefaultDependencies=no` added (see the module's doc). A key this function does not know
/// is dropped too, with a reason saying so: a test keeps the shipped unit free of them.
pub fn user_unit(shipped: &str, exec_start: &[&str]) -> Result<UserUnit, String> {
    if exec_start.is_empty() {
        return Err("ExecStart: no command".to_owned());
    }
    let mut u = UserUnit {
        unit: Vec::new(),
        service: Vec::new(),
        dropped: Vec::new(),
        changes: Vec::new(),
    };
    let mut exec_at = None;
    for (section, key, value) in parse_unit(shipped)? {
        let kept = match section.as_str() {
            "Unit" => KEPT_UNIT.contains(&key.as_str()),
            "Service" => KEPT_SERVICE.contains(&key.as_str()),
            _ => false,
        };
        if kept {
            match section.as_str() {
                "Unit" => u.unit.push((key, value)),
                _ => u.service.push((key, value)),
            }
            continue;
        }
        if section == "Service" && key == "ExecStart" && exec_at.is_none() {
            exec_at = Some(u.service.len());
        }
        let reason = if section == "Install" {
            INSTALL_DROPPED.to_owned()
        } else {
            DROPPED
                .iter()
                .find(|(s, keys, _)| *s == section && keys.contains(&key.as_str()))
                .map_or_else(
                    || {
                        format!(
                            "not classified by npu_chaos::systemd::user_unit: add `{key}` to the kept or the dropped keys"
                        )
                    },
                    |(_, _, r)| (*r).to_owned(),
                )
        };
        u.dropped.push(DroppedKey {
            section,
            key,
            value,
            reason,
        });
    }
    let exec = exec_line(exec_start);
    let at = exec_at.unwrap_or(u.service.len()).min(u.service.len());
    u.service.insert(at, ("ExecStart".to_owned(), exec.clone()));
    u.changes
        .push(format!("ExecStart={exec}: the command under test"));
    u.unit
        .push(("DefaultDependencies".to_owned(), "no".to_owned()));
    u.changes.push(
        "[Unit] DefaultDependencies=no: the default dependencies pull in basic.target, whose sockets.target starts the host's user sockets (dbus, gpg-agent)".to_owned(),
    );
    Ok(u)
}

/// The `[Unit]`-file entries of `text` as (section, key, value): comments (`#`, `;`) and
/// blank lines skipped, a line ending in `\` continued on the next (as systemd joins them,
/// with a space).
pub fn parse_unit(text: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    let mut lines = text.lines().enumerate();
    while let Some((n, raw)) = lines.next() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.to_owned());
            continue;
        }
        let mut full = line.to_owned();
        while full.ends_with('\\') {
            full.pop();
            full.push(' ');
            // The next line that is not a comment continues it.
            for (_, next) in lines.by_ref() {
                let next = next.trim();
                if !(next.starts_with('#') || next.starts_with(';')) {
                    full.push_str(next);
                    break;
                }
            }
        }
        let Some((key, value)) = full.split_once('=') else {
            return Err(format!("line {}: {raw:?} is not `Key=value`", n + 1));
        };
        let Some(section) = &section else {
            return Err(format!("line {}: {raw:?} is outside any [section]", n + 1));
        };
        out.push((
            section.clone(),
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    Ok(out)
}

/// A command line for `ExecStart=`: each word in double quotes, with `\` and `"` escaped, and
/// `%` and `$` doubled so systemd expands neither specifiers nor variables in them.
pub fn exec_line(argv: &[&str]) -> String {
    argv.iter()
        .map(|a| {
            let mut q = String::with_capacity(a.len() + 2);
            q.push('"');
            for c in a.chars() {
                match c {
                    '\\' | '"' => {
                        q.push('\\');
                        q.push(c);
                    }
                    '%' => q.push_str("%%"),
                    '$' => q.push_str("$$"),
                    _ => q.push(c),
                }
            }
            q.push('"');
            q
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A value for `Environment=`: `"KEY=value"` quoted as [`exec_line`] quotes a word (without
/// the `$` doubling: systemd expands no variables in `Environment=`).
pub fn environment_value(key: &str, value: &str) -> String {
    let mut q = String::from("\"");
    for c in format!("{key}={value}").chars() {
        match c {
            '\\' | '"' => {
                q.push('\\');
                q.push(c);
            }
            '%' => q.push_str("%%"),
            _ => q.push(c),
        }
    }
    q.push('"');
    q
}

/// A systemd time span (`RestartSec=1s`, `500ms`, `2min 30s`, a bare number of seconds).
pub fn parse_timespan(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The unit operators install, as a user manager runs it: the keys that shape starting,
    // stopping, restarting and keeping sockets are kept as shipped; the identity, device
    // and ordering keys are dropped with a reason; no key of the shipped file is left
    // unclassified (a new one fails here until it is sorted into a list).
    #[test]
    fn the_user_unit_follows_the_shipped_unit() {
        let u = user_unit(SHIPPED_UNIT, &["/x/npu-health-agent", "--fake", "run"]).unwrap();
        let shipped = parse_unit(SHIPPED_UNIT).unwrap();
        let unknown: Vec<&DroppedKey> = u
            .dropped
            .iter()
            .filter(|d| d.reason.starts_with("not classified"))
            .collect();
        assert!(unknown.is_empty(), "unclassified keys: {unknown:#?}");
        // Every shipped [Service] key is either kept with its value or dropped with a reason.
        for (section, key, value) in &shipped {
            let kept = match section.as_str() {
                "Service" => u.service_keys().any(|(k, v)| k == key && v == value),
                "Unit" => u.unit_keys().any(|(k, v)| k == key && v == value),
                _ => false,
            };
            let dropped = u
                .dropped
                .iter()
                .any(|d| &d.section == section && &d.key == key && &d.value == value);
            assert!(
                kept != dropped,
                "[{section}] {key}={value}: kept {kept}, dropped {dropped}"
            );
        }
        // What the runner's faults depend on is kept whenever shipped.
        for key in [
            "Type",
            "NotifyAccess",
            "KillMode",
            "TimeoutStopSec",
            "WatchdogSec",
            "Restart",
            "RestartSec",
            "FileDescriptorStoreMax",
            "RuntimeDirectory",
            "RuntimeDirectoryPreserve",
            "Nice",
            "CPUWeight",
        ] {
            let shipped_value = shipped
                .iter()
                .rev()
                .find(|(s, k, _)| s == "Service" && k == key)
                .map(|(_, _, v)| v.as_str());
            assert_eq!(u.service_value(key), shipped_value, "{key}");
        }
        assert_eq!(
            u.service_value("ExecStart"),
            Some(r#""/x/npu-health-agent" "--fake" "run""#)
        );
        assert!(u.dropped.iter().any(|d| d.key == "User"), "{:?}", u.dropped);
        assert!(u.dropped.iter().any(|d| d.key == "DeviceAllow"));
        assert!(
            !u.service_keys()
                .any(|(k, _)| k == "User" || k == "DevicePolicy"),
            "{}",
            u.text()
        );
        let text = u.text();
        assert!(text.contains("DefaultDependencies=no"), "{text}");
        assert!(text.contains("# Left out:"), "{text}");
        // The text is itself a unit file with one ExecStart.
        let again = parse_unit(&text).unwrap();
        assert_eq!(again.iter().filter(|(_, k, _)| k == "ExecStart").count(), 1);
    }

    #[test]
    fn set_replaces_and_add_appends() {
        let mut u = user_unit(
            "[Service]\nType=notify\nRestartSec=1s\nEnvironment=A=1\n[Install]\nWantedBy=x\n",
            &["/bin/true"],
        )
        .unwrap();
        u.set("RestartSec", "50ms", "scaled");
        u.add("Environment", &environment_value("B", "two words"), "test");
        assert_eq!(u.service_value("RestartSec"), Some("50ms"));
        assert_eq!(
            u.service_keys()
                .filter(|(k, _)| *k == "Environment")
                .count(),
            2
        );
        assert_eq!(u.dropped.len(), 1);
        assert_eq!(u.dropped[0].reason, INSTALL_DROPPED);
        assert!(u.text().contains("Environment=\"B=two words\""));
        let err = user_unit("[Service]\nType=notify\nNoSuchKey=1\n", &["/bin/true"]).unwrap();
        assert!(err.dropped[0].reason.starts_with("not classified"));
    }

    #[test]
    fn unit_files_parse_with_comments_and_continuations() {
        let t = "# c\n[Unit]\nDescription=a = b\n[Service]\n; c\nExecStart=/bin/x \\\n  --y \\\n  # skipped\n  --z\n";
        let p = parse_unit(t).unwrap();
        assert_eq!(p[0], ("Unit".into(), "Description".into(), "a = b".into()));
        assert_eq!(p[1].2, "/bin/x  --y  --z");
        assert!(parse_unit("Key=1\n").unwrap_err().contains("outside"));
        assert!(parse_unit("[S]\nnothing\n").unwrap_err().contains("line 2"));
    }

    #[test]
    fn exec_words_are_quoted_and_escaped() {
        assert_eq!(
            exec_line(&["/a b/c", "50%", "$HOME", "x\"y"]),
            r#""/a b/c" "50%%" "$$HOME" "x\"y""#
        );
        assert_eq!(environment_value("K", "a%b"), r#""K=a%%b""#);
    }

    #[test]
    fn time_spans() {
        assert_eq!(parse_timespan("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_timespan("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_timespan("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timespan("2min 30s"), Some(Duration::from_secs(150)));
        assert_eq!(parse_timespan("soon"), None);
    }
}
