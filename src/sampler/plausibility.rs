//! Whether a figure that `libdcmi.so` answered with `DCMI_OK` is a reading.
//!
//! The driver's own source (hicann/driver, `src/custom/dev_prod/user/dcmi/`) answers OK with
//! figures that are not readings in three places the agent relies on:
//! - the multi-utilization call lets the firmware's "not supported" for its TS sub-command
//!   through, copies out the zeroed struct and returns OK
//!   (`dcmi_inner_info_get_ext.c`, `dcmi_get_npu_device_utilization_rate_v2`), so a firmware
//!   without the sub-command reads 0 % on every NPU, busy or not;
//! - the single call turns a figure above 100 into 0 and returns OK
//!   (`dcmi_inner_info_get.c`, `dcmi_get_npu_device_utilization_rate`), so type 14's 0 may
//!   be a bad figure;
//! - the pre-release name `dcmi_get_device_utilization_rate_v2` was first declared with a
//!   4-byte struct of four `unsigned char` (MindCluster `83a5b2ea`, 2026-02-11; the 48-byte
//!   struct came in `05c8454c` three days later), so against an early library `aic_util`
//!   packs four bytes together.
//!
//! A zero cannot be told from an idle NPU by looking at it, so a zero counts only when the call
//! has proven itself (a non-zero field: the firmware has the sub-command) or when a second call
//! agrees. Where two calls disagree the figure is *suspect*: the sampler stores it as an
//! invalid sample, so a window of suspect figures is unavailable, never 0 %. A call is
//! abandoned only when the disagreement lasts: the figures are refreshed about every 100 ms,
//! not at the same instant, so one busy/idle edge between two reads is no verdict.
//!
//! Pure logic: the DCMI thread calls the driver and feeds the answers in.

use super::codes;
use super::status::Opinion;
use crate::driver::dcmi::{MultiSymbol, MultiUtil, UtilType};
use std::time::Duration;

/// A disagreement must last this long before a call is judged.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);
/// ... and be seen this many times.
pub(crate) const MIN_DISAGREEMENTS: u32 = 3;
/// Default time between re-checks of a call already judged: one extra call per device.
pub(crate) const DEFAULT_RECHECK: Duration = Duration::from_secs(10);
/// Consecutive `npu-smi` rows that must read non-zero against a type-14 zero before the
/// device leaves type 14 for `npu-smi`.
pub(crate) const NPU_SMI_DISAGREEMENTS: u32 = 3;

/// What the agent knows about a device's multi-utilization call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MultiTrust {
    /// Only all-zero answers so far: each zero is checked against a single call.
    Unverified,
    /// It answered a non-zero field: the firmware has the sub-command, so its zeros are an
    /// idle NPU.
    Verified,
    /// Not a reading on this device; the device reads type 14.
    Unreal(Unreal),
}

/// Why the multi-utilization call was judged not to give readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreal {
    /// It answered an all-zero struct for at least [`SETTLE`] while `kind` read non-zero
    /// (`single` % the last time): the firmware lacks the sub-command.
    Zeroed { kind: UtilType, single: u32 },
    /// The pre-release name answered a figure above 100 (`value`): the library writes the
    /// early 4-byte struct, whose bytes land packed in `aic_util`.
    Layout { value: u32 },
}

/// What to do with an answer of the multi-utilization call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MultiStep {
    /// A reading, percent.
    Reading(u8),
    /// Read the single call ([`CubeJudge::corroborator`]) and pass both to
    /// [`CubeJudge::pair`].
    Ask,
    /// Not a reading: store an invalid sample with this code.
    Invalid(i32),
    /// Stop using the multi call on this device: read type 14 from now on.
    Abandon(Unreal),
}

/// What to do with a type-14 answer on a device that reads type 14.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SingleStep {
    /// A reading, percent.
    Reading(u8),
    /// Not a reading: store an invalid sample with this code.
    Invalid(i32),
}

