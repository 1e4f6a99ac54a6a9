//! The chaos suite's summary: per policy and row (Node Manager at a cadence, or the
//! kubelet), false kills (false restarts under the kubelet) and the lowest availability on
//! the benign experiments, detection rate and median / worst time to detect on the faults,
//! the kubelet's median times to not-ready and to restart, and a line per experiment.

use super::run::{Cadence, Integration, Outcome, Policy, Row, Verdict};
use std::fmt::Write;

/// Figures of one policy in one row. Times are given both on the run's scaled clock
/// (`…_ms_scaled`) and unscaled (`…_s_unscaled`, divided by the time scale).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicySummary {
    pub policy: Policy,
    pub integration: Integration,
    /// Node Manager's cadence; `null` in the kubelet's row.
    pub cadence: Option<Cadence>,
    /// The router the load went through (`null`: straight to the engine).
    pub router: Option<crate::router::RouterKind>,
    pub benign: usize,
    /// Every false kill, the known ones included.
    pub false_kills: usize,
    /// False kills the experiment names as this policy's known behaviour.
    pub known_false_kills: usize,
    /// Benign experiments in which the agent escalated the engine as a restart loop (issue
    /// 50; each fails the run as [`Verdict::EscalatedBenign`]): must be 0.
    pub escalated_benign: usize,
    pub faults: usize,
    pub detected: usize,
    /// Faults this policy cannot detect by design (not counted as missed).
    pub by_design: usize,
    pub missed: usize,
    pub errors: usize,
    /// Router rows: experiments whose draft served though the agent never took the main
    /// engine out ([`Verdict::DraftWithoutCause`]).
    pub draft_without_cause: usize,
    /// Experiments whose fault this engine cannot take (`--engine vllm`); in neither count.
    pub not_applicable: usize,
    pub median_detect_ms_scaled: Option<u64>,
    pub worst_detect_ms_scaled: Option<u64>,
    pub median_detect_s_unscaled: Option<f64>,
    pub worst_detect_s_unscaled: Option<f64>,
    /// The lowest availability (completed over attempted requests) of a benign experiment.
    pub min_benign_availability: Option<f64>,
    /// The median, over the faults, of the availability from the agent's first `abnormal`
    /// to the end (the tail after the kill included): with a router, what the draft saved.
    pub median_fault_availability_after_abnormal: Option<f64>,
    /// Kubelet row: the median time from injection to the first not-ready, and to the first
    /// restart, over the faults where it happened.
    pub median_not_ready_s_unscaled: Option<f64>,
    pub median_restart_s_unscaled: Option<f64>,
    /// Failed polls of the agent in the fault windows, summed over the experiments (Node
    /// Manager's polls or PyMotor's heartbeats; the kubelet's probes in its row).
    pub failed_polls: u32,
    /// The longest stretch without a successful answer over those windows (unscaled; the
    /// agent's own start-up time does not scale, so a scaled run overstates it).
    pub longest_gap_s_unscaled: Option<f64>,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
}

