//! The kernel's socket tables as text (`net/tcp`, `net/tcp6`, `net/unix`), parsed row by row,
//! and which listening socket an address meets: the one the kernel hands a connection to
//! (the stopped-process rule's engine), and the ones in the way of a `bind` (check-config).
//! Pure: a row that is not one (a header, a truncated or garbled line) is skipped, never a
//! panic, and costs only itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

/// `st` of a listening TCP socket (`TCP_LISTEN`).
const TCP_LISTEN: &str = "0A";
/// The flag of a unix socket that accepts connections (`__SO_ACCEPTCON`).
const UNIX_ACCEPTS: u32 = 0x0001_0000;

/// A listening TCP socket: one row of `net/tcp` or `net/tcp6` in state `LISTEN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listening {
    /// The address and port it is bound to.
    pub local: SocketAddr,
    /// The user that created it.
    pub uid: u32,
    /// Its inode, which the holders' `/proc/<pid>/fd` links name (`socket:[inode]`).
    pub inode: u64,
}

/// The listening socket a row of `net/tcp` or `net/tcp6` names; `None` for any other row.
pub(crate) fn tcp_listening(row: &str) -> Option<Listening> {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    let f: Vec<&str> = row.split_whitespace().collect();
    if *f.get(3)? != TCP_LISTEN {
        return None;
    }
    Some(Listening {
        local: hex_socket_addr(f.get(1)?)?,
        uid: f.get(7)?.parse().ok()?,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// `0100007F:1F40` (IPv4) or 32 hex digits and a port (IPv6), as the kernel prints them.
fn hex_socket_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints each 32-bit word of the address as a number in the host's byte
    // order: the word's bytes in memory are the address's bytes in order.
    let words = |n: usize| -> Option<Vec<u8>> {
        if addr.len() != 8 * n || !addr.is_ascii() {
            return None;
        }
        let mut bytes = Vec::with_capacity(4 * n);
        for i in 0..n {
            let w = u32::from_str_radix(&addr[8 * i..8 * i + 8], 16).ok()?;
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        Some(bytes)
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(words(1)?).ok()?)),
        32 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(words(4)?).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// A unix socket that accepts connections, with its path: one row of `net/unix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnixListening {
    pub inode: u64,
    pub path: PathBuf,
}

/// The listening unix socket with a path in the file system that a row of `net/unix`
/// names; `None` for any other row (a header, a connection, an abstract or unnamed socket).
pub(crate) fn unix_listening(row: &str) -> Option<UnixListening> {
    // Num RefCount Protocol Flags Type St Inode Path: the path is the rest of the line, and
    // may hold spaces.
    let mut rest = row;
    let mut f = Vec::with_capacity(7);
    for _ in 0..7 {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        f.push(&rest[..end]);
        rest = &rest[end..];
    }
    let flags = u32::from_str_radix(f[3], 16).ok()?;
    let inode = f[6].parse().ok()?;
    let path = rest.trim_start();
    (flags & UNIX_ACCEPTS != 0 && path.starts_with('/')).then(|| UnixListening {
        inode,
        path: PathBuf::from(path),
    })
}

/// The address as IPv4 when it is one, or an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
/// which an IPv6 socket uses for IPv4 peers).
fn as_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    }
}

/// How well a socket listening on `listener` takes a connection to `to`, or `None` if it
/// does not: the kernel hands it to the best (an exact address before a wildcard, an IPv4
/// socket before an IPv6 one at the same address). `::` is taken to accept IPv4 too (its
/// `IPV6_V6ONLY` is not in the table; Linux's default is off).
pub(crate) fn reach(listener: SocketAddr, to: SocketAddr) -> Option<u8> {
    if listener.port() != to.port() {
        return None;
    }
    let (l, t) = (listener.ip(), to.ip());
    match (as_v4(t), l) {
        (Some(t4), IpAddr::V4(l4)) if l4 == t4 => Some(4),
        (Some(_), IpAddr::V4(l4)) if l4.is_unspecified() => Some(2),
        (Some(t4), IpAddr::V6(l6)) if l6.to_ipv4_mapped() == Some(t4) => Some(3),
        (Some(_), IpAddr::V6(l6)) if l6.is_unspecified() => Some(1),
        (None, IpAddr::V6(l6)) if l6 == t => Some(4),
        (None, IpAddr::V6(l6)) if l6.is_unspecified() => Some(2),
        _ => None,
    }
}

