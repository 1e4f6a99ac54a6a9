//! `[agent.kubernetes]` (the Kubernetes API mode, opt-in: the table turns it on) and
//! `[engine.kubernetes]` (how the engine's pod is found), read by the configuration through
//! the seam ([`AGENT_TABLE`], [`ENGINE_TABLE`]). What the mode does is in
//! `integrations::kubernetes` and `docs/kubernetes.md`.
//!
//! Long because: the mode's whole table in one file (the pod's condition, the eviction, the
//! Events, the public faults and the fleet brake's `[agent.kubernetes.brake]`), as the layout
//! test keeps an integration's configuration table: its `config.rs`, read by the
//! configuration and reading no runtime module.

use crate::config::tables::{ConfigTable, Table};
use crate::config::{AgentSettings, EngineSpec, KeyError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

/// `[agent.kubernetes]`, as the configuration reads it (`None`: the table is not there).
pub(crate) static AGENT_TABLE: ConfigTable<Option<KubernetesConfig>> =
    ConfigTable::agent("kubernetes");

/// `[engine.kubernetes]`, as the configuration reads it; shown as `pod`, the name the
/// effective configuration has always given it.
pub(crate) static ENGINE_TABLE: ConfigTable<PodSelector> =
    ConfigTable::engine("kubernetes").shown_as("pod");

/// The condition type the agent sets on the engine's pod by default.
pub const DEFAULT_CONDITION_TYPE: &str = "npu-health-agent.io/qos-ready";

/// MindCluster's fault annotation on a pod (`huawei.com/pod-status`), read by its
/// infer-operator: a value beginning with `Unhealthy` makes it delete and recreate the pod's
/// whole instance (`component/infer-operator/pkg/controller/rescheduling/rescheduling.go` in
/// Ascend/mind-cluster; docs/kubernetes.md has the contract).
pub(crate) const MINDCLUSTER_ANNOTATION: &str = "huawei.com/pod-status";
/// The value written: `Unhealthy-<fault type>` as MindCluster's Volcano plugin writes it;
/// `process-exception` is its type for a business process that failed.
pub(crate) const MINDCLUSTER_VALUE: &str = "Unhealthy-process-exception";
/// The label infer-operator's pods carry; without it the annotation would do nothing.
pub(crate) const MINDCLUSTER_POD_LABEL: &str = "infer.huawei.com/ascend-infer-operator";

/// The public-fault ConfigMaps' namespace by default: the agent's own (the shipped
/// DaemonSet's), where its Role lets it write them.
pub(crate) const DEFAULT_PUBLIC_FAULT_NAMESPACE: &str = "npu-health-agent";
/// The public-fault ConfigMaps' name prefix by default.
pub(crate) const DEFAULT_PUBLIC_FAULT_PREFIX: &str = "npu-health-agent-pf";
/// The sender's name by default (the operator adds it to ClusterD's `publicFaultResource`).
pub(crate) const DEFAULT_PUBLIC_FAULT_RESOURCE: &str = "npu-health-agent";
/// The agent's code for an `abnormal` engine, by MindCluster's convention
/// (docs/kubernetes.md): NPU (`0`), default level SubHealthFault (`1`), `00`, user-defined
/// (`1`), number 9001.
pub(crate) const DEFAULT_ABNORMAL_CODE: &str = "010019001";
/// The agent's code for an engine in a restart loop: NPU, default level SeparateNPU (`2`),
/// `00`, user-defined, number 9002.
pub(crate) const DEFAULT_LOOP_CODE: &str = "020019002";

/// How a held `evict` takes the engine's pod out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionMode {
    /// An Eviction through the Eviction API (PodDisruptionBudgets respected).
    #[default]
    Api,
    /// MindCluster's fault annotation; its infer-operator rebuilds the instance.
    Mindcluster,
    /// No eviction; the readiness gate only.
    Off,
}

impl EvictionMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EvictionMode::Api => "api",
            EvictionMode::Mindcluster => "mindcluster",
            EvictionMode::Off => "off",
        }
    }
}

