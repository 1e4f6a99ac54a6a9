//! What a fake NPU reads over time: a fixed value, a square wave, a ramp, a trace file or a
//! file the test writes, and how a programme in the scenario file becomes one.

use super::MultiUtilMode;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// What one reading of a device's AI Cube usage returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// A percentage (values above 100 are passed through so the agent's check can be tested).
    Value(u32),
    /// No figure: `NA` in `npu-smi`, a transient -8005 from DCMI.
    Na,
    /// A DCMI return code (`npu-smi` prints `NA`).
    Error(i32),
    /// The DCMI read blocks (for as long as the programme says so; `npu-smi` prints `NA`).
    Hang,
}

/// Square-wave parameters.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Square {
    pub high: u32,
    pub low: u32,
    pub width_ms: u64,
    pub period_ms: u64,
    #[serde(default)]
    pub phase_ms: u64,
}

/// Saw-tooth ramp parameters.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ramp {
    pub from: u32,
    pub to: u32,
    pub period_ms: u64,
}

/// A CSV trace of `t_ms,value` lines (value an integer or `NA`), repeated every `period_ms`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TraceSpec {
    pub file: PathBuf,
    #[serde(default)]
    pub period_ms: Option<u64>,
}

/// A per-device AI Cube programme as written in the scenario file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ProgrammeSpec {
    Constant(u32),
    Square(Square),
    Ramp(Ramp),
    Trace(TraceSpec),
    Na,
    Error(i32),
    /// Read the value from a file at every call: see [`file_reading`] (and
    /// [`Programme::file_hbm_used_mb`]).
    File(PathBuf),
}

/// A programme ready to evaluate (traces loaded).
#[derive(Debug, Clone, PartialEq)]
pub enum Programme {
    Constant(u32),
    Square(Square),
    Ramp(Ramp),
    Trace {
        points: Vec<(u64, Option<u32>)>,
        period_ms: u64,
    },
    Na,
    Error(i32),
    File(PathBuf),
}

impl Programme {
    /// The reading at Unix time `t_ms`.
    pub fn at(&self, t_ms: u64) -> Reading {
        match self {
            Programme::Constant(v) => Reading::Value(*v),
            Programme::Square(s) => {
                let period = s.period_ms.max(1);
                let pos = (t_ms + period - s.phase_ms % period) % period;
                Reading::Value(if pos < s.width_ms { s.high } else { s.low })
            }
            Programme::Ramp(r) => {
                let period = r.period_ms.max(1);
                let pos = (t_ms % period) as f64 / period as f64;
                let v = r.from as f64 + (r.to as f64 - r.from as f64) * pos;
                Reading::Value(v.round().max(0.0) as u32)
            }
            Programme::Trace { points, period_ms } => {
                let pos = t_ms % (*period_ms).max(1);
                let idx = points.partition_point(|(t, _)| *t <= pos);
                match idx.checked_sub(1).map(|i| points[i].1) {
                    Some(Some(v)) => Reading::Value(v),
                    _ => Reading::Na,
                }
            }
            Programme::Na => Reading::Na,
            Programme::Error(code) => Reading::Error(*code),
            Programme::File(path) => std::fs::read_to_string(path)
                .map(|t| file_reading(&t))
                .unwrap_or(Reading::Na),
        }
    }

    /// HBM in use set by a `file` programme (`hbm_used_mb=<n>` after the reading).
    pub fn file_hbm_used_mb(&self) -> Option<u64> {
        self.file_word("hbm_used_mb=").and_then(|v| v.parse().ok())
    }

    /// Health word set by a `file` programme (`health=<n>` after the reading; decimal or
    /// `0x` hex, e.g. `health=0xFFFFFFFF` for a device that no longer exists).
    pub fn file_health(&self) -> Option<u32> {
        let v = self.file_word("health=")?;
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    }

