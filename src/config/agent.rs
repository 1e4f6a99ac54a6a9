//! `[agent]`: the agent's own settings (sampling, the driver, listeners and their limits,
//! the admin listener's access, the state directory), their defaults, their bounds and
//! their check.

use super::bounds::Shown;
use super::tables::{self, At, Tables};
use super::{KeyError, duration, policy};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `--backend`: which sources the agent may use.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// DCMI where it works, `npu-smi` for the rest.
    #[default]
    Auto,
    /// DCMI only; devices without AI Cube calls report no figures.
    Dcmi,
    /// `npu-smi` only; `libdcmi.so` is not loaded.
    NpuSmi,
}

/// Default for how long a blocked DCMI call or a silent sampler thread is tolerated before
/// the agent calls itself unhealthy (`/healthz` 503, systemd watchdog pings stop).
pub const DEFAULT_SAMPLER_STUCK_AFTER: Duration = Duration::from_secs(10);

/// Whether `directives` is a valid level filter (`[agent] log_level`, and a reload's).
pub fn check_log_filter(directives: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(directives)
        .map(|_| ())
        .map_err(|e| format!("{directives:?} is not a valid filter like \"info\" or \"warn,npu_health_agent=debug\": {e}"))
}

/// Agent-wide settings (`[agent]` table or global flags).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentSettings {
    #[serde(with = "duration")]
    pub sample_period: Duration,
    pub dcmi_lib: Option<PathBuf>,
    pub npu_smi: PathBuf,
    pub backend: BackendChoice,
    pub dcmi_no_owner_check: bool,
    pub npu_smi_delay: u32,
    /// Admin/metrics listener (all engines' metrics, `/healthz`); none by default.
    pub admin_listen: Option<SocketAddr>,
    /// HAProxy's agent-check listener, for every engine (`integrations::haproxy`); none by
    /// default.
    pub haproxy_agent_listen: Option<SocketAddr>,
    /// Tokio worker threads.
    pub worker_threads: usize,
    /// Run the DCMI sampler thread under `SCHED_FIFO` when permitted.
    pub sampler_realtime: bool,
    /// A DCMI call blocking longer marks its NPU stale (hung). Default 1 s.
    #[serde(with = "duration")]
    pub driver_call_deadline: Duration,
    /// Time between reads of the driver's fault codes (at least 5 s through `npu-smi`).
    /// Default 1 s (docs/fault-codes.md).
    #[serde(with = "duration")]
    pub fault_period: Duration,
    /// A DCMI call blocked this long, or no sampling pass for this long, makes the agent
    /// unhealthy: `/healthz` answers 503 and the systemd watchdog pings stop. Default 10 s.
    #[serde(with = "duration")]
    pub sampler_stuck_after: Duration,
    /// Level filter (`RUST_LOG` syntax) when `RUST_LOG` is not set; default `info`.
    pub log_level: Option<String>,
    /// Connection limits of every listener the agent serves (mgmt, admin, TLS).
    pub listeners: ListenerLimits,
    /// Who may call the admin listener (`admin_token_file`, `admin_tls`).
    pub admin_auth: AdminAuthConfig,
    /// The detection policy of every engine that does not name its own. Default `agent`.
    pub policy: policy::Policy,
    /// The shadow policy of every engine that does not name its own: computed beside the
    /// policy in force on the same evidence and recorded, never answered (docs/policy.md,
    /// "The shadow policy"). Default none.
    pub shadow_policy: Option<policy::Policy>,
    /// The integrations' agent-wide tables (`[agent.kubernetes]`), each the integration's
    /// own type (`KubernetesConfig::of(agent)`).
    #[serde(flatten)]
    pub(crate) tables: Tables,
    /// Where the state file and the handover socket live (`continuity`); `None`: systemd's
    /// `RUNTIME_DIRECTORY` if set, else nothing survives a restart of the agent.
    pub state_dir: Option<PathBuf>,
    /// MindCluster's `faultCode.json` (the levels of the driver's fault codes); `None`: its
    /// install path if the file is there, else the built-in table (docs/fault-codes.md).
    pub fault_code_file: Option<PathBuf>,
    /// Also export the NPU families under Huawei npu-exporter's names (`npu_chip_info_*`),
    /// beside the agent's own (`npu_health_agent_chip_*`). Off by default: on a node that
    /// also runs npu-exporter every such series would exist twice and a sum would double
    /// (docs/operator-views.md, "Beside npu-exporter"). Start-only.
    pub npu_exporter_names: bool,
    /// The pod labels of the NPU and engine series, from the kubelet's PodResources API
    /// (`pod_resources_socket`, `pod_resources_period`); `None`: off.
    pub pod_resources: Option<PodResourcesSettings>,
    /// The evidence bundles kept at every verdict (`evidence_dir` and its caps).
    pub evidence: super::evidence::EvidenceSettings,
}

