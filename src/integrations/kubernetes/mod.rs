//! The Kubernetes API mode (`[agent.kubernetes]`, opt-in): for each engine, find its pod on
//! this node ([`pods`]), keep a readiness-gate condition on it that follows the `/readyz`
//! rule, and at a held `evict` create an Eviction (or set MindCluster's fault annotation).
//! The readiness rule is the agent's ([`crate::integrations::answers::readiness`]), the
//! eviction rule is [`eviction_ground`] and its gate [`eviction`]; [`api`] makes the calls;
//! [`task`] is the loop (I/O only); [`config`] is `[agent.kubernetes]` and
//! `[engine.kubernetes]`. What it did is the engine's record ([`told`], kept in the engine's
//! monitor and its state file as this integration's [`memory`]), which `/status/detail` shows; nothing it does or fails to do changes the
//! verdict, and no handler waits on it. With `public_faults` on, each engine's `abnormal` is
//! also published to MindCluster's ClusterD as a public fault ([`public_fault`]).

pub mod api;
pub mod brake;
pub mod config;
pub(crate) mod events;
pub(crate) mod eviction;
pub(crate) mod memory;
pub(crate) mod pods;
pub(crate) mod public_fault;
pub(crate) mod shared;
pub(crate) mod task;
pub mod told;

use crate::config::tables::TableReader;
use crate::config::{AgentSettings, EngineSpec};
use crate::integrations::facts::ActionInputs;
use crate::integrations::seam::{EngineNpu, Integration, Serving, Started};
use crate::monitor::Monitor;
use crate::monitor::journal::{Id, Told};
use api::KubeClient;
use config::{EvictionMode, KubernetesConfig, MINDCLUSTER_ANNOTATION, PodSelector};
use shared::SharedLists;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use told::{Outcome, PodAction};

/// Its name in the journal, `/status/detail` and the metrics.
pub(crate) const ID: Id = Id("kubernetes_api");

/// The call `action` on the pod, ended as `outcome`, as the journal records it.
pub(crate) fn told_call(action: PodAction, outcome: Outcome) -> Told {
    Told::call(ID, action.as_str(), outcome.as_str())
}

/// The Kubernetes API mode, in the registry.
pub(crate) struct KubernetesApi;

impl Integration for KubernetesApi {
    fn id(&self) -> Id {
        ID
    }

    fn tables(&self) -> Vec<&'static dyn TableReader> {
        vec![&config::AGENT_TABLE, &config::ENGINE_TABLE]
    }

    fn memory(&self) -> Option<Box<dyn crate::monitor::acted::Memory>> {
        Some(Box::<memory::KubeMemory>::default())
    }

    fn preflight(&self, agent: &AgentSettings) -> Result<(), (String, String)> {
        match KubernetesConfig::of(agent) {
            // The token and CA files, read as the client reads them.
            Some(k) if k.api_server.is_some() => api::Files::read(k)
                .map(drop)
                .map_err(|(key, m)| (format!("[agent.kubernetes] {key}"), m)),
            _ => Ok(()),
        }
    }

    fn start(&self, agent: &AgentSettings) -> Option<Arc<dyn Started>> {
        let mode: Arc<dyn Started> = ApiMode::start(KubernetesConfig::of(agent)?);
        Some(mode)
    }

    fn describe(&self, spec: &EngineSpec, agent: &AgentSettings) -> String {
        let Some(k) = KubernetesConfig::of(agent) else {
            return "off ([agent.kubernetes] not set)".to_owned();
        };
        let sel = PodSelector::of(spec);
        let pod = match (&sel.pod, &sel.pod_selector) {
            (Some(p), _) => format!("pod {p}"),
            (None, Some(sel)) => format!("the pod on this node with labels {sel}"),
            (None, None) => format!("the pod on this node serving port {}", spec.port),
        };
        let gate = if k.readiness_gate {
            format!("condition {} follows /readyz", k.condition_type)
        } else {
            "no readiness gate".to_owned()
        };
        let evict = match k.eviction {
            EvictionMode::Api => format!(
                "an Eviction at a held evict (at most one per {})",
                humantime::format_duration(k.eviction_cooldown)
            ),
            EvictionMode::Mindcluster => format!(
                "MindCluster's {MINDCLUSTER_ANNOTATION} at a held evict (at most once per {})",
                humantime::format_duration(k.eviction_cooldown)
            ),
            EvictionMode::Off => "no eviction".to_owned(),
        };
        let events = if k.events {
            "Events on the pod"
        } else {
            "no Events"
        };
        let faults = if k.public_faults {
            format!(
                "; MindCluster public faults {}/{} at abnormal ({} at a restart loop) as {}",
                k.public_fault_namespace,
                k.public_fault_code,
                k.public_fault_loop_code,
                k.public_fault_resource
            )
        } else {
            String::new()
        };
        format!("{pod}: {gate}; {evict}; {events}{faults}")
    }
}

/// The mode as started: its settings, the node, the client (or why there is none), shared
/// by every engine's loop ([`shared`]: one pod list per resync), and when it started.
pub(crate) struct ApiMode {
    pub cfg: KubernetesConfig,
    pub node: Option<String>,
    pub client: Result<SharedLists<KubeClient>, String>,
    /// The public faults' client and settings, when `public_faults` is on.
    pub public_faults: Option<(KubeClient, public_fault::task::Settings)>,
    pub origin: tokio::time::Instant,
    /// The Events' recorder (`events = true`, a client, a runtime); its writer stops with
    /// the mode.
    pub events: Option<events::Recorder>,
    stop_events: CancellationToken,
    /// The fleet brake and its client, when it is on and could start.
    pub brake: Option<(KubeClient, Arc<brake::Brake>)>,
}

