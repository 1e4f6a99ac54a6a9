//! What `agent.toml` writes beyond the values its serde structs hold, read from the parsed
//! document: which `[engine.qos]` keys each engine sets (its policy's preset leaves them
//! alone), and whether `[agent]` names the policy (for where an engine's policy came from).

/// What the file writes, beyond the values the serde structs hold: which `[engine.qos]` keys
/// each engine sets (its policy's preset leaves them alone), and whether `[agent]` names the
/// policy (for where an engine's policy came from).
pub(super) struct Written {
    pub(super) qos: Vec<Vec<String>>,
    pub(super) agent_policy: bool,
}

impl Written {
    pub(super) fn of(doc: &toml::de::DeTable<'_>) -> Written {
        fn table<'a, 'i>(
            v: &'a toml::Spanned<toml::de::DeValue<'i>>,
        ) -> Option<&'a toml::de::DeTable<'i>> {
            v.get_ref().as_table()
        }
        let qos = doc
            .get("engine")
            .and_then(|e| e.get_ref().as_array())
            .map(|engines| {
                engines
                    .iter()
                    .map(|e| {
                        table(e)
                            .and_then(|e| e.get("qos"))
                            .and_then(table)
                            .map(|q| q.keys().map(|k| k.get_ref().to_string()).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default();
        let agent_policy = doc
            .get("agent")
            .and_then(table)
            .is_some_and(|a| a.get("policy").is_some());
        Written { qos, agent_policy }
    }
}
