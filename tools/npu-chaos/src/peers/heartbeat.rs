//! `token-heartbeat`: gonka-ai/gonka PR #1421's runner heartbeat (carried on by #1531 and the
//! reviewed #1533, `mlnode` `runner.py`, closed unmerged), which reads vLLM's step counter
//! instead of `/health`.
//!
//! - Each check scrapes `/metrics` with a 3 s timeout and reads
//!   `vllm:iteration_tokens_total_count` (summed over the series), `vllm:num_requests_running`
//!   and `vllm:num_requests_waiting` (the largest).
//! - A refused connection is dead at once; a timeout or another error (an HTTP error status
//!   included) is unknown: no progress seen, left to the grace.
//! - Until one complete scrape is seen the engine is unhealthy; that scrape is the baseline.
//! - Idle (nothing running or waiting) or a moved counter is alive, and starts the grace
//!   again. A frozen counter with work is alive within the grace (`MLNODE_HANG_GRACE_SEC`,
//!   120 s); past it each check counts one `hung`, and the third in a row
//!   (`HANG_CONSECUTIVE`) is unhealthy.
//! - The cadence: `runner.py` polls `is_available` every `WAIT_FOR_SERVER_CHECK_INTERVAL`
//!   (3 s) while it waits for the server; the cadence of its callers afterwards is not in
//!   the PR. The runner uses the same 3 s.
//! - Unhealthy is the kill (the runner restarts vLLM).

use super::probe::{self, Failure, ProbeLog};
use std::time::Duration;
use tokio::time::Instant;

/// The scrape's timeout.
pub(super) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(3);
/// `MLNODE_HANG_GRACE_SEC`'s default.
pub(super) const GRACE: Duration = Duration::from_secs(120);
/// `HANG_CONSECUTIVE`.
pub(super) const HANG_CONSECUTIVE: u32 = 3;
/// The check's cadence (see the module doc).
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(3);

/// What one scrape read (`None`: a series missing, or the scrape failed).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Reading {
    pub(super) iterations: Option<f64>,
    pub(super) running: Option<f64>,
    pub(super) waiting: Option<f64>,
}

impl Reading {
    /// All three read.
    fn complete(&self) -> Option<(f64, f64, f64)> {
        Some((self.iterations?, self.running?, self.waiting?))
    }
}

/// One scrape's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Scrape {
    Read(Reading),
    /// A timeout or another error: nothing known.
    Unknown,
    /// The connection was refused.
    Refused,
}

/// The three series read from `/metrics` text.
pub(super) fn parse(text: &str) -> Reading {
    let mut r = Reading::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        match name {
            "vllm:iteration_tokens_total_count" => {
                r.iterations = Some(r.iterations.unwrap_or(0.0) + v);
            }
            "vllm:num_requests_running" => r.running = Some(r.running.map_or(v, |m| m.max(v))),
            "vllm:num_requests_waiting" => r.waiting = Some(r.waiting.map_or(v, |m| m.max(v))),
            _ => {}
        }
    }
    r
}

/// What the heartbeat makes of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Alive,
    /// Frozen with work past the grace, this many checks in a row (below the threshold).
    Hung(u32),
    /// Unhealthy: the kill.
    Unhealthy(&'static str),
}

/// The heartbeat's memory of one engine.
#[derive(Debug, Clone, Default)]
pub(super) struct Heartbeat {
    /// The counter at the last progress, once baselined.
    counter: Option<f64>,
    last_progress: Option<Instant>,
    hung: u32,
}

impl Heartbeat {
    /// One check's verdict at `now`.
    pub(super) fn check(&mut self, scrape: Scrape, now: Instant, grace: Duration) -> Verdict {
        let reading = match scrape {
            Scrape::Refused => return Verdict::Unhealthy("connection refused: dead"),
            Scrape::Read(r) => r,
            Scrape::Unknown => Reading::default(),
        };
        let Some(counter) = self.counter else {
            return match reading.complete() {
                Some((iterations, _, _)) => {
                    self.progress(iterations, now);
                    Verdict::Alive
                }
                None => Verdict::Unhealthy("no complete first scrape"),
            };
        };
        if let Some((iterations, running, waiting)) = reading.complete()
            && ((running == 0.0 && waiting == 0.0) || iterations != counter)
        {
            self.progress(iterations, now);
            return Verdict::Alive;
        }
        let since = self.last_progress.map_or(Duration::ZERO, |t| now - t);
        if since <= grace {
            self.hung = 0;
            return Verdict::Alive;
        }
        self.hung += 1;
        if self.hung >= HANG_CONSECUTIVE {
            Verdict::Unhealthy("the step counter froze with work past the grace")
        } else {
            Verdict::Hung(self.hung)
        }
    }

    fn progress(&mut self, counter: f64, now: Instant) {
        self.counter = Some(counter);
        self.last_progress = Some(now);
        self.hung = 0;
    }
}

/// One scrape of `url`, recorded in `log` by the caller.
async fn scrape(client: &reqwest::Client, url: &str, timeout: Duration) -> (Scrape, probe::Answer) {
    let a = probe::get(client, url, timeout, true).await;
    let s = match &a.status {
        Err(Failure::Refused) => Scrape::Refused,
        Ok(200..=299) => Scrape::Read(parse(&a.body)),
        _ => Scrape::Unknown,
    };
    (s, a)
}

