//! The evidence seam's proof: a test-only 13th rule, [`Canary`], living in this one file and
//! one line of [`super::SOURCES`]. Its loop, spawned by the monitor from the list, sings for
//! an engine a test armed; its finding, read by the one verdict, makes that engine abnormal
//! and names rule 13 in the cause. Nothing else in the agent knows it.

use super::{Finding, Kind, Loops, Rule, RuleId, Source, Task};
use crate::monitor::Monitor;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// A source that only a test arms.
pub(super) struct Canary;

/// The 13th rule.
const SANG: Rule = Rule {
    id: RuleId(13),
    name: "canary_sang",
    doc: "test only: an engine whose canary loop sang is abnormal",
    keys: &[],
};

/// The engines a test armed (their loops sing), and those whose loop sang, by name.
static ARMED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SUNG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn has(list: &Mutex<Vec<String>>, name: &str) -> bool {
    list.lock().unwrap().iter().any(|n| n == name)
}

impl Source for Canary {
    fn name(&self) -> &'static str {
        "canary"
    }

    fn rules(&self) -> &'static [Rule] {
        &[SANG]
    }

    fn finding(&self, m: &Monitor, _: super::Side) -> Option<Finding> {
        has(&SUNG, &m.spec.name).then_some(Finding {
            kind: Kind::VirtualInference,
            rule: Some(SANG.id),
        })
    }

    fn reason(&self, _: &Monitor, _: &Finding) -> String {
        "the canary sang (test-only rule 13)".to_owned()
    }

    fn task(&self, m: &Arc<Monitor>, _: &Loops<'_>, _: &CancellationToken) -> Option<Task> {
        let name = m.spec.name.clone();
        has(&ARMED, &name)
            .then(|| -> Task { Box::pin(async move { SUNG.lock().unwrap().push(name) }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;
    use crate::integrations::facts::{AbnormalCause, ActionInputs};
    use crate::monitor::verdict::Status;
    use crate::probe::health::HealthOutcome;
    use crate::probe::http::EngineClient;
    use crate::sampler::Sampler;

    /// An engine on a port nothing listens on, under the reference policy.
    fn monitor(name: &str) -> Arc<Monitor> {
        let text = format!(
            "[[engine]]\nname = \"{name}\"\npolicy = \"reference\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 9\nmgmt_port = 9001\nengine_env = {{}}\n"
        );
        let spec = file::parse(&text, std::path::Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0);
        Arc::new(Monitor::new(spec, Vec::new()))
    }

    #[tokio::test]
    async fn a_thirteenth_rule_in_one_file_fires_through_the_one_verdict_and_names_itself_in_the_cause()
     {
        let m = monitor("seam-canary");
        ARMED.lock().unwrap().push(m.spec.name.clone());
        m.record_health(&HealthOutcome::Healthy, true);
        assert_eq!(m.verdict().status, Status::Normal, "{:?}", m.verdict());

        // The monitor spawns every loop from the list; the canary's sings at once, and the
        // others end at the cancellation.
        let client = EngineClient::new(&m.spec).unwrap();
        let sampler = Sampler::without_backend("the seam test has no NPU");
        let with = Loops {
            client: &client,
            shared: sampler.shared(),
            saved_start: None,
        };
        let cancel = CancellationToken::new();
        let mut tasks = m.spawn_loops(&with, &cancel);
        cancel.cancel();
        while tasks.join_next().await.is_some() {}
        assert!(
            has(&SUNG, &m.spec.name),
            "the monitor did not spawn the canary's loop"
        );

        let v = m.verdict();
        assert_eq!(v.status, Status::Abnormal);
        let cause = v.cause.expect("an abnormal verdict has a cause");
        assert_eq!((cause.source, cause.rule), ("canary", Some(RuleId(13))));
        assert_eq!(v.reason, "the canary sang (test-only rule 13)");
        assert_eq!(m.status(), Status::Abnormal);
        assert_eq!(m.status().body(), r#"{"status":"abnormal"}"#);
        let read = ActionInputs::of(&m);
        assert_eq!(read.status, Status::Abnormal);
        assert_eq!(read.cause, Some(AbnormalCause::VirtualInference));
        assert_eq!(read.reason, v.reason);
    }

    #[test]
    fn the_thirteenth_rule_is_listed_with_its_source() {
        let listed: Vec<(&str, u8)> = crate::monitor::evidence::rules()
            .map(|(s, r)| (s.name(), r.id.0))
            .collect();
        assert!(listed.contains(&("canary", 13)), "{listed:?}");
    }
}
