//! The shadow rows of a run (issue 50): the comparison of `agent-observe` and
//! `reference-shadow` with the `reference` and `agent` rows of the same run (on what each
//! experiment kept of its shadow, [`crate::run::ShadowSeen`]), and the check that Node Manager
//! killed only by the policy in force, never by the shadow (docs/chaos.md, "Observe mode and
//! the shadow").

use crate::run::{Outcome, Policy, ShadowSeen, Verdict};
use serde::Serialize;
use std::fmt::Write as _;

/// What the comparison reads of one experiment's outcome (times from the scheduled
/// injection, as scaled).
#[derive(Debug, Clone)]
pub struct RowView {
    pub experiment: String,
    /// The summary row (`1s`, `3s`, …).
    pub row: String,
    pub policy: Policy,
    pub verdict: Verdict,
    /// Node Manager's kill.
    pub killed_at_ms: Option<i64>,
    /// The agent's own first `abnormal` after the injection (the `agent` row's time).
    pub abnormal_at_ms: Option<i64>,
    pub seen: Option<ShadowSeen>,
}

impl RowView {
    /// The comparison's view of `o`.
    pub fn of(o: &Outcome) -> RowView {
        RowView {
            experiment: o.experiment.clone(),
            row: o.row().label(),
            policy: o.policy,
            verdict: o.verdict,
            killed_at_ms: o.killed_at_ms,
            abnormal_at_ms: o
                .abnormal_after_ms
                .zip(o.first_injected_ms)
                .map(|(a, f)| f + a as i64),
            seen: o.shadow.clone(),
        }
    }

    /// Whether it ran to a verdict that says something about kills.
    fn ran(&self) -> bool {
        !matches!(self.verdict, Verdict::Error | Verdict::NotApplicable)
    }

    fn killed(&self) -> Option<bool> {
        self.ran().then_some(self.killed_at_ms.is_some())
    }
}

/// One shadow row's experiment beside the `reference` and `agent` rows of the same
/// experiment and Node Manager row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub experiment: String,
    pub row: String,
    /// `agent-observe` or `reference-shadow`.
    pub policy: &'static str,
    /// Node Manager killed under `reference`; `null`: that row did not run to a verdict.
    pub reference_killed: Option<bool>,
    /// Node Manager killed under this row (its `/status` is the reference's).
    pub killed: Option<bool>,
    /// (a) this row's kill decision equals `reference`'s; `null`: not both ran.
    pub kills_equal: Option<bool>,
    /// One of the two is a kill the experiment names as the reference's known false kill
    /// (`known_false_kill`: a race the reference loses some runs and not others), so a
    /// difference in (a) is that race, not the row's `/status`: reported, not failed.
    pub known_kill: bool,
    /// Node Manager killed under `agent`.
    pub agent_killed: Option<bool>,
    /// The `agent` row's cause rule and its first `abnormal`.
    pub agent_rule: Option<u8>,
    pub agent_abnormal_ms: Option<i64>,
    /// This row's shadow: its first `abnormal` and rule.
    pub shadow_rule: Option<u8>,
    pub shadow_abnormal_ms: Option<i64>,
    /// (b) the shadow said `abnormal` (before this row's kill) exactly where `agent` said
    /// it; `null`: not both ran.
    pub detected_equal: Option<bool>,
    pub disagreements: usize,
}

impl Line {
    /// The shadow's first `abnormal` minus the `agent` row's (positive: the shadow later).
    pub fn shadow_lag_ms(&self) -> Option<i64> {
        Some(self.shadow_abnormal_ms? - self.agent_abnormal_ms?)
    }
}

/// A kill under a shadow row: when each side said `abnormal`, and when Node Manager killed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowKill {
    pub experiment: String,
    pub row: String,
    pub policy: &'static str,
    pub shadow_abnormal_ms: Option<i64>,
    pub in_force_abnormal_ms: Option<i64>,
    pub killed_at_ms: i64,
    /// Why the kill was not by the policy in force, if it was not: `/status` never said
    /// `abnormal`, or said it only after the kill.
    pub by_shadow: Option<String>,
}