/// A disagreement between two calls on one device, while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dispute {
    /// The multi struct is all zero while the single call reads non-zero (else: type 14
    /// reads 0 while the verified multi call reads non-zero).
    multi_zero: bool,
    since_ns: u64,
    count: u32,
}

/// The plausibility state of one device's AI Cube calls.
#[derive(Debug, Clone)]
pub(crate) struct CubeJudge {
    multi: MultiTrust,
    /// Type 14 read 0 for [`SETTLE`] while the verified multi call read non-zero: its zeros
    /// cannot vouch for an idle NPU on this device.
    type14_zero_unreliable: bool,
    /// Type 14 answered -8255 or is missing: zeros are checked against type 2.
    type14_missing: bool,
    /// Type 2 answered -8255 or is missing too: nothing can vouch for a zero.
    aicore_missing: bool,
    dispute: Option<Dispute>,
    recheck_ns: u64,
    /// Ring time of the next re-check (0: none planned).
    next_check_ns: u64,
    /// The last multi answer had a non-zero field.
    last_busy: bool,
    /// After a verified call drops from busy to all-zero, its zeros are checked until
    /// this ring time (a firmware that stops answering while the NPU works looks like this).
    edge_until_ns: u64,
}

impl CubeJudge {
    /// A device whose calls are not judged yet; a judged call is checked again every
    /// `recheck`.
    pub(crate) fn new(recheck: Duration) -> CubeJudge {
        CubeJudge {
            multi: MultiTrust::Unverified,
            type14_zero_unreliable: false,
            type14_missing: false,
            aicore_missing: false,
            dispute: None,
            recheck_ns: u64::try_from(recheck.as_nanos()).unwrap_or(u64::MAX),
            next_check_ns: 0,
            last_busy: false,
            edge_until_ns: 0,
        }
    }

    /// What is known about the multi call.
    pub(crate) fn multi(&self) -> MultiTrust {
        self.multi
    }

    /// Whether two calls disagree right now (the verdict is pending).
    pub(crate) fn disputed(&self) -> bool {
        self.dispute.is_some()
    }

    /// Whether type 14's zeros were seen contradicted by the multi call.
    #[cfg(test)]
    pub(crate) fn type14_zero_unreliable(&self) -> bool {
        self.type14_zero_unreliable
    }

    /// The single call that checks a multi answer: type 14, or type 2 (AI Core, which
    /// includes the cube units) where type 14 is missing or its zeros are unreliable; `None`
    /// when neither answers.
    pub(crate) fn corroborator(&self) -> Option<UtilType> {
        if !self.type14_missing && !self.type14_zero_unreliable {
            Some(UtilType::AiCube)
        } else if !self.aicore_missing {
            Some(UtilType::AiCore)
        } else {
            None
        }
    }

    /// The corroborating call `kind` answered -8255 or is missing.
    pub(crate) fn corroborator_missing(&mut self, kind: UtilType) {
        match kind {
            UtilType::AiCube => self.type14_missing = true,
            UtilType::AiCore => self.aicore_missing = true,
        }
    }

    fn due(&self, now_ns: u64) -> bool {
        self.next_check_ns != 0 && now_ns >= self.next_check_ns
    }

    fn schedule(&mut self, now_ns: u64) {
        self.next_check_ns = now_ns.saturating_add(self.recheck_ns).max(1);
    }

    /// Counts one more disagreement of the given kind; true once it has lasted.
    fn disagree(&mut self, multi_zero: bool, now_ns: u64) -> bool {
        let d = match self.dispute {
            Some(d) if d.multi_zero == multi_zero => Dispute {
                count: d.count + 1,
                ..d
            },
            _ => Dispute {
                multi_zero,
                since_ns: now_ns,
                count: 1,
            },
        };
        self.dispute = Some(d);
        d.count >= MIN_DISAGREEMENTS
            && now_ns.saturating_sub(d.since_ns) >= SETTLE.as_nanos() as u64
    }

