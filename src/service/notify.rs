//! systemd's notification protocol (`sd_notify`), sent with the `sd-notify` crate. What stays
//! here is what that crate (0.5) leaves out, each shown by a test below: a `NOTIFY_SOCKET`
//! naming an abstract socket (`@name`), a malformed `WATCHDOG_USEC` or `WATCHDOG_PID` being
//! reported rather than taken, and `STATUS=` kept to one short line.

pub(crate) use sd_notify::NotifyState;
use std::ffi::OsStr;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A socket to the service manager.
#[derive(Debug)]
pub(crate) struct Notifier {
    target: Target,
}

#[derive(Debug)]
enum Target {
    /// A socket path: `sd_notify::notify` sends (it reads `NOTIFY_SOCKET` itself).
    Path,
    /// An abstract socket, sent to here: sd-notify connects to `NOTIFY_SOCKET` as a file path,
    /// so `@name` would be a file named `@name` in the working directory, not the socket
    /// systemd means (`sd_notify_misses_an_abstract_socket_and_takes_bad_watchdog_values`).
    Abstract(UnixDatagram, SocketAddr),
}

impl Notifier {
    /// The notifier of `NOTIFY_SOCKET`; `Ok(None)` when the variable is unset or empty (not
    /// started by systemd with `Type=notify`).
    pub(crate) fn from_env() -> Result<Option<Notifier>, String> {
        match std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) {
            Some(v) => Notifier::for_socket(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The notifier of a `NOTIFY_SOCKET` value.
    fn for_socket(v: &OsStr) -> Result<Notifier, String> {
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(v);
        let target = if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = SocketAddr::from_abstract_name(name)
                .map_err(|e| format!("NOTIFY_SOCKET {v:?}: {e}"))?;
            let sock = UnixDatagram::unbound().map_err(|e| format!("NOTIFY_SOCKET: {e}"))?;
            Target::Abstract(sock, addr)
        } else if bytes.starts_with(b"/") {
            Target::Path
        } else {
            return Err(format!(
                "NOTIFY_SOCKET {v:?} is neither an absolute path nor an abstract name (@...)"
            ));
        };
        Ok(Notifier { target })
    }

    /// Sends one message with descriptors attached (`FDSTORE=1`): systemd keeps them for the
    /// service and passes them back to its next process (`LISTEN_FDS`). Sent with rustix's
    /// `sendmsg` to either kind of socket (sd-notify's own `notify_with_fds` takes only a path).
    pub(crate) fn send_with_fds(
        &self,
        states: &[NotifyState<'_>],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
        let sock = UnixDatagram::unbound()?;
        match &self.target {
            Target::Path => {
                let path = std::env::var_os("NOTIFY_SOCKET").unwrap_or_default();
                sock.connect(path)?;
            }
            Target::Abstract(_, addr) => sock.connect_addr(addr)?,
        }
        let mut space =
            vec![
                std::mem::MaybeUninit::uninit();
                rustix::cmsg_space!(ScmRights(crate::continuity::handover::MAX_SOCKETS))
            ];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        if !control.push(rustix::net::SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other(
                "too many descriptors for one message",
            ));
        }
        rustix::net::sendmsg(
            &sock,
            &[std::io::IoSlice::new(msg.as_bytes())],
            &mut control,
            rustix::net::SendFlags::empty(),
        )?;
        Ok(())
    }

    /// Sends one message: the states, one `KEY=value` line each.
    pub(crate) fn send(&self, states: &[NotifyState<'_>]) -> std::io::Result<()> {
        match &self.target {
            Target::Path => sd_notify::notify(states),
            Target::Abstract(sock, addr) => {
                // The lines sd-notify writes for a path.
                let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
                sock.send_to_addr(msg.as_bytes(), addr).map(|_| ())
            }
        }
    }
}

/// The watchdog timeout systemd asks for (`WATCHDOG_USEC`), unless `WATCHDOG_PID` names
/// another process; pings are due at half of it. `sd_notify::watchdog_enabled` is not used:
/// it takes a zero timeout and ignores a `WATCHDOG_PID` it cannot parse, where a
/// misconfigured unit should be reported.
pub(crate) fn watchdog_timeout() -> Result<Option<Duration>, String> {
    watchdog_from(
        std::env::var_os("WATCHDOG_USEC").as_deref(),
        std::env::var_os("WATCHDOG_PID").as_deref(),
        std::process::id(),
    )
}

/// [`watchdog_timeout`] of these values, for process `me`.
fn watchdog_from(
    usec: Option<&OsStr>,
    pid: Option<&OsStr>,
    me: u32,
) -> Result<Option<Duration>, String> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    if let Some(pid) = pid {
        let pid: u32 = pid
            .to_str()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("WATCHDOG_PID {pid:?} is not a process id"))?;
        if pid != me {
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
pub(crate) const STATUS_MAX: usize = 1024;

/// Text for [`NotifyState::Status`]: one line, no control characters, at most
/// [`STATUS_MAX`] bytes (the crate sends what it is given, so a newline would start
/// another key).
pub(crate) fn status_text(s: &str) -> String {
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
    clean
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt;

    #[test]
    fn status_is_one_short_line() {
        assert_eq!(status_text("a\nb\tc"), "a b c");
        let long = status_text(&"é".repeat(5000));
        assert!(long.len() <= STATUS_MAX, "{}", long.len());
        assert!(long.ends_with("..."));
    }

    /// A socket with an abstract name unique to this test process.
    fn abstract_socket(tag: &str) -> (String, UnixDatagram) {
        let name = format!("npu-health-agent-{tag}-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        (name, rx)
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        let (name, rx) = abstract_socket("notify");
        let n = Notifier::for_socket(OsStr::new(&format!("@{name}"))).unwrap();
        n.send(&[NotifyState::Watchdog, NotifyState::Status("x")])
            .unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1\nSTATUS=x\n");
    }

    // What systemd's file-descriptor store receives: the lines and the descriptor.
    #[test]
    fn a_descriptor_reaches_the_socket_with_its_lines() {
        use std::os::fd::AsFd;
        let (name, rx) = abstract_socket("fdstore");
        let n = Notifier::for_socket(OsStr::new(&format!("@{name}"))).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        n.send_with_fds(
            &[
                NotifyState::Custom("FDSTORE=1"),
                NotifyState::Custom("FDNAME=listen_x"),
            ],
            &[tcp.as_fd()],
        )
        .unwrap();
        let mut buf = [0u8; 64];
        let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let r = rustix::net::recvmsg(
            &rx,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            rustix::net::RecvFlags::empty(),
        )
        .unwrap();
        assert_eq!(&buf[..r.bytes], b"FDSTORE=1\nFDNAME=listen_x\n");
        let mut fds = Vec::new();
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        assert_eq!(fds.len(), 1);
        let back = std::net::TcpListener::from(fds.pop().unwrap());
        assert_eq!(back.local_addr().unwrap(), tcp.local_addr().unwrap());
    }

    #[test]
    fn bad_socket_and_watchdog_values_are_reported() {
        assert!(
            Notifier::for_socket(OsStr::new("run/notify"))
                .unwrap_err()
                .contains("neither an absolute path")
        );
        let w = |usec: &str, pid: Option<&str>| {
            watchdog_from(Some(OsStr::new(usec)), pid.map(OsStr::new), 42)
        };
        assert_eq!(w("3000000", None), Ok(Some(Duration::from_secs(3))));
        assert_eq!(w("3000000", Some("42")), Ok(Some(Duration::from_secs(3))));
        assert_eq!(w("3000000", Some("7")), Ok(None), "another process's");
        assert!(w("0", None).unwrap_err().contains("positive"));
        assert!(w("soon", None).unwrap_err().contains("positive"));
        assert!(w("1", Some("x")).unwrap_err().contains("not a process id"));
        assert_eq!(watchdog_from(None, None, 42), Ok(None));
    }

    /// Run as a child by the test below, with the environment it sets: what sd-notify does
    /// with those values, one line each.
    #[test]
    #[ignore = "run in a child process by sd_notify_misses_an_abstract_socket_and_takes_bad_watchdog_values"]
    fn sd_notify_in_a_child() {
        let sent = sd_notify::notify(&[NotifyState::Watchdog]).map_err(|e| e.kind());
        println!("notify: {sent:?}");
        println!("watchdog: {:?}", sd_notify::watchdog_enabled());
    }

    // The crate's gaps that keep the code above: with `NOTIFY_SOCKET=@name` it looks for a
    // file `@name` and never reaches the abstract socket; `WATCHDOG_USEC=0` with an
    // unparsable `WATCHDOG_PID` is taken as a watchdog of zero.
    #[test]
    fn sd_notify_misses_an_abstract_socket_and_takes_bad_watchdog_values() {
        let (name, rx) = abstract_socket("sd-notify");
        let cwd = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "service::notify::tests::sd_notify_in_a_child",
                "--ignored",
                "--nocapture",
            ])
            .current_dir(cwd.path())
            .env("NOTIFY_SOCKET", format!("@{name}"))
            .env("WATCHDOG_USEC", "0")
            .env("WATCHDOG_PID", "not-a-pid")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("notify: Err(NotFound)"), "{stdout}");
        assert!(stdout.contains("watchdog: Some(0ns)"), "{stdout}");
        let mut buf = [0u8; 64];
        assert!(rx.recv(&mut buf).is_err(), "nothing reached the socket");
    }
}