/// The comparison of a run's shadow rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Comparison {
    pub lines: Vec<Line>,
    pub kills: Vec<ShadowKill>,
}

impl Comparison {
    /// The run fails: a shadow row's kills differ from `reference`'s (its `/status` is the
    /// reference's), or Node Manager killed where `/status` had not said `abnormal`.
    pub fn failed(&self) -> bool {
        self.lines
            .iter()
            .any(|l| l.kills_equal == Some(false) && !l.known_kill)
            || self.kills.iter().any(|k| k.by_shadow.is_some())
    }
}

/// Compares every shadow row's experiment with the `reference` and `agent` rows of the same
/// experiment and Node Manager row, and checks every kill under a shadow row.
pub fn compare(views: &[RowView]) -> Comparison {
    let find = |e: &str, row: &str, p: Policy| {
        views
            .iter()
            .find(|v| v.experiment == e && v.row == row && v.policy == p)
    };
    let mut c = Comparison::default();
    for v in views.iter().filter(|v| v.policy.has_shadow()) {
        let reference = find(&v.experiment, &v.row, Policy::Reference);
        let agent = find(&v.experiment, &v.row, Policy::Agent);
        let seen = v.seen.clone().unwrap_or_default();
        let killed = v.killed();
        let reference_killed = reference.and_then(RowView::killed);
        let agent_killed = agent.and_then(RowView::killed);
        // What the shadow said before this row's own kill: a turn after it reads the kill
        // itself (the port closed: rule 2), not the experiment.
        let said = v.ran().then_some(
            seen.shadow_abnormal_ms
                .is_some_and(|a| v.killed_at_ms.is_none_or(|k| a <= k)),
        );
        // What `agent` did: it said `abnormal` (Node Manager's kill follows unless the engine
        // came back first, as after a restart at the 3 s cadence).
        let agent_said = agent
            .filter(|a| a.ran())
            .map(|a| a.abnormal_at_ms.is_some() || a.killed_at_ms.is_some());
        c.lines.push(Line {
            experiment: v.experiment.clone(),
            row: v.row.clone(),
            policy: v.policy.as_str(),
            reference_killed,
            killed,
            kills_equal: killed.zip(reference_killed).map(|(a, b)| a == b),
            known_kill: [Some(v), reference]
                .into_iter()
                .flatten()
                .any(|r| r.verdict == Verdict::KnownFalseKill),
            agent_killed,
            agent_rule: agent.and_then(|a| a.seen.as_ref()?.fired.first().copied()),
            agent_abnormal_ms: agent.and_then(|a| a.abnormal_at_ms),
            shadow_rule: seen.shadow_rule,
            shadow_abnormal_ms: seen.shadow_abnormal_ms,
            detected_equal: said.zip(agent_said).map(|(a, b)| a == b),
            disagreements: seen.disagreements.len(),
        });
        if let Some(k) = v.killed_at_ms {
            // The observer records a turn up to 250 ms (real time) after `/status` turned:
            // the runner's own first `abnormal` (the probe that decided it) is earlier when
            // it has one.
            let in_force = [seen.in_force_abnormal_ms, v.abnormal_at_ms]
                .into_iter()
                .flatten()
                .min();
            let by_shadow = match in_force {
                None => Some("/status never said abnormal".to_owned()),
                Some(a) if a > k => Some(format!(
                    "/status said abnormal only {:.1} s after the kill",
                    (a - k) as f64 / 1000.0
                )),
                Some(_) => None,
            };
            c.kills.push(ShadowKill {
                experiment: v.experiment.clone(),
                row: v.row.clone(),
                policy: v.policy.as_str(),
                shadow_abnormal_ms: seen.shadow_abnormal_ms,
                in_force_abnormal_ms: in_force,
                killed_at_ms: k,
                by_shadow,
            });
        }
    }
    c
}

/// Seconds, unscaled, or `—`.
fn at(ms: Option<i64>, time_scale: f64) -> String {
    ms.map_or_else(
        || "—".to_owned(),
        |ms| format!("{:.1} s", ms as f64 / 1000.0 / time_scale),
    )
}