/// `[agent.kubernetes]`, a key left out keeps its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The node the agent runs on, to find the engines' pods. Default: `$NODE_NAME` (the
    /// shipped DaemonSet sets it from `spec.nodeName`). Needed unless every engine names its
    /// pod.
    pub node_name: Option<String>,
    /// The API server. Default: in-cluster (`KUBERNETES_SERVICE_HOST`/`_PORT` and the pod's
    /// service account).
    pub api_server: Option<String>,
    /// Bearer token file when `api_server` is set. Default: the service account's token.
    pub token_file: Option<PathBuf>,
    /// CA bundle (PEM) when `api_server` is `https`. Default: the service account's CA.
    pub ca_file: Option<PathBuf>,
    /// Set the readiness-gate condition on each engine's pod. Default true.
    pub readiness_gate: bool,
    /// Its type (a qualified name; the pods list it in `spec.readinessGates`). Default
    /// `npu-health-agent.io/qos-ready`.
    pub condition_type: String,
    /// What a held `evict` does. Default `api`.
    pub eviction: EvictionMode,
    /// At most one eviction per engine in this long. Default 10 min.
    #[serde(with = "crate::config::duration")]
    pub eviction_cooldown: Duration,
    /// How often each engine's pod is looked up again and its condition set again even if
    /// unchanged (repairs a pod recreated or a condition changed by someone else). Default
    /// 30 s.
    #[serde(with = "crate::config::duration")]
    pub resync_period: Duration,
    /// The timeout of each API request. Default 5 s.
    #[serde(with = "crate::config::duration")]
    pub request_timeout: Duration,
    /// Post a Kubernetes Event (events.k8s.io/v1) on the pod for each action the mode takes
    /// on it. Default true.
    pub events: bool,
    /// Publish MindCluster public faults for abnormal engines (`super::public_fault`).
    /// Default false.
    pub public_faults: bool,
    /// The namespace of the public-fault ConfigMaps. Default `npu-health-agent`.
    pub public_fault_namespace: String,
    /// The ConfigMaps' name before `-<node>-<engine>`. Default `npu-health-agent-pf`.
    pub public_fault_name_prefix: String,
    /// The sender's name, listed in ClusterD's `publicFaultResource`. Default
    /// `npu-health-agent`.
    pub public_fault_resource: String,
    /// The fault code of an `abnormal` engine. Default `010019001`.
    pub public_fault_code: String,
    /// The fault code of an engine in a restart loop (escalated). Default `020019002`.
    pub public_fault_loop_code: String,
    /// At most one message per engine in this long (changes meanwhile are coalesced).
    /// Default 5 s.
    #[serde(with = "crate::config::duration")]
    pub public_fault_min_interval: Duration,
    /// An open fault's `occur` is written again this often (a message ClusterD dropped is
    /// not lost for ever). Default 10 min.
    #[serde(with = "crate::config::duration")]
    pub public_fault_refresh: Duration,
    /// The fleet brake (`[agent.kubernetes.brake]`; off by default).
    pub brake: brake::BrakeConfig,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            node_name: None,
            api_server: None,
            token_file: None,
            ca_file: None,
            readiness_gate: true,
            condition_type: DEFAULT_CONDITION_TYPE.to_owned(),
            eviction: EvictionMode::Api,
            eviction_cooldown: Duration::from_secs(600),
            resync_period: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            events: true,
            public_faults: false,
            public_fault_namespace: DEFAULT_PUBLIC_FAULT_NAMESPACE.to_owned(),
            public_fault_name_prefix: DEFAULT_PUBLIC_FAULT_PREFIX.to_owned(),
            public_fault_resource: DEFAULT_PUBLIC_FAULT_RESOURCE.to_owned(),
            public_fault_code: DEFAULT_ABNORMAL_CODE.to_owned(),
            public_fault_loop_code: DEFAULT_LOOP_CODE.to_owned(),
            public_fault_min_interval: Duration::from_secs(5),
            public_fault_refresh: Duration::from_secs(600),
            brake: brake::BrakeConfig::default(),
        }
    }
}

