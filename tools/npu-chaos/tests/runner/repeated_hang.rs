//! The `repeated_hang` experiment (issue 50, point 5): its file validates, and its verdict
//! holds the agent's episodes at each kill decision to the restart-loop rule — judged from
//! recorded rounds, with no clock and no stack.

use npu_chaos::run::{Round, Verdict, judge_rounds};
use npu_health_wire::AbnormalEpisodes;

/// Hang `k` killed after 15 s (scaled), the agent counting `in_window` episodes, escalated
/// or not, with the reason a hang's plus the escalation clause when escalated.
fn round(k: u32, in_window: u32, escalated: bool) -> Round {
    let clause = if escalated {
        format!("; restart loop: episode {k} in 1 h (escalated)")
    } else {
        String::new()
    };
    Round {
        hang: k,
        injected_at_ms: i64::from(k - 1) * 60_000,
        completed_before: u64::from(k) * 40,
        killed_after_ms: Some(15_000),
        episodes: Some(AbnormalEpisodes {
            last_hour: in_window,
            last_day: in_window,
            in_window,
            open: true,
            escalated,
            escalate_after: 3,
            escalate_window_s: 3600.0,
            starts_unix_ms: (0..u64::from(in_window)).map(|i| i * 60_000).collect(),
        }),
        reason: Some(format!(
            "virtual inference: the probe got no answer within 1 s{clause}"
        )),
    }
}

/// The three hangs as they must go: episodes 1, 2 and 3, only the third escalated.
fn good() -> Vec<Round> {
    vec![round(1, 1, false), round(2, 2, false), round(3, 3, true)]
}

/// The verdict of `rounds` and its reason, which must name `hang` and say `says`.
fn fails(rounds: &[Round], verdict: Verdict, hang: &str, says: &str) {
    let (v, why) = judge_rounds(rounds, 3).expect_err("must fail");
    assert_eq!(v, verdict, "{why}");
    assert!(why.contains(hang) && why.contains(says), "{why}");
}

#[test]
fn three_hangs_pass_only_when_the_third_episode_alone_escalates_as_a_restart_loop() {
    assert_eq!(judge_rounds(&good(), 3), Ok(()));

    let mut r = good();
    r[2] = round(3, 3, false);
    fails(&r, Verdict::WrongEscalation, "hang 3:", "was not escalated");

    let mut r = good();
    r[1] = round(2, 2, true);
    fails(&r, Verdict::WrongEscalation, "hang 2:", "before episode 3");

    let mut r = good();
    r[2].reason = Some("virtual inference: the probe got no answer within 1 s".into());
    fails(&r, Verdict::WrongEscalation, "hang 3:", "\"restart loop\"");

    // One hang counted as two episodes (say, the restart seen as a second one).
    let mut r = good();
    r[1] = round(2, 3, true);
    fails(
        &r,
        Verdict::WrongEscalation,
        "hang 2:",
        "counted 3 abnormal episodes",
    );

    let mut r = good();
    r[0].episodes = None;
    fails(&r, Verdict::WrongEscalation, "hang 1:", "did not answer");

    // An agent that escalates later than three hangs can show.
    let mut r = good();
    for x in &mut r {
        x.episodes.as_mut().unwrap().escalate_after = 5;
    }
    fails(&r, Verdict::WrongEscalation, "hang 1:", "cannot show");
}

#[test]
fn a_hang_that_is_not_killed_is_a_miss_named_by_its_number() {
    let mut r = good();
    r.truncate(2);
    r[1].killed_after_ms = None;
    r[1].episodes = None;
    fails(&r, Verdict::Missed, "hang 2 of 3", "not killed");
    // Rounds missing at the end (a run cut short) are not a pass.
    fails(&good()[..2], Verdict::Error, "only 2 of 3", "hangs ran");
}

#[test]
fn the_repeated_hang_file_validates() {
    let text = super::chaos_cli::checked("repeated-hang.yaml");
    assert!(
        text.starts_with("repeated_hang: engine_hang on Engine for 2m, 3 times"),
        "{text}"
    );
}
