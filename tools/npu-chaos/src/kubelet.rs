//! A kubelet emulator with the kubelet's probe semantics, acting on the stack the way the
//! shipped example manifest (`deploy/kubernetes/examples/vllm-with-agent-probes.yaml`) has a
//! real kubelet act on a vLLM pod:
//!
//! - a startup probe on the engine's own `/health` after each container start; liveness and
//!   readiness wait for it (the first container of an experiment has started already);
//! - a readiness probe on the agent's `/readyz`: not ready stops the load generator from
//!   sending new requests, as a Service stops routing to the pod;
//! - a liveness probe on the agent's `/livez`: a failure restarts the engine's container;
//! - a container that exits (a crash) is restarted after the kubelet's first back-off (10 s).
//!
//! Each probe is one worker (`pkg/kubelet/prober/worker.go` in kubernetes/kubernetes): it
//! probes every `periodSeconds` with `timeoutSeconds`; an answer in 200..400 is a success,
//! anything else (another code, a timeout, a refused connection) a failure; its result
//! changes only after `failureThreshold` failures or `successThreshold` successes in a row.
//! Readiness starts as a failure and liveness as a success on a new container. Periods and
//! the restart back-off are scaled with the experiment; timeouts are not (they bound the
//! agent's real answer time, as Node Manager's poll timeout does).

use serde::Serialize;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One probe's settings, as in a container spec.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProbeSpec {
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// The example manifest's probes (unscaled), checked against the manifest by a test.
pub mod manifest {
    use super::ProbeSpec;
    use std::time::Duration;

    const fn probe(period: u64, timeout: u64, failure: u32, success: u32) -> ProbeSpec {
        ProbeSpec {
            period: Duration::from_secs(period),
            timeout: Duration::from_secs(timeout),
            failure_threshold: failure,
            success_threshold: success,
        }
    }

    /// `startupProbe`: the engine's own `/health`, up to 10 minutes of model loading.
    pub const STARTUP: ProbeSpec = probe(5, 2, 120, 1);
    /// `readinessProbe`: the agent's `/readyz`.
    pub const READINESS: ProbeSpec = probe(2, 2, 2, 1);
    /// `livenessProbe`: the agent's `/livez`.
    pub const LIVENESS: ProbeSpec = probe(5, 2, 3, 1);
    /// The kubelet's first back-off before restarting a container that exited.
    pub const EXIT_BACKOFF: Duration = Duration::from_secs(10);
}

/// The kubelet's worker for one probe: the result it holds, and the run of identical probe
/// results behind it.
#[derive(Debug, Clone)]
pub struct Worker {
    spec: ProbeSpec,
    result: bool,
    last: Option<bool>,
    run: u32,
}

impl Worker {
    /// A worker holding `initial` (readiness: false; liveness: true).
    pub fn new(spec: ProbeSpec, initial: bool) -> Worker {
        Worker {
            spec,
            result: initial,
            last: None,
            run: 0,
        }
    }

    /// The result held.
    pub fn result(&self) -> bool {
        self.result
    }

    /// Records one probe; the new result when it changes.
    pub fn record(&mut self, ok: bool) -> Option<bool> {
        if self.last == Some(ok) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(ok);
            self.run = 1;
        }
        let needed = if ok {
            self.spec.success_threshold
        } else {
            self.spec.failure_threshold
        };
        (ok != self.result && self.run >= needed.max(1)).then(|| {
            self.result = ok;
            ok
        })
    }
}

/// What the kubelet did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Readiness failed: the Service stops sending new requests.
    NotReady,
    /// Readiness passed again.
    Ready,
    /// Liveness failed: the container is restarted.
    RestartLiveness,
    /// The container exited and is restarted after the back-off.
    RestartExited,
}

/// Which probe a [`ProbeRecord`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    Readiness,
    Liveness,
}

/// One readiness or liveness probe as the kubelet saw it: when it ended, and whether it
/// succeeded.
#[derive(Debug, Clone, Copy)]
pub struct ProbeRecord {
    pub probe: ProbeKind,
    pub at: Instant,
    pub ok: bool,
}

/// Every readiness and liveness probe of a run, shared with the runner.
#[derive(Debug, Clone, Default)]
pub struct ProbeLog(std::sync::Arc<std::sync::Mutex<Vec<ProbeRecord>>>);

impl ProbeLog {
    fn push(&self, probe: ProbeKind, ok: bool) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ProbeRecord {
                probe,
                at: Instant::now(),
                ok,
            });
    }

    /// The probes so far.
    pub fn records(&self) -> Vec<ProbeRecord> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The emulator's settings for one experiment.
#[derive(Debug, Clone)]
pub struct Kubelet {
    pub startup: ProbeSpec,
    pub readiness: ProbeSpec,
    pub liveness: ProbeSpec,
    pub exit_backoff: Duration,
    /// The engine's `/health` (the startup probe).
    pub health_url: String,
    pub readyz_url: String,
    pub livez_url: String,
}

