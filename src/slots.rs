//! Connection slots, shared fairly: every listener of the agent (the HTTP listeners of
//! [`crate::server::conn`] and HAProxy's agent check,
//! [`crate::integrations::haproxy::listener`]) holds at most its cap of connections, and one
//! source (an IPv4 address, an IPv6 /64) at most a share of it ([`share`]), as HAProxy's
//! `src_conn_cur` limits do. A new connection from a source at its share closes that
//! source's own least recently active idle connection, so a flood from one address never
//! costs another address a slot; a new connection at the cap closes an idle one of the
//! source holding the most ([`room`], [`victim`]). Within the source that pays, a connection
//! accepted less than 250 ms ago that has sent no request yet goes last, after every older
//! idle one; among the rest, one whose peer never sent a byte goes before one that did; then
//! the least recently active. If every connection that could pay is inside a handler, the
//! new one is closed instead.
//!
//! Each listener keeps a [`Registry`] of its connections, each connection an [`Activity`]
//! that its own loop stamps; the rule itself is the pure [`room`] and [`victim`].

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Milliseconds since the first call (a process-wide monotonic clock for activity stamps).
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// No request head is awaited (one is inside the handler).
pub(crate) const NO_HEAD: u64 = u64::MAX;

/// How long a new connection is spared by the cap while it has sent no request: long enough
/// for a TLS handshake and a request head on a loaded host. A flood of idle connections
/// older than this goes first, so a Node Manager poll that just connected is answered.
const FRESH_GRACE_MS: u64 = 250;

/// The fewest connections one source may hold whatever the cap ([`share`]): a client's pool
/// of keep-alive connections, and a few polls beside it.
const MIN_SHARE: usize = 8;

/// The connections one source may hold under `cap`: a quarter of it, at least [`MIN_SHARE`]
/// (all of a cap smaller than that). A quarter leaves three quarters to the others when one
/// source floods, and is far more than a poller holds (Node Manager, Prometheus and the
/// kubelet each keep a few at most).
pub(crate) fn share(cap: usize) -> usize {
    (cap / 4).max(MIN_SHARE).min(cap)
}

/// Who holds a connection, for [`share`]: the peer's IPv4 address, or its IPv6 /64 (one host
/// takes new addresses in its /64 at will; an IPv4 peer on a dual-stack socket is IPv4).
pub(crate) fn source(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & !(u64::MAX as u128))),
        v4 => v4,
    }
}

/// What a connection is doing, read by the accept loop when it must make room and by the
/// connection's own watchdog.
#[derive(Debug)]
pub(crate) struct Activity {
    /// [`now_ms`] of the last byte read or written.
    pub(crate) last_ms: AtomicU64,
    /// Requests inside the handler now.
    pub(crate) busy: AtomicU32,
    /// Requests that reached the handler on this connection so far.
    pub(crate) requests: AtomicU64,
    /// Since when the next request head is awaited ([`now_ms`]; [`NO_HEAD`]: not now): from
    /// the accept, then from the end of each answer (its last byte written).
    pub(crate) head_since_ms: AtomicU64,
    /// [`now_ms`] of the accept.
    pub(crate) opened_ms: u64,
    /// The peer has sent at least one byte (a TLS `ClientHello`, a request head).
    pub(crate) heard: AtomicBool,
}

impl Default for Activity {
    fn default() -> Self {
        let now = now_ms();
        Activity {
            last_ms: AtomicU64::new(now),
            busy: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(now),
            opened_ms: now,
            heard: AtomicBool::new(false),
        }
    }
}

impl Activity {
    /// Accepted less than [`FRESH_GRACE_MS`] ago and no request yet: a poll on its way in
    /// (its TLS handshake, its request head), spared while an older idle connection exists.
    pub(crate) fn fresh(&self, now: u64) -> bool {
        self.requests.load(Ordering::Relaxed) == 0
            && now.saturating_sub(self.opened_ms) < FRESH_GRACE_MS
    }

    pub(crate) fn touch(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// A byte came from the peer.
    pub(crate) fn heard(&self) {
        self.heard.store(true, Ordering::Relaxed);
        self.touch();
    }

    /// An answer is being written: the wait for the next head starts after it.
    pub(crate) fn wrote(&self) {
        let now = now_ms();
        self.last_ms.store(now, Ordering::Relaxed);
        if self.head_since_ms.load(Ordering::Relaxed) != NO_HEAD {
            self.head_since_ms.store(now, Ordering::Relaxed);
        }
    }
}

/// One connection as the registry sees it.
#[derive(Debug)]
pub(crate) struct Registered {
    activity: Arc<Activity>,
    shed: CancellationToken,
    /// [`source`] of its peer.
    source: IpAddr,
}

/// The connections of one listener.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: u64,
    conns: HashMap<u64, Registered>,
    /// Connections held by each [`source`].
    held: HashMap<IpAddr, usize>,
}