    /// The two calls agree (or cannot disagree): the dispute and any busy-to-zero check end;
    /// a verified call is next checked after the re-check interval.
    fn agree(&mut self, now_ns: u64) {
        self.dispute = None;
        self.edge_until_ns = 0;
        if self.multi == MultiTrust::Verified {
            self.schedule(now_ns);
        }
    }

    /// Judges an answer of the multi call at ring time `now_ns`.
    pub(crate) fn multi_answer(&mut self, now_ns: u64, m: &MultiUtil) -> MultiStep {
        if m.symbol == MultiSymbol::PreRelease && m.max_figure() > 100 {
            let why = Unreal::Layout {
                value: m.max_figure(),
            };
            self.multi = MultiTrust::Unreal(why);
            self.dispute = None;
            return MultiStep::Abandon(why);
        }
        if m.aic > 100 {
            return MultiStep::Invalid(codes::BAD_VALUE);
        }
        let was_busy = std::mem::replace(&mut self.last_busy, !m.all_zero());
        if !m.all_zero() {
            if self.multi != MultiTrust::Verified {
                self.multi = MultiTrust::Verified;
                self.schedule(now_ns);
            }
            // A busy answer ends any doubt about the call's zeros.
            if self.dispute.is_some_and(|d| d.multi_zero) {
                self.dispute = None;
            }
            // A re-check compares a busy answer with type 14 too (is type 14's 0 a lie?).
            if self.due(now_ns) || self.dispute.is_some() {
                return MultiStep::Ask;
            }
            return MultiStep::Reading(m.aic as u8);
        }
        if self.multi == MultiTrust::Verified && was_busy {
            self.edge_until_ns = now_ns.saturating_add(SETTLE.as_nanos() as u64);
        }
        let checking = self.due(now_ns) || self.dispute.is_some() || now_ns < self.edge_until_ns;
        match self.multi {
            MultiTrust::Verified if !checking => MultiStep::Reading(0),
            _ => MultiStep::Ask,
        }
    }

    /// Judges a multi answer together with the corroborating single call's answer
    /// (`None`: it failed or no single call answers).
    pub(crate) fn pair(
        &mut self,
        now_ns: u64,
        m: &MultiUtil,
        single: Option<(UtilType, u32)>,
    ) -> MultiStep {
        if !m.all_zero() {
            // A verified call under re-check: does type 14 read 0 against a busy AI Cube?
            let type14_zero = single == Some((UtilType::AiCube, 0)) && m.aic > 0;
            if type14_zero {
                let lasted = self.disagree(false, now_ns);
                self.type14_zero_unreliable |= lasted;
                if lasted {
                    self.agree(now_ns);
                }
            } else if single.is_some() {
                self.agree(now_ns);
            }
            return MultiStep::Reading(m.aic.min(100) as u8);
        }
        match single {
            Some((_, 0)) => {
                self.agree(now_ns);
                MultiStep::Reading(0)
            }
            Some((kind, v)) => {
                if self.disagree(true, now_ns) {
                    let why = Unreal::Zeroed { kind, single: v };
                    self.multi = MultiTrust::Unreal(why);
                    self.dispute = None;
                    self.schedule(now_ns);
                    return MultiStep::Abandon(why);
                }
                MultiStep::Invalid(codes::SUSPECT)
            }
            // A proven call's zero stands on its own; an unproven one's does not.
            None if self.multi == MultiTrust::Verified => {
                self.agree(now_ns);
                MultiStep::Reading(0)
            }
            None => MultiStep::Invalid(codes::SUSPECT),
        }
    }

