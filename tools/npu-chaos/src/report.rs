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
    /// Experiments whose fault this engine cannot take (`--engine vllm`); in neither count.
    pub not_applicable: usize,
    pub median_detect_ms: Option<u64>,
    pub worst_detect_ms: Option<u64>,
}

/// Sums up the outcomes of one policy.
pub fn summarize(policy: Policy, outcomes: &[Outcome]) -> PolicySummary {
    let all: Vec<&Outcome> = outcomes.iter().filter(|o| o.policy == policy).collect();
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
    PolicySummary {
        policy,
        benign: benign.len(),
        false_kills: count(Verdict::FalseKill),
        faults: faults.len(),
        detected: faults.iter().filter(|o| o.verdict == Verdict::Pass).count(),
        by_design: count(Verdict::NotDetectableByDesign),
        missed: count(Verdict::Missed),
        errors: count(Verdict::Error),
        not_applicable: all.len() - mine.len(),
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
        "| Policy | False kills (benign) | Detected (faults) | Not detectable by design | Not applicable | Median time to detect | Worst time to detect |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for &p in policies {
        let m = summarize(p, outcomes);
        let _ = writeln!(
            s,
            "| {} | {} / {} | {} / {} | {} | {} | {} | {} |",
            p.as_str(),
            m.false_kills,
            m.benign,
            m.detected,
            m.faults - m.by_design,
            m.by_design,
            m.not_applicable,
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
        "| Experiment | Fault | Expect | Policy | Verdict | Injected | Detected after | Killed at | Guard events |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---:|---:|---:|---|");
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
            "| {} | {} | {} | {} | {}{} | {} | {} | {} | {} |",
            o.experiment,
            o.fault,
            o.expect,
            o.policy.as_str(),
            verdict,
            o.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default(),
            unscale(o.injected_ms as i64),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::Target;

    fn outcome(name: &str, expect: &str, verdict: Verdict, detected: Option<u64>) -> Outcome {
        Outcome {
            experiment: name.into(),
            target: Target::Engine,
            fault: "engine_hang".into(),
            policy: Policy::Full,
            expect: expect.into(),
            verdict,
            detected_after_ms: detected,
            killed_at_ms: detected.map(|d| d as i64),
            first_injected_ms: Some(0),
            injected_ms: 5000,
            guard_events: Vec::new(),
            load: serde_json::Value::Null,
            error: None,
            timeline: Vec::new(),
        }
    }

    #[test]
    fn summary_counts_and_table_shape() {
        let os = vec![
            outcome("a", "healthy", Verdict::Pass, None),
            outcome("b", "healthy", Verdict::FalseKill, None),
            outcome("c", "detect_within 1m", Verdict::Pass, Some(2000)),
            outcome("d", "detect_within 1m", Verdict::Pass, Some(6000)),
            outcome("e", "detect_within 1m", Verdict::Pass, Some(4000)),
            outcome("f", "detect_within 1m", Verdict::Missed, None),
            outcome("g", "detect_within 1m", Verdict::NotApplicable, None),
            outcome("h", "healthy", Verdict::NotApplicable, None),
        ];
        let m = summarize(Policy::Full, &os);
        assert_eq!((m.benign, m.false_kills), (2, 1));
        assert_eq!((m.faults, m.detected, m.missed), (4, 3, 1));
        assert_eq!(m.not_applicable, 2, "neither a pass nor a failure");
        assert!(!failed(&os[6..]), "not applicable does not fail the run");
        assert_eq!(m.median_detect_ms, Some(4000));
        assert_eq!(m.worst_detect_ms, Some(6000));
        assert!(failed(&os));
        assert!(!failed(&os[..1]));
        let md = markdown(&os, &[Policy::Full], 0.1);
        assert!(
            md.contains("| full | 1 / 2 | 3 / 4 | 0 | 2 | 40.0 s | 60.0 s |"),
            "{md}"
        );
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
}