impl Drop for ApiMode {
    fn drop(&mut self) {
        self.stop_events.cancel();
    }
}

impl Started for ApiMode {
    fn engine_task(
        &self,
        m: Arc<Monitor>,
        npus: &[EngineNpu],
        cancel: CancellationToken,
    ) -> Option<Serving> {
        match &self.client {
            Ok(client) => {
                let events = self.events.clone().map(events::EngineEvents::new);
                let pods = task::run(
                    client.clone(),
                    self.cfg.clone(),
                    self.node.clone(),
                    m.clone(),
                    self.origin,
                    events.clone(),
                    cancel.clone(),
                );
                let faults = self.public_faults.clone().map(|(api, s)| {
                    let to = public_fault::task::Reach {
                        node: self.node.clone(),
                        npus: npus.to_vec(),
                        events,
                    };
                    public_fault::task::run(api, s, to, m.clone(), cancel.clone())
                });
                let brake = self.brake.clone().map(|(c, b)| brake::run(c, b, m, cancel));
                Some(Box::pin(async move {
                    let faults = async move {
                        if let Some(faults) = faults {
                            faults.await;
                        }
                    };
                    let brake = async move {
                        if let Some(brake) = brake {
                            brake.await;
                        }
                    };
                    tokio::join!(pods, faults, brake);
                }))
            }
            Err(why) => {
                task::inactive(&m, &self.cfg, why);
                None
            }
        }
    }
}

impl ApiMode {
    /// Builds the client for `cfg`; a failure is kept (each engine's record shows it) and
    /// logged once, and the agent runs on without the mode.
    pub(crate) fn start(cfg: &KubernetesConfig) -> Arc<ApiMode> {
        let client = KubeClient::new(cfg);
        let node = cfg.node();
        match &client {
            Ok(_) => tracing::info!(
                node = node.as_deref().unwrap_or("unknown"),
                eviction = cfg.eviction.as_str(),
                readiness_gate = cfg.readiness_gate,
                "the Kubernetes API mode is on"
            ),
            Err(e) => tracing::error!("the Kubernetes API mode cannot start: {e}"),
        }
        let stop_events = CancellationToken::new();
        let events = match &client {
            Ok(c) if cfg.events => start_events(c, node.as_deref(), &stop_events),
            _ => None,
        };
        let public_faults = match (&client, public_fault::task::Settings::of(cfg)) {
            (Ok(c), Some(s)) => Some((c.clone(), s)),
            _ => None,
        };
        let brake = match (brake::Brake::of(cfg), &client) {
            (Some(Ok(b)), Ok(c)) => Some((c.clone(), Arc::new(b))),
            (Some(Ok(_)), Err(_)) => None,
            (Some(Err(why)), _) => {
                tracing::error!(
                    "the fleet brake cannot start: {why}; the engines it holds stay held (fail closed)"
                );
                None
            }
            (None, _) => None,
        };
        Arc::new(ApiMode {
            brake,
            cfg: cfg.clone(),
            node,
            public_faults,
            client: client.map(|c| SharedLists::new(c, cfg.resync_period)),
            origin: tokio::time::Instant::now(),
            events,
            stop_events,
        })
    }
}

/// The Events' recorder, its writer spawned on the runtime until `stop`; `None` (and said
/// once) outside a runtime.
fn start_events(
    client: &KubeClient,
    node: Option<&str>,
    stop: &CancellationToken,
) -> Option<events::Recorder> {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("Kubernetes Events: no runtime to write them from; none are posted");
        return None;
    };
    let (rec, queue) = events::Recorder::new(node, events::QUEUE, events::Counts::global());
    rt.spawn(events::sink::run(
        client.clone(),
        queue,
        rec.clone(),
        stop.clone(),
    ));
    Some(rec)
}

/// Whether the Kubernetes API mode may evict the engine's pod now: a held `evict` whose
/// score rests on no missing input.
pub(crate) fn eviction_ground(f: &ActionInputs) -> Option<String> {
    f.evict_held().then(|| {
        format!(
            "{} held for the eviction hold, every input present",
            f.level_words()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::config::KubernetesConfig;
    use super::{ApiMode, eviction_ground};
    use crate::integrations::tests::facts;
    use crate::monitor::verdict::Status;
    use crate::qos::score::Level;
    use Level::{Degrade, Evict, Throttle};
    use Status::Abnormal;
    const OK: Status = Status::Normal;
    const NORMAL: Level = Level::Normal;

    // The off switch: `events = false` starts no recorder (no Event is ever queued), and the
    // default starts one.
    #[tokio::test]
    async fn events_false_starts_no_recorder_and_the_default_one() {
        let cfg = |events| KubernetesConfig {
            api_server: Some("http://127.0.0.1:9".into()),
            events,
            ..KubernetesConfig::default()
        };
        assert!(KubernetesConfig::default().events);
        assert!(ApiMode::start(&cfg(false)).events.is_none());
        assert!(ApiMode::start(&cfg(true)).events.is_some());
    }

    #[test]
    fn eviction_needs_a_held_evict_on_every_input() {
        assert!(eviction_ground(&facts(OK, Evict)).is_some());
        assert!(eviction_ground(&facts(Abnormal, Evict)).is_some());
        for level in [NORMAL, Throttle, Degrade] {
            assert_eq!(eviction_ground(&facts(OK, level)), None, "{level:?}");
        }
        let mut f = facts(OK, Evict);
        f.inputs_complete = false;
        assert_eq!(
            eviction_ground(&f),
            None,
            "a score resting on a missing input"
        );
        // An abnormal verdict alone is the kubelet's (a restart), not an eviction.
        assert_eq!(eviction_ground(&facts(Abnormal, NORMAL)), None);
    }
}