/// The listeners among `rows` that the kernel hands a connection to one of `to` to: those
/// of the best [`reach`] (several with `SO_REUSEPORT`). A listener on the same port at
/// another address (`127.0.0.2`, `::1` for an engine on `127.0.0.1`) is not among them.
pub(crate) fn reached<'a>(rows: &'a [Listening], to: &[SocketAddr]) -> Vec<&'a Listening> {
    let rank = |r: &Listening| to.iter().filter_map(|t| reach(r.local, *t)).max();
    let Some(best) = rows.iter().filter_map(rank).max() else {
        return Vec::new();
    };
    rows.iter().filter(|r| rank(r) == Some(best)).collect()
}

/// Whether a socket listening on `listener` keeps a `bind` to `bind` from succeeding: the
/// same port, and the same address or a wildcard on either side (`0.0.0.0` against any IPv4
/// address; `::`, dual-stack as `std` binds it, against any address).
pub(crate) fn conflicts(listener: SocketAddr, bind: SocketAddr) -> bool {
    if listener.port() != bind.port() {
        return false;
    }
    let (l, b) = (listener.ip(), bind.ip());
    let any_v6 = |ip: IpAddr| matches!(ip, IpAddr::V6(a) if a.is_unspecified());
    if any_v6(l) || any_v6(b) {
        return true;
    }
    match (as_v4(l), as_v4(b)) {
        (Some(l4), Some(b4)) => l4 == b4 || l4.is_unspecified() || b4.is_unspecified(),
        (None, None) => l == b,
        _ => false,
    }
}

/// Rows as the kernel prints them, for the tests of this module and of its users.
#[cfg(test)]
pub(crate) mod test_rows {
    use std::net::{IpAddr, SocketAddr};

    /// A `net/tcp` row, for `local` (as [`hex`] gives it) in state `st`.
    pub(crate) fn row(local: &str, st: &str, uid: u32, inode: u64) -> String {
        format!(
            "   0: {local} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {inode} 1 0000000000000000 100 0 0 10 0"
        )
    }

