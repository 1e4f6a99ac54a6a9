//! `npu-chaos compare`: every policy that makes kill decisions on the same experiments, at
//! both Node Manager cadences, N times, summed up as ONE table, one row per policy: false
//! kills of the benign runs and recall on the fault runs (Wilson intervals), the median and
//! p90 time from the injection to the kill decision (order-statistic intervals), availability
//! at the client (the mean over runs, bootstrap over runs). It reads the runner's [`Outcome`]s and runs
//! nothing itself ([`crate::run_plan`] does); `compare.json` and `compare.svg` are written
//! from this table.

mod chart;
mod stats;

use crate::run::{Cadence, Outcome, Policy, Row, Verdict};
use serde::Serialize;
use stats::{Pooled, Quantile, Rate};
use std::fmt::Write;

/// One policy's row of the comparison, pooled over the Node Manager rows (both cadences) and
/// the repetitions. Kubelet and router rows, when run, are in the runner's summary only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PolicyRow {
    pub(crate) policy: Policy,
    /// Benign runs that ran (not `not_applicable`, not `error`).
    pub(crate) benign_runs: u64,
    /// Healthy engines killed, known kills included, with the Wilson interval.
    pub(crate) false_kills: Option<Rate>,
    /// Of them, kills the experiment names as the policy's known behaviour.
    pub(crate) known_false_kills: u64,
    /// Fault runs that ran.
    pub(crate) fault_runs: u64,
    /// Faults detected in time (recall), with the Wilson interval. A fault the policy cannot
    /// detect by design counts as not detected: the operator's engine stayed broken either way.
    pub(crate) detected: Option<Rate>,
    /// Of the fault runs, those not detectable by design.
    pub(crate) by_design: u64,
    /// Seconds (unscaled) from the injection to the kill decision, detected faults only.
    pub(crate) median_s: Option<Quantile>,
    pub(crate) p90_s: Option<Quantile>,
    /// Completed over attempted requests, the mean over every run that ran.
    pub(crate) availability: Option<Pooled>,
    /// Runs excluded: the policy or the engine cannot run the experiment here.
    pub(crate) not_applicable: u64,
    /// Runs excluded: the stack did not come up (each also fails the command).
    pub(crate) errors: u64,
}

/// Whether a benign run killed the engine (a false kill, known or not).
fn killed_healthy(o: &Outcome) -> bool {
    matches!(o.verdict, Verdict::FalseKill | Verdict::KnownFalseKill)
        || (o.verdict == Verdict::EscalatedBenign && o.killed_at_ms.is_some())
}

/// The row of `policy` from the outcomes of Node Manager rows.
pub(crate) fn row(policy: Policy, outcomes: &[Outcome], time_scale: f64) -> PolicyRow {
    let mine: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.policy == policy && matches!(o.row(), Row::NodeManager(_)))
        .collect();
    let count = |v: Verdict| mine.iter().filter(|o| o.verdict == v).count() as u64;
    let ran: Vec<&&Outcome> = mine
        .iter()
        .filter(|o| !matches!(o.verdict, Verdict::NotApplicable | Verdict::Error))
        .collect();
    let (benign, faults): (Vec<&&&Outcome>, Vec<&&&Outcome>) =
        ran.iter().partition(|o| o.expect == "healthy");
    let killed = benign.iter().filter(|o| killed_healthy(o)).count() as u64;
    let detected: Vec<&&&Outcome> = faults
        .iter()
        .copied()
        .filter(|o| o.verdict == Verdict::Pass)
        .collect();
    let times: Vec<f64> = detected
        .iter()
        .filter_map(|o| o.detected_after_ms)
        .map(|ms| ms as f64 / 1000.0 / time_scale)
        .collect();
    let requests: Vec<(u64, u64)> = ran
        .iter()
        .map(|o| (o.load.completed, o.load.attempted))
        .collect();
    PolicyRow {
        policy,
        benign_runs: benign.len() as u64,
        false_kills: stats::wilson(killed, benign.len() as u64),
        known_false_kills: benign
            .iter()
            .filter(|o| o.verdict == Verdict::KnownFalseKill)
            .count() as u64,
        fault_runs: faults.len() as u64,
        detected: stats::wilson(detected.len() as u64, faults.len() as u64),
        by_design: count(Verdict::NotDetectableByDesign),
        median_s: stats::quantile(&times, 0.5),
        p90_s: stats::quantile(&times, 0.9),
        availability: stats::pooled(&requests),
        not_applicable: count(Verdict::NotApplicable),
        errors: count(Verdict::Error),
    }
}