/// A connection as [`victim`] weighs it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u64,
    /// [`Activity::last_ms`].
    last_ms: u64,
    /// Requests in the handler now.
    busy: u32,
    /// [`Activity::fresh`].
    fresh: bool,
    /// The peer has sent a byte.
    heard: bool,
    /// Connections its source holds.
    held: usize,
    /// Its source is the new connection's.
    same_source: bool,
}

/// The connection to close to make room, among those with no request in their handler: one
/// of the source holding the most, and within it not a fresh one ([`Activity::fresh`]) while
/// any other exists, then one whose peer never sent a byte before one that did, then the
/// least recently active (ties: the older id). `None` when every connection is busy.
fn victim(conns: impl Iterator<Item = Candidate>) -> Option<u64> {
    conns
        .filter(|c| c.busy == 0)
        .min_by_key(|c| (Reverse(c.held), c.fresh, c.heard, c.last_ms, c.id))
        .map(|c| c.id)
}

/// Which limit a new connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Its source holds its [`share`].
    Share,
    /// The listener holds `max_connections`.
    Cap,
}

/// What the accept loop does with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// It fits.
    Fits,
    /// Close this connection to make room.
    Close(u64, Limit),
    /// Every connection that could make room is busy: close the new one.
    Refuse(Limit),
}

/// Room for a new connection whose source holds `own` of the listener's `total` under `cap`,
/// given the connections held (`conns`): a source at its [`share`] pays with one of its own,
/// the cap is paid by the source holding the most ([`victim`]).
fn room(conns: impl Iterator<Item = Candidate>, own: usize, total: usize, cap: usize) -> Room {
    let limit = if own >= share(cap) {
        Limit::Share
    } else if total >= cap {
        Limit::Cap
    } else {
        return Room::Fits;
    };
    let pick = match limit {
        Limit::Share => victim(conns.filter(|c| c.same_source)),
        Limit::Cap => victim(conns),
    };
    pick.map_or(Room::Refuse(limit), |id| Room::Close(id, limit))
}

impl Registry {
    /// The connections as [`room`] weighs them, for a new one from `from` (none: an accept
    /// error, no new connection). Lazy: most accepts fit and read none of it.
    fn candidates(&self, from: Option<IpAddr>) -> impl Iterator<Item = Candidate> + '_ {
        let now = now_ms();
        self.conns.iter().map(move |(&id, e)| Candidate {
            id,
            last_ms: e.activity.last_ms.load(Ordering::Relaxed),
            busy: e.activity.busy.load(Ordering::Relaxed),
            fresh: e.activity.fresh(now),
            heard: e.activity.heard.load(Ordering::Relaxed),
            held: self.held.get(&e.source).copied().unwrap_or(0),
            same_source: Some(e.source) == from,
        })
    }

    /// Makes room for a connection from `from` under `cap`: closes the connection [`room`]
    /// picks, if any.
    pub(crate) fn admit(&mut self, from: IpAddr, cap: usize) -> Room {
        let own = self.held.get(&from).copied().unwrap_or(0);
        let r = room(self.candidates(Some(from)), own, self.conns.len(), cap);
        if let Room::Close(id, _) = r {
            self.shed(id);
        }
        r
    }

    /// Closes an idle connection of the source holding the most; false when there is none.
    pub(crate) fn shed_one(&mut self) -> bool {
        match victim(self.candidates(None)) {
            Some(id) => {
                self.shed(id);
                true
            }
            None => false,
        }
    }

    fn shed(&mut self, id: u64) {
        if let Some(e) = self.remove(id) {
            e.shed.cancel();
        }
    }

    pub(crate) fn insert(
        &mut self,
        source: IpAddr,
        activity: Arc<Activity>,
        shed: CancellationToken,
    ) -> u64 {
        let id = self.next;
        self.next += 1;
        *self.held.entry(source).or_default() += 1;
        self.conns.insert(
            id,
            Registered {
                activity,
                shed,
                source,
            },
        );
        id
    }

    /// Forgets connection `id` (closed, or shed earlier: then nothing).
    pub(crate) fn remove(&mut self, id: u64) -> Option<Registered> {
        let e = self.conns.remove(&id)?;
        if let Some(n) = self.held.get_mut(&e.source) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&e.source);
            }
        }
        Some(e)
    }
}

