//! A TCP proxy that adds latency: every client of the engine (the load and the agent)
//! connects through it, and during a `network_latency_<N>ms` fault each chunk read from either
//! side is delivered N later. Chunks are pipelined (a chunk read while another waits is not
//! delayed twice), as a slow link would. The latency can change at any time. A jitter adds a
//! random delay, up to its value, to each chunk from the engine (`batch_jitter_<N>ms` on a
//! real engine: token events arrive unevenly, in order).
//!
//! A closed port stays a closed port: when the engine refuses a connection (it crashed, or
//! restarts), the proxy closes its own listener until the engine accepts again, so its
//! clients see the refusal the engine gives, not an accepted connection that closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Handle to a running proxy.
#[derive(Debug, Clone)]
pub struct Proxy {
    latency_us: Arc<AtomicU64>,
    jitter_us: Arc<AtomicU64>,
    /// Where clients connect.
    pub addr: SocketAddr,
}

impl Proxy {
    /// Listens on `listen` and forwards to `upstream` until `cancel`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        cancel: CancellationToken,
    ) -> std::io::Result<Proxy> {
        let mut listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let latency_us = Arc::new(AtomicU64::new(0));
        let jitter_us = Arc::new(AtomicU64::new(0));
        let (lat, jit) = (latency_us.clone(), jitter_us.clone());
        let refused = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = refused.notified() => {
                        drop(listener);
                        match reopen_when_up(addr, upstream, &cancel).await {
                            Some(l) => listener = l,
                            None => return,
                        }
                        continue;
                    }
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(_) => continue,
                    },
                };
                let (lat, jit, cancel) = (lat.clone(), jit.clone(), cancel.clone());
                let refused = refused.clone();
                tokio::spawn(async move {
                    let server = match TcpStream::connect(upstream).await {
                        Ok(s) => s,
                        Err(e) => {
                            // The engine's port is closed: so is ours, until it opens.
                            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                                refused.notify_one();
                            }
                            return;
                        }
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = pipe(cr, sw, lat.clone(), None) => {}
                        _ = pipe(sr, cw, lat, Some(jit)) => {}
                    }
                });
            }
        });
        Ok(Proxy {
            latency_us,
            jitter_us,
            addr,
        })
    }

    /// Sets the added one-way latency (zero: none).
    pub fn set_latency(&self, d: Duration) {
        self.latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets the largest random delay added to each chunk from the engine (zero: none).
    pub fn set_jitter(&self, d: Duration) {
        self.jitter_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Waits until `upstream` accepts a connection again (polled every 10 ms), then listens on
/// `addr` again; `None` when cancelled first or the address cannot be taken back.
async fn reopen_when_up(
    addr: SocketAddr,
    upstream: SocketAddr,
    cancel: &CancellationToken,
) -> Option<TcpListener> {
    loop {
        if TcpStream::connect(upstream).await.is_ok() {
            return TcpListener::bind(addr).await.ok();
        }
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
}

/// Copies `from` to `to`, each chunk delivered `latency` (plus up to `jitter`) after it was
/// read, in order.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency_us: Arc<AtomicU64>,
    jitter_us: Option<Arc<AtomicU64>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(256);
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        // xorshift: enough randomness for a jitter.
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let mut delay = latency_us.load(Ordering::Relaxed);
                    if let Some(j) = jitter_us.as_ref().map(|j| j.load(Ordering::Relaxed))
                        && j > 0
                    {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        delay += rng % (j + 1);
                    }
                    let due = Instant::now() + Duration::from_micros(delay);
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> Duration {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let t = Instant::now();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        t.elapsed()
    }

    // Bytes pass through unchanged; with latency L each direction adds L (paused clock: exact).
    #[tokio::test(start_paused = true)]
    async fn forwards_and_delays_both_directions() {
        let upstream = echo_server().await;
        let cancel = CancellationToken::new();
        let p = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream, cancel.clone())
            .await
            .unwrap();
        assert!(round_trip(p.addr).await < Duration::from_millis(5));
        p.set_latency(Duration::from_millis(100));
        let rt = round_trip(p.addr).await;
        assert!(
            rt >= Duration::from_millis(200) && rt < Duration::from_millis(210),
            "{rt:?}"
        );
        p.set_latency(Duration::ZERO);
        assert!(round_trip(p.addr).await < Duration::from_millis(5));
        cancel.cancel();
    }

    // Upstream down: the client's connection is closed, nothing hangs, and the proxy refuses
    // new connections until the upstream listens again.
    #[tokio::test]
    async fn upstream_down_closes_the_client() {
        // The engine's port is held by a socket bound without listening: a connection to it
        // is refused, and no other process can take it, as it could a port bound and released
        // (the proxy then forwarded to that process and stayed open: 1 of 3 suite runs under
        // load).
        let engine = tokio::net::TcpSocket::new_v4().unwrap();
        engine.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let free = engine.local_addr().unwrap();
        // The proxy's own port from below the ephemeral range, which no `:0` listener or
        // outgoing connection takes while the proxy has it closed.
        let [port] = fake_engine::launch::free_ports::<1>().unwrap();
        let cancel = CancellationToken::new();
        let p = Proxy::start(
            format!("127.0.0.1:{port}").parse().unwrap(),
            free,
            cancel.clone(),
        )
        .await
        .unwrap();
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("closed promptly")
            .unwrap_or(0);
        assert_eq!(n, 0);
        // From then on the proxy's port is closed too, as the engine's is …
        tokio::time::sleep(Duration::from_millis(50)).await;
        let e = TcpStream::connect(p.addr).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        // … until the engine listens again.
        let up = engine.listen(64).unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = up.accept().await {
                let _ = c.write_all(b"x").await;
            }
        });
        let end = Instant::now() + Duration::from_secs(5);
        let mut s = loop {
            match TcpStream::connect(p.addr).await {
                Ok(s) => break s,
                Err(_) if Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("the proxy did not listen again: {e}"),
            }
        };
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((n, buf[0]), (1, b'x'));
        cancel.cancel();
    }
}