/// Whether `url`'s host is a loopback address (`localhost`, 127.0.0.0/8, `[::1]`): what is
/// sent to it never leaves the host.
fn loopback_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match uri.host() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

impl KubernetesConfig {
    /// Checks every value; `Err((key, message))`.
    pub(crate) fn validate(&self) -> Result<(), crate::config::KeyError> {
        use bounds::{
            EVICTION_COOLDOWN, REQUEST_TIMEOUT, RESYNC_PERIOD, dns_subdomain, qualified_name,
        };
        if let Some(n) = &self.node_name {
            dns_subdomain(n).map_err(|m| ("node_name".to_owned(), m))?;
        }
        if let Some(url) = &self.api_server
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err((
                "api_server".to_owned(),
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        if let Some(url) = &self.api_server
            && self.token_file.is_some()
            && url.starts_with("http://")
            && !loopback_url(url)
        {
            return Err((
                "api_server".to_owned(),
                format!(
                    "{url:?} is plain http:// to another host, and token_file is set: the token would cross the network in clear text. Use https:// (with ca_file), or a local proxy on a loopback address (http://127.0.0.1:…, as `kubectl proxy` serves)"
                ),
            ));
        }
        if self.api_server.is_none() {
            for (key, set) in [
                ("token_file", self.token_file.is_some()),
                ("ca_file", self.ca_file.is_some()),
            ] {
                if set {
                    return Err((
                        key.to_owned(),
                        "is set, but api_server is not (in-cluster config reads the service account's)".to_owned(),
                    ));
                }
            }
        }
        qualified_name(&self.condition_type).map_err(|m| ("condition_type".to_owned(), m))?;
        EVICTION_COOLDOWN.check("eviction_cooldown", self.eviction_cooldown)?;
        RESYNC_PERIOD.check("resync_period", self.resync_period)?;
        REQUEST_TIMEOUT.check("request_timeout", self.request_timeout)?;
        self.brake.validate()?;
        self.validate_public_faults()
    }

    /// Checks the public-fault keys (whether or not `public_faults` is on: a file that turns
    /// it on later must not meet an old mistake then).
    fn validate_public_faults(&self) -> Result<(), crate::config::KeyError> {
        use bounds::{
            PUBLIC_FAULT_MIN_INTERVAL, PUBLIC_FAULT_REFRESH, dns_label, fault_code, resource,
        };
        fn key(k: &'static str) -> impl Fn(String) -> (String, String) {
            move |m| (k.to_owned(), m)
        }
        dns_label(&self.public_fault_namespace).map_err(key("public_fault_namespace"))?;
        // The name is `<prefix>-<node>-<engine slug ≤ 40>-<8 hex>`: the prefix leaves room.
        if self.public_fault_name_prefix.len() > 100 {
            return Err((
                "public_fault_name_prefix".to_owned(),
                "is over 100 characters (the node and the engine follow it)".to_owned(),
            ));
        }
        bounds::dns_subdomain(&self.public_fault_name_prefix)
            .map_err(key("public_fault_name_prefix"))?;
        resource(&self.public_fault_resource).map_err(key("public_fault_resource"))?;
        fault_code(&self.public_fault_code).map_err(key("public_fault_code"))?;
        fault_code(&self.public_fault_loop_code).map_err(key("public_fault_loop_code"))?;
        if self.public_fault_code == self.public_fault_loop_code {
            return Err((
                "public_fault_loop_code".to_owned(),
                "is public_fault_code: the restart loop needs a code of its own".to_owned(),
            ));
        }
        PUBLIC_FAULT_MIN_INTERVAL
            .check("public_fault_min_interval", self.public_fault_min_interval)?;
        PUBLIC_FAULT_REFRESH.check("public_fault_refresh", self.public_fault_refresh)?;
        Ok(())
    }

    /// The node name: the configured one, else `$NODE_NAME`.
    pub(crate) fn node(&self) -> Option<String> {
        self.node_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
    }
}

/// `[engine.kubernetes]`: how the engine's pod is found. With neither key, the one pod on
/// this node that serves the engine's port (a container port of a host-network pod, a host
/// port, or a container port of the pod whose IP is the engine's host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct PodSelector {
    /// The pod, `namespace/name`.
    pub pod: Option<String>,
    /// A label selector (`app=vllm,role=decode`) among this node's pods.
    pub pod_selector: Option<String>,
    /// Only pods of this namespace (with `pod_selector` or the port). Default: every
    /// namespace.
    pub namespace: Option<String>,
}

impl PodSelector {
    /// Checks the keys; `Err((key, message))`.
    pub(crate) fn validate(&self) -> Result<(), crate::config::KeyError> {
        use bounds::{dns_label, dns_subdomain, label_selector};
        if let Some(p) = &self.pod {
            if self.pod_selector.is_some() || self.namespace.is_some() {
                return Err((
                    "pod".to_owned(),
                    "names the pod; pod_selector and namespace must not be set with it".to_owned(),
                ));
            }
            let (ns, name) = p
                .split_once('/')
                .ok_or_else(|| ("pod".to_owned(), format!("{p:?} is not namespace/name")))?;
            dns_label(ns).map_err(|m| ("pod".to_owned(), format!("namespace: {m}")))?;
            dns_subdomain(name).map_err(|m| ("pod".to_owned(), format!("name: {m}")))?;
        }
        if let Some(ns) = &self.namespace {
            dns_label(ns).map_err(|m| ("namespace".to_owned(), m))?;
        }
        if let Some(sel) = &self.pod_selector {
            label_selector(sel).map_err(|m| ("pod_selector".to_owned(), m))?;
        }
        Ok(())
    }

