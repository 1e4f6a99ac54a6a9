//! The private systemd user manager (`npu_chaos::systemd::UserManager`), for real: a small
//! `Type=notify` service that keeps its listening socket in systemd's file-descriptor store is
//! restarted, crashed and stopped, and the manager leaves nothing behind. Two managers side by
//! side do not touch each other's units. Root only (and python3 for the service): skipped with
//! the reason otherwise, but failing when `CI=true`.

use npu_chaos::systemd::{self, UserManager};
use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";

/// The service: takes its listener back from `LISTEN_FDS` (or binds a new one), stores it
/// with `FDSTORE=1`, says `READY=1`, logs `<pid> <port> took-back|bound <marker>` (whether
/// its RuntimeDirectory already held a marker), and answers each connection with its pid.
const SERVICE: &str = r#"
import os, socket, sys
log = open(sys.argv[1], "a")
took = os.environ.get("LISTEN_PID") == str(os.getpid()) and int(os.environ.get("LISTEN_FDS", "0")) > 0
if took:
    s = socket.socket(fileno=3)
else:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
marker = os.path.join(os.environ["RUNTIME_DIRECTORY"], "marker")
had = os.path.exists(marker)
open(marker, "w").close()
n = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
n.connect(os.environ["NOTIFY_SOCKET"])
socket.send_fds(n, [b"FDSTORE=1\nFDNAME=listener"], [s.fileno()])
n.send(b"READY=1")
print(os.getpid(), s.getsockname()[1], "took-back" if took else "bound", "marker" if had else "no-marker", file=log, flush=True)
while True:
    c, _ = s.accept()
    c.sendall(str(os.getpid()).encode())
    c.close()
"#;

/// A manager, or `None` (with the reason printed) where none can run; under `CI=true` a
/// missing prerequisite is a failure.
fn manager(dir: &Path) -> Option<UserManager> {
    let why = systemd::preflight()
        .err()
        .or_else(|| (!Path::new(PYTHON).is_file()).then(|| format!("{PYTHON} not found")));
    if let Some(why) = why {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true, but no private systemd user manager can run: {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    Some(UserManager::start(dir).unwrap_or_else(|e| panic!("{e}")))
}

fn unit(script: &Path, log: &Path) -> String {
    format!(
        "[Unit]\nDefaultDependencies=no\n[Service]\nType=notify\nNotifyAccess=main\nExecStart={}\nFileDescriptorStoreMax=4\nRestart=on-failure\nRestartSec=100ms\nRuntimeDirectory=npu-chaos-fdstore-test\nRuntimeDirectoryPreserve=restart\n",
        systemd::exec_line(&[
            PYTHON,
            &script.display().to_string(),
            &log.display().to_string()
        ])
    )
}

/// The service's log lines: (pid, port, took back, marker found).
fn lines(log: &Path) -> Vec<(u32, u16, bool, bool)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((
                w.first()?.parse().ok()?,
                w.get(1)?.parse().ok()?,
                *w.get(2)? == "took-back",
                *w.get(3)? == "marker",
            ))
        })
        .collect()
}

/// The pid that answers on `port` (a connection that waits in the backlog is answered by
/// whichever process accepts it).
fn answer(port: u16) -> std::io::Result<u32> {
    let mut c = TcpStream::connect(("127.0.0.1", port))?;
    c.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    s.trim()
        .parse()
        .map_err(|_| std::io::Error::other(format!("answer {s:?}")))
}

/// Waits (bounded) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < end, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