/// The decider: a check every [`CHECK_EVERY`] (scaled) until unhealthy; the kill time.
pub(super) async fn decide(base: String, s: f64, log: ProbeLog) -> Instant {
    let (every, timeout, grace) = (
        super::interval(CHECK_EVERY, s),
        super::timeout(SCRAPE_TIMEOUT, s),
        super::interval(GRACE, s),
    );
    let client = probe::client();
    let url = format!("{base}/metrics");
    let mut hb = Heartbeat::default();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (sc, a) = scrape(&client, &url, timeout).await;
        let v = hb.check(sc, Instant::now(), grace);
        let result = match v {
            Verdict::Alive => "alive".to_owned(),
            Verdict::Hung(n) => format!("hung {n}/{HANG_CONSECUTIVE}"),
            Verdict::Unhealthy(why) => format!("unhealthy: {why}"),
        };
        let error = match sc {
            Scrape::Read(r) if r.complete().is_none() => Some("a series is missing".to_owned()),
            Scrape::Read(_) => None,
            _ => a.error(),
        };
        log.push("/metrics", result, error, a.latency);
        if matches!(v, Verdict::Unhealthy(_)) {
            return Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(iterations: f64, running: f64, waiting: f64) -> Scrape {
        Scrape::Read(Reading {
            iterations: Some(iterations),
            running: Some(running),
            waiting: Some(waiting),
        })
    }

    /// The verdicts of checks `step` apart, from `t0`.
    fn verdicts(scrapes: &[Scrape], step: Duration) -> Vec<Verdict> {
        let t0 = Instant::now();
        let mut hb = Heartbeat::default();
        scrapes
            .iter()
            .enumerate()
            .map(|(i, s)| hb.check(*s, t0 + step * i as u32, GRACE))
            .collect()
    }

    // A counter frozen with work is alive for the whole grace, then needs 3 checks in a row
    // past it; progress in between starts everything again.
    #[test]
    fn a_frozen_counter_is_tolerated_for_the_grace_and_needs_three_in_a_row() {
        let step = Duration::from_secs(30);
        // Baseline at 0; frozen with 4 running at 30..120 s (within the grace), then past it.
        let mut s = vec![read(100.0, 4.0, 0.0); 8];
        let v = verdicts(&s, step);
        use Verdict::{Alive, Hung, Unhealthy};
        assert_eq!(&v[..5], &[Alive; 5], "0..=120 s: within the grace");
        assert_eq!(v[5], Hung(1));
        assert_eq!(v[6], Hung(2));
        assert!(matches!(v[7], Unhealthy(_)), "{v:?}");
        // Progress at the second hung check: alive, and the grace starts again.
        s[6] = read(101.0, 4.0, 0.0);
        let v = verdicts(&s, step);
        assert_eq!(&v[5..], &[Hung(1), Alive, Alive]);
    }

    // Idle (nothing running or waiting) with a frozen counter is alive however long; a
    // refused connection is dead at once; a failed scrape is left to the grace.
    #[test]
    fn idle_is_alive_refused_is_dead_and_unknown_waits_for_the_grace() {
        let step = Duration::from_secs(60);
        let idle = vec![read(5.0, 0.0, 0.0); 10];
        assert!(verdicts(&idle, step).iter().all(|v| *v == Verdict::Alive));
        let v = verdicts(&[read(5.0, 0.0, 0.0), Scrape::Refused], step);
        assert!(matches!(v[1], Verdict::Unhealthy(_)), "{v:?}");
        let unknown = [
            read(5.0, 0.0, 0.0),
            Scrape::Unknown,
            Scrape::Unknown,
            Scrape::Unknown,
            Scrape::Unknown,
        ];
        let v = verdicts(&unknown, step);
        assert_eq!(
            &v[..3],
            &[Verdict::Alive; 3],
            "60 and 120 s: within the grace"
        );
        assert_eq!(v[3], Verdict::Hung(1));
    }

    // The first baseline must be complete: until then the engine is unhealthy. A counter
    // that goes down (an engine restarted) is progress, a new baseline.
    #[test]
    fn the_first_baseline_must_be_complete_and_a_lower_counter_is_progress() {
        let partial = Scrape::Read(Reading {
            iterations: Some(3.0),
            running: None,
            waiting: Some(0.0),
        });
        let v = verdicts(&[partial], Duration::from_secs(3));
        assert!(matches!(v[0], Verdict::Unhealthy(_)), "{v:?}");
        let v = verdicts(&[Scrape::Unknown], Duration::from_secs(3));
        assert!(matches!(v[0], Verdict::Unhealthy(_)), "{v:?}");
        let step = Duration::from_secs(100);
        let v = verdicts(
            &[
                read(50.0, 2.0, 0.0),
                read(50.0, 2.0, 0.0),
                read(3.0, 2.0, 0.0),
                read(3.0, 2.0, 0.0),
            ],
            step,
        );
        assert_eq!(v, [Verdict::Alive; 4], "the drop at 200 s is progress");
    }

    // The series are read as vLLM writes them: the step count summed over engines, the
    // queue's largest; other series (the histogram's buckets and sum) left alone.
    #[test]
    fn the_scrape_sums_the_step_count_and_takes_the_largest_queue() {
        let text = "# TYPE vllm:iteration_tokens_total histogram\n\
            vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 9.0\n\
            vllm:iteration_tokens_total_count{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:iteration_tokens_total_count{engine=\"1\",model_name=\"m\"} 4.0\n\
            vllm:iteration_tokens_total_sum{engine=\"0\",model_name=\"m\"} 5.0\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 5.0\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n";
        assert_eq!(
            parse(text),
            Reading {
                iterations: Some(7.0),
                running: Some(5.0),
                waiting: Some(0.0)
            }
        );
        assert_eq!(parse("sglang:num_running_reqs 1.0\n"), Reading::default());
    }
}