    /// The named pod as (namespace, name).
    pub(crate) fn named(&self) -> Option<(&str, &str)> {
        self.pod.as_deref().and_then(|p| p.split_once('/'))
    }
}

impl KubernetesConfig {
    /// The mode's settings under `agent`; `None`: the mode is off.
    pub fn of(agent: &AgentSettings) -> Option<&KubernetesConfig> {
        agent
            .tables
            .get::<Option<KubernetesConfig>>()
            .and_then(Option::as_ref)
    }
}

/// Checked, then its files made relative to the configuration's folder.
impl Table for Option<KubernetesConfig> {
    fn check(&mut self, base: &Path) -> Result<(), KeyError> {
        let Some(k) = self else { return Ok(()) };
        k.validate()?;
        let rel = |p: &PathBuf| {
            if p.is_relative() {
                base.join(p)
            } else {
                p.clone()
            }
        };
        k.token_file = k.token_file.as_ref().map(rel);
        k.ca_file = k.ca_file.as_ref().map(rel);
        Ok(())
    }
}

impl PodSelector {
    /// How the pod of the engine `spec` is found.
    pub(crate) fn of(spec: &EngineSpec) -> &PodSelector {
        static ANY: LazyLock<PodSelector> = LazyLock::new(PodSelector::default);
        spec.tables.get::<PodSelector>().unwrap_or(&ANY)
    }
}

impl Table for PodSelector {
    fn check(&mut self, _base: &Path) -> Result<(), KeyError> {
        self.validate()
    }
}

/// `[agent.kubernetes]` bounds and the Kubernetes name rules (checked by
/// [`KubernetesConfig::validate`] and [`PodSelector::validate`]).
pub(crate) mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    pub(crate) const EVICTION_COOLDOWN: Within<Duration> =
        Within::new(secs(10), secs(7 * 24 * 3600));
    pub(crate) const RESYNC_PERIOD: Within<Duration> = Within::new(secs(1), secs(3600));
    pub(crate) const REQUEST_TIMEOUT: Within<Duration> = Within::new(ms(100), secs(120));
    pub(crate) const PUBLIC_FAULT_MIN_INTERVAL: Within<Duration> = Within::new(secs(1), secs(600));
    pub(crate) const PUBLIC_FAULT_REFRESH: Within<Duration> =
        Within::new(secs(60), secs(24 * 3600));

