//! `devices` and `sample`: look at the NPUs and the driver backends without an engine.

use super::{CliError, EXIT_USAGE};
use crate::driver::DriverConfig;
use crate::sampler::{DeviceSnapshot, Sampler, SamplerConfig};
use anyhow::Context;
use std::time::Duration;

/// Longest `sample --window`.
const MAX_WINDOW: Duration = Duration::from_secs(600);

/// `devices [--json]`.
pub(super) fn devices(driver: &DriverConfig, json: bool) -> Result<(), CliError> {
    let sampler =
        Sampler::start(driver, &SamplerConfig::default()).context("starting the sampler")?;
    if !sampler.wait_settled(Duration::from_secs(10)) {
        tracing::warn!("some devices did not settle on a backend within 10s");
    }
    let usable = sampler.require_cube_source();
    let now = sampler.shared().ring.now_ns();
    let snaps: Vec<DeviceSnapshot> = sampler.devices().iter().map(|d| d.snapshot(now)).collect();
    sampler.shutdown();
    if json {
        let devices: Vec<serde_json::Value> = snaps
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).expect("snapshot serialises");
                v["capabilities"] = serde_json::json!({
                    "aicube": s.source.backend().reads_cube(),
                    "hbm": s.hbm_total_mb.is_some(),
                    "health": s.health.is_some(),
                });
                v
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return usable.map_err(CliError::from);
    }
    let rows: Vec<Vec<String>> = snaps.iter().map(device_row).collect();
    print!("{}", table(&DEVICE_COLUMNS, &rows));
    // Exit 3 when the NPUs were found but none has a source of AI Cube figures.
    usable.map_err(CliError::from)
}

/// `devices`' columns.
const DEVICE_COLUMNS: [Column; 9] = [
    Column::left("ID"),
    Column::left("CARD"),
    Column::left("CHIP"),
    Column::left("NAME"),
    Column::left("BACKEND"),
    Column::left("AI CUBE"),
    Column::left("HBM MB"),
    Column::left("HEALTH"),
    Column::left("WHY"),
];

/// One NPU's line of `devices`.
fn device_row(s: &DeviceSnapshot) -> Vec<String> {
    let chip = s.chip.map_or_else(|| "-".to_owned(), |c| c.to_string());
    let hbm = match (s.hbm_used_mb, s.hbm_total_mb) {
        (Some(u), Some(t)) => format!("{u}/{t}"),
        _ => "n/a".to_owned(),
    };
    let health = match s.health {
        _ if s.device_gone => "device gone".to_owned(),
        Some(0) => "ok".to_owned(),
        Some(1) => "minor alarm".to_owned(),
        Some(2) => "major alarm".to_owned(),
        Some(3) => "critical alarm".to_owned(),
        Some(h) => h.to_string(),
        None => "n/a".to_owned(),
    };
    let name = if s.name.is_empty() { "-" } else { &s.name };
    vec![
        s.id.to_string(),
        s.card.to_string(),
        chip,
        name.to_owned(),
        s.backend.to_string(),
        s.method.to_string(),
        hbm,
        health,
        s.source_note.to_string(),
    ]
}

