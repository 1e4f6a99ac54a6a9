//! The evidence wing: one file per source of evidence about an engine, each holding its loop,
//! its reading, its rules and their keys, behind one small trait ([`Source`]) and one list
//! ([`SOURCES`]).
//!
//! The monitor reads the list twice and nothing else: to spawn each source's loop
//! ([`Monitor::spawn_loops`]), and to compute the one verdict ([`Monitor::verdict`]): the
//! first source in the list whose evidence makes the engine abnormal gives the cause and the
//! reason. `/status`, `/status/detail` and every integration read that one value.
//!
//! Every rule of docs/policy.md is a [`Rule`] of the source whose evidence it reads, keyed by
//! its number there ([`RuleId`]); [`rules`] lists them all, and a test holds docs/policy.md's
//! table to that list.
//!
//! The wing lives inside the monitor, not beside it: the sources write the monitor's state
//! and the monitor walks the sources, which as two top-level modules would be an import
//! circle; as the monitor's children they reach its state without it naming them.

pub(crate) mod driver_faults;
pub(crate) mod health;
pub(crate) mod identity;
pub mod processes;
pub(crate) mod progress;
pub(crate) mod qos;
pub(crate) mod virtual_inference;

#[cfg(test)]
mod seam_tests;

use super::Monitor;
use super::verdict::{HealthState, Status};
use super::vi_state::Phase;
pub(crate) use crate::config::policy::Side;
use crate::probe::http::EngineClient;
use crate::sampler::Shared;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Every source of evidence, in the order the verdict asks them: the first whose evidence
/// makes the engine abnormal names the cause.
pub static SOURCES: &[&dyn Source] = &[
    &health::Health,
    &processes::Processes,
    &virtual_inference::VirtualInference,
    &qos::Qos,
    &progress::Progress,
    &driver_faults::DriverFaults,
    &identity::Identity,
    #[cfg(test)]
    &seam_tests::Canary,
];

/// One source of evidence about an engine.
pub trait Source: Sync {
    /// Its name (`health`, `virtual_inference`, …).
    fn name(&self) -> &'static str;

    /// The rules of docs/policy.md that read it.
    fn rules(&self) -> &'static [Rule] {
        &[]
    }

    /// What its evidence says of `m` now, as `side` judges: `Some` when one of the rules
    /// `side` applies makes the engine abnormal. Read at every `/status` (the policy in
    /// force) and by the observer (the shadow): atomics and short locks only.
    fn finding(&self, _m: &Monitor, _side: Side) -> Option<Finding> {
        None
    }

    /// Why `finding` made the engine abnormal, in words (`/status/detail`'s `reason`).
    fn reason(&self, _m: &Monitor, _finding: &Finding) -> String {
        String::new()
    }

    /// Why `finding` made the engine abnormal as `side` judges (the shadow's own words where
    /// they differ, as for virtual inference's own count).
    fn reason_on(&self, m: &Monitor, finding: &Finding, side: Side) -> String {
        let _ = side;
        self.reason(m, finding)
    }

    /// Its loop for the engine `m`, if it runs one, until `cancel`.
    fn task(
        &self,
        _m: &Arc<Monitor>,
        _with: &Loops<'_>,
        _cancel: &CancellationToken,
    ) -> Option<Task> {
        None
    }
}

/// A source's loop, ready to spawn.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the sources' loops read from outside the monitor.
pub struct Loops<'a> {
    /// The engine's HTTP client (`/health`, the virtual request, `/metrics`).
    pub client: &'a EngineClient,
    /// The sampler's ring and devices (the AI Cube peaks, the driver's faults).
    pub shared: &'a Arc<Shared>,
    /// The engine process's start time in a restored state, which the identity check
    /// confirms; `None` when no saved `/health` state was carried over.
    pub saved_start: Option<f64>,
}

/// A rule's number in docs/policy.md: its key, stable across releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleId(pub u8);