/// Sums up the outcomes of one policy in one row.
pub fn summarize(policy: Policy, row: Row, outcomes: &[Outcome], time_scale: f64) -> PolicySummary {
    let all: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.policy == policy && o.row() == row)
        .collect();
    let mine: Vec<&Outcome> = all
        .iter()
        .copied()
        .filter(|o| o.verdict != Verdict::NotApplicable)
        .collect();
    let benign: Vec<&&Outcome> = mine.iter().filter(|o| o.expect == "healthy").collect();
    let faults: Vec<&&Outcome> = mine.iter().filter(|o| o.expect != "healthy").collect();
    let mut times: Vec<u64> = faults.iter().filter_map(|o| o.detected_after_ms).collect();
    times.sort_unstable();
    let count = |v: Verdict| mine.iter().filter(|o| o.verdict == v).count();
    let mid = median(times.clone());
    let worst = times.last().copied();
    let unscaled = |t: Option<u64>| t.map(|t| t as f64 / 1000.0 / time_scale);
    let kubelet_times = |f: fn(&super::run::KubeletOutcome) -> Option<u64>| {
        median(
            faults
                .iter()
                .filter_map(|o| o.kubelet.as_ref().and_then(f))
                .collect(),
        )
    };
    PolicySummary {
        policy,
        integration: row.integration(),
        cadence: row.cadence(),
        router: row.router(),
        benign: benign.len(),
        false_kills: count(Verdict::FalseKill) + count(Verdict::KnownFalseKill),
        known_false_kills: count(Verdict::KnownFalseKill),
        escalated_benign: benign
            .iter()
            .filter(|o| o.escalated_at_ms.is_some())
            .count(),
        faults: faults.len(),
        detected: faults.iter().filter(|o| o.verdict == Verdict::Pass).count(),
        by_design: count(Verdict::NotDetectableByDesign),
        missed: count(Verdict::Missed),
        errors: count(Verdict::Error),
        draft_without_cause: count(Verdict::DraftWithoutCause),
        not_applicable: all.len() - mine.len(),
        median_detect_ms_scaled: mid,
        worst_detect_ms_scaled: worst,
        median_detect_s_unscaled: unscaled(mid),
        worst_detect_s_unscaled: unscaled(worst),
        min_benign_availability: benign
            .iter()
            .filter_map(|o| o.load.availability)
            .min_by(f64::total_cmp),
        median_fault_availability_after_abnormal: {
            let mut a: Vec<f64> = faults
                .iter()
                .filter_map(|o| o.load_after_abnormal.and_then(|l| l.availability))
                .collect();
            a.sort_by(f64::total_cmp);
            (!a.is_empty()).then(|| a[(a.len() - 1) / 2])
        },
        median_not_ready_s_unscaled: unscaled(kubelet_times(|k| k.not_ready_after_ms)),
        median_restart_s_unscaled: unscaled(kubelet_times(|k| k.restart_after_ms)),
        failed_polls: mine
            .iter()
            .flat_map(|o| o.polls.iter())
            .map(|p| p.failed)
            .sum(),
        longest_gap_s_unscaled: unscaled(
            mine.iter()
                .flat_map(|o| o.polls.iter())
                .map(|p| p.longest_gap_ms)
                .max(),
        ),
    }
}

/// True when the run must fail: a false kill, a missed detection, an experiment that could
/// not run, a draft that served without the agent's word, a benign experiment the agent
/// escalated as a restart loop, a repeated hang it escalated at the wrong episode, or a shadow
/// row whose kills differ from `reference`'s or were not by the policy in force
/// ([`crate::shadow::Comparison::failed`]). A peer's false kill or miss is what the peer does,
/// measured for the comparison, not a failure of the run (its errors are).
pub fn failed(outcomes: &[Outcome]) -> bool {
    crate::shadow::compare(&shadow_views(outcomes)).failed()
        || outcomes.iter().any(|o| {
            let measured_only = o.policy.peer().is_some()
                && matches!(o.verdict, Verdict::FalseKill | Verdict::Missed);
            !measured_only
                && matches!(
                    o.verdict,
                    Verdict::FalseKill
                        | Verdict::Missed
                        | Verdict::Error
                        | Verdict::DraftWithoutCause
                        | Verdict::EscalatedBenign
                        | Verdict::WrongEscalation
                )
        })
}

fn secs(s: Option<f64>) -> String {
    s.map_or_else(|| "—".to_owned(), |s| format!("{s:.1} s"))
}

/// An availability as a percentage (`—` with nothing attempted).
pub fn percent(a: Option<f64>) -> String {
    a.map_or_else(|| "—".to_owned(), |a| format!("{:.2} %", a * 100.0))
}

/// The Markdown report: the summary table (one row per policy and row), then one line per
/// experiment. Times are unscaled (measured at `time_scale`, divided by it). Under the
/// kubelet a false kill is a liveness restart of a healthy engine, and the time to detect is
/// the time to the action the fault expects (a restart, or not-ready).
pub fn markdown(
    outcomes: &[Outcome],
    policies: &[Policy],
    rows: &[Row],
    time_scale: f64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| Policy | Acting (NM heartbeat, or kubelet) | False kills or restarts (benign) | Escalated as a restart loop (benign) | Detected (faults) | Not detectable by design | Not applicable | Median time to detect | Worst time to detect | Lowest benign availability | Faults: median availability after abnormal | Kubelet: median time to not-ready | Kubelet: median time to restart |"
    );
    let _ = writeln!(
        s,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &p in policies {
        for &c in rows {
            let _ = writeln!(s, "{}", summary_line(p, c, outcomes, time_scale));
        }
    }
    let _ = writeln!(
        s,
        "\nTimes to detect are unscaled (measured at time scale {time_scale}, divided by it).\n"
    );
    let _ = writeln!(
        s,
        "| Experiment | Fault | Expect | Policy | Acting | Verdict | Injected | Detected after | Killed at | Kubelet | Availability | Guard events | Agent | Polls failed / longest gap |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---:|---:|---:|---|---:|---|---|---|"
    );
    for o in outcomes {
        let _ = writeln!(s, "{}", experiment_line(o, time_scale));
    }
    if policies.iter().any(|p| p.has_shadow()) {
        s.push_str(&crate::shadow::markdown(
            &shadow_views(outcomes),
            time_scale,
        ));
    }
    s
}

