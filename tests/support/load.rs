//! Streaming load for end-to-end tests: `threads` clients, each sending `tokens`-token SSE
//! completions back to back over real HTTP, started `stagger` apart so their phases stay
//! spread out.

use super::stack::http;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A running load.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u32>>,
}

impl Load {
    /// Starts the clients against `base` (`http://host:port`) asking `model` for `tokens`
    /// tokens per stream (`ignore_eos`, so a real engine produces them all).
    pub fn start(base: &str, model: &str, threads: usize, tokens: u32, stagger: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("{base}/v1/completions");
        let body = format!(
            r#"{{"model": "{model}", "prompt": "a long prompt for the load", "max_tokens": {tokens}, "ignore_eos": true, "stream": true}}"#
        );
        let threads = (0..threads)
            .map(|i| {
                let (stop, url, body) = (stop.clone(), url.clone(), body.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(stagger * i as u32);
                    let mut done = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if http("POST", &url, Some(&body))
                            .is_some_and(|(c, b)| c == 200 && b.contains("[DONE]"))
                        {
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the clients; the streams completed.
    pub fn stop(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|h| h.join().unwrap()).sum()
    }
}