/// One rule of docs/policy.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub id: RuleId,
    /// Its name, snake_case, as docs/policy.md's table writes it.
    pub name: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
    /// The configuration keys it reads (`[engine.agent_policy]`, `[engine.qos]`).
    pub keys: &'static [&'static str],
}

/// Every rule, source by source, in [`SOURCES`]' order.
pub fn rules() -> impl Iterator<Item = (&'static dyn Source, &'static Rule)> {
    SOURCES
        .iter()
        .flat_map(|s| s.rules().iter().map(move |r| (*s, r)))
}

/// How the integrations tell one abnormal from another (a closed port and a held `evict`
/// are treated apart; the rest alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/health` answered before and fails now.
    Health,
    /// One of the engine's processes is stopped.
    EngineStopped,
    /// The engine does not serve: virtual inference went abnormal.
    VirtualInference,
    /// A held QoS `evict` with `qos.eviction` on.
    QosEviction,
}

/// What a source's evidence says when it makes the engine abnormal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finding {
    pub kind: Kind,
    /// The rule of docs/policy.md that fired; `None` for the reference's own rules.
    pub rule: Option<RuleId>,
}

/// Why the engine is abnormal: the source, and what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cause {
    /// The source's name.
    pub source: &'static str,
    pub kind: Kind,
    pub rule: Option<RuleId>,
}

/// The one verdict: what `/status` serves, why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    /// `None` unless `status` is `abnormal`.
    pub cause: Option<Cause>,
    pub reason: String,
}

impl Verdict {
    /// The verdict of `status`, the source and finding that made it (if any), and `reason`.
    fn of(status: Status, found: Option<(&dyn Source, Finding)>, reason: String) -> Verdict {
        Verdict {
            status,
            cause: found.map(|(source, f)| Cause {
                source: source.name(),
                kind: f.kind,
                rule: f.rule,
            }),
            reason,
        }
    }
}

impl Monitor {
    /// Spawns every source's loop for this engine, until `cancel`.
    pub fn spawn_loops(
        self: &Arc<Self>,
        with: &Loops<'_>,
        cancel: &CancellationToken,
    ) -> JoinSet<()> {
        let mut tasks = JoinSet::new();
        for task in SOURCES.iter().filter_map(|s| s.task(self, with, cancel)) {
            tasks.spawn(task);
        }
        tasks
    }