/// The shadow comparison's view of the outcomes.
fn shadow_views(outcomes: &[Outcome]) -> Vec<crate::shadow::RowView> {
    outcomes.iter().map(crate::shadow::RowView::of).collect()
}

/// One line of the summary table: a policy in a row.
fn summary_line(p: Policy, c: Row, outcomes: &[Outcome], time_scale: f64) -> String {
    let m = summarize(p, c, outcomes, time_scale);
    let kubelet = c == Row::Kubelet;
    format!(
        "| {} | {} | {} / {}{} | {} / {} | {} / {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
        p.as_str(),
        c.label(),
        m.false_kills,
        m.benign,
        if m.known_false_kills > 0 {
            format!(" ({} known)", m.known_false_kills)
        } else {
            String::new()
        },
        m.escalated_benign,
        m.benign,
        m.detected,
        m.faults - m.by_design,
        if m.draft_without_cause > 0 {
            format!(
                "; the draft served without cause in {}",
                m.draft_without_cause
            )
        } else {
            String::new()
        },
        m.by_design,
        m.not_applicable,
        secs(m.median_detect_s_unscaled),
        secs(m.worst_detect_s_unscaled),
        percent(m.min_benign_availability),
        percent(m.median_fault_availability_after_abnormal),
        if kubelet {
            secs(m.median_not_ready_s_unscaled)
        } else {
            "—".to_owned()
        },
        if kubelet {
            secs(m.median_restart_s_unscaled)
        } else {
            "—".to_owned()
        },
    )
}

/// One experiment's line of the report.
fn experiment_line(o: &Outcome, time_scale: f64) -> String {
    let unscale = |t: i64| format!("{:.1} s", t as f64 / time_scale / 1000.0);
    let verdict = serde_json::to_value(o.verdict)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let guards: Vec<String> = o
        .guard_events
        .iter()
        .map(|g| format!("{} {} ({})", g.guard, g.action, g.detail))
        .collect();
    let availability = availability_cell(o);
    let kubelet = kubelet_cell(o, time_scale);
    let mut detected = o
        .detected_after_ms
        .map_or_else(|| "—".to_owned(), |t| unscale(t as i64));
    if let Some(t) = o.abnormal_after_ms {
        detected.push_str(&format!(" (agent abnormal after {})", unscale(t as i64)));
    }
    if !o.rounds.is_empty() {
        let rounds: Vec<String> = o
            .rounds
            .iter()
            .map(|r| crate::run::round_line(r, time_scale))
            .collect();
        detected = format!("worst {detected}: {}", rounds.join("; "));
    }
    format!(
        "| {} | {} | {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
        o.experiment,
        o.fault,
        o.expect,
        o.policy.as_str(),
        o.row().label(),
        verdict,
        match (&o.error, &o.ran_again_after) {
            (Some(e), _) => format!(": {e}"),
            (None, Some(first)) => format!(" (second attempt; the first: {first})"),
            (None, None) => String::new(),
        },
        unscale(o.injected_ms as i64),
        detected,
        o.killed_at_ms.map_or_else(|| "—".to_owned(), unscale),
        kubelet,
        availability,
        if guards.is_empty() {
            "—".to_owned()
        } else {
            guards.join("; ")
        },
        agent_cell(o, time_scale),
        polls_cell(o, time_scale),
    )
}