/// The table's rows, in the order the policies were given.
pub(crate) fn table(policies: &[Policy], outcomes: &[Outcome], time_scale: f64) -> Vec<PolicyRow> {
    policies
        .iter()
        .map(|&p| row(p, outcomes, time_scale))
        .collect()
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// `k / n (rate, 95 % CI low–high)`, or `—` with no run.
fn rate_cell(r: Option<Rate>, note: &str) -> String {
    r.map_or_else(
        || "—".to_owned(),
        |r| {
            format!(
                "{} / {}{note} ({}, CI {}–{})",
                r.k,
                r.n,
                pct(r.rate),
                pct(r.low),
                pct(r.high)
            )
        },
    )
}

/// A time with its interval, or why there is none.
fn time_cell(q: Option<Quantile>) -> String {
    match q {
        None => "—".to_owned(),
        Some(Quantile {
            value,
            interval: Some((lo, hi)),
        }) => format!("{value:.1} s (CI {lo:.1}–{hi:.1})"),
        Some(Quantile { value, .. }) => format!("{value:.1} s (too few for a CI)"),
    }
}

/// The table as Markdown, with the notes a reader needs to read it.
pub(crate) fn markdown(
    rows: &[PolicyRow],
    repeat: u32,
    cadences: &[Cadence],
    time_scale: f64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| Policy | False kills (benign runs) | Faults detected (recall) | Median time to the kill decision | p90 time to the kill decision | Availability at the client | Not applicable | Errors |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let known = match r.known_false_kills {
            0 => String::new(),
            k => format!(" ({k} known)"),
        };
        let by_design = match r.by_design {
            0 => String::new(),
            k => format!(" ({k} not by design)"),
        };
        let availability = r.availability.map_or_else(
            || "—".to_owned(),
            |a| {
                format!(
                    "{}{} ({} of {} requests)",
                    pct(a.ratio),
                    a.interval.map_or_else(String::new, |(lo, hi)| format!(
                        ", CI {}–{}",
                        pct(lo),
                        pct(hi)
                    )),
                    a.completed,
                    a.attempted,
                )
            },
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.policy.as_str(),
            rate_cell(r.false_kills, &known),
            rate_cell(r.detected, &by_design),
            time_cell(r.median_s),
            time_cell(r.p90_s),
            availability,
            r.not_applicable,
            r.errors
        );
    }
    let cadences: Vec<String> = cadences.iter().map(|c| c.label()).collect();
    let _ = writeln!(
        s,
        "\nEach experiment ran {repeat} time(s) at each Node Manager cadence ({}; a peer, which does not read it, at the first only), at time scale {time_scale}; times are unscaled. Intervals are 95 %: Wilson for the rates, order statistics for the times (none below 6 detections for the median, 29 for the p90), availability the mean of the runs' (each run weighs the same) with a bootstrap over runs. Known false kills count as false kills; faults not detectable by design count as missed.\n",
        cadences.join(", ")
    );
    s
}

/// `compare.json`: the table and every outcome it was made from.
pub(crate) fn json(
    rows: &[PolicyRow],
    outcomes: &[Outcome],
    repeat: u32,
    time_scale: f64,
) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "repeat": repeat,
        "time_scale": time_scale,
        "table": rows,
        "outcomes": outcomes,
    }))
    .unwrap_or_default()
}

/// `compare.svg`: the chart of the table.
pub(crate) fn svg(rows: &[PolicyRow]) -> String {
    chart::chart(rows)
}

