//! The public-fault message as ClusterD reads it, and the ConfigMap that carries it.
//!
//! The fields and their JSON names are those of `PubFaultInfo`, `Fault` and `Influence` in
//! `component/ascend-common/api/publicfault.go` (Ascend/mind-cluster @ 22bb3d98); the label
//! `mc-consumer-publicfault=true` and the data key `PublicFault` are
//! `PubFaultCMLabelKey` and `PubFaultCMDataKey` of `component/ascend-common/api/consts.go`.
//! [`check`] applies the limits of ClusterD's checker
//! (`component/clusterd/pkg/application/publicfault/checker.go`) before anything is written:
//! ClusterD drops a message it rejects without a word to the writer, so the agent says why
//! in its own log instead.

use super::{Assertion, FaultSent};
use serde::{Deserialize, Serialize};

/// The ConfigMap label ClusterD's informer selects on, and its value.
pub(crate) const LABEL: (&str, &str) = ("mc-consumer-publicfault", "true");
/// The data key holding the message.
pub(crate) const DATA_KEY: &str = "PublicFault";
/// The only version ClusterD takes.
pub(crate) const VERSION: &str = "1.0";
/// ClusterD's floor for `timestamp` and `faultTime`: 2025-01-01T00:00:00Z in ms.
pub(crate) const TIME_FLOOR_MS: u64 = 1_735_689_600_000;
/// Most device ids per influence, and the highest id (`checkDeviceIds`).
pub(crate) const MAX_DEVICE_IDS: usize = 32;
pub(crate) const MAX_DEVICE_ID: u32 = 31;
/// Most characters of a description (`^[\S ]{0,512}$`).
pub(crate) const MAX_DESCRIPTION: usize = 512;

/// `PubFaultInfo`: one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Message {
    pub id: String,
    pub timestamp: u64,
    pub version: String,
    pub resource: String,
    pub faults: Vec<Fault>,
}

/// `Fault`: one fault and where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Fault {
    pub fault_id: String,
    pub fault_type: String,
    pub fault_code: String,
    pub fault_time: u64,
    pub assertion: Assertion,
    pub influence: Vec<Influence>,
    pub description: String,
}

/// `Influence`: the node (by name) and its NPUs (by physical id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Influence {
    pub node_name: String,
    pub device_ids: Vec<u32>,
}

/// The message for `faults` of the engine `key` on `node`, from `resource`, at `now_ms`.
pub(crate) fn message(
    key: &str,
    node: &str,
    resource: &str,
    faults: &[(FaultSent, Assertion)],
    now_ms: u64,
) -> Message {
    Message {
        id: format!("nha-{key}-{now_ms}"),
        timestamp: now_ms,
        version: VERSION.to_owned(),
        resource: resource.to_owned(),
        faults: faults
            .iter()
            .map(|(f, a)| Fault {
                fault_id: f.fault_id.clone(),
                fault_type: "NPU".to_owned(),
                fault_code: f.code.clone(),
                fault_time: f.fault_time_unix_ms,
                assertion: *a,
                influence: vec![Influence {
                    node_name: node.to_owned(),
                    device_ids: f.device_ids.clone(),
                }],
                description: f.description.clone(),
            })
            .collect(),
    }
}

/// One line of at most [`MAX_DESCRIPTION`] characters that ClusterD's description regex
/// takes: every whitespace but a space becomes a space.
pub(crate) fn description(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .take(MAX_DESCRIPTION)
        .collect()
}

/// The NPUs' physical ids as ClusterD takes them (`0..=31`, each once, sorted), and those
/// left out in words (`None`: no physical id from the driver).
pub(crate) fn device_ids(phy: &[Option<u32>]) -> (Vec<u32>, Vec<String>) {
    let mut ids = Vec::new();
    let mut left = Vec::new();
    for p in phy {
        match p {
            Some(id) if *id <= MAX_DEVICE_ID => ids.push(*id),
            Some(id) => left.push(format!("physical id {id} is over {MAX_DEVICE_ID}")),
            None => left.push("an NPU without a physical id from the driver".to_owned()),
        }
    }
    ids.sort_unstable();
    ids.dedup();
    (ids, left)
}