impl Room {
    /// Logs what making room cost the listener `listener` under `cap`; whether the new
    /// connection is kept (not when every connection that could pay is in a handler).
    pub(crate) fn keeps_new(self, listener: &str, cap: usize) -> bool {
        let share = share(cap);
        match self {
            Room::Fits => {}
            Room::Close(_, Limit::Share) => tracing::warn!(
                listener,
                "{share} connections from one source (its share of the cap of {cap}): closed its least recently active idle one"
            ),
            Room::Close(_, Limit::Cap) => tracing::warn!(
                listener,
                "{cap} connections (the cap): closed the least recently active idle one of the source holding the most"
            ),
            Room::Refuse(limit) => {
                let held = match limit {
                    Limit::Share => format!(
                        "{share} connections from one source (its share of the cap of {cap})"
                    ),
                    Limit::Cap => format!("{cap} connections (the cap)"),
                };
                tracing::warn!(listener, "{held}, all inside a handler: closed the new one");
                return false;
            }
        }
        true
    }
}

/// Decrements `busy` when the handler's future ends (or is dropped).
pub(crate) struct BusyGuard(Arc<Activity>);

impl BusyGuard {
    /// A request head arrived whole: it is in the handler, no head is awaited.
    pub(crate) fn enter(a: &Arc<Activity>) -> BusyGuard {
        a.busy.fetch_add(1, Ordering::Relaxed);
        a.requests.fetch_add(1, Ordering::Relaxed);
        a.head_since_ms.store(NO_HEAD, Ordering::Relaxed);
        BusyGuard(Arc::clone(a))
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.head_since_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// The registry, whoever panicked holding it.
pub(crate) fn lock(r: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_victim_is_the_least_recently_active_idle_connection() {
        // (id, last activity, busy, fresh, heard)
        let v = |cs: &[(u64, u64, u32, bool, bool)]| {
            victim(
                cs.iter()
                    .map(|&(id, last_ms, busy, fresh, heard)| Candidate {
                        id,
                        last_ms,
                        busy,
                        fresh,
                        heard,
                        held: 1,
                        same_source: false,
                    }),
            )
        };
        assert_eq!(
            v(&[
                (1, 50, 0, false, true),
                (2, 10, 0, false, true),
                (3, 5, 1, false, true)
            ]),
            Some(2)
        );
        assert_eq!(
            v(&[(7, 10, 0, false, true), (3, 10, 0, false, true)]),
            Some(3)
        );
        assert_eq!(v(&[(1, 5, 1, false, true), (2, 1, 2, false, true)]), None);
        assert_eq!(v(&[]), None);
        // A fresh connection (a poll in its handshake) is spared while an older idle one
        // exists, however recently that one moved a byte; among fresh ones only, the usual
        // order.
        assert_eq!(
            v(&[(9, 1, 0, true, true), (4, 80, 0, false, true)]),
            Some(4)
        );
        assert_eq!(v(&[(9, 3, 0, true, true), (8, 2, 0, true, true)]), Some(8));
        // A peer that never sent a byte goes before one that did, however much longer ago
        // that one was active: at the start of a flood every connection is fresh, and a
        // poll that has begun its TLS handshake is older than the silent ones behind it.
        assert_eq!(v(&[(1, 2, 0, true, true), (2, 9, 0, true, false)]), Some(2));
        assert_eq!(
            v(&[(1, 2, 0, false, true), (2, 9, 0, false, false)]),
            Some(2)
        );
        // Freshness first: a silent connection just accepted outlasts an idle talker.
        assert_eq!(
            v(&[(1, 2, 0, false, true), (2, 9, 0, true, false)]),
            Some(1)
        );
    }

    // Fair slots (issue 41): one source cannot hold every slot. A source at its share pays
    // with its own connection, whatever the others' age; the cap is paid by the source
    // holding the most; a new peer's connection in its handshake is never the one closed.
    #[test]
    fn a_source_at_its_share_or_the_biggest_at_the_cap_makes_room() {
        // (id, last activity, busy, fresh, heard, held by its source, same source as the new)
        type Row = (u64, u64, u32, bool, bool, usize, bool);
        let room_for = |cs: &[Row], own: usize, cap: usize| {
            room(
                cs.iter().map(
                    |&(id, last_ms, busy, fresh, heard, held, same_source)| Candidate {
                        id,
                        last_ms,
                        busy,
                        fresh,
                        heard,
                        held,
                        same_source,
                    },
                ),
                own,
                cs.len(),
                cap,
            )
        };
        let flood = |from: u64, n: u64, held: usize, same: bool| -> Vec<Row> {
            (from..from + n)
                .map(|id| (id, 100 + id, 0, true, false, held, same))
                .collect()
        };
        // Cap 16, share 8. The flooder holds 8 young silent connections, a poll from another
        // source (id 1) is older, silent so far, and fresh: the flooder's next one closes the
        // flooder's own oldest (id 10), not the poll.
        let mut conns = vec![(1, 50, 0, true, false, 1, false)];
        conns.extend(flood(10, 8, 8, true));
        assert_eq!(room_for(&conns, 8, 16), Room::Close(10, Limit::Share));
        // All of the flooder's busy: its new one is refused; the poll stays.
        let busy: Vec<Row> = conns
            .iter()
            .map(|&(id, l, _, f, h, n, same)| (id, l, u32::from(same), f, h, n, same))
            .collect();
        assert_eq!(room_for(&busy, 8, 16), Room::Refuse(Limit::Share));
        // Below its share and below the cap: it fits.
        assert_eq!(room_for(&conns[..5], 4, 16), Room::Fits);
        // At the cap (8) with the flood at 7 (share 8): a new source's connection closes the
        // flooder's oldest, not the other source's fresh one nor its own.
        let mut full = vec![(1, 50, 0, true, true, 1, false)];
        full.extend(flood(10, 7, 7, false));
        assert_eq!(room_for(&full, 0, 8), Room::Close(10, Limit::Cap));
        // The source holding the most pays even with a young connection, before an old idle
        // one of a source holding fewer.
        let mixed = [
            (1, 1, 0, false, true, 2, false),
            (2, 2, 0, false, true, 2, false),
            (3, 90, 0, true, true, 3, false),
            (4, 91, 0, true, true, 3, false),
            (5, 92, 0, true, true, 3, false),
        ];
        assert_eq!(room_for(&mixed, 0, 5), Room::Close(3, Limit::Cap));
        // Every source holding one: the order within a source decides (the oldest idle).
        let even = [
            (1, 30, 0, false, true, 1, false),
            (2, 10, 0, false, true, 1, false),
            (3, 5, 0, true, false, 1, false),
        ];
        assert_eq!(room_for(&even, 0, 3), Room::Close(2, Limit::Cap));
    }

    #[test]
    fn a_share_is_a_quarter_of_the_cap_at_least_eight_and_a_source_is_an_address_or_a_64() {
        let shares: Vec<usize> = [4, 8, 16, 32, 256, 1000].map(share).to_vec();
        assert_eq!(shares, [4, 8, 8, 8, 64, 250]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(source(ip("10.0.0.5")), ip("10.0.0.5"));
        assert_eq!(source(ip("::ffff:10.0.0.5")), ip("10.0.0.5"));
        assert_eq!(
            source(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            ip("2001:db8:1:2::")
        );
        assert_ne!(source(ip("2001:db8:1:3::1")), source(ip("2001:db8:1:2::1")));
    }

    #[test]
    fn shedding_cancels_and_forgets_the_victim() {
        let mut reg = Registry::default();
        let mut tokens = Vec::new();
        let from: IpAddr = [127, 0, 0, 1].into();
        for (last, busy) in [(30u64, 0u32), (10, 0), (1, 1)] {
            let activity = Arc::new(Activity::default());
            activity.last_ms.store(last, Ordering::Relaxed);
            activity.busy.store(busy, Ordering::Relaxed);
            let shed = CancellationToken::new();
            tokens.push(shed.clone());
            reg.insert(from, activity, shed);
        }
        assert_eq!(reg.held[&from], 3);
        assert!(reg.shed_one());
        assert!(tokens[1].is_cancelled() && !tokens[0].is_cancelled());
        assert!(reg.shed_one());
        assert!(tokens[0].is_cancelled());
        assert!(!reg.shed_one(), "the busy one stays");
        assert!(!tokens[2].is_cancelled());
        assert_eq!(reg.held[&from], 1, "the shed ones are no longer held");
        assert!(
            reg.remove(1).is_none(),
            "a shed one's own end forgets nothing twice"
        );
        assert_eq!(reg.held[&from], 1);
        reg.remove(2);
        assert!(reg.held.is_empty());
    }
}