/// Runs the plan `repeat` times, prints the runner's summary and then the comparison, and
/// writes `compare.md`, `compare.json` and `compare.svg` beside `summary.md`. True when
/// nothing failed, as for `run` (a known false kill does not fail it).
pub async fn run(plan: &crate::Plan<'_>, repeat: u32) -> Result<bool, String> {
    let outcomes = crate::run_plan(plan, repeat).await?;
    crate::write_summary(plan, &outcomes)?;
    let rows = table(plan.policies, &outcomes, plan.time_scale);
    let md = markdown(&rows, repeat, plan.cadences, plan.time_scale);
    println!("\n## The comparison\n\n{md}");
    let write = |name: &str, text: String| {
        let path = plan.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("compare.md", md.clone())?;
    write(
        "compare.json",
        json(&rows, &outcomes, repeat, plan.time_scale),
    )?;
    write("compare.svg", svg(&rows))?;
    Ok(!crate::report::failed(&outcomes))
}

#[cfg(test)]
mod tests {
    use super::{markdown, row, svg};
    use crate::report::tests::outcome;
    use crate::run::{Cadence, Integration, Policy, Verdict};

    // What an operator reads in one row: every kill of a healthy engine, the known one
    // included and marked; a fault missed by design counted as missed; only the Node Manager
    // rows, both cadences pooled; not-applicable and failed runs left out and counted; times
    // unscaled.
    #[test]
    fn a_policy_row_pools_the_node_manager_rows_and_counts_known_kills_as_kills() {
        let mut v = vec![
            outcome("a", "healthy", Verdict::Pass, None),
            outcome("b", "healthy", Verdict::FalseKill, Some(500)),
            outcome("c", "healthy", Verdict::KnownFalseKill, Some(500)),
            outcome("d", "healthy", Verdict::NotApplicable, None),
            outcome("e", "healthy", Verdict::Error, None),
            outcome("f", "detect_within 30s", Verdict::Pass, Some(1000)),
            outcome("g", "detect_within 30s", Verdict::Pass, Some(3000)),
            outcome(
                "h",
                "detect_within 30s",
                Verdict::NotDetectableByDesign,
                None,
            ),
            outcome("i", "detect_within 30s", Verdict::Missed, None),
        ];
        // The same at 3 s; a kubelet row and another policy, which this row must not read.
        let at_3s: Vec<_> = v
            .iter()
            .cloned()
            .map(|mut o| {
                o.cadence = Some(Cadence::REFERENCE);
                o
            })
            .collect();
        v.extend(at_3s);
        let mut kubelet = outcome("k", "healthy", Verdict::FalseKill, Some(1));
        (kubelet.integration, kubelet.cadence) = (Integration::Kubelet, None);
        let mut other = outcome("o", "healthy", Verdict::FalseKill, Some(1));
        other.policy = Policy::Reference;
        v.extend([kubelet, other]);
        let r = row(Policy::Agent, &v, 0.05);
        let fk = r.false_kills.expect("benign runs");
        assert_eq!((fk.k, fk.n, r.known_false_kills), (4, 6, 2));
        let rc = r.detected.expect("fault runs");
        assert_eq!((rc.k, rc.n, r.by_design), (4, 8, 2));
        assert_eq!((r.not_applicable, r.errors), (2, 2));
        // 1 s and 3 s scaled by 0.05: 20 s and 60 s, twice each.
        let median = r.median_s.expect("detections");
        assert_eq!((median.value, median.interval), (20.0, None));
        assert_eq!(r.p90_s.map(|q| q.value), Some(60.0));
        let a = r.availability.expect("requests");
        assert_eq!(
            (a.completed, a.attempted),
            (13_980, 14_000),
            "7 runs at each cadence"
        );
        let md = markdown(std::slice::from_ref(&r), 1, &[Cadence::REFERENCE], 0.05);
        assert!(md.contains("| agent | 4 / 6 (2 known) (66.7 %"), "{md}");
        assert!(md.contains("4 / 8 (2 not by design)"), "{md}");
        assert!(svg(&[r]).contains("agent (4/6, 4/8)"));
    }
}