    /// A public fault's code: 9 digits. ClusterD checks the length and that its
    /// configuration lists the code (`checkFaultCode`, `component/clusterd/pkg/application/
    /// publicfault/checker.go` in Ascend/mind-cluster); digits are MindCluster's convention.
    pub(crate) fn fault_code(s: &str) -> Result<(), String> {
        if s.len() == 9 && s.chars().all(|c| c.is_ascii_digit()) {
            Ok(())
        } else {
            Err(format!(
                "{s:?} is not 9 digits (MindCluster's fault codes, e.g. 010019001)"
            ))
        }
    }

    /// A public fault's sender (`resource`): 1 to 64 letters, digits, `-`, `_`, `.`, as
    /// ClusterD's own senders are named (`CCAE`, `fd-online`).
    pub(crate) fn resource(s: &str) -> Result<(), String> {
        let ok = (1..=64).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{s:?} is not 1 to 64 letters, digits, '-', '_' or '.'"
            ))
        }
    }

    fn label_chars(s: &str, max: usize, dots: bool) -> Result<(), String> {
        let ok_char = |c: char| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.')
        };
        if s.is_empty() || s.len() > max {
            return Err(format!("{s:?} must be 1 to {max} characters"));
        }
        if !s.chars().all(ok_char) {
            return Err(format!(
                "{s:?} may hold only lower-case letters, digits{} and '-'",
                if dots { ", '.'" } else { "" }
            ));
        }
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !edge(s.chars().next()) || !edge(s.chars().last()) {
            return Err(format!("{s:?} must begin and end with a letter or digit"));
        }
        Ok(())
    }

    /// A DNS-1123 label (a namespace).
    pub(crate) fn dns_label(s: &str) -> Result<(), String> {
        label_chars(s, 63, false)
    }

    /// A DNS-1123 subdomain (a pod or node name).
    pub(crate) fn dns_subdomain(s: &str) -> Result<(), String> {
        label_chars(s, 253, true)
    }

    /// A qualified name (`prefix/name`, as a condition type): a DNS subdomain prefix, and a
    /// name of at most 63 letters, digits, `-`, `_` and `.`, beginning and ending with a
    /// letter or digit.
    pub(crate) fn qualified_name(s: &str) -> Result<(), String> {
        let name = match s.split_once('/') {
            Some((prefix, name)) => {
                dns_subdomain(prefix).map_err(|m| format!("prefix: {m}"))?;
                name
            }
            None => s,
        };
        let ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{s:?} is not a qualified name like npu-health-agent.io/qos-ready"
            ))
        }
    }

    /// A label selector as the API server takes it: comma-separated requirements of
    /// qualified-name keys (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a)`).
    /// Checked loosely: the characters and the shape of each term; the API server has the
    /// last word.
    pub(crate) fn label_selector(s: &str) -> Result<(), String> {
        if s.trim().is_empty() {
            return Err("is empty".to_owned());
        }
        let allowed = |c: char| {
            c.is_ascii_alphanumeric()
                || matches!(c, '-' | '_' | '.' | '/' | '=' | '!' | ',' | '(' | ')' | ' ')
        };
        if let Some(c) = s.chars().find(|c| !allowed(*c)) {
            return Err(format!("{s:?}: {c:?} has no place in a label selector"));
        }
        let mut depth = 0i32;
        for c in s.chars() {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            if !(0..=1).contains(&depth) {
                return Err(format!("{s:?}: unbalanced parentheses"));
            }
        }
        if depth != 0 {
            return Err(format!("{s:?}: unbalanced parentheses"));
        }
        Ok(())
    }
}