/// The availability cell: what the load saw, after abnormal too, and through a router.
fn availability_cell(o: &Outcome) -> String {
    format!(
        "{} ({} / {}{}{}{}{})",
        percent(o.load.availability),
        o.load.completed,
        o.load.attempted,
        if o.load.held_back > 0 {
            format!("; {} held back while not ready", o.load.held_back)
        } else {
            String::new()
        },
        if o.load.cut_off > 0 {
            format!("; {} cut off at the end", o.load.cut_off)
        } else {
            String::new()
        },
        match &o.load_after_abnormal {
            Some(a) => format!(
                "; after abnormal {} ({} / {}{})",
                percent(a.availability),
                a.completed,
                a.attempted,
                if o.router.is_some() {
                    format!(", {} by the draft", a.by_draft)
                } else {
                    String::new()
                }
            ),
            None => String::new(),
        },
        match o.router {
            Some(r) => format!(
                "; through {}: the draft served {} ({}), p99 first token {}",
                r.as_str(),
                o.load.by_draft,
                percent(
                    (o.load.completed > 0)
                        .then(|| o.load.by_draft as f64 / o.load.completed as f64)
                ),
                o.load
                    .first_token_p99_ms
                    .map_or_else(|| "—".to_owned(), |t| format!("{t:.0} ms"))
            ),
            None => String::new(),
        }
    )
}

/// The kubelet cell: what the kubelet emulator was expected to do and did.
fn kubelet_cell(o: &Outcome, time_scale: f64) -> String {
    let unscale = |t: i64| format!("{:.1} s", t as f64 / time_scale / 1000.0);
    o.kubelet.as_ref().map_or_else(
        || "—".to_owned(),
        |k| {
            format!(
                "expects {}; not ready {}{}; {} liveness / {} exit restarts",
                serde_json::to_value(k.expect)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                k.not_ready_after_ms.map_or_else(
                    || "never".to_owned(),
                    |t| format!("after {}", unscale(t as i64))
                ),
                if k.not_ready_ms > 0 {
                    format!(" ({} in all)", unscale(k.not_ready_ms as i64))
                } else {
                    String::new()
                },
                k.liveness_restarts,
                k.exit_restarts
            )
        },
    )
}

/// Who ran the agent, and what each operation on it did: the pids, and how long after the
/// operation began `/status` answered again (unscaled).
fn agent_cell(o: &Outcome, time_scale: f64) -> String {
    let mut cell = o.agent_supervisor.as_str().to_owned();
    for op in &o.agent_ops {
        let pid = |p: Option<u32>| p.map_or_else(|| "—".to_owned(), |p| p.to_string());
        let _ = write!(
            cell,
            "; {} ({}): {} → {}",
            op.fault,
            op.supervisor.as_str(),
            pid(op.old_pid),
            pid(op.new_pid)
        );
        match (op.answered_ms, &op.error) {
            (_, Some(_)) => cell.push_str(", failed"),
            (Some(a), None) => {
                let _ = write!(
                    cell,
                    ", answered {:.2} s after",
                    (a - op.started_ms) as f64 / 1000.0 / time_scale
                );
            }
            (None, None) => {}
        }
    }
    cell
}

