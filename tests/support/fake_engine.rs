//! The fake engine in the test's own runtime, on free loopback ports, until dropped.

use fake_engine::engine::{EngineOptions, run};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A running fake engine.
pub struct FakeEngine {
    /// `http://127.0.0.1:<port>` of its inference surface.
    pub base: String,
    pub port: u16,
    /// `http://127.0.0.1:<port>` of its fault-control surface.
    pub control: String,
    cancel: CancellationToken,
}

impl FakeEngine {
    /// Starts it with `opts` (its addresses replaced by free ports) and waits until
    /// `/health` answers.
    pub async fn start(opts: EngineOptions) -> FakeEngine {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let [port, control] = super::stack::free_ports::<2>();
        let cancel = CancellationToken::new();
        let opts = EngineOptions {
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            control: format!("127.0.0.1:{control}").parse().unwrap(),
            ..opts
        };
        tokio::spawn(run(opts, cancel.clone()));
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..200 {
            if client.get(format!("{base}/health")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        FakeEngine {
            base,
            port,
            control: format!("http://127.0.0.1:{control}"),
            cancel,
        }
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