/// `[agent.kubernetes.brake]`: the fleet brake's settings (docs/configuration.md, "The fleet
/// brake"; docs/kubernetes.md says what it does). Off by default. Beside the mode's own table,
/// as the configuration's layer wants it; the brake itself is `integrations::kubernetes::brake`.
pub mod brake {
    use crate::config::KeyError;
    use crate::config::bounds::{Within, ms, secs};
    use crate::integrations::kubernetes::config::bounds::{
        dns_label, dns_subdomain, label_selector,
    };
    use serde::{Deserialize, Serialize};
    use std::time::Duration;

    /// The ConfigMap's name by default.
    pub(crate) const DEFAULT_NAME: &str = "npu-health-agent-brake";

    /// `max_fraction`: a fraction of the fleet, above 0, at most 1 (1 never engages).
    const MAX_FRACTION: Within<f64> = Within::new(0.001, 1.0);
    /// `window`: at least a minute (shorter than an engine's restart would count each restart
    /// apart), at most a day.
    const WINDOW: Within<Duration> = Within::new(secs(60), secs(24 * 3600));
    /// `refresh` and `count_every`: the slow looks.
    const SLOW: Within<Duration> = Within::new(secs(10), secs(24 * 3600));
    /// `retries` after a conflict (409).
    const RETRIES: Within<u32> = Within::new(0, 50);
    /// `retry_backoff`: the first retry's wait, doubled each retry, jittered.
    const RETRY_BACKOFF: Within<Duration> = Within::new(ms(1), secs(10));