/// Each poller's failed polls and longest stretch without an answer (unscaled).
fn polls_cell(o: &Outcome, time_scale: f64) -> String {
    if o.polls.is_empty() {
        return "—".to_owned();
    }
    o.polls
        .iter()
        .map(|p| {
            format!(
                "{} {} / {:.1} s",
                p.poller.trim_start_matches("kubelet_"),
                p.failed,
                p.longest_gap_ms as f64 / 1000.0 / time_scale
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::experiment::Target;

    /// An outcome of the `1s` Node Manager row, for the tests here and in `run`.
    pub(crate) fn outcome(
        name: &str,
        expect: &str,
        verdict: Verdict,
        detected: Option<u64>,
    ) -> Outcome {
        Outcome {
            experiment: name.into(),
            target: Target::Engine,
            fault: "engine_hang".into(),
            policy: Policy::Agent,
            integration: Integration::NodeManager,
            cadence: Some(Cadence::PYMOTOR),
            router: None,
            node_manager: crate::run::NodeManagerKind::Emulator,
            expect: expect.into(),
            verdict,
            detected_after_ms: detected,
            abnormal_after_ms: None,
            killed_at_ms: detected.map(|d| d as i64),
            escalated_at_ms: None,
            shadow: None,
            first_injected_ms: Some(0),
            injected_ms: 5000,
            guard_events: Vec::new(),
            load: crate::load::LoadSnapshot {
                attempted: 1000,
                completed: if verdict == Verdict::FalseKill {
                    990
                } else {
                    1000
                },
                ..Default::default()
            },
            load_after_abnormal: None,
            router_actions: Vec::new(),
            error: None,
            ran_again_after: None,
            kubelet: None,
            kill_evidence: Vec::new(),
            agent_supervisor: crate::agent::Supervisor::Direct,
            agent_supervisor_note: None,
            agent_ops: Vec::new(),
            polls: Vec::new(),
            timeline: Vec::new(),
            rounds: Vec::new(),
        }
    }

    // Only an error that says the real vLLM died by itself makes the runner try once more;
    // the second attempt's line says why.
    #[test]
    fn a_real_engine_that_died_by_itself_is_run_again_and_said_so() {
        let mut o = outcome("a", "healthy", Verdict::Error, None);
        o.error = Some("the real vLLM died by itself 4.2 s into the experiment".into());
        assert!(o.real_engine_died().is_some());
        o.error = Some("virtual inference did not start".into());
        assert_eq!(o.real_engine_died(), None);
        o.verdict = Verdict::Pass;
        o.error = None;
        o.ran_again_after = Some("the real vLLM died by itself 4.2 s in".into());
        let md = markdown(
            &[o],
            &[Policy::Agent],
            &[Row::NodeManager(Cadence::PYMOTOR)],
            1.0,
        );
        assert!(
            md.contains("pass (second attempt; the first: the real vLLM died by itself 4.2 s in)"),
            "{md}"
        );
    }

    #[test]
    fn summary_counts_and_table_shape() {
        let mut os = vec![
            outcome("a", "healthy", Verdict::Pass, None),
            outcome("b", "healthy", Verdict::FalseKill, None),
            outcome("c", "detect_within 1m", Verdict::Pass, Some(2000)),
            outcome("d", "detect_within 1m", Verdict::Pass, Some(6000)),
            outcome("e", "detect_within 1m", Verdict::Pass, Some(4000)),
            outcome("f", "detect_within 1m", Verdict::Missed, None),
            outcome("g", "detect_within 1m", Verdict::NotApplicable, None),
            outcome("h", "healthy", Verdict::NotApplicable, None),
        ];
        for o in &mut os {
            o.load.availability = Some(o.load.completed as f64 / o.load.attempted as f64);
        }
        let m = summarize(Policy::Agent, Row::NodeManager(Cadence::PYMOTOR), &os, 0.1);
        assert_eq!(
            summarize(
                Policy::Agent,
                Row::NodeManager(Cadence::REFERENCE),
                &os,
                0.1
            )
            .benign,
            0,
            "another cadence's outcomes are not counted"
        );
        assert_eq!(m.min_benign_availability, Some(0.99));
        assert_eq!(m.median_detect_s_unscaled, Some(40.0));
        assert_eq!((m.benign, m.false_kills), (2, 1));
        assert_eq!((m.faults, m.detected, m.missed), (4, 3, 1));
        assert_eq!(m.not_applicable, 2, "neither a pass nor a failure");
        assert!(!failed(&os[6..]), "not applicable does not fail the run");
        assert_eq!(m.median_detect_ms_scaled, Some(4000));
        assert_eq!(m.worst_detect_ms_scaled, Some(6000));
        assert!(failed(&os));
        assert!(!failed(&os[..1]));
        let md = markdown(
            &os,
            &[Policy::Agent],
            &[Row::NodeManager(Cadence::PYMOTOR)],
            0.1,
        );
        assert!(
            md.contains(
                "| agent | 1s | 1 / 2 | 0 / 2 | 3 / 4 | 0 | 2 | 40.0 s | 60.0 s | 99.00 % | — | — | — |"
            ),
            "{md}"
        );
        // A benign experiment the agent escalated is counted in its own column (issue 50).
        os[0].escalated_at_ms = Some(100);
        let m = summarize(Policy::Agent, Row::NodeManager(Cadence::PYMOTOR), &os, 0.1);
        assert_eq!(m.escalated_benign, 1);
        os[0].escalated_at_ms = None;
        // A repeated hang escalated at the wrong episode fails the run.
        let wrong = outcome("r", "detect_within 2m", Verdict::WrongEscalation, Some(1));
        assert!(failed(&[wrong]));
        // A peer's false kill or miss is measured, not failed; its error fails the run.
        let peer = |v: Verdict| {
            let mut o = outcome("p", "healthy", v, None);
            o.policy = Policy::K8sLiveness;
            o
        };
        assert!(!failed(&[peer(Verdict::FalseKill), peer(Verdict::Missed)]));
        assert!(failed(&[peer(Verdict::Error)]));
        // Every row of the per-experiment table has as many cells as its header.
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        let header = rows.iter().find(|l| l.contains("Experiment")).unwrap();
        for r in rows
            .iter()
            .filter(|l| l.starts_with("| a ") || l.starts_with("| f "))
        {
            assert_eq!(r.matches('|').count(), header.matches('|').count(), "{r}");
        }
    }

    // A router row: the availability after `abnormal` is summed up over the faults (their
    // median), and a draft that served without the agent's word fails the run and is named
    // in the summary.
    #[test]
    fn router_rows_report_what_the_draft_saved_and_fail_a_draft_without_cause() {
        use crate::load::LoadSnapshot;
        let router = Row::Router(crate::router::RouterKind::Haproxy);
        let after = |completed: u64, attempted: u64| LoadSnapshot {
            attempted,
            completed,
            by_draft: completed,
            availability: Some(completed as f64 / attempted as f64),
            ..Default::default()
        };
        let mut os = vec![
            outcome("hang", "detect_within 1m", Verdict::Pass, Some(2000)),
            outcome("crash", "detect_within 1m", Verdict::Pass, Some(3000)),
            outcome("5xx", "detect_within 1m", Verdict::Pass, Some(4000)),
            outcome("burst", "healthy", Verdict::DraftWithoutCause, None),
        ];
        for (o, a) in os
            .iter_mut()
            .zip([after(90, 100), after(50, 100), after(99, 100)])
        {
            o.load_after_abnormal = Some(a);
        }
        for o in &mut os {
            o.router = Some(crate::router::RouterKind::Haproxy);
        }
        os[3].load.by_draft = 12;
        let m = summarize(Policy::Agent, router, &os, 0.1);
        assert_eq!(m.median_fault_availability_after_abnormal, Some(0.9));
        assert_eq!(m.draft_without_cause, 1);
        assert!(failed(&os));
        assert!(!failed(&os[..3]));
        let md = markdown(&os, &[Policy::Agent], &[router], 0.1);
        assert!(
            md.contains("| 3 / 3; the draft served without cause in 1 |"),
            "{md}"
        );
        assert!(md.contains("| 90.00 % |"), "{md}");
        assert!(
            md.contains("; after abnormal 50.00 % (50 / 100, 50 by the draft)"),
            "{md}"
        );
    }

    // An agent fault's line says who ran the agent, what the runner did to it and what the
    // poller saw (unscaled); the summary adds up the failed polls and keeps the longest gap.
    #[test]
    fn agent_operations_and_polls_in_the_summary() {
        use crate::agent::{AgentOp, Supervisor};
        use crate::polls::PollFigures;
        let mut o = outcome("restart", "healthy", Verdict::Pass, None);
        o.agent_supervisor = Supervisor::Systemd;
        o.agent_ops.push(AgentOp {
            started_ms: 100,
            old_pid: Some(10),
            new_pid: Some(11),
            new_running_ms: Some(150),
            answered_ms: Some(200),
            ..AgentOp::unfinished(crate::experiment::Fault::AgentRestart, Supervisor::Systemd)
        });
        o.polls.push(PollFigures {
            poller: "node_manager".into(),
            window_ms: (100, 1500),
            polls: 14,
            failed: 2,
            longest_gap_ms: 300,
        });
        let mut quiet = outcome("quiet", "healthy", Verdict::Pass, None);
        quiet.polls.push(PollFigures {
            poller: "node_manager".into(),
            window_ms: (0, 1500),
            polls: 15,
            failed: 1,
            longest_gap_ms: 100,
        });
        let os = [o, quiet];
        let m = summarize(Policy::Agent, Row::NodeManager(Cadence::PYMOTOR), &os, 0.1);
        assert_eq!(m.failed_polls, 3);
        assert!(
            m.longest_gap_s_unscaled
                .is_some_and(|g| (g - 3.0).abs() < 1e-9),
            "{m:?}"
        );
        let md = markdown(
            &os,
            &[Policy::Agent],
            &[Row::NodeManager(Cadence::PYMOTOR)],
            0.1,
        );
        assert!(
            md.contains(
                "| systemd; agent_restart (systemd): 10 → 11, answered 1.00 s after | node_manager 2 / 3.0 s |"
            ),
            "{md}"
        );
        assert!(md.contains("| direct | node_manager 1 / 1.0 s |"), "{md}");
    }
}