/// `[agent] pod_resources_socket` and `pod_resources_period`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodResourcesSettings {
    /// The kubelet's PodResources socket.
    pub socket: PathBuf,
    /// Time between two `List` calls. Default 10 s.
    #[serde(with = "duration")]
    pub period: Duration,
}

/// The kubelet's PodResources socket, where the kubelet serves it (`PodResourcesSocket` of
/// the Kubernetes repository's `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/constants.go`).
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Default of `pod_resources_period`.
pub(crate) const DEFAULT_POD_RESOURCES_PERIOD: Duration = Duration::from_secs(10);

impl PodResourcesSettings {
    /// `pod_resources_socket`: absolute, and short enough for a unix socket's address;
    /// `pod_resources_period` within its bounds.
    pub(crate) fn validate(&self) -> Result<(), KeyError> {
        let key = "pod_resources_socket";
        let p = &self.socket;
        if !p.is_absolute() {
            return Err((
                key.to_owned(),
                format!("{:?} is not an absolute path", p.display()),
            ));
        }
        let len = p.as_os_str().len();
        if len > SOCKET_PATH_MAX {
            return Err((
                key.to_owned(),
                format!(
                    "{:?} is {len} bytes, over the {SOCKET_PATH_MAX} a unix socket path holds",
                    p.display()
                ),
            ));
        }
        bounds::POD_RESOURCES_PERIOD.check("pod_resources_period", self.period)
    }
}

/// Access to the admin listener. With neither key it is open (bind it to loopback then);
/// `/healthz` always stays open, for liveness probes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AdminAuthConfig {
    /// A file holding the bearer token every other route requires.
    pub token_file: Option<PathBuf>,
    /// HTTPS on the admin listener; with `client_ca_file`, a client certificate signed by it.
    pub tls: Option<AdminTls>,
}

/// `[agent] admin_tls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Routes other than `/healthz` require a client certificate signed by this CA.
    pub client_ca_file: Option<PathBuf>,
}

/// Connection limits of one listener (`[agent] max_connections`, `header_read_timeout`,
/// `idle_timeout`, `stall_timeout`; see `server::conn`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ListenerLimits {
    /// Concurrent connections per listener, a share of them per source address
    /// (`slots::share`); past either the least recently active idle connection is
    /// closed to make room.
    pub max_connections: usize,
    /// A request's headers must arrive within this (also bounds a TLS handshake).
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// A connection whose peer takes nothing more of what the agent sends (its receive
    /// window stays closed), or leaves sent data unacknowledged, for this long is closed by
    /// the kernel (`TCP_USER_TIMEOUT`).
    #[serde(with = "duration")]
    pub stall_timeout: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(20),
        }
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            sample_period: Duration::from_millis(50),
            dcmi_lib: None,
            npu_smi: PathBuf::from("npu-smi"),
            backend: BackendChoice::Auto,
            dcmi_no_owner_check: false,
            npu_smi_delay: 1,
            admin_listen: None,
            haproxy_agent_listen: None,
            worker_threads: 2,
            sampler_realtime: true,
            driver_call_deadline: Duration::from_secs(1),
            fault_period: Duration::from_secs(1),
            sampler_stuck_after: DEFAULT_SAMPLER_STUCK_AFTER,
            log_level: None,
            listeners: ListenerLimits::default(),
            admin_auth: AdminAuthConfig::default(),
            policy: policy::Policy::default(),
            shadow_policy: None,
            tables: Tables::defaults(&tables::listed(), At::Agent),
            state_dir: None,
            fault_code_file: None,
            npu_exporter_names: false,
            pod_resources: None,
            evidence: super::evidence::EvidenceSettings::default(),
        }
    }
}

