//! systemd's notification protocol (`sd_notify`): datagrams of `KEY=value` lines sent to the
//! socket named by `NOTIFY_SOCKET` (a path, or an abstract name starting with `@`).

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// A socket to the service manager.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    target: Target,
}

#[derive(Debug)]
enum Target {
    Path(std::path::PathBuf),
    Abstract(std::os::unix::net::SocketAddr),
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`; `Ok(None)` when the variable is unset or empty (not
    /// started by systemd with `Type=notify`).
    pub fn from_env() -> Result<Option<Notifier>, String> {
        let Some(v) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let sock = UnixDatagram::unbound().map_err(|e| format!("NOTIFY_SOCKET: {e}"))?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str());
        let target = if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            Target::Abstract(
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .map_err(|e| format!("NOTIFY_SOCKET {v:?}: {e}"))?,
            )
        } else if bytes.starts_with(b"/") {
            Target::Path(v.into())
        } else {
            return Err(format!(
                "NOTIFY_SOCKET {v:?} is neither an absolute path nor an abstract name (@...)"
            ));
        };
        Ok(Some(Notifier { sock, target }))
    }

    /// Sends one message (lines `KEY=value`).
    pub fn send(&self, msg: &str) -> std::io::Result<()> {
        match &self.target {
            Target::Path(p) => self.sock.send_to(msg.as_bytes(), p),
            Target::Abstract(a) => self.sock.send_to_addr(msg.as_bytes(), a),
        }
        .map(|_| ())
    }
}

/// The watchdog timeout systemd asks for (`WATCHDOG_USEC`), unless `WATCHDOG_PID` names
/// another process; pings are due at half of it.
pub fn watchdog_timeout() -> Result<Option<Duration>, String> {
    let Some(usec) = std::env::var_os("WATCHDOG_USEC") else {
        return Ok(None);
    };
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        let pid: u32 = pid
            .to_str()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("WATCHDOG_PID {pid:?} is not a process id"))?;
        if pid != std::process::id() {
            return Ok(None);
        }
    }
    let usec: u64 = usec
        .to_str()
        .and_then(|u| u.parse().ok())
        .filter(|&u| u > 0)
        .ok_or_else(|| {
            format!("WATCHDOG_USEC {usec:?} is not a positive number of microseconds")
        })?;
    Ok(Some(Duration::from_micros(usec)))
}

/// Longest `STATUS=` text sent: systemd drops a whole notify datagram of 4096 bytes or more
/// (a rejected reload's error chain can be long).
pub const STATUS_MAX: usize = 1024;

/// `STATUS=` text: one line, no control characters, at most [`STATUS_MAX`] bytes.
pub fn status_line(s: &str) -> String {
    let mut clean: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.len() > STATUS_MAX {
        let mut end = STATUS_MAX - 3;
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean.truncate(end);
        clean.push_str("...");
    }
    format!("STATUS={clean}")
}

/// `CLOCK_MONOTONIC` in microseconds (for `RELOADING=1`'s `MONOTONIC_USEC=`).
pub fn monotonic_usec() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_one_short_line() {
        assert_eq!(status_line("a\nb\tc"), "STATUS=a b c");
        let long = status_line(&"é".repeat(5000));
        assert!(long.len() <= "STATUS=".len() + STATUS_MAX, "{}", long.len());
        assert!(long.ends_with("..."));
    }

    #[test]
    fn messages_reach_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            sock: UnixDatagram::unbound().unwrap(),
            target: Target::Path(path),
        };
        n.send("READY=1\nSTATUS=x").unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=x");
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("npu-health-agent-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier {
            sock: UnixDatagram::unbound().unwrap(),
            target: Target::Abstract(addr),
        };
        n.send("WATCHDOG=1").unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn monotonic_clock_moves() {
        let a = monotonic_usec();
        std::thread::sleep(Duration::from_millis(2));
        assert!(monotonic_usec() > a);
    }
}