fn yes(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        Some(false) => "no",
        None => "—",
    }
}

fn rule(r: Option<u8>) -> String {
    r.map_or_else(|| "—".to_owned(), |r| r.to_string())
}

/// The report's section: the comparison table, the kills under a shadow, and every
/// disagreement. Times are unscaled, from the scheduled injection.
pub fn markdown(views: &[RowView], time_scale: f64) -> String {
    let c = compare(views);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n## The shadow rows\n\n(a) the row's kills equal `reference`'s (its `/status` is the reference's; a difference fails the run, but for a kill the experiment names as the reference's known false kill, a race it loses in some runs); (b) its shadow said `abnormal` (before the row's own kill) exactly where `agent` said it. Times are unscaled, from the scheduled injection; lag: the shadow's first `abnormal` minus the `agent` row's (positive: later).\n"
    );
    let _ = writeln!(
        s,
        "| Experiment | Acting | Row | Killed (reference / row) | (a) equal | Agent killed | Agent rule | Agent abnormal | Shadow rule | Shadow abnormal | (b) equal | Lag | Disagreements |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---:|---:|---:|---:|---|---:|---:|"
    );
    for l in &c.lines {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.experiment,
            l.row,
            l.policy,
            yes(l.reference_killed),
            yes(l.killed),
            match (l.kills_equal, l.known_kill) {
                (Some(false), true) => "no (a known kill)",
                (e, _) => yes(e),
            },
            yes(l.agent_killed),
            rule(l.agent_rule),
            at(l.agent_abnormal_ms, time_scale),
            rule(l.shadow_rule),
            at(l.shadow_abnormal_ms, time_scale),
            yes(l.detected_equal),
            at(l.shadow_lag_ms(), time_scale),
            l.disagreements,
        );
    }
    let earlier = c
        .lines
        .iter()
        .filter(|l| l.shadow_lag_ms().is_some_and(|d| d < 0))
        .count();
    let _ = writeln!(
        s,
        "\n(a) differs in {} of {}; (b) differs in {}; the shadow said `abnormal` before the `agent` row in {earlier}.\n",
        c.lines
            .iter()
            .filter(|l| l.kills_equal == Some(false))
            .count(),
        c.lines.len(),
        c.lines
            .iter()
            .filter(|l| l.detected_equal == Some(false))
            .count(),
    );
    kills_table(&mut s, &c, time_scale);
    disagreements_table(&mut s, views, time_scale);
    s
}

/// Each kill under a shadow row: Node Manager must have killed after `/status` said
/// `abnormal`, whenever the shadow said it.
fn kills_table(s: &mut String, c: &Comparison, time_scale: f64) {
    let _ = writeln!(
        s,
        "| Experiment | Acting | Row | Shadow abnormal | /status abnormal | Killed | By the policy in force |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---|");
    for k in &c.kills {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            k.experiment,
            k.row,
            k.policy,
            at(k.shadow_abnormal_ms, time_scale),
            at(k.in_force_abnormal_ms, time_scale),
            at(Some(k.killed_at_ms), time_scale),
            k.by_shadow
                .as_deref()
                .map_or_else(|| "yes".to_owned(), |w| format!("**no**: {w}")),
        );
    }
}

/// Every disagreement of every shadow row.
fn disagreements_table(s: &mut String, views: &[RowView], time_scale: f64) {
    let _ = writeln!(
        s,
        "\n| Experiment | Acting | Row | Began | Ended | /status | Would have | Rule | Why |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---|---|---:|---|");
    for v in views.iter().filter(|v| v.policy.has_shadow()) {
        for d in v.seen.iter().flat_map(|x| &x.disagreements) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                v.experiment,
                v.row,
                v.policy.as_str(),
                at(Some(d.began_ms), time_scale),
                at(d.ended_ms, time_scale),
                d.status,
                d.would_status,
                rule(d.rule),
                d.reason.replace('|', "/"),
            );
        }
    }
}