impl AgentSettings {
    /// Bounds of `[agent]` (host mode; single-engine mode takes the defaults and the flags).
    pub(crate) fn validate(&self) -> Result<(), KeyError> {
        use bounds::{
            DRIVER_CALL_DEADLINE, FAULT_PERIOD, HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS,
            NPU_SMI_DELAY, SAMPLE_PERIOD, SAMPLER_STUCK_AFTER, STALL_TIMEOUT, WORKER_THREADS,
        };
        let s = self;
        SAMPLE_PERIOD.check("sample_period", s.sample_period)?;
        NPU_SMI_DELAY.check("npu_smi_delay", s.npu_smi_delay)?;
        WORKER_THREADS.check("worker_threads", s.worker_threads)?;
        DRIVER_CALL_DEADLINE.check("driver_call_deadline", s.driver_call_deadline)?;
        FAULT_PERIOD.check("fault_period", s.fault_period)?;
        SAMPLER_STUCK_AFTER.check("sampler_stuck_after", s.sampler_stuck_after)?;
        if s.sampler_stuck_after <= s.driver_call_deadline {
            return Err((
                "sampler_stuck_after".to_owned(),
                format!(
                    "`{}` must be longer than driver_call_deadline (`{}`)",
                    s.sampler_stuck_after.shown(),
                    s.driver_call_deadline.shown()
                ),
            ));
        }
        let l = &s.listeners;
        MAX_CONNECTIONS.check("max_connections", l.max_connections)?;
        HEADER_READ_TIMEOUT.check("header_read_timeout", l.header_read_timeout)?;
        IDLE_TIMEOUT.check("idle_timeout", l.idle_timeout)?;
        STALL_TIMEOUT.check("stall_timeout", l.stall_timeout)?;
        if let Some(d) = &s.state_dir {
            check_state_dir(d).map_err(|m| ("state_dir".to_owned(), m))?;
        }
        if let Some(p) = &s.pod_resources {
            p.validate()?;
        }
        s.evidence.validate()
    }
}

/// The longest unix socket path (`sun_path` holds 108 bytes with the terminating NUL).
pub(crate) const SOCKET_PATH_MAX: usize = 107;

/// The handover socket's name inside the state directory (`continuity`).
pub(crate) const HANDOVER_SOCKET: &str = "handover.sock";

/// A state directory: absolute, and short enough for the handover socket's path.
pub(crate) fn check_state_dir(p: &std::path::Path) -> Result<(), String> {
    if !p.is_absolute() {
        return Err(format!("{:?} is not an absolute path", p.display()));
    }
    let socket = p.join(HANDOVER_SOCKET);
    let len = socket.as_os_str().len();
    if len > SOCKET_PATH_MAX {
        return Err(format!(
            "{:?} is too long: the handover socket {:?} would be {len} bytes, over the {SOCKET_PATH_MAX} a unix socket path holds",
            p.display(),
            socket.display()
        ));
    }
    Ok(())
}

/// `[agent]` bounds.
pub(crate) mod bounds {
    use crate::config::bounds::{Within, ms, secs};
    use std::time::Duration;

    /// The sampler's periods (`sampler::MIN_PERIOD`, `MAX_PERIOD` are these).
    pub(crate) const SAMPLE_PERIOD: Within<Duration> =
        Within::new(Duration::from_micros(10), secs(60));
    pub(crate) const NPU_SMI_DELAY: Within<u32> = Within::new(1, 100);
    pub(crate) const WORKER_THREADS: Within<usize> = Within::new(1, 64);
    pub(crate) const DRIVER_CALL_DEADLINE: Within<Duration> = Within::new(ms(10), secs(60));
    pub(crate) const FAULT_PERIOD: Within<Duration> = Within::new(ms(10), secs(60));
    pub(crate) const SAMPLER_STUCK_AFTER: Within<Duration> = Within::new(secs(1), secs(600));
    pub(crate) const MAX_CONNECTIONS: Within<usize> = Within::new(4, 65536);
    pub(crate) const HEADER_READ_TIMEOUT: Within<Duration> = Within::new(ms(100), secs(120));
    pub(crate) const IDLE_TIMEOUT: Within<Duration> = Within::new(secs(1), secs(3600));
    pub(crate) const STALL_TIMEOUT: Within<Duration> = Within::new(secs(1), secs(600));
    pub(crate) const POD_RESOURCES_PERIOD: Within<Duration> = Within::new(ms(100), secs(600));
}