    /// Judges a type-14 answer on a device that reads type 14; `npu_smi` is what its
    /// cross-check watch says. A zero is suspect while that watch reads non-zero or its first
    /// row is awaited, and always once type 14's zeros were seen contradicted.
    pub(crate) fn single_answer(&self, value: u32, npu_smi: Opinion) -> SingleStep {
        if value > 100 {
            return SingleStep::Invalid(codes::BAD_VALUE);
        }
        let contradicted = match npu_smi {
            Opinion::Row(v) => v > 0,
            Opinion::Pending => true,
            Opinion::None => false,
        };
        if value == 0 && (self.type14_zero_unreliable || contradicted) {
            return SingleStep::Invalid(codes::SUSPECT);
        }
        SingleStep::Reading(value as u8)
    }

    /// Whether a device that abandoned a zeroed multi call should try it once more now.
    pub(crate) fn multi_recheck_due(&self, now_ns: u64) -> bool {
        matches!(self.multi, MultiTrust::Unreal(Unreal::Zeroed { .. })) && self.due(now_ns)
    }

    /// The re-check answer of an abandoned multi call: true when it now gives readings (a
    /// non-zero field, all figures in range), and the device goes back to it.
    pub(crate) fn multi_recheck(&mut self, now_ns: u64, m: Option<&MultiUtil>) -> bool {
        match m {
            Some(m) if !m.all_zero() && m.max_figure() <= 100 => {
                self.multi = MultiTrust::Verified;
                self.dispute = None;
                self.schedule(now_ns);
                true
            }
            _ => {
                self.schedule(now_ns);
                false
            }
        }
    }
}

/// Compares `npu-smi` rows with a device's type-14 readings (the cross-check watch of a
/// device that reads type 14).
#[derive(Debug, Clone, Default)]
pub(crate) struct NpuSmiCheck {
    disagreements: u32,
}

