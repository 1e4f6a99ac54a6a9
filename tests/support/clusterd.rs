//! A stand-in for MindCluster's ClusterD as a consumer of public faults: it takes the
//! messages of ConfigMaps labelled `mc-consumer-publicfault=true` (data key `PublicFault`)
//! in the order the API server took them, and applies ClusterD's rules, as read in
//! Ascend/mind-cluster @ 22bb3d98 (every rule's file is cited in docs/kubernetes.md):
//!
//! - the per-resource limiter, 1 token a second, burst 100, a message over it dropped
//!   (`component/clusterd/pkg/application/publicfault/limiter.go`);
//! - the checker's regexes and limits, an invalid fault removed, a message with none left
//!   dropped (`checker.go` beside it);
//! - the code → level lookup from `publicCustomization.json`, SeparateNPU first, a code it
//!   does not list invalid (`component/clusterd/pkg/domain/publicfault/util.go`);
//! - `occur` added if absent, `recover` deleting an occur held at least 5 s (later if
//!   younger), `once` held 5 s (`dealFault` in `fault_collector.go`).
//!
//! A rejection is silent to the writer, as in ClusterD: only this consumer's log says it.
//! Time is given by the caller (each write's arrival), so nothing here waits on a clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// ClusterD's hold of an `occur` before a `recover` deletes it (`diffTime`).
pub const HOLD: Duration = Duration::from_secs(5);

/// A fault in ClusterD's cache, as `cluster-info-cm` would show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub fault_id: String,
    pub code: String,
    pub level: String,
    pub device_ids: Vec<i64>,
    /// Seconds, as ClusterD stores it.
    pub fault_time_s: i64,
    added: Instant,
}

/// The consumer's state.
pub struct ClusterD {
    levels: Vec<(String, Vec<String>)>,
    resources: Vec<String>,
    limiters: BTreeMap<String, (f64, Instant)>,
    /// By node, then `resource + faultId`.
    cache: BTreeMap<String, BTreeMap<String, Held>>,
    deletes: Vec<(Instant, String, String)>,
    /// Every message taken whole, as received (JSON).
    pub accepted: Vec<serde_json::Value>,
    /// Why each message or fault was dropped.
    pub log: Vec<String>,
}

/// The levels public faults may have, most severe first (`GetFaultLevelByCode`).
const LEVELS: [(&str, &str); 4] = [
    ("SeparateNPUCodes", "SeparateNPU"),
    ("PreSeparateNPUCodes", "PreSeparateNPU"),
    ("SubHealthFaultCodes", "SubHealthFault"),
    ("NotHandleFaultCodes", "NotHandleFault"),
];

fn id_ok(s: &str) -> bool {
    (8..=128).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// `^\d{13}$` and not before 2025-01-01.
fn time_ok(t: &serde_json::Value) -> bool {
    t.as_i64()
        .is_some_and(|t| t.to_string().len() == 13 && t >= 1_735_689_600_000)
}

fn node_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=253).contains(&b.len())
        && edge(b[0])
        && edge(b[b.len() - 1])
        && b.iter().all(|&c| edge(c) || c == b'-' || c == b'.')
}

impl ClusterD {
    /// A consumer configured by `custom` (a `publicCustomization.json`).
    pub fn new(custom: &str) -> ClusterD {
        let v: serde_json::Value = serde_json::from_str(custom).expect("publicCustomization.json");
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        ClusterD {
            levels: LEVELS
                .iter()
                .map(|(k, l)| ((*l).to_owned(), strings(&v["publicFaultCode"][k])))
                .collect(),
            resources: strings(&v["publicFaultResource"]),
            limiters: BTreeMap::new(),
            cache: BTreeMap::new(),
            deletes: Vec::new(),
            accepted: Vec::new(),
            log: Vec::new(),
        }
    }

    fn level(&self, code: &str) -> Option<String> {
        self.levels
            .iter()
            .find(|(_, codes)| codes.iter().any(|c| c == code))
            .map(|(l, _)| l.clone())
    }

