//! `[agent.kubernetes.brake]`: the fleet brake's settings (docs/configuration.md, "The fleet
//! brake"; docs/kubernetes.md says what it does). Off by default.

use crate::config::KeyError;
use crate::config::bounds::{Within, ms, secs};
use crate::integrations::kubernetes::config::bounds::{dns_label, dns_subdomain, label_selector};
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<BrakeConfig, String> {
        let c: BrakeConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map_err(|(k, m)| format!("{k}: {m}"))?;
        Ok(c)
    }

    #[test]
    fn the_defaults_are_off_half_the_fleet_in_five_minutes() {
        let c = parsed("").unwrap();
        assert!(!c.enabled);
        assert_eq!((c.max_fraction, c.window), (0.5, Duration::from_secs(300)));
        assert_eq!(c.name, DEFAULT_NAME);
    }

    #[test]
    fn each_bad_value_is_refused_with_its_key() {
        for (text, key) in [
            ("enabled = true", "brake.fleet"),
            ("max_fraction = 0.0", "brake.max_fraction"),
            ("max_fraction = 1.5", "brake.max_fraction"),
            ("window = \"10s\"", "brake.window"),
            ("name = \"Brake!\"", "brake.name"),
            (
                "fleet = { namespace = \"Not_A_Label\" }",
                "brake.fleet.namespace",
            ),
            ("fleet = { selector = \"app=v*\" }", "brake.fleet.selector"),
            ("retries = 51", "brake.retries"),
        ] {
            let e = parsed(text).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        let e = parsed("fleet = { nmespace = \"a\" }").unwrap_err();
        assert!(e.contains("nmespace"), "{e}");
        assert!(parsed("enabled = true\nfleet = { selector = \"app=vllm\" }").is_ok());
    }
}