    /// Fault codes set by a `file` programme (`errors=0x80E01801,0x80C98002` after the
    /// reading; `errors=` alone: none). `None` when the word is absent or a code is not hex.
    pub fn file_error_codes(&self) -> Option<Vec<u32>> {
        let v = self.file_word("errors=")?;
        v.split(',')
            .filter(|c| !c.is_empty())
            .map(|c| {
                let hex = c
                    .strip_prefix("0x")
                    .or_else(|| c.strip_prefix("0X"))
                    .unwrap_or(c);
                u32::from_str_radix(hex, 16).ok()
            })
            .collect()
    }

    /// Multi-utilization mode set by a `file` programme (`multi_util=zeroed` after the
    /// reading; also `supported`, `unsupported`): a firmware change while running.
    pub fn file_multi_util(&self) -> Option<MultiUtilMode> {
        match self.file_word("multi_util=")?.as_str() {
            "supported" => Some(MultiUtilMode::Supported),
            "unsupported" => Some(MultiUtilMode::Unsupported),
            "zeroed" => Some(MultiUtilMode::Zeroed),
            _ => None,
        }
    }

    pub(super) fn file_word(&self, key: &str) -> Option<String> {
        let Programme::File(path) = self else {
            return None;
        };
        let text = std::fs::read_to_string(path).ok()?;
        text.split_whitespace()
            .find_map(|t| t.strip_prefix(key))
            .map(str::to_owned)
    }
}

/// The reading a `file` programme's text gives: its first word is a percentage, `NA`,
/// `error:<code>` (DCMI answers that code) or `hang` (DCMI reads block while it says so);
/// anything else reads as `NA`.
pub fn file_reading(text: &str) -> Reading {
    match text.split_whitespace().next() {
        Some("hang") => Reading::Hang,
        Some(t) => match t.strip_prefix("error:") {
            Some(code) => code.parse().map(Reading::Error).unwrap_or(Reading::Na),
            None => t.parse().map(Reading::Value).unwrap_or(Reading::Na),
        },
        None => Reading::Na,
    }
}

pub(super) fn resolve(spec: ProgrammeSpec, base: &Path) -> Result<Programme, String> {
    Ok(match spec {
        ProgrammeSpec::Constant(v) => Programme::Constant(v),
        ProgrammeSpec::Square(s) => {
            if s.period_ms == 0 {
                return Err("square period_ms must be at least 1".to_owned());
            }
            Programme::Square(s)
        }
        ProgrammeSpec::Ramp(r) => {
            if r.period_ms == 0 {
                return Err("ramp period_ms must be at least 1".to_owned());
            }
            Programme::Ramp(r)
        }
        ProgrammeSpec::Trace(t) => {
            let path = base.join(&t.file);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
            let points = parse_trace(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let last = points.last().map(|p| p.0).unwrap_or(0);
            let period_ms = t.period_ms.unwrap_or(last + 100);
            Programme::Trace { points, period_ms }
        }
        ProgrammeSpec::Na => Programme::Na,
        ProgrammeSpec::Error(code) => Programme::Error(code),
        ProgrammeSpec::File(p) => Programme::File(base.join(p)),
    })
}

/// Parses `t_ms,value` lines (blank lines and `#` comments ignored; times ascending).
pub(super) fn parse_trace(text: &str) -> Result<Vec<(u64, Option<u32>)>, String> {
    let mut points: Vec<(u64, Option<u32>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (t, v) = line
            .split_once(',')
            .ok_or_else(|| format!("line {}: expected t_ms,value", n + 1))?;
        let t: u64 = t
            .trim()
            .parse()
            .map_err(|_| format!("line {}: bad time {t:?}", n + 1))?;
        let v = match v.trim() {
            "NA" => None,
            v => Some(
                v.parse()
                    .map_err(|_| format!("line {}: bad value {v:?}", n + 1))?,
            ),
        };
        if points.last().is_some_and(|p| p.0 > t) {
            return Err(format!("line {}: times must ascend", n + 1));
        }
        points.push((t, v));
    }
    if points.is_empty() {
        return Err("trace is empty".to_owned());
    }
    Ok(points)
}
