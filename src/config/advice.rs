//! What `check-config` says of a valid configuration that may not do what was meant: an
//! engine with virtual inference off (a `WARNING`: a hung engine is then never reported), and
//! a `/status` on loopback (a note: Node Manager polls from its own host or pod). Each names
//! the key to set, where the engine was written.

use super::AgentConfig;
use super::engine::origin_file;

impl AgentConfig {
    /// One line per engine whose `enable_virtual_inference` is false: what that costs and the
    /// key that turns it on (in `agent.toml`, or MindIE's JSON path in its `user_config.json`).
    pub(crate) fn virtual_inference_off(&self) -> Vec<String> {
        self.engines
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.health_check_config.enable_virtual_inference)
            .map(|(i, e)| {
                let set = match origin_file(&e.origin) {
                    None => format!(
                        "{} = true",
                        self.engine_place(i, "health_check_config.enable_virtual_inference")
                    ),
                    Some(file) => format!(
                        "{}.health_check_config.enable_virtual_inference to true in {file}",
                        e.role.section()
                    ),
                };
                format!(
                    "engine {}: virtual inference is off, so a hung engine (alive, /health 200, no token out) is never reported abnormal; set {set}",
                    e.name
                )
            })
            .collect()
    }

    /// One line per engine whose `/status` listens on a loopback address, which a Node
    /// Manager on another host or in another pod cannot reach.
    pub(crate) fn loopback_status(&self) -> Vec<String> {
        self.engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.mgmt_listen.ip().is_loopback())
            .map(|(i, e)| {
                format!(
                    "engine {}'s /status listens on {}, a loopback address: a Node Manager on another host or in another pod cannot reach it; set {} to \"0.0.0.0\" or the node's address where it polls from elsewhere",
                    e.name,
                    e.mgmt_listen,
                    self.engine_place(i, "mgmt_host")
                )
            })
            .collect()
    }
}