    /// `a` as the kernel prints it in `net/tcp` or `net/tcp6`.
    pub(crate) fn hex(a: SocketAddr) -> String {
        let bytes = match a.ip() {
            IpAddr::V4(v) => v.octets().to_vec(),
            IpAddr::V6(v) => v.octets().to_vec(),
        };
        let words: String = bytes
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes(w.try_into().unwrap())))
            .collect();
        format!("{words}:{:04X}", a.port())
    }

    /// The `net/tcp` (IPv4) and `net/tcp6` texts of listeners `(address, uid, inode)`.
    pub(crate) fn tables(listeners: &[(&str, u32, u64)]) -> (String, String) {
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let (mut v4, mut v6) = (header.to_owned(), header.to_owned());
        for (a, uid, inode) in listeners {
            let a: SocketAddr = a.parse().unwrap();
            let text = if a.is_ipv4() { &mut v4 } else { &mut v6 };
            text.push_str(&row(&hex(a), "0A", *uid, *inode));
            text.push('\n');
        }
        (v4, v6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    use super::test_rows::{hex, row};

    #[test]
    fn a_listening_row_names_its_address_uid_and_inode() {
        let rows = [
            (
                "127.0.0.1:8000",
                "0A",
                Some(("127.0.0.1:8000", 1000, 12345)),
            ),
            ("0.0.0.0:9001", "0A", Some(("0.0.0.0:9001", 1000, 12345))),
            ("[::1]:8000", "0A", Some(("[::1]:8000", 1000, 12345))),
            ("[::]:8000", "0A", Some(("[::]:8000", 1000, 12345))),
            (
                "[::ffff:127.0.0.1]:8000",
                "0A",
                Some(("[::ffff:127.0.0.1]:8000", 1000, 12345)),
            ),
            ("127.0.0.1:8000", "01", None),
            ("127.0.0.1:8000", "06", None),
        ];
        for (local, st, want) in rows {
            let got = tcp_listening(&row(&hex(addr(local)), st, 1000, 12345));
            let want = want.map(|(l, uid, inode)| Listening {
                local: addr(l),
                uid,
                inode,
            });
            assert_eq!(got, want, "{local} {st}");
        }
    }

    #[test]
    fn a_row_that_is_not_one_is_skipped_without_a_panic() {
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
        let good = row("0100007F:1F40", "0A", 0, 7);
        let cut = &good[..good.len() / 2];
        let rows = [
            header,
            "",
            "   ",
            cut,
            "   0: 0100007F 00000000:0000 0A 0 0 0 0 0 7",
            "   0: 0100007F:XYZW 00000000:0000 0A 0 0 0 0 0 7",
            "   0: 0100007:1F40 00000000:0000 0A 0 0 0 0 0 7",
            "   0: 0100007F:1F40 00000000:0000 0A 0 0 0 notauid 0 7",
            "   0: 0100007F:1F40 00000000:0000 0A 0 0 0 0 0 -7",
            "   0: 0100007F:1F400 00000000:0000 0A 0 0 0 0 0 7",
            "   0: é100007F:1F40 00000000:0000 0A 0 0 0 0 0 7",
            "   0: 0000000000000000000000000100000é:1F40 0 0A 0 0 0 0 0 7",
        ];
        for r in rows {
            assert_eq!(tcp_listening(r), None, "{r:?}");
        }
        assert!(tcp_listening(&good).is_some());
    }

    #[test]
    fn a_listening_unix_row_names_its_path() {
        let rows = [
            (
                "0000000000000000: 00000002 00000000 00010000 0001 01 4242 /run/npu-health-agent/handover.sock",
                Some((4242, "/run/npu-health-agent/handover.sock")),
            ),
            (
                "0000000000000000: 00000002 00000000 00010000 0001 01 4243 /tmp/a dir/handover.sock",
                Some((4243, "/tmp/a dir/handover.sock")),
            ),
            // Connected, not listening.
            (
                "0000000000000000: 00000003 00000000 00000000 0001 03 4244 /run/x.sock",
                None,
            ),
            // Abstract and unnamed sockets have no file.
            (
                "0000000000000000: 00000002 00000000 00010000 0001 01 4245 @/tmp/.X11-unix/X0",
                None,
            ),
            (
                "0000000000000000: 00000002 00000000 00010000 0001 01 4246",
                None,
            ),
            (
                "Num       RefCount Protocol Flags    Type St Inode Path",
                None,
            ),
            ("", None),
            (
                "0000000000000000: 00000002 00000000 zz 0001 01 4247 /x",
                None,
            ),
            (
                "0000000000000000: 00000002 00000000 00010000 0001 01 -1 /x",
                None,
            ),
        ];
        for (r, want) in rows {
            let want = want.map(|(inode, p)| UnixListening {
                inode,
                path: PathBuf::from(p),
            });
            assert_eq!(unix_listening(r), want, "{r:?}");
        }
    }

    // Which listener the kernel hands a connection to: R1 of issue 48 watched a process on
    // 127.0.0.2 or ::1 with the engine's port, which never receives the agent's connections.
    #[test]
    fn a_connection_reaches_the_exact_address_first_then_a_wildcard() {
        let rows = [
            // (listener, target, rank)
            ("127.0.0.1:8000", "127.0.0.1:8000", Some(4)),
            ("[::ffff:127.0.0.1]:8000", "127.0.0.1:8000", Some(3)),
            ("0.0.0.0:8000", "127.0.0.1:8000", Some(2)),
            ("[::]:8000", "127.0.0.1:8000", Some(1)),
            ("127.0.0.2:8000", "127.0.0.1:8000", None),
            ("[::1]:8000", "127.0.0.1:8000", None),
            ("127.0.0.1:8001", "127.0.0.1:8000", None),
            ("0.0.0.0:8001", "127.0.0.1:8000", None),
            ("[::1]:8000", "[::1]:8000", Some(4)),
            ("[::]:8000", "[::1]:8000", Some(2)),
            ("0.0.0.0:8000", "[::1]:8000", None),
            ("127.0.0.1:8000", "[::1]:8000", None),
            ("[::2]:8000", "[::1]:8000", None),
            ("127.0.0.1:8000", "[::ffff:127.0.0.1]:8000", Some(4)),
            ("10.0.0.5:8000", "10.0.0.5:8000", Some(4)),
            ("0.0.0.0:8000", "10.0.0.5:8000", Some(2)),
        ];
        for (l, t, want) in rows {
            assert_eq!(reach(addr(l), addr(t)), want, "{l} → {t}");
        }
    }

    #[test]
    fn the_engine_is_the_best_reached_listener_never_one_at_another_address() {
        let l = |a: &str, inode| Listening {
            local: addr(a),
            uid: 0,
            inode,
        };
        let engine = [addr("127.0.0.1:8000")];
        let table = |rows: &[Listening]| -> Vec<u64> {
            reached(rows, &engine).iter().map(|r| r.inode).collect()
        };
        // An impostor on another loopback address or on ::1, beside the engine.
        let rows = [
            l("127.0.0.2:8000", 1),
            l("[::1]:8000", 2),
            l("127.0.0.1:8000", 3),
        ];
        assert_eq!(table(&rows), [3]);
        // The engine on the wildcard, reached at 127.0.0.1.
        let rows = [
            l("127.0.0.2:8000", 1),
            l("[::1]:8000", 2),
            l("0.0.0.0:8000", 3),
        ];
        assert_eq!(table(&rows), [3]);
        // Only impostors: nothing is the engine.
        let rows = [l("127.0.0.2:8000", 1), l("[::1]:8000", 2)];
        assert_eq!(table(&rows), Vec::<u64>::new());
        // SO_REUSEPORT: two sockets at the same address are both the engine's.
        let rows = [l("127.0.0.1:8000", 1), l("127.0.0.1:8000", 2)];
        assert_eq!(table(&rows), [1, 2]);
        // The exact address wins over the wildcard (the kernel hands it the connection).
        let rows = [l("0.0.0.0:8000", 1), l("127.0.0.1:8000", 2)];
        assert_eq!(table(&rows), [2]);
        // A name resolved to both families: a listener on either is reached.
        let both = [addr("127.0.0.1:8000"), addr("[::1]:8000")];
        let rows = [l("[::1]:8000", 1), l("127.0.0.2:8000", 2)];
        let got: Vec<u64> = reached(&rows, &both).iter().map(|r| r.inode).collect();
        assert_eq!(got, [1]);
    }

    // What check-config asks of a port in use: which listener keeps `run` from binding.
    #[test]
    fn a_bind_conflicts_with_the_same_address_or_a_wildcard_of_either_side() {
        let rows = [
            // (listener, bind, conflicts)
            ("127.0.0.1:9001", "127.0.0.1:9001", true),
            ("0.0.0.0:9001", "127.0.0.1:9001", true),
            ("127.0.0.1:9001", "0.0.0.0:9001", true),
            ("127.0.0.2:9001", "127.0.0.1:9001", false),
            ("127.0.0.2:9001", "0.0.0.0:9001", true),
            ("127.0.0.1:9002", "127.0.0.1:9001", false),
            ("[::]:9001", "127.0.0.1:9001", true),
            ("[::]:9001", "0.0.0.0:9001", true),
            ("127.0.0.1:9001", "[::]:9001", true),
            ("[::1]:9001", "[::]:9001", true),
            ("[::1]:9001", "127.0.0.1:9001", false),
            ("127.0.0.1:9001", "[::1]:9001", false),
            ("0.0.0.0:9001", "[::1]:9001", false),
            ("[::1]:9001", "[::1]:9001", true),
            ("[::2]:9001", "[::1]:9001", false),
            ("[::ffff:127.0.0.1]:9001", "127.0.0.1:9001", true),
            ("[::ffff:127.0.0.1]:9001", "0.0.0.0:9001", true),
            ("[::ffff:127.0.0.2]:9001", "127.0.0.1:9001", false),
        ];
        for (l, b, want) in rows {
            assert_eq!(
                conflicts(addr(l), addr(b)),
                want,
                "{l} against a bind of {b}"
            );
        }
    }
}