    /// `[agent.kubernetes.brake]`; a key left out keeps its default.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct BrakeConfig {
        /// Turns the brake on. Default false.
        pub enabled: bool,
        /// The brake engages when more than this share of the fleet's engines went `abnormal`
        /// through the agent's own rules within `window`. Default 0.5 (NVSentinel's 50 %).
        pub max_fraction: f64,
        /// Default 5 min (NVSentinel's).
        #[serde(with = "crate::config::duration")]
        pub window: Duration,
        /// The fleet: the pods of a namespace, or those of a label selector (in a namespace, or
        /// every namespace). Required when `enabled`.
        pub fleet: Fleet,
        /// The ConfigMap that holds the shared state. Default `npu-health-agent-brake`.
        pub name: String,
        /// Its namespace. Default `$POD_NAMESPACE` (the shipped DaemonSet sets it), else the
        /// fleet's namespace.
        pub namespace: Option<String>,
        /// How often an agent reads the shared state when none of its engines asks (for the
        /// metric and `/status/detail`). Default 5 min, jittered by up to a tenth.
        #[serde(with = "crate::config::duration")]
        pub refresh: Duration,
        /// How old the fleet's engine count in the shared state may be before the next writer
        /// counts again. Default 5 min.
        #[serde(with = "crate::config::duration")]
        pub count_every: Duration,
        /// Retries of a write refused for a conflict (another agent wrote first). Default 8.
        pub retries: u32,
        /// The first retry's wait, doubled at each, with full jitter. Default 50 ms.
        #[serde(with = "crate::config::duration")]
        pub retry_backoff: Duration,
    }

    /// The fleet whose engines the brake counts.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct Fleet {
        /// Its namespace; every namespace when left out (then `selector` is required).
        pub namespace: Option<String>,
        /// A label selector of its engines' pods (`app=vllm`).
        pub selector: Option<String>,
    }

    impl Default for BrakeConfig {
        fn default() -> Self {
            BrakeConfig {
                enabled: false,
                max_fraction: 0.5,
                window: Duration::from_secs(300),
                fleet: Fleet::default(),
                name: DEFAULT_NAME.to_owned(),
                namespace: None,
                refresh: Duration::from_secs(300),
                count_every: Duration::from_secs(300),
                retries: 8,
                retry_backoff: Duration::from_millis(50),
            }
        }
    }

    impl BrakeConfig {
        /// Checks every value; `Err((key, message))` with the key under `brake.`.
        pub(crate) fn validate(&self) -> Result<(), KeyError> {
            self.check().map_err(|(k, m)| (format!("brake.{k}"), m))
        }

        fn check(&self) -> Result<(), KeyError> {
            MAX_FRACTION.check("max_fraction", self.max_fraction)?;
            WINDOW.check("window", self.window)?;
            SLOW.check("refresh", self.refresh)?;
            SLOW.check("count_every", self.count_every)?;
            RETRIES.check("retries", self.retries)?;
            RETRY_BACKOFF.check("retry_backoff", self.retry_backoff)?;
            dns_subdomain(&self.name).map_err(|m| ("name".to_owned(), m))?;
            if let Some(ns) = &self.namespace {
                dns_label(ns).map_err(|m| ("namespace".to_owned(), m))?;
            }
            if let Some(ns) = &self.fleet.namespace {
                dns_label(ns).map_err(|m| ("fleet.namespace".to_owned(), m))?;
            }
            if let Some(sel) = &self.fleet.selector {
                label_selector(sel).map_err(|m| ("fleet.selector".to_owned(), m))?;
            }
            if self.enabled && self.fleet.namespace.is_none() && self.fleet.selector.is_none() {
                return Err((
                    "fleet".to_owned(),
                    "is required with enabled = true: { namespace = \"…\" } or { selector = \"app=…\" } (or both); the brake counts the fleet's engines as its pods".to_owned(),
                ));
            }
            Ok(())
        }

        /// The ConfigMap's namespace: the configured one, else `$POD_NAMESPACE`, else the fleet's.
        pub(crate) fn home(&self) -> Option<String> {
            self.namespace
                .clone()
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|n| !n.is_empty())
                })
                .or_else(|| self.fleet.namespace.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hardening round 2: plain http:// with a token only to a loopback address (a local
    // proxy); without a token (`kubectl proxy` adds its own), anywhere.
    #[test]
    fn an_http_api_server_with_a_token_file_must_be_loopback() {
        let with = |url: &str, token: bool| KubernetesConfig {
            api_server: Some(url.to_owned()),
            token_file: token.then(|| "t".into()),
            ..KubernetesConfig::default()
        };
        for url in [
            "http://127.0.0.1:8001",
            "http://localhost:8001",
            "http://[::1]:8001",
        ] {
            assert!(with(url, true).validate().is_ok(), "{url}");
        }
        for url in [
            "http://10.0.0.1:8080",
            "http://api.example:8080",
            "http://[fe80::1]:80",
        ] {
            let (key, m) = with(url, true).validate().unwrap_err();
            assert_eq!(key, "api_server");
            assert!(m.contains("clear text"), "{m}");
            assert!(with(url, false).validate().is_ok(), "{url} without a token");
        }
        assert!(with("https://10.0.0.1:6443", true).validate().is_ok());
    }

    // The public faults' keys are checked whether or not `public_faults` is on: 9-digit
    // codes, two different ones, a sender ClusterD's ids could name, a namespace.
    #[test]
    fn the_public_fault_keys_are_checked_and_name_the_key() {
        assert!(KubernetesConfig::default().validate().is_ok());
        let bad = |f: fn(&mut KubernetesConfig)| {
            let mut k = KubernetesConfig::default();
            f(&mut k);
            k.validate().unwrap_err().0
        };
        assert_eq!(
            bad(|k| k.public_fault_code = "01001900".into()),
            "public_fault_code"
        );
        assert_eq!(
            bad(|k| k.public_fault_code = "01001900x".into()),
            "public_fault_code"
        );
        assert_eq!(
            bad(|k| k.public_fault_loop_code = k.public_fault_code.clone()),
            "public_fault_loop_code"
        );
        assert_eq!(
            bad(|k| k.public_fault_resource = "a b".into()),
            "public_fault_resource"
        );
        assert_eq!(
            bad(|k| k.public_fault_namespace = "Mindx".into()),
            "public_fault_namespace"
        );
        assert_eq!(
            bad(|k| k.public_fault_min_interval = Duration::from_millis(10)),
            "public_fault_min_interval"
        );
    }
}
