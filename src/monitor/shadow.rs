//! The records of the rules' modes and of the shadow (docs/policy.md, "Modes" and "The shadow
//! policy"): each time a rule fires in force, and each time the shadow — the rules in
//! `observe` enforced too, or `shadow_policy` — would have answered otherwise than `/status`.
//!
//! The observer ([`crate::integrations::observe`]) calls [`Monitor::observe_rules`] every
//! 250 ms, more often than any poll and off `/status`'s path: it reads both verdicts, notes
//! each side's turns, opens and closes disagreements, and says so in the log ("would have"),
//! the journal and the counters. The turns and the disagreements are kept in the state file,
//! so `npu-health-agent disagreements` reads the history after the fact and an agent restart
//! forgets none of it.

use super::Monitor;
use super::evidence::Verdict;
use super::journal::{Entry, Id, Told};
use super::verdict::{HealthState, Status};
use crate::clock::unix_ms;
use crate::config::policy::Side;
use crate::config::policy::{Mode, Policy, rule_name};
use npu_health_wire::{Disagreement, KEPT_TURNS, RuleRecord, ShadowRecord, Turn};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The shadow in the journal.
pub(crate) const SHADOW: Id = Id("shadow");

/// One side's verdict as the records compare it: the status and the rule behind it.
type Said = (Status, Option<u8>);

/// The records of one engine's rules and shadow.
#[derive(Debug, Default)]
pub(crate) struct Records {
    inner: Mutex<Inner>,
    /// Times the shadow turned `abnormal` while `/status` did not (the evidence bundles watch
    /// it), and the rule each last time.
    observed: AtomicU64,
    observed_rule: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    /// What each side said at the last observation.
    last: Option<(Said, Option<Said>)>,
    turns: VecDeque<Turn>,
    disagreements: VecDeque<Disagreement>,
    /// By rule (0: the reference's own): times it fired in force, times it would have.
    fired: BTreeMap<u8, (u64, u64)>,
}

/// What of the records outlives the agent process: the turns and the disagreements.
pub(crate) type Saved = npu_health_wire::ShadowHistory;

fn push<T>(q: &mut VecDeque<T>, x: T) {
    if q.len() == KEPT_TURNS {
        q.pop_front();
    }
    q.push_back(x);
}

fn said(v: &Verdict) -> Said {
    (v.status, v.cause.and_then(|c| c.rule).map(|r| r.0))
}

fn rule_words(rule: Option<u8>) -> String {
    rule.map_or_else(
        || "the reference's own rule".to_owned(),
        |id| format!("rule {id} {}", rule_name(id)),
    )
}

impl Monitor {
    /// Compares `in_force` (the verdict the observer read this beat) with the shadow's and
    /// records what changed: each side's turn, a rule fired, a disagreement opened or closed
    /// (with its log line and journal entry). The observer's; never on `/status`'s path.
    pub(crate) fn observe_rules(&self, in_force: &Verdict) {
        let shadow = self.shadow_verdict();
        let now = (said(in_force), shadow.as_ref().map(said));
        let at = unix_ms();
        let mut g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (was_in, was_shadow) = g.last.unwrap_or(((Status::Initial, None), None));
        if g.last.is_some_and(|l| l == now) {
            return;
        }
        let policy = self.spec.policy.value;
        if now.0 != was_in {
            push(&mut g.turns, turn(at, "in_force", policy, in_force));
            if in_force.status == Status::Abnormal && was_in.0 != Status::Abnormal {
                g.fired.entry(now.0.1.unwrap_or(0)).or_default().0 += 1;
                self.warn_if_escalated();
            }
        }
        if let (Some(v), Some(s)) = (&shadow, self.spec.judging.shadow) {
            if now.1 != was_shadow {
                push(&mut g.turns, turn(at, "shadow", s.policy, v));
            }
            self.disagreement(&mut g, at, in_force, v);
        }
        g.last = Some(now);
    }

    /// Opens, changes or closes the disagreement between `in_force` and `shadow`.
    fn disagreement(&self, g: &mut Inner, at: u64, in_force: &Verdict, shadow: &Verdict) {
        let open = g
            .disagreements
            .back()
            .filter(|d| d.ended_unix_ms.is_none())
            .map(|d| d.would_status);
        let differ = in_force.status != shadow.status;
        if open.is_some() && (!differ || open != Some(shadow.status)) {
            if let Some(d) = g.disagreements.back_mut() {
                d.ended_unix_ms = Some(at);
            }
            if !differ {
                tracing::info!(
                    engine = %self.spec.name,
                    "the shadow agrees with /status again: {}",
                    in_force.status.as_str()
                );
            }
        }
        if !differ || open == Some(shadow.status) {
            return;
        }
        let rule = self.difference(in_force, shadow);
        let reason = match shadow.status {
            Status::Abnormal => shadow.reason.clone(),
            _ => format!(
                "{}; the shadow would have held it back ({})",
                in_force.reason,
                rule_words(rule)
            ),
        };
        tracing::warn!(
            engine = %self.spec.name,
            rule = rule.unwrap_or(0),
            mode = "observe",
            "would have answered {} ({}, not in force), /status answers {}: {reason}",
            shadow.status.as_str(),
            rule_words(rule),
            in_force.status.as_str()
        );
        g.fired.entry(rule.unwrap_or(0)).or_default().1 += 1;
        if shadow.status == Status::Abnormal {
            self.records
                .observed_rule
                .store(u64::from(rule.unwrap_or(0)), Ordering::Release);
            self.records.observed.fetch_add(1, Ordering::AcqRel);
        }
        self.journal.push(Entry {
            at_unix_ms: at,
            told: Told::state(SHADOW, "would_have", shadow.status.as_str()),
            before: Some(Told::state(SHADOW, "would_have", in_force.status.as_str())),
            level: self.qos.level(),
            reason: format!("would have answered {}: {reason}", shadow.status.as_str()),
        });
        push(
            &mut g.disagreements,
            Disagreement {
                began_unix_ms: at,
                ended_unix_ms: None,
                status: in_force.status,
                would_status: shadow.status,
                rule,
                reason,
            },
        );
    }

