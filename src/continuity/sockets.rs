//! Listening sockets that outlive one agent process: taken over at start (from systemd's
//! `LISTEN_FDS`, or from a running agent through [`super::handover`]) and matched to the
//! configured addresses; and stored in systemd's file-descriptor store, so the next process
//! gets them back.
//!
//! A socket is matched by the address it is bound to (`getsockname`), so the order and the
//! names systemd passes do not matter, and a socket configured at an address no longer in
//! the configuration is closed (and removed from the store). Each stored socket is named
//! after its address ([`fd_name`]), which is how it is removed again.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;

/// Where a socket came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// systemd passed it back (`LISTEN_FDS`: its file-descriptor store, or a socket unit).
    Systemd,
    /// The agent this one took over from.
    Handover,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Systemd => "systemd",
            Origin::Handover => "the agent handing over",
        }
    }
}

/// Sockets taken over, not yet claimed by an address of the configuration.
#[derive(Debug, Default)]
pub struct Inherited {
    sockets: Vec<(SocketAddr, TcpListener, Origin)>,
    /// Descriptors that were not usable listening TCP sockets, with why.
    pub rejected: Vec<String>,
}

impl Inherited {
    /// What systemd passed, as [`capture_systemd`] took it at start (empty if it did not run).
    pub(crate) fn from_systemd() -> Inherited {
        CAPTURED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// Adds a socket taken over; one that is not a bound listening socket is rejected.
    pub(crate) fn add(&mut self, l: TcpListener, origin: Origin) {
        // Inherited descriptors may lack close-on-exec: keep them from npu-smi's children.
        let _ = rustix::io::fcntl_setfd(l.as_fd(), rustix::io::FdFlags::CLOEXEC);
        if let Err(e) = l.set_nonblocking(true) {
            self.rejected
                .push(format!("a socket from {}: {e}", origin.as_str()));
            return;
        }
        match l.local_addr() {
            Ok(addr) if self.sockets.iter().all(|(a, _, _)| *a != addr) => {
                self.sockets.push((addr, l, origin));
            }
            Ok(_) => {} // the same address twice (stored under two names): one is enough
            Err(e) => self
                .rejected
                .push(format!("a socket from {}: {e}", origin.as_str())),
        }
    }

    /// The socket bound to `addr`, if one was taken over (never for port 0).
    pub(crate) fn take(&mut self, addr: SocketAddr) -> Option<(TcpListener, Origin)> {
        if addr.port() == 0 {
            return None;
        }
        let i = self.sockets.iter().position(|(a, _, _)| *a == addr)?;
        let (_, l, o) = self.sockets.remove(i);
        Some((l, o))
    }

    /// How many are unclaimed.
    pub(crate) fn len(&self) -> usize {
        self.sockets.len()
    }

    /// Whether none is unclaimed.
    pub(crate) fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }

    /// The unclaimed sockets' addresses, closing them.
    pub(crate) fn close_unclaimed(&mut self) -> Vec<(SocketAddr, Origin)> {
        self.sockets.drain(..).map(|(a, _, o)| (a, o)).collect()
    }
}

/// Sockets systemd passed, taken from the environment while the process had one thread.
static CAPTURED: std::sync::Mutex<Option<Inherited>> = std::sync::Mutex::new(None);

/// Takes the listening sockets systemd passed (`LISTEN_FDS` for this `LISTEN_PID`: its
/// file-descriptor store, or a socket unit) for [`Inherited::from_systemd`]. Call it first
/// thing, while the process has one thread: the `listenfd` crate removes the variables from
/// the environment, which is only sound then. TCP listening sockets, IPv4 or IPv6, are kept;
/// anything else is noted in `rejected` and closed.
pub(crate) fn capture_systemd() {
    // systemd always names the process; listenfd would take the descriptors without it.
    if std::env::var_os("LISTEN_PID").is_none_or(|p| p.is_empty()) {
        return;
    }
    let mut fds = listenfd::ListenFd::from_env();
    let mut out = Inherited::default();
    let stream = rustix::net::SocketType::STREAM.as_raw() as i32;
    for i in 0..fds.len() {
        let v4 = fds.take_tcp_listener(i);
        let taken = match v4 {
            Ok(l) => Ok(l),
            // listenfd's TCP check knows AF_INET only.
            Err(_) => fds.take_custom::<TcpListener>(
                i,
                i32::from(rustix::net::AddressFamily::INET6.as_raw()),
                stream,
                "tcp6 socket",
            ),
        };
        match taken {
            Ok(Some(l)) => out.add(l, Origin::Systemd),
            Ok(None) => {}
            Err(e) => out
                .rejected
                .push(format!("descriptor {} from systemd: {e}", 3 + i)),
        }
    }
    *CAPTURED.lock().unwrap_or_else(|p| p.into_inner()) = Some(out);
}

/// The name a socket is stored under in systemd's file-descriptor store: its address, in
/// the characters `FDNAME=` allows (no `:`).
pub(crate) fn fd_name(addr: SocketAddr) -> String {
    let ip = addr.ip().to_string().replace(':', "-");
    format!("listen_{ip}_{}", addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_have_no_colon_and_differ_by_address() {
        let a = fd_name("127.0.0.1:9001".parse().unwrap());
        let b = fd_name("[::1]:9001".parse().unwrap());
        assert_eq!(a, "listen_127.0.0.1_9001");
        assert!(!b.contains(':'), "{b}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_socket_is_claimed_by_its_address_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut inh = Inherited::default();
        inh.add(l.try_clone().unwrap(), Origin::Handover);
        inh.add(l, Origin::Handover);
        assert_eq!(inh.len(), 1, "the same address twice is kept once");
        let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(inh.take(other).is_none());
        let (got, origin) = inh.take(addr).unwrap();
        assert_eq!(got.local_addr().unwrap(), addr);
        assert_eq!(origin, Origin::Handover);
        assert!(inh.take(addr).is_none());
    }
}