    /// The status and, when abnormal, the source and its finding: the cheap half of the
    /// verdict, which `/status` reads at every poll.
    fn judged(&self) -> (Status, Option<(&'static dyn Source, Finding)>) {
        let judged = self.judged_on(Side::InForce);
        // The restart-loop memory notes the change wherever the verdict is read: one atomic
        // load per read ([`super::episodes`]).
        self.note_episode(judged.1.is_some());
        judged
    }

    /// The status and its source and finding as `side` judges (the shadow: as if it were in
    /// force, on the same evidence).
    fn judged_on(&self, side: Side) -> (Status, Option<(&'static dyn Source, Finding)>) {
        // The fleet brake's gate: one atomic load ([`super::brake`]).
        let side = self.sided(side).unwrap_or(side);
        if self.health() == HealthState::NeverAnswered {
            return (Status::Initial, None);
        }
        let found = SOURCES
            .iter()
            .find_map(|s| s.finding(self, side).map(|f| (*s, f)));
        match found {
            Some(found) => (Status::Abnormal, Some(found)),
            None => (Status::Normal, None),
        }
    }

    /// The shadow's verdict (rules in `observe`, or `shadow_policy`): what `/status` would
    /// answer if it were in force. `None` without a shadow. Never served.
    pub(crate) fn shadow_verdict(&self) -> Option<Verdict> {
        self.spec.judging.shadow?;
        self.sided(Side::Shadow)?;
        let (status, found) = self.judged_on(Side::Shadow);
        let reason = match &found {
            Some((source, finding)) => source.reason_on(self, finding, Side::Shadow),
            None => match status {
                Status::Initial => "the engine's /health has not answered yet".to_owned(),
                _ => "no rule of the shadow makes the engine abnormal".to_owned(),
            },
        };
        Some(Verdict::of(status, found, reason))
    }

    /// The verdict for `/status`; the first healthy call starts virtual inference.
    pub fn status(&self) -> Status {
        if self.health().answers() && !self.started.swap(true, Ordering::AcqRel) {
            self.start.notify_one();
        }
        self.judged().0
    }

    /// The verdict's status without side effects (for logs and metrics).
    pub fn peek_status(&self) -> Status {
        self.judged().0
    }

    /// The one verdict: status, cause and reason, from one walk of the sources.
    pub fn verdict(&self) -> Verdict {
        let (status, found) = self.judged();
        let reason = match &found {
            Some((source, finding)) => {
                let side = self.sided(Side::InForce).unwrap_or(Side::InForce);
                source.reason_on(self, finding, side) + &self.escalation_clause()
            }
            None => self.quiet_reason(status),
        };
        Verdict::of(status, found, reason)
    }

    /// Why the verdict is what it is.
    pub fn reason(&self) -> String {
        self.verdict().reason
    }

    /// The reason of a verdict no source made abnormal: not answered yet, or normal.
    fn quiet_reason(&self, status: Status) -> String {
        let h = self.health_detail();
        match status {
            Status::Initial => format!(
                "the engine's /health has not answered yet{}",
                h.last_error.map(|e| format!(" ({e})")).unwrap_or_default()
            ),
            _ if h.state == HealthState::Failing => format!(
                "/health fails for {:.1} s, within agent_policy.health_failure_grace ({:?}): {}",
                h.failing_for_ms.unwrap_or_default() as f64 / 1e3,
                self.spec.agent_policy.health_failure_grace,
                h.last_error.unwrap_or_default()
            ),
            _ => match self.vi.phase() {
                Phase::Disabled => {
                    "/health answers; virtual inference is disabled (see conditions)".to_owned()
                }
                Phase::NotStarted => {
                    "/health answers; virtual inference starts at the next /status".to_owned()
                }
                _ => "/health answers and virtual inference is not abnormal".to_owned(),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The rows of docs/policy.md's rule table: `| id | name | source | … |`.
    fn documented() -> BTreeMap<u8, (String, String)> {
        let text = include_str!("../../../docs/policy.md");
        let table = text
            .split("<!-- rules -->")
            .nth(1)
            .expect("docs/policy.md has its rule table between two <!-- rules --> marks");
        table
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let id = cells.get(1)?.parse::<u8>().ok()?;
                let unquote = |c: &str| c.trim_matches('`').to_owned();
                Some((id, (unquote(cells.get(2)?), unquote(cells.get(3)?))))
            })
            .collect()
    }

    /// The shipped rules (the seam test's own rule aside), by id: (name, source).
    fn shipped() -> BTreeMap<u8, (String, String)> {
        let mut out = BTreeMap::new();
        for (s, r) in rules().filter(|(s, _)| s.name() != seam_tests::Canary.name()) {
            let before = out.insert(r.id.0, (r.name.to_owned(), s.name().to_owned()));
            assert!(before.is_none(), "rule {} is listed twice", r.id.0);
        }
        out
    }

    #[test]
    fn docs_policy_tables_every_rule_the_code_lists_and_no_other() {
        let (docs, code) = (documented(), shipped());
        assert!(!code.is_empty());
        for (id, named) in &code {
            assert_eq!(
                docs.get(id),
                Some(named),
                "rule {id} in the code, not so in docs/policy.md"
            );
        }
        for (id, named) in &docs {
            assert_eq!(
                code.get(id),
                Some(named),
                "rule {id} in docs/policy.md, not so in the code"
            );
        }
    }

    // `[engine.agent_policy] rules` takes the names the wing lists, and no other.
    #[test]
    fn the_configuration_names_every_rule_as_the_wing_does() {
        let code = shipped();
        assert_eq!(code.len(), crate::config::policy::RULE_NAMES.len());
        for (id, (name, _)) in &code {
            assert_eq!(crate::config::policy::rule_name(*id), name, "rule {id}");
        }
    }

    #[test]
    fn rule_ids_run_from_one_without_a_gap_and_every_rule_says_what_it_does() {
        let ids: Vec<u8> = shipped().into_keys().collect();
        assert_eq!(ids, (1..=ids.len() as u8).collect::<Vec<_>>());
        for (s, r) in rules() {
            assert!(
                !r.doc.is_empty() && !r.name.contains(' '),
                "{} of {}",
                r.id.0,
                s.name()
            );
        }
    }

    /// An engine from `extra` lines of its `[[engine]]` table (the episode memory's tests use
    /// it too).
    pub(crate) fn engine(extra: &str) -> Monitor {
        let text = format!(
            "[[engine]]\nname = \"e\"\nengine_type = \"vllm\"\nserved_model_name = \"m\"\nhost = \"127.0.0.1\"\nport = 9\nmgmt_port = 9001\nengine_env = {{}}\n{extra}"
        );
        let spec = crate::config::file::parse(&text, std::path::Path::new("/x/agent.toml"))
            .unwrap()
            .engines
            .remove(0);
        Monitor::new(spec, vec![0, 1])
    }

    // Reference §3.3 and the agent's additions, through the one verdict the sources give:
    // the `/health` state, virtual inference, a held QoS `evict` (on by default under the
    // agent policy) and a stopped engine process.
    #[test]
    fn the_one_verdict_follows_the_references_table_and_the_agents_additions() {
        use HealthState::*;
        let rows = [
            (NeverAnswered, false, false, false, Status::Initial),
            (NeverAnswered, true, true, true, Status::Initial),
            (Unhealthy, false, false, false, Status::Abnormal),
            (Healthy, false, false, false, Status::Normal),
            (Healthy, true, false, false, Status::Abnormal),
            (Healthy, false, true, false, Status::Abnormal),
            (Slow, false, false, false, Status::Normal),
            (Slow, true, false, false, Status::Abnormal),
            (AgentError, false, false, false, Status::Normal),
            (Failing, false, false, false, Status::Normal),
            (Failing, true, false, false, Status::Abnormal),
            (Failing, false, false, true, Status::Abnormal),
            (Healthy, false, false, true, Status::Abnormal),
        ];
        for (h, vi, evict, stopped, want) in rows {
            let m = engine("policy = \"agent\"\n");
            m.health.store(h.to_u8(), Ordering::Release);
            if vi {
                m.vi.set_abnormal("x");
            }
            if evict {
                let mut q = m.qos.saved();
                q.level = crate::qos::score::Level::Evict;
                m.qos.restore(&q);
            }
            if stopped {
                let long_ago = tokio::time::Instant::now()
                    .checked_sub(std::time::Duration::from_secs(60))
                    .unwrap();
                *m.stopped.lock().unwrap() = Some((7, 0, long_ago));
            }
            let row = format!("{h:?} vi {vi} evict {evict} stopped {stopped}");
            assert_eq!(m.verdict().status, want, "{row}");
            assert_eq!(m.status(), want, "{row}");
        }
    }

    /// The cause of a virtual-inference abnormal names the rule that fired in the loop (kept
    /// by [`crate::monitor::vi_state::ViState`]), and none for the reference's own count.
    #[test]
    fn a_virtual_inference_abnormal_names_the_rule_that_fired_in_the_cause() {
        let m = engine("");
        m.record_health(&crate::probe::health::HealthOutcome::Healthy, true);
        m.vi.set_abnormal("6 consecutive virtual requests failed");
        let cause = |m: &Monitor| m.verdict().cause.map(|c| (c.source, c.kind, c.rule));
        assert_eq!(
            cause(&m),
            Some(("virtual_inference", Kind::VirtualInference, None))
        );
        m.vi.set_abnormal_rule(Some(11));
        assert_eq!(
            cause(&m),
            Some((
                "virtual_inference",
                Kind::VirtualInference,
                Some(RuleId(11))
            ))
        );
    }

    #[test]
    fn source_names_are_unique() {
        let mut names: Vec<&str> = SOURCES.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