    /// The rule that makes the difference between the two verdicts: the shadow's rule that
    /// fired; else the one that held the shadow back (rule 1's grace, or 3 or 4 in its count);
    /// else the rule in force the shadow lacks.
    fn difference(&self, in_force: &Verdict, shadow: &Verdict) -> Option<u8> {
        let rule = |v: &Verdict| v.cause.and_then(|c| c.rule).map(|r| r.0);
        if shadow.status == Status::Abnormal {
            return rule(shadow);
        }
        if self.health_on(Side::Shadow) == HealthState::Failing {
            return Some(1);
        }
        self.vi.shadow().held_by.or_else(|| rule(in_force))
    }

    /// Times the shadow turned `abnormal` while `/status` did not, and the rule the last time
    /// (0: the reference's own): the evidence bundles' trigger for a rule in `observe`.
    pub(crate) fn observed(&self) -> (u64, u8) {
        (
            self.records.observed.load(Ordering::Acquire),
            self.records.observed_rule.load(Ordering::Acquire) as u8,
        )
    }

    /// Every rule of docs/policy.md with its mode here and its counts (`/status/detail`'s
    /// `rules`, the metric).
    pub(crate) fn rule_records(&self) -> Vec<RuleRecord> {
        let g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        let j = &self.spec.judging;
        (1..=crate::config::policy::RULE_NAMES.len() as u8)
            .map(|id| {
                let mode = if j.in_force.applies(id) {
                    Mode::Enforce
                } else if j.shadow.is_some_and(|s| s.applies(id)) {
                    Mode::Observe
                } else {
                    Mode::Off
                };
                let (fired, would_have) = g.fired.get(&id).copied().unwrap_or_default();
                RuleRecord {
                    id,
                    name: rule_name(id).to_owned(),
                    mode: mode.as_str().to_owned(),
                    fired,
                    would_have,
                }
            })
            .collect()
    }

    /// The reference's own rules' counts (rule 0 in the records): fired, would have.
    pub(crate) fn reference_fired(&self) -> (u64, u64) {
        let g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.fired.get(&0).copied().unwrap_or_default()
    }

    /// The shadow now and its history (`/status/detail`'s `shadow`); `None` without one.
    pub(crate) fn shadow_record(&self) -> Option<ShadowRecord> {
        let j = self.spec.judging.shadow?;
        let v = self.shadow_verdict()?;
        let g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        Some(ShadowRecord {
            policy: j.policy,
            status: v.status,
            rule: said(&v).1,
            reason: v.reason,
            turns: g.turns.iter().cloned().collect(),
            disagreements: g.disagreements.iter().cloned().collect(),
        })
    }

    /// What of the records outlives the agent process.
    pub(crate) fn records_saved(&self) -> Saved {
        let g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        Saved {
            turns: g.turns.iter().cloned().collect(),
            disagreements: g.disagreements.iter().cloned().collect(),
        }
    }

    /// Takes back saved records: the history, and each side's last turn as the last seen (so
    /// the first observation after a restart repeats no turn).
    pub(crate) fn restore_records(&self, s: &Saved) {
        let mut g = self.records.inner.lock().unwrap_or_else(|p| p.into_inner());
        let last = |side: &str| {
            s.turns
                .iter()
                .rev()
                .find(|t| t.side == side)
                .map(|t| (t.status, t.rule))
        };
        g.turns = kept(&s.turns);
        g.disagreements = kept(&s.disagreements);
        if let Some(in_force) = last("in_force") {
            g.last = Some((in_force, last("shadow")));
        }
    }
}

/// The last [`KEPT_TURNS`] of `v`, oldest first.
fn kept<T: Clone>(v: &[T]) -> VecDeque<T> {
    v[v.len().saturating_sub(KEPT_TURNS)..]
        .iter()
        .cloned()
        .collect()
}

fn turn(at: u64, side: &str, policy: Policy, v: &Verdict) -> Turn {
    Turn {
        at_unix_ms: at,
        side: side.to_owned(),
        policy,
        status: v.status,
        rule: said(v).1,
        reason: v.reason.clone(),
    }
}

#[cfg(test)]
mod tests;