// What the agent's continuity under systemd rests on, as systemd 252 does it: the stored
// listener survives `systemctl restart` and a crash under `Restart=on-failure` (the new
// process gets it in LISTEN_FDS and answers on the same port; RuntimeDirectory= is kept with
// RuntimeDirectoryPreserve=restart), and is released by `stop` (the next start binds anew).
// Then the manager stops and leaves no process, cgroup or directory behind.
#[test]
fn a_notify_unit_keeps_its_listener_across_restart_and_crash_not_stop() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut m) = manager(dir.path()) else {
        return;
    };
    let script = dir.path().join("service.py");
    let log = dir.path().join("service.log");
    std::fs::write(&script, SERVICE).unwrap();
    let name = "npu-chaos-fdstore-test.service";
    m.install_unit(name, &unit(&script, &log)).unwrap();
    m.systemctl(&["start", name]).unwrap();
    let first = m.main_pid(name).unwrap().expect("a main process");
    let port = lines(&log)[0].1;
    assert_eq!(answer(port).unwrap(), first);
    assert_eq!(m.show(name, "NFileDescriptorStore").unwrap(), "1");

    m.systemctl(&["restart", name]).unwrap();
    let second = m.main_pid(name).unwrap().expect("a main process");
    assert_ne!(second, first);
    assert_eq!(answer(port).unwrap(), second, "same port, new process");
    let l = lines(&log);
    assert_eq!(l.last(), Some(&(second, port, true, true)), "{l:?}");

    m.systemctl(&["kill", "-s", "SIGKILL", "--kill-whom=main", name])
        .unwrap();
    until("the crashed service's restart", || {
        m.main_pid(name).ok().flatten().is_some_and(|p| p != second)
            && m.show(name, "ActiveState").is_ok_and(|s| s == "active")
    });
    let third = m.main_pid(name).unwrap().unwrap();
    assert_eq!(answer(port).unwrap(), third);
    assert_eq!(m.show(name, "NRestarts").unwrap(), "1");
    assert_eq!(lines(&log).last(), Some(&(third, port, true, true)));

    m.systemctl(&["stop", name]).unwrap();
    assert_eq!(m.show(name, "NFileDescriptorStore").unwrap(), "0");
    assert!(answer(port).is_err(), "nothing holds the port once stopped");
    assert!(!m.runtime_dir().join("npu-chaos-fdstore-test").exists());
    m.systemctl(&["start", name]).unwrap();
    let fourth = lines(&log).last().copied().unwrap();
    assert!(
        !fourth.2 && !fourth.3,
        "a new listener, a new directory: {fourth:?}"
    );

    let cgroup = m.cgroup().to_owned();
    let runtime = m.runtime_dir().to_owned();
    m.stop().unwrap();
    assert!(m.processes().is_empty());
    assert!(
        processes_naming(&script.display().to_string()).is_empty(),
        "the service is gone"
    );
    for h in ["systemd", "unified", ""] {
        let p = Path::new("/sys/fs/cgroup").join(h).join(&cgroup);
        assert!(!p.exists(), "{} left behind", p.display());
    }
    assert!(!runtime.exists());
}

// Two managers at once, each with a unit of the same name: restarting and stopping one's
// unit leaves the other's running process alone, as does stopping the first manager.
#[test]
fn two_managers_side_by_side_do_not_touch_each_other() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| manager(d1.path()));
        let b = s.spawn(|| manager(d2.path()));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (Some(mut a), Some(mut b)) = (a, b) else {
        return;
    };
    assert_ne!(a.cgroup(), b.cgroup());
    let name = "npu-chaos-twin.service";
    let text = "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep 600\n";
    a.install_unit(name, text).unwrap();
    b.install_unit(name, text).unwrap();
    a.systemctl(&["start", name]).unwrap();
    b.systemctl(&["start", name]).unwrap();
    let b_pid = b.main_pid(name).unwrap().unwrap();
    let a_pid = a.main_pid(name).unwrap().unwrap();
    assert_ne!(a_pid, b_pid);
    a.systemctl(&["restart", name]).unwrap();
    a.systemctl(&["stop", name]).unwrap();
    assert_eq!(b.main_pid(name).unwrap(), Some(b_pid));
    a.stop().unwrap();
    assert_eq!(
        b.main_pid(name).unwrap(),
        Some(b_pid),
        "b's unit still runs"
    );
    assert_eq!(b.show(name, "ActiveState").unwrap(), "active");
    assert!(b.processes().contains(&b_pid));
    b.stop().unwrap();
    assert!(
        std::fs::read_to_string(format!("/proc/{b_pid}/stat")).map_or(true, |s| s.contains(") Z ")),
        "b's process is gone"
    );
}