impl Kubelet {
    /// The example manifest's probes with periods and back-off scaled by `s`.
    pub fn manifest(s: f64, health_url: String, mgmt: &str) -> Kubelet {
        let scale = |p: ProbeSpec| ProbeSpec {
            period: Duration::from_secs_f64(p.period.as_secs_f64() * s),
            ..p
        };
        Kubelet {
            startup: scale(manifest::STARTUP),
            readiness: scale(manifest::READINESS),
            liveness: scale(manifest::LIVENESS),
            exit_backoff: Duration::from_secs_f64(manifest::EXIT_BACKOFF.as_secs_f64() * s),
            health_url,
            readyz_url: format!("{mgmt}/readyz"),
            livez_url: format!("{mgmt}/livez"),
        }
    }
}

/// One probe over HTTP: a success is an answer in 200..400 within `timeout`.
async fn probe(client: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, client.get(url).send()).await {
        Ok(Ok(r)) => (200..400).contains(&r.status().as_u16()),
        _ => false,
    }
}

/// Runs the probes until `cancel`, sending what it decides on `actions`. `generation` counts
/// container starts: when it changes (the runner restarted the engine) the workers start
/// over with the startup probe. `ready` is told every readiness change (the load generator).
/// Every readiness and liveness probe goes into `probes`.
pub async fn run(
    k: Kubelet,
    actions: mpsc::UnboundedSender<(Action, Instant)>,
    mut generation: watch::Receiver<u64>,
    ready: impl Fn(bool) + Send,
    probes: ProbeLog,
    cancel: CancellationToken,
) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("plain HTTP client builds");
    // The first container has started and warmed up before the experiment begins.
    let mut starting = false;
    let mut readiness = Worker::new(k.readiness, true);
    let mut liveness = Worker::new(k.liveness, true);
    let mut ready_tick = tokio::time::interval(k.readiness.period);
    let mut live_tick = tokio::time::interval(k.liveness.period);
    let mut start_tick = tokio::time::interval(k.startup.period);
    for t in [&mut ready_tick, &mut live_tick, &mut start_tick] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    // After a liveness failure the worker holds until the new container.
    let mut on_hold = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = generation.changed() => {
                if changed.is_err() {
                    return;
                }
                starting = true;
                on_hold = false;
                readiness = Worker::new(k.readiness, false);
                liveness = Worker::new(k.liveness, true);
                ready(false);
                start_tick.reset();
            }
            _ = start_tick.tick(), if starting => {
                if probe(&client, &k.health_url, k.startup.timeout).await {
                    starting = false;
                    // The kubelet runs readiness at once on a container that is not ready.
                    ready_tick.reset_immediately();
                    live_tick.reset();
                }
            }
            _ = ready_tick.tick(), if !starting => {
                let ok = probe(&client, &k.readyz_url, k.readiness.timeout).await;
                probes.push(ProbeKind::Readiness, ok);
                if let Some(now) = readiness.record(ok) {
                    ready(now);
                    let _ = actions.send((if now { Action::Ready } else { Action::NotReady }, Instant::now()));
                }
            }
            _ = live_tick.tick(), if !starting && !on_hold => {
                let ok = probe(&client, &k.livez_url, k.liveness.timeout).await;
                probes.push(ProbeKind::Liveness, ok);
                if liveness.record(ok) == Some(false) {
                    on_hold = true;
                    let _ = actions.send((Action::RestartLiveness, Instant::now()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The worker's result moves only after the threshold of identical results in a row;
    // a different result in between starts the run over.
    #[test]
    fn thresholds_of_consecutive_results() {
        let mut live = Worker::new(manifest::LIVENESS, true);
        let seq = [false, false, true, false, false, false, true];
        let got: Vec<Option<bool>> = seq.iter().map(|&ok| live.record(ok)).collect();
        assert_eq!(
            got,
            [None, None, None, None, None, Some(false), Some(true)],
            "3 failures in a row to fail, 1 success to pass"
        );
        let mut ready = Worker::new(manifest::READINESS, false);
        assert_eq!(ready.record(false), None, "already failing");
        assert_eq!(ready.record(true), Some(true));
        assert_eq!(ready.record(false), None);
        assert_eq!(ready.record(false), Some(false), "2 failures in a row");
        let mut two = Worker::new(
            ProbeSpec {
                success_threshold: 2,
                ..manifest::READINESS
            },
            false,
        );
        assert_eq!(two.record(true), None);
        assert_eq!(two.record(true), Some(true));
        assert!(two.result());
    }

    // The emulator's probes are the example manifest's: a change to one without the other
    // fails here.
    #[test]
    fn the_probes_are_the_example_manifests() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/kubernetes/examples/vllm-with-agent-probes.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let dep = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment");
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        let spec = |p: &serde_yaml_ng::Value| ProbeSpec {
            period: Duration::from_secs(p["periodSeconds"].as_u64().unwrap()),
            timeout: Duration::from_secs(p["timeoutSeconds"].as_u64().unwrap()),
            failure_threshold: p["failureThreshold"].as_u64().unwrap() as u32,
            success_threshold: p["successThreshold"].as_u64().unwrap_or(1) as u32,
        };
        assert_eq!(spec(&c["startupProbe"]), manifest::STARTUP);
        assert_eq!(spec(&c["readinessProbe"]), manifest::READINESS);
        assert_eq!(spec(&c["livenessProbe"]), manifest::LIVENESS);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
        assert_eq!(c["startupProbe"]["httpGet"]["path"], "/health");
    }
}