/// `sample [--window] [--period] [--devices] [--json]`.
pub(super) fn sample(
    driver: &DriverConfig,
    window: Duration,
    period: Duration,
    ids: Option<Vec<u32>>,
    json: bool,
) -> Result<(), CliError> {
    if window.is_zero() || window > MAX_WINDOW {
        return Err(CliError {
            code: EXIT_USAGE,
            error: anyhow::anyhow!("--window {window:?} is outside 1ns..=10m"),
        });
    }
    let cfg = SamplerConfig {
        period,
        retention: window.max(Duration::from_secs(1)) + Duration::from_secs(1),
        devices: ids,
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(driver, &cfg).context("starting the sampler")?;
    sampler.wait_settled(Duration::from_secs(10));
    sampler.require_cube_source()?;
    std::thread::sleep(window);
    let ids: Vec<u32> = sampler.devices().iter().map(|d| d.info.id).collect();
    let report = sampler.window(&ids, window)?;
    let backends: Vec<crate::driver::Backend> = sampler
        .devices()
        .iter()
        .map(|d| d.source().backend())
        .collect();
    sampler.shutdown();
    if report.truncated {
        tracing::warn!("the ring did not hold the whole window; figures cover its newest part");
    }
    if json {
        let devices: Vec<serde_json::Value> = ids
            .iter()
            .zip(&report.devices)
            .zip(&backends)
            .map(|((id, st), backend)| {
                serde_json::json!({
                    "id": id,
                    "backend": backend,
                    "peak": st.peak,
                    "mean": st.mean.map(|m| (m * 100.0).round() / 100.0),
                    "valid": st.valid,
                    "invalid": st.invalid,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "devices": devices }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = ids
        .iter()
        .zip(&report.devices)
        .zip(&backends)
        .map(|((id, st), backend)| {
            let peak = st.peak.map_or_else(|| "n/a".to_owned(), |p| p.to_string());
            let mean = st
                .mean
                .map_or_else(|| "n/a".to_owned(), |m| format!("{m:.1}"));
            vec![
                id.to_string(),
                backend.to_string(),
                peak,
                mean,
                st.valid.to_string(),
                st.invalid.to_string(),
            ]
        })
        .collect();
    print!("{}", table(&SAMPLE_COLUMNS, &rows));
    Ok(())
}

/// `sample`'s columns: the figures right-aligned.
const SAMPLE_COLUMNS: [Column; 6] = [
    Column::left("ID"),
    Column::left("BACKEND"),
    Column::right("PEAK"),
    Column::right("MEAN"),
    Column::right("VALID"),
    Column::right("INVALID"),
];

/// A column of a text table: its title, and whether its cells are right-aligned (figures).
#[derive(Debug, Clone, Copy)]
struct Column {
    title: &'static str,
    right: bool,
}

impl Column {
    const fn left(title: &'static str) -> Column {
        Column {
            title,
            right: false,
        }
    }

    const fn right(title: &'static str) -> Column {
        Column { title, right: true }
    }
}

/// The title line and `rows` as text, each column as wide as its widest cell and two spaces
/// apart, so the columns line up whatever the names, the number of NPUs or the missing
/// values. (`format!`'s width is no help here: a type whose `Display` writes without
/// `Formatter::pad` ignores it, as the backend's did.) No trailing spaces.
fn table(columns: &[Column], rows: &[Vec<String>]) -> String {
    let width = |i: usize| {
        rows.iter()
            .filter_map(|r| r.get(i))
            .chain(std::iter::once(&columns[i].title.to_owned()))
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..columns.len()).map(width).collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (c, cell)) in columns.iter().zip(cells).enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if c.right {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(columns.iter().map(|c| c.title).collect());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each column starts in the title line (its title's first character), and where
    /// a right-aligned one ends.
    fn edges(columns: &[Column], title: &str) -> Vec<(usize, usize)> {
        let mut from = 0;
        columns
            .iter()
            .map(|c| {
                let at = from + title[from..].find(c.title).unwrap();
                from = at + c.title.len();
                (at, from)
            })
            .collect()
    }

    /// Asserts that every cell of every line sits in its column.
    fn assert_aligned(columns: &[Column], rows: &[Vec<String>]) {
        let text = table(columns, rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), rows.len() + 1, "{text}");
        let edges = edges(columns, lines[0]);
        for (line, row) in lines[1..].iter().zip(rows) {
            assert_eq!(line.trim_end(), *line, "no trailing spaces: {line:?}");
            for ((c, (start, end)), cell) in columns.iter().zip(&edges).zip(row) {
                if cell.is_empty() {
                    continue;
                }
                if c.right {
                    // Right-aligned: the cell ends where its title ends.
                    assert_eq!(
                        &line[end - cell.len()..*end],
                        cell.as_str(),
                        "{}: {line:?}\n{text}",
                        c.title
                    );
                } else {
                    assert!(
                        line[*start..].starts_with(cell.as_str()),
                        "{}: {cell:?} not at {start}: {line:?}\n{text}",
                        c.title
                    );
                }
            }
        }
    }

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| (*c).to_owned()).collect()
    }

    // Issue 48: `devices` and `sample` lined up only while every cell fit its fixed width,
    // and not at all for the backend (its `Display` ignored the width): each column is now
    // as wide as its widest cell, whatever the names, the number of NPUs, the missing values.
    #[test]
    fn columns_line_up_whatever_the_widths() {
        let long = "a-very-long-npu-name-from-some-future-driver";
        let devices: Vec<Vec<String>> = vec![
            row(&[
                "0",
                "0",
                "0",
                "910B3",
                "dcmi",
                "multi-utilization aic_util",
                "3072/65536",
                "ok",
                "why",
            ]),
            row(&[
                "127",
                "63",
                "-",
                long,
                "npu-smi",
                "npu-smi watch",
                "n/a",
                "device gone",
                "",
            ]),
            row(&["12", "6", "1", "-", "none", "-", "n/a", "n/a", "no source"]),
        ];
        assert_aligned(&DEVICE_COLUMNS, &devices);
        let many: Vec<Vec<String>> = (0..128)
            .map(|i| {
                row(&[
                    &i.to_string(),
                    "dcmi",
                    if i % 3 == 0 { "n/a" } else { "100" },
                    "12.5",
                    &(i * 1000).to_string(),
                    "0",
                ])
            })
            .collect();
        assert_aligned(&SAMPLE_COLUMNS, &many);
        let wide = vec![row(&[
            "1234567",
            "npu-smi-fallback",
            "n/a",
            "n/a",
            "123456789012",
            "7",
        ])];
        assert_aligned(&SAMPLE_COLUMNS, &wide);
    }

    #[test]
    fn a_table_is_its_titles_and_cells_two_spaces_apart() {
        let t = table(
            &SAMPLE_COLUMNS,
            &[row(&["0", "dcmi", "85", "29.0", "20", "0"])],
        );
        assert_eq!(
            t,
            "ID  BACKEND  PEAK  MEAN  VALID  INVALID\n0   dcmi       85  29.0     20        0\n"
        );
    }
}