impl NpuSmiCheck {
    /// One `npu-smi` row `row` against the device's latest type-14 reading (`None`: none
    /// recent). True when type 14 has read 0 against a non-zero row for
    /// [`NPU_SMI_DISAGREEMENTS`] rows in a row: the device should move to `npu-smi`.
    pub(crate) fn row(&mut self, row: u8, type14: Option<u8>) -> bool {
        match type14 {
            Some(0) if row > 0 => self.disagreements += 1,
            Some(_) => self.disagreements = 0,
            None => {}
        }
        self.disagreements >= NPU_SMI_DISAGREEMENTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn m(aic: u32, aiv: u32, aicore: u32, npu: u32) -> MultiUtil {
        MultiUtil {
            aic,
            aiv,
            aicore,
            npu,
            reserved_set: false,
            symbol: MultiSymbol::Released,
        }
    }

    fn zero() -> MultiUtil {
        m(0, 0, 0, 0)
    }

    fn judge() -> CubeJudge {
        CubeJudge::new(Duration::from_secs(60))
    }

    /// Feeds a zeroed multi answer and the single call's `single` every 50 ms from `t0_ms`
    /// for `n` passes; returns the steps.
    fn zeros_against(j: &mut CubeJudge, t0_ms: u64, n: u64, single: u32) -> Vec<MultiStep> {
        (0..n)
            .map(|i| {
                let now = (t0_ms + i * 50) * MS;
                assert_eq!(j.multi_answer(now, &zero()), MultiStep::Ask);
                j.pair(now, &zero(), Some((UtilType::AiCube, single)))
            })
            .collect()
    }

    // Defect 1: the firmware lacks the sub-command; the struct is zeroed and OK is returned.
    #[test]
    fn multi_call_zeroed_while_type14_reads_busy_is_suspect_then_abandoned() {
        let mut j = judge();
        let steps = zeros_against(&mut j, 1000, 21, 40);
        // Suspect (never a 0 % reading) until the disagreement has lasted a second.
        assert!(
            steps[..20]
                .iter()
                .all(|s| *s == MultiStep::Invalid(codes::SUSPECT)),
            "{steps:?}"
        );
        assert_eq!(
            steps[20],
            MultiStep::Abandon(Unreal::Zeroed {
                kind: UtilType::AiCube,
                single: 40
            })
        );
        assert!(matches!(j.multi(), MultiTrust::Unreal(_)));
    }

    #[test]
    fn multi_call_zeros_agreeing_with_type14_are_an_idle_npu() {
        let mut j = judge();
        for s in zeros_against(&mut j, 0, 40, 0) {
            assert_eq!(s, MultiStep::Reading(0));
        }
        assert_eq!(j.multi(), MultiTrust::Unverified);
    }

    // A real multi call at a busy/idle edge: one disagreement, then the busy answer proves
    // the call. Never abandoned.
    #[test]
    fn a_busy_edge_between_the_two_reads_is_no_verdict() {
        let mut j = judge();
        let steps = zeros_against(&mut j, 0, 2, 60);
        assert_eq!(steps, [MultiStep::Invalid(codes::SUSPECT); 2]);
        assert_eq!(
            j.multi_answer(100 * MS, &m(60, 30, 60, 60)),
            MultiStep::Reading(60)
        );
        assert_eq!(j.multi(), MultiTrust::Verified);
        assert!(!j.disputed());
        // Proven: once type 14 agrees with the first zero after it, zeros are idle readings
        // without asking.
        assert_eq!(j.multi_answer(150 * MS, &zero()), MultiStep::Ask);
        assert_eq!(
            j.pair(150 * MS, &zero(), Some((UtilType::AiCube, 0))),
            MultiStep::Reading(0)
        );
        assert_eq!(j.multi_answer(200 * MS, &zero()), MultiStep::Reading(0));
        // Three disagreements inside a second do not settle either.
        let mut k = judge();
        zeros_against(&mut k, 0, 3, 60);
        assert_eq!(k.multi(), MultiTrust::Unverified);
    }

    #[test]
    fn an_unproven_zero_with_no_single_call_to_vouch_for_it_is_suspect() {
        let mut j = judge();
        assert_eq!(j.corroborator(), Some(UtilType::AiCube));
        j.corroborator_missing(UtilType::AiCube);
        assert_eq!(j.corroborator(), Some(UtilType::AiCore));
        j.corroborator_missing(UtilType::AiCore);
        assert_eq!(j.corroborator(), None);
        assert_eq!(j.multi_answer(0, &zero()), MultiStep::Ask);
        assert_eq!(j.pair(0, &zero(), None), MultiStep::Invalid(codes::SUSPECT));
        // Once proven, a zero stands on its own (even the first after a busy answer, when
        // nothing can check it).
        assert_eq!(j.multi_answer(MS, &m(0, 5, 5, 5)), MultiStep::Reading(0));
        assert_eq!(j.multi_answer(2 * MS, &zero()), MultiStep::Ask);
        assert_eq!(j.pair(2 * MS, &zero(), None), MultiStep::Reading(0));
        assert_eq!(j.multi_answer(3 * MS, &zero()), MultiStep::Reading(0));
    }

    #[test]
    fn a_verified_call_is_checked_again_after_the_recheck_interval() {
        let mut j = CubeJudge::new(Duration::from_secs(10));
        assert_eq!(
            j.multi_answer(0, &m(50, 20, 50, 50)),
            MultiStep::Reading(50)
        );
        assert_eq!(j.multi_answer(9_000 * MS, &zero()), MultiStep::Ask);
        assert_eq!(
            j.pair(9_000 * MS, &zero(), Some((UtilType::AiCube, 0))),
            MultiStep::Reading(0)
        );
        assert_eq!(j.multi_answer(9_001 * MS, &zero()), MultiStep::Reading(0));
        // Due ten seconds after the last agreement: the next answer is compared with type 14.
        assert_eq!(j.multi_answer(18_999 * MS, &zero()), MultiStep::Reading(0));
        let t = 19_000 * MS;
        assert_eq!(j.multi_answer(t, &zero()), MultiStep::Ask);
        assert_eq!(
            j.pair(t, &zero(), Some((UtilType::AiCube, 0))),
            MultiStep::Reading(0)
        );
        // Agreement: not asked again until the next interval.
        assert_eq!(j.multi_answer(t + MS, &zero()), MultiStep::Reading(0));
        // A firmware that lost the sub-command: zeros against a busy type 14, for a second.
        let steps = zeros_against(&mut j, 30_000, 21, 70);
        assert!(matches!(
            steps[20],
            MultiStep::Abandon(Unreal::Zeroed { single: 70, .. })
        ));
    }

    // A firmware that stops answering while the NPU works: the verified call drops from
    // busy to zeros, and those zeros are checked at once, not at the next re-check.
    #[test]
    fn a_verified_call_dropping_to_zeros_while_type14_stays_busy_is_abandoned() {
        let mut j = judge();
        assert_eq!(
            j.multi_answer(0, &m(40, 20, 40, 40)),
            MultiStep::Reading(40)
        );
        let steps = zeros_against(&mut j, 50, 21, 40);
        assert!(
            steps[..20]
                .iter()
                .all(|s| *s == MultiStep::Invalid(codes::SUSPECT))
        );
        assert!(matches!(steps[20], MultiStep::Abandon(_)), "{steps:?}");
        // A real busy-to-idle edge: type 14 agrees (after one lagging read) and the zeros
        // are idle readings without asking.
        let mut k = judge();
        k.multi_answer(0, &m(40, 20, 40, 40));
        assert_eq!(
            zeros_against(&mut k, 50, 1, 40),
            [MultiStep::Invalid(codes::SUSPECT)]
        );
        assert_eq!(zeros_against(&mut k, 100, 1, 0), [MultiStep::Reading(0)]);
        assert_eq!(k.multi_answer(150 * MS, &zero()), MultiStep::Reading(0));
        assert_eq!(k.multi(), MultiTrust::Verified);
    }

    #[test]
    fn an_abandoned_zeroed_call_is_tried_again_and_taken_back_once_it_reads() {
        let mut j = CubeJudge::new(Duration::from_secs(10));
        zeros_against(&mut j, 0, 21, 40);
        assert!(!j.multi_recheck_due(5_000 * MS));
        assert!(j.multi_recheck_due(11_000 * MS));
        assert!(!j.multi_recheck(11_000 * MS, Some(&zero())));
        assert!(!j.multi_recheck_due(12_000 * MS));
        assert!(j.multi_recheck_due(21_001 * MS));
        assert!(j.multi_recheck(21_001 * MS, Some(&m(33, 10, 33, 33))));
        assert_eq!(j.multi(), MultiTrust::Verified);
    }

    // Defect 3: the early form writes four bytes; read as a u32, aic_util packs them.
    #[test]
    fn prerelease_name_answering_the_4_byte_struct_is_abandoned() {
        let packed = u32::from_le_bytes([40, 20, 40, 40]);
        let mut four = m(packed, 0, 0, 0);
        four.symbol = MultiSymbol::PreRelease;
        let mut j = judge();
        assert_eq!(
            j.multi_answer(0, &four),
            MultiStep::Abandon(Unreal::Layout { value: packed })
        );
        // Never tried again: a library's layout does not change.
        assert!(!j.multi_recheck_due(u64::MAX));
        // The 48-byte form under the pre-release name is judged like the released name.
        let mut ok = m(40, 20, 40, 40);
        ok.symbol = MultiSymbol::PreRelease;
        assert_eq!(judge().multi_answer(0, &ok), MultiStep::Reading(40));
        let mut zeros = zero();
        zeros.symbol = MultiSymbol::PreRelease;
        assert_eq!(judge().multi_answer(0, &zeros), MultiStep::Ask);
        // The released name's figure above 100 is a bad reading, not a layout.
        assert_eq!(
            judge().multi_answer(0, &m(150, 0, 0, 0)),
            MultiStep::Invalid(codes::BAD_VALUE)
        );
    }

    // In the 4-byte form the three trailing u32 fields are never written: an accepted figure
    // (every field <= 100) is exactly the aic byte.
    #[test]
    fn every_figure_accepted_from_the_4_byte_form_is_its_aic_byte() {
        for bytes in [
            [0u8, 0, 0, 0],
            [37, 0, 0, 0],
            [0, 1, 0, 0],
            [100, 0, 0, 1],
            [5, 2, 9, 9],
        ] {
            let mut four = m(u32::from_le_bytes(bytes), 0, 0, 0);
            four.symbol = MultiSymbol::PreRelease;
            match judge().multi_answer(0, &four) {
                MultiStep::Reading(v) => assert_eq!(v, bytes[0], "{bytes:?}"),
                MultiStep::Ask => assert_eq!(bytes, [0; 4]),
                MultiStep::Abandon(_) => assert!(bytes[1..] != [0, 0, 0] || bytes[0] > 100),
                MultiStep::Invalid(c) => panic!("{bytes:?}: {c}"),
            }
        }
    }

    // Defect 4: the driver turns a type-14 figure above 100 into 0 and answers OK.
    #[test]
    fn type14_zero_while_npu_smi_reads_busy_is_suspect() {
        let j = judge();
        let suspect = SingleStep::Invalid(codes::SUSPECT);
        assert_eq!(j.single_answer(0, Opinion::Row(45)), suspect);
        assert_eq!(j.single_answer(0, Opinion::Pending), suspect);
        assert_eq!(j.single_answer(0, Opinion::Row(0)), SingleStep::Reading(0));
        assert_eq!(j.single_answer(0, Opinion::None), SingleStep::Reading(0));
        assert_eq!(
            j.single_answer(30, Opinion::Row(45)),
            SingleStep::Reading(30)
        );
        assert_eq!(
            j.single_answer(30, Opinion::Pending),
            SingleStep::Reading(30)
        );
        assert_eq!(
            j.single_answer(101, Opinion::None),
            SingleStep::Invalid(codes::BAD_VALUE)
        );
        let mut c = NpuSmiCheck::default();
        assert!(!c.row(45, Some(0)));
        assert!(!c.row(45, Some(0)));
        assert!(
            !c.row(45, None),
            "no type-14 reading: no verdict either way"
        );
        assert!(c.row(45, Some(0)));
        let mut c = NpuSmiCheck::default();
        assert!(!c.row(45, Some(0)));
        assert!(!c.row(45, Some(30)), "agreement resets");
        assert!(!c.row(45, Some(0)));
        assert!(!c.row(0, Some(0)));
    }

    #[test]
    fn type14_zero_against_a_busy_verified_multi_call_is_learnt_unreliable() {
        let mut j = CubeJudge::new(Duration::from_secs(10));
        assert_eq!(
            j.multi_answer(0, &m(50, 20, 50, 50)),
            MultiStep::Reading(50)
        );
        let mut t = 10_000;
        for _ in 0..21 {
            assert_eq!(j.multi_answer(t * MS, &m(50, 20, 50, 50)), MultiStep::Ask);
            assert_eq!(
                j.pair(t * MS, &m(50, 20, 50, 50), Some((UtilType::AiCube, 0))),
                MultiStep::Reading(50)
            );
            t += 50;
        }
        assert!(j.type14_zero_unreliable());
        // Its zeros no longer vouch for anything: zeros are checked against AI Core, and a
        // device reading type 14 gets its zeros marked suspect.
        assert_eq!(j.corroborator(), Some(UtilType::AiCore));
        assert_eq!(
            j.single_answer(0, Opinion::None),
            SingleStep::Invalid(codes::SUSPECT)
        );
    }
}
