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
    threads: Vec<std::thread::JoinHandle<(u32, Duration)>>,
}

/// What the clients saw.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Streams completed (`[DONE]` read).
    pub done: u32,
    /// The longest attempt, completed or not (the client's read timeout is 10 s).
    pub worst: Duration,
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
                    let (mut done, mut worst) = (0, Duration::ZERO);
                    while !stop.load(Ordering::Relaxed) {
                        let t = std::time::Instant::now();
                        if http("POST", &url, Some(&body))
                            .is_some_and(|(c, b)| c == 200 && b.contains("[DONE]"))
                        {
                            done += 1;
                        }
                        worst = worst.max(t.elapsed());
                    }
                    (done, worst)
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the clients; the streams completed.
    pub fn stop(self) -> u32 {
        self.stop_seen().done
    }

    /// Stops the clients; what they saw.
    pub fn stop_seen(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|h| h.join().unwrap()).fold(
            Seen {
                done: 0,
                worst: Duration::ZERO,
            },
            |s, (d, w)| Seen {
                done: s.done + d,
                worst: s.worst.max(w),
            },
        )
    }
}