/// Whether ClusterD's checker would take `m` whole (`Err`: the first rule it breaks). The
/// code's presence in ClusterD's configuration and the resource's in its list are the
/// operator's (docs/kubernetes.md); they cannot be checked from here.
pub(crate) fn check(m: &Message) -> Result<(), String> {
    let id_ok = |s: &str| {
        (8..=128).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let time_ok = |t: u64| (TIME_FLOOR_MS..10_000_000_000_000).contains(&t);
    if !id_ok(&m.id) {
        return Err(format!(
            "message id {:?} is not 8 to 128 of [a-zA-Z0-9-_.]",
            m.id
        ));
    }
    if !time_ok(m.timestamp) {
        return Err(format!(
            "the host's clock ({} ms) is before 2025-01-01, which ClusterD refuses",
            m.timestamp
        ));
    }
    if !(1..=100).contains(&m.faults.len()) {
        return Err(format!("{} faults (1 to 100)", m.faults.len()));
    }
    for f in &m.faults {
        if !id_ok(&f.fault_id) {
            return Err(format!("fault id {:?}", f.fault_id));
        }
        if f.fault_code.len() != 9 {
            return Err(format!("fault code {:?} is not 9 characters", f.fault_code));
        }
        if !time_ok(f.fault_time) {
            return Err(format!("fault time {} is before 2025-01-01", f.fault_time));
        }
        if f.description.chars().count() > MAX_DESCRIPTION
            || f.description.chars().any(|c| c.is_whitespace() && c != ' ')
        {
            return Err("a description over 512 characters or not one line".to_owned());
        }
        for i in &f.influence {
            let n = i.device_ids.len();
            let mut sorted = i.device_ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if n == 0 || n > MAX_DEVICE_IDS || sorted.len() != n {
                return Err(format!(
                    "{n} device ids, or some twice (1 to {MAX_DEVICE_IDS}, each once)"
                ));
            }
            if let Some(id) = i.device_ids.iter().find(|&&d| d > MAX_DEVICE_ID) {
                return Err(format!("device id {id} is over {MAX_DEVICE_ID}"));
            }
        }
    }
    Ok(())
}

/// The ConfigMap carrying `m`, named `name` in `namespace`; `engine` and `node` are kept
/// in its annotations for whoever reads it with kubectl.
pub(crate) fn configmap(
    namespace: &str,
    name: &str,
    engine: &str,
    node: &str,
    m: &Message,
) -> serde_json::Value {
    let text = serde_json::to_string(m).expect("plain data encodes");
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                LABEL.0: LABEL.1,
                "app.kubernetes.io/managed-by": "npu-health-agent",
            },
            "annotations": {
                "npu-health-agent.io/engine": engine,
                "npu-health-agent.io/node": node,
            },
        },
        "data": { DATA_KEY: text },
    })
}

/// The ConfigMap's name: `<prefix>-<node>-<engine slug>-<8 hex of the key>`, a DNS
/// subdomain of at most 253 characters whatever the engine's name.
pub(crate) fn configmap_name(prefix: &str, node: &str, engine: &str, key: &str) -> String {
    let slug: String = engine
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .take(40)
        .collect();
    let slug = slug.trim_matches('-');
    let tail = if slug.is_empty() {
        key[..8].to_owned()
    } else {
        format!("{slug}-{}", &key[..8])
    };
    // The node is cut so the whole stays within 253 (a DNS subdomain's limit).
    let room = 253usize.saturating_sub(prefix.len() + tail.len() + 2);
    let node: String = node.chars().take(room).collect();
    let node = node.trim_matches(|c: char| c == '-' || c == '.');
    format!("{prefix}-{node}-{tail}")
}