    /// `rate.NewLimiter(rate.Every(time.Second), 100)` per resource, `Allow()` at `now`.
    fn allow(&mut self, resource: &str, now: Instant) -> Result<(), String> {
        if !self.resources.iter().any(|r| r == resource) {
            return Err(format!("resource <{resource}> limiter does not exist"));
        }
        let (tokens, at) = self
            .limiters
            .entry(resource.to_owned())
            .or_insert((100.0, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64()).min(100.0);
        *at = (*at).max(now);
        if *tokens < 1.0 {
            return Err(format!(
                "request exceeds the upper limit, resource: <{resource}>"
            ));
        }
        *tokens -= 1.0;
        Ok(())
    }

    /// Why one fault is invalid (`faultChecker.check`).
    fn fault_error(&self, f: &serde_json::Value) -> Option<String> {
        let s = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
        if !id_ok(&s("faultId")) {
            return Some("invalid fault id".into());
        }
        if !["NPU", "Node", "Network", "Storage"].contains(&s("faultType").as_str()) {
            return Some("invalid fault type".into());
        }
        let code = s("faultCode");
        if code.len() != 9 || self.level(&code).is_none() {
            return Some(format!("invalid fault code {code:?}"));
        }
        if !time_ok(&f["faultTime"]) {
            return Some("invalid fault time".into());
        }
        if !["occur", "recover", "once"].contains(&s("assertion").as_str()) {
            return Some("invalid fault assertion".into());
        }
        if let Some(loc) = f["faultLocation"].as_object()
            && (loc.len() > 10
                || loc
                    .iter()
                    .any(|(k, v)| k.len() > 16 || v.as_str().is_none_or(|v| v.len() > 128)))
        {
            return Some("invalid fault location".into());
        }
        let inf = f["influence"].as_array().cloned().unwrap_or_default();
        if !(1..=1000).contains(&inf.len()) {
            return Some("invalid influence length".into());
        }
        for i in &inf {
            if !node_ok(i["nodeName"].as_str().unwrap_or_default()) {
                return Some("invalid node name".into());
            }
            let ids: Vec<i64> = i["deviceIds"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
                .unwrap_or_default();
            let mut unique = ids.clone();
            unique.sort_unstable();
            unique.dedup();
            if !(1..=32).contains(&ids.len()) || unique.len() != ids.len() {
                return Some("invalid device id length or duplicate ids".into());
            }
            if ids.iter().any(|d| !(0..=31).contains(d)) {
                return Some("invalid device id".into());
            }
        }
        let d = s("description");
        if d.chars().count() > 512 || d.chars().any(|c| c.is_whitespace() && c != ' ') {
            return Some("invalid fault description".into());
        }
        None
    }

    /// Takes one message (the `PublicFault` data of a ConfigMap) arriving at `now`: `Err`
    /// with ClusterD's reason when it is dropped whole.
    pub fn receive(&mut self, text: &str, now: Instant) -> Result<(), String> {
        self.expire(now);
        let r = self.take(text, now);
        if let Err(e) = &r {
            self.log.push(e.clone());
        }
        r
    }

    fn take(&mut self, text: &str, now: Instant) -> Result<(), String> {
        let mut m: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("parse public fault cm error: {e}"))?;
        let resource = m["resource"].as_str().unwrap_or_default().to_owned();
        self.allow(&resource, now)?;
        if !id_ok(m["id"].as_str().unwrap_or_default()) {
            return Err("invalid id".into());
        }
        if !time_ok(&m["timestamp"]) {
            return Err("invalid timestamp".into());
        }
        if m["version"] != "1.0" {
            return Err("invalid version".into());
        }
        let faults = m["faults"].as_array().cloned().unwrap_or_default();
        if !(1..=100).contains(&faults.len()) {
            return Err("invalid faults length".into());
        }
        let mut valid = Vec::new();
        for f in faults {
            match self.fault_error(&f) {
                Some(e) => self.log.push(format!(
                    "fault({}) is invalid and will be removed, err is {e}",
                    f["faultId"]
                )),
                None => valid.push(f),
            }
        }
        if valid.is_empty() {
            return Err("there is no valid fault".into());
        }
        m["faults"] = serde_json::Value::Array(valid.clone());
        self.accepted.push(m);
        for f in &valid {
            for i in f["influence"].as_array().into_iter().flatten() {
                self.deal(&resource, f, i, now);
            }
        }
        Ok(())
    }

    /// `dealFault`: one fault on one node.
    fn deal(&mut self, resource: &str, f: &serde_json::Value, i: &serde_json::Value, now: Instant) {
        let node = i["nodeName"].as_str().unwrap_or_default().to_owned();
        let key = format!("{resource}{}", f["faultId"].as_str().unwrap_or_default());
        let code = f["faultCode"].as_str().unwrap_or_default().to_owned();
        let held = Held {
            fault_id: f["faultId"].as_str().unwrap_or_default().to_owned(),
            level: self.level(&code).unwrap_or_default(),
            code,
            device_ids: i["deviceIds"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_i64).collect())
                .unwrap_or_default(),
            fault_time_s: f["faultTime"].as_i64().unwrap_or_default() / 1000,
            added: now,
        };
        let existing = self
            .cache
            .get(&node)
            .and_then(|c| c.get(&key))
            .map(|h| h.added);
        match (f["assertion"].as_str().unwrap_or_default(), existing) {
            ("occur", None) => {
                self.cache.entry(node).or_default().insert(key, held);
            }
            ("occur", Some(_)) => {}
            ("recover", None) => self.deletes.push((now + HOLD, node, key)),
            ("recover", Some(added)) if now.saturating_duration_since(added) >= HOLD => {
                self.cache.entry(node).or_default().remove(&key);
            }
            ("recover", Some(added)) => self.deletes.push((added + HOLD, node, key)),
            ("once", None) => {
                self.cache
                    .entry(node.clone())
                    .or_default()
                    .insert(key.clone(), held);
                self.deletes.push((now + HOLD, node, key));
            }
            _ => {}
        }
    }

    /// Carries out the deletes due by `now` (`DealDelete`).
    fn expire(&mut self, now: Instant) {
        let (due, later): (Vec<_>, Vec<_>) = self.deletes.drain(..).partition(|(t, ..)| *t <= now);
        self.deletes = later;
        for (_, node, key) in due {
            if let Some(c) = self.cache.get_mut(&node) {
                c.remove(&key);
            }
        }
    }

    /// The faults held for `node` at `now`, by fault id.
    pub fn faults(&mut self, node: &str, now: Instant) -> Vec<Held> {
        self.expire(now);
        self.cache
            .get(node)
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Takes every labelled ConfigMap write the stand-in API server accepted, in order.
    pub fn read_writes(&mut self, writes: &[(Instant, k8s_openapi::api::core::v1::ConfigMap)]) {
        for (at, cm) in writes {
            let labelled = cm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("mc-consumer-publicfault"))
                .is_some_and(|v| v == "true");
            let data = cm.data.as_ref().and_then(|d| d.get("PublicFault"));
            match (labelled, data) {
                (true, Some(text)) => {
                    let _ = self.receive(text, *at);
                }
                (true, None) => self.log.push("no PublicFault data".into()),
                (false, _) => {}
            }
        }
    }
}
