//! The chaos suite's summary: per policy, false kills on the benign experiments, detection
//! rate and median / worst time to detect on the faults, and a line per experiment.

use super::run::{Outcome, Policy, Verdict};
use std::fmt::Write;

/// Figures of one policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicySummary {
    pub policy: Policy,
    pub benign: usize,
    pub false_kills: usize,
    pub faults: usize,
    pub detected: usize,
    /// Faults this policy cannot detect by design (not counted as missed).
    pub by_design: usize,
    pub missed: usize,
    pub errors: usize,
    pub median_detect_ms: Option<u64>,
    pub worst_detect_ms: Option<u64>,
}

/// Sums up the outcomes of one policy.
pub fn summarize(policy: Policy, outcomes: &[Outcome]) -> PolicySummary {
    let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.policy == policy).collect();
    let benign: Vec<&&Outcome> = mine.iter().filter(|o| o.expect == "healthy").collect();
    let faults: Vec<&&Outcome> = mine.iter().filter(|o| o.expect != "healthy").collect();
    let mut times: Vec<u64> = faults.iter().filter_map(|o| o.detected_after_ms).collect();
    times.sort_unstable();
    let count = |v: Verdict| mine.iter().filter(|o| o.verdict == v).count();
    PolicySummary {
        policy,
        benign: benign.len(),
        false_kills: count(Verdict::FalseKill),
        faults: faults.len(),
        detected: faults.iter().filter(|o| o.verdict == Verdict::Pass).count(),
        by_design: count(Verdict::NotDetectableByDesign),
        missed: count(Verdict::Missed),
        errors: count(Verdict::Error),
        median_detect_ms: (!times.is_empty()).then(|| times[(times.len() - 1) / 2]),
        worst_detect_ms: times.last().copied(),
    }
}

/// True when the run must fail: a false kill, a missed detection or an experiment that could
/// not run.
pub fn failed(outcomes: &[Outcome]) -> bool {
    outcomes.iter().any(|o| {
        matches!(
            o.verdict,
            Verdict::FalseKill | Verdict::Missed | Verdict::Error
        )
    })
}

fn secs(ms: Option<u64>) -> String {
    ms.map_or_else(|| "—".to_owned(), |m| format!("{:.1} s", m as f64 / 1000.0))
}

/// The Markdown report: the summary table, then one line per experiment. Times are on the
/// scaled clock of the run (`time_scale`); divide by it for the unscaled equivalent.
pub fn markdown(outcomes: &[Outcome], policies: &[Policy], time_scale: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| Policy | False kills (benign) | Detected (faults) | Not detectable by design | Median time to detect | Worst time to detect |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for &p in policies {
        let m = summarize(p, outcomes);
        let _ = writeln!(
            s,
            "| {} | {} / {} | {} / {} | {} | {} | {} |",
            p.as_str(),
            m.false_kills,
            m.benign,
            m.detected,
            m.faults - m.by_design,
            m.by_design,
            secs(m.median_detect_ms.map(|t| (t as f64 / time_scale) as u64)),
            secs(m.worst_detect_ms.map(|t| (t as f64 / time_scale) as u64)),
        );
    }
    let _ = writeln!(
        s,
        "\nTimes to detect are unscaled (measured at time scale {time_scale}, divided by it).\n"
    );
    let _ = writeln!(
        s,
        "| Experiment | Fault | Expect | Policy | Verdict | Detected after | Killed at | Guard events |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---:|---:|---|");
    for o in outcomes {
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
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {}{} | {} | {} | {} |",
            o.experiment,
            o.fault,
            o.expect,
            o.policy.as_str(),
            verdict,
            o.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default(),
            o.detected_after_ms
                .map_or_else(|| "—".to_owned(), |t| unscale(t as i64)),
            o.killed_at_ms.map_or_else(|| "—".to_owned(), unscale),
            if guards.is_empty() {
                "—".to_owned()
            } else {
                guards.join("; ")
            },
        );
    }
    s
}
