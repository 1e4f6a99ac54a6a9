//! Parsers for `npu-smi` output: the streaming `info watch -s u` reader, `info -m`, and
//! `info -t health` (a chip's health word and fault codes).
//!
//! The watch output is read from the raw pipe into our own buffer: a header and several rows
//! can arrive in one write, the last line of a read can be partial, figures can be `NA`, the
//! 950 layout has no `ChipId(Idx)` column, and columns are split on whitespace, never on
//! offsets. No input, however malformed, makes these functions panic (see the property tests).

/// Longest line kept; anything longer is dropped and reported (bounded memory on garbage).
pub(crate) const MAX_LINE: usize = 4096;

/// An AI Cube figure from one data row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cube {
    /// A percentage in 0..=100.
    Percent(u8),
    /// `NA`: the tool has no figure.
    Na,
    /// A number above 100, or one too large to parse: never used as a reading.
    OutOfRange,
}

/// One data row of `npu-smi info watch -s u`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchRow {
    /// `NpuID(Idx)`: card id (logic id on a 950).
    pub npu: u32,
    /// `ChipId(Idx)`, absent in the 950 layout.
    pub chip: Option<u32>,
    /// The last column.
    pub cube: Cube,
}

/// What one line of watch output is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchLine {
    /// Blank line.
    Blank,
    /// The header; `cube_column` tells whether `AI Cube(%)` is present.
    Header {
        chip_column: bool,
        cube_column: bool,
    },
    /// A data row.
    Row(WatchRow),
    /// Anything else (an error message such as `error: driver not ready`).
    Text(String),
}

/// Classifies one line the way the reference does for data rows (skip `NpuID` headers, at
/// least two whitespace-separated tokens, the last token is the figure), and additionally
/// requires the first token to be an NPU id so that messages are never read as figures.
pub(crate) fn parse_watch_line(line: &str) -> WatchLine {
    let line = line.trim();
    if line.is_empty() {
        return WatchLine::Blank;
    }
    if line.starts_with("NpuID") {
        return WatchLine::Header {
            chip_column: line.contains("ChipId") || line.contains("ChipID"),
            cube_column: line.contains("AI Cube(%)"),
        };
    }
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let (Some(first), Some(last)) = (tokens.first(), tokens.last()) else {
        return WatchLine::Blank;
    };
    let Ok(npu) = first.parse::<u32>() else {
        return WatchLine::Text(line.to_owned());
    };
    if tokens.len() < 2 {
        return WatchLine::Text(line.to_owned());
    }
    let cube = match *last {
        "NA" => Cube::Na,
        t if t.bytes().all(|b| b.is_ascii_digit()) => match t.parse::<u64>() {
            Ok(v) if v <= 100 => Cube::Percent(v as u8),
            _ => Cube::OutOfRange,
        },
        _ => return WatchLine::Text(line.to_owned()),
    };
    // `-s u` rows are "npu [chip] cube". Wider rows (all metrics) start with the chip id on
    // A2/A3 and with the power figure (always with a decimal point, or NA) on a 950.
    let chip = match tokens.len() {
        2 => None,
        3 => match tokens[1].parse::<u32>() {
            Ok(c) => Some(c),
            Err(_) => return WatchLine::Text(line.to_owned()),
        },
        _ => tokens[1].parse::<u32>().ok(),
    };
    WatchLine::Row(WatchRow { npu, chip, cube })
}

/// Incremental reader of a watch child's stdout.
#[derive(Debug, Default)]
pub struct WatchParser {
    buf: Vec<u8>,
    /// Header seen without an `AI Cube(%)` column: the tool silently dropped `-s u`
    /// (chips other than 910B/910_93/950), so rows carry no cube figure.
    no_cube_column: bool,
    overlong: bool,
}

/// An event from [`WatchParser`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Row(WatchRow),
    /// A row arrived but the header had no AI Cube column; the row is not a reading.
    RowWithoutCube,
    Text(String),
    /// A line longer than [`MAX_LINE`] was dropped.
    Overlong,
}

impl WatchParser {
    /// A parser with an empty buffer.
    pub fn new() -> WatchParser {
        WatchParser::default()
    }

    /// Feeds bytes read from the pipe; calls `emit` for each complete line's event.
    pub fn push(&mut self, bytes: &[u8], mut emit: impl FnMut(WatchEvent)) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|b| *b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if self.overlong {
                self.overlong = false;
                self.buf.clear();
                emit(WatchEvent::Overlong);
                continue;
            }
            if self.buf.len() + head.len() > MAX_LINE {
                self.buf.clear();
                emit(WatchEvent::Overlong);
                continue;
            }
            self.buf.extend_from_slice(head);
            let line = std::mem::take(&mut self.buf);
            self.line(&line, &mut emit);
        }
        if self.overlong {
            return;
        }
        if self.buf.len() + rest.len() > MAX_LINE {
            self.buf.clear();
            self.overlong = true;
        } else {
            self.buf.extend_from_slice(rest);
        }
    }

    /// At end of stream: parses a trailing line that had no newline.
    pub(crate) fn finish(&mut self, mut emit: impl FnMut(WatchEvent)) {
        let line = std::mem::take(&mut self.buf);
        if self.overlong {
            self.overlong = false;
            emit(WatchEvent::Overlong);
        } else if !line.is_empty() {
            self.line(&line, &mut emit);
        }
    }

    fn line(&mut self, bytes: &[u8], emit: &mut impl FnMut(WatchEvent)) {
        let text = String::from_utf8_lossy(bytes);
        match parse_watch_line(&text) {
            WatchLine::Blank => {}
            WatchLine::Header { cube_column, .. } => self.no_cube_column = !cube_column,
            WatchLine::Row(_) if self.no_cube_column => emit(WatchEvent::RowWithoutCube),
            WatchLine::Row(r) => emit(WatchEvent::Row(r)),
            WatchLine::Text(t) => emit(WatchEvent::Text(t)),
        }
    }
}

/// One chip listed by `npu-smi info -m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedChip {
    pub npu: u32,
    /// Chip id for `-c`; `None` in the 950 layout, whose npu-smi has no `-c`.
    pub chip: Option<u32>,
    /// Logic id; on a 950 (no `Chip Logic ID` column) the NPU id is the logical id.
    pub logic_id: u32,
    pub name: String,
    /// `Chip Phy-ID`, where the layout has the column (910_93, 950); `None` elsewhere.
    pub phy_id: Option<u32>,
}

/// Why `npu-smi info -m` output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MappingError(pub String);

/// Parses `npu-smi info -m`, skipping MCU rows. Columns are found by header name.
pub fn parse_mapping(text: &str) -> Result<Vec<MappedChip>, MappingError> {
    parse_mapping_inner(text).map_err(MappingError)
}

fn parse_mapping_inner(text: &str) -> Result<Vec<MappedChip>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| "npu-smi info -m printed nothing".to_owned())?;
    let names: Vec<String> = header
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let col = |n: &str| names.iter().position(|h| h == n);
    let (Some(npu_col), Some(name_col)) = (col("NPU ID"), col("Chip Name")) else {
        return Err(format!(
            "unexpected header {}",
            crate::logging::quote(header.trim())
        ));
    };
    if name_col + 1 != names.len() {
        return Err(format!(
            "Chip Name is not the last column in {}",
            crate::logging::quote(header.trim())
        ));
    }
    let chip_col = col("Chip ID");
    let logic_col = col("Chip Logic ID");
    let phy_col = col("Chip Phy-ID");
    let mut chips = Vec::new();
    for line in lines {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() < names.len() {
            return Err(format!("short row {}", crate::logging::quote(line.trim())));
        }
        let name = tokens[name_col..].join(" ");
        if name.eq_ignore_ascii_case("mcu") {
            continue;
        }
        let num = |i: usize| {
            tokens[i].parse::<u32>().map_err(|_| {
                format!(
                    "bad number {} in {}",
                    crate::logging::quote(tokens[i]),
                    crate::logging::quote(line.trim())
                )
            })
        };
        let npu = num(npu_col)?;
        // Without a logic id column (950 layout) the NPU id is the logical id and there is
        // no chip addressing.
        let (chip, logic_id) = match logic_col {
            Some(i) if tokens[i] == "-" => continue,
            Some(i) => (Some(chip_col.map(num).transpose()?.unwrap_or(0)), num(i)?),
            None => (None, npu),
        };
        let phy_id = phy_col.map(num).transpose()?;
        chips.push(MappedChip {
            npu,
            chip,
            logic_id,
            name,
            phy_id,
        });
    }
    Ok(chips)
}

/// What `npu-smi info -t health -i <card> -c <chip>` says about one chip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChipHealth {
    /// `OK`, `Warning`, `Alarm`, `Critical`, `UNKNOWN`, or `NA` (the tool's words).
    pub health: String,
    /// The codes of `Error Code` (hex); empty for `NA`.
    pub codes: Vec<u32>,
    /// The lines of `Error Information`, one per code as printed (empty for `NA`).
    pub texts: Vec<String>,
}

/// Why `npu-smi info -t health` output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HealthError(pub String);

/// Parses `npu-smi info -t health -i <card> -c <chip>` (the driver's `npucli`
/// `print_diagnosis_info`: `\t<key padded to 30> : <value>` lines; `Health Status`, or
/// `Health` on a 950; `Error Code` as space-separated hex or `NA`; `Error Information` with
/// one text per code, the later ones on lines with an empty key). Blank lines are skipped.
pub fn parse_health(text: &str) -> Result<ChipHealth, HealthError> {
    let mut health = None;
    let mut codes = None;
    let mut texts: Vec<String> = Vec::new();
    let mut in_info = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((key, value)) = line
            .split_once(" : ")
            .or_else(|| line.trim_end().strip_suffix(" :").map(|k| (k, "")))
        else {
            return Err(HealthError(format!(
                "not a `key : value` line: {}",
                crate::logging::quote(line.trim())
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "Health Status" | "Health" => {
                in_info = false;
                health = Some(value.to_owned());
            }
            "Error Code" => {
                in_info = false;
                codes = Some(if value == "NA" {
                    Vec::new()
                } else {
                    value
                        .split_whitespace()
                        .map(|c| {
                            // The fault table's rule (a sign is no part of a code), in 32 bits.
                            let code = crate::driver::fault_levels::parse_code(c)
                                .map_err(|why| why.to_string())
                                .and_then(|v| {
                                    u32::try_from(v).map_err(|_| "wider than 32 bits".to_owned())
                                });
                            code.map_err(|why| {
                                HealthError(format!(
                                    "Error Code {} is not hex: {why}",
                                    crate::logging::quote(c)
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?
                });
            }
            "Error Information" => {
                in_info = true;
                if value != "NA" && !value.is_empty() {
                    texts.push(value.to_owned());
                }
            }
            "" if in_info => {
                if !value.is_empty() {
                    texts.push(value.to_owned());
                }
            }
            _ => in_info = false,
        }
    }
    let health = health.ok_or_else(|| HealthError("no Health Status line".to_owned()))?;
    let codes = codes.ok_or_else(|| HealthError("no Error Code line".to_owned()))?;
    Ok(ChipHealth {
        health,
        codes,
        texts,
    })
}

#[cfg(test)]
mod tests {

    // The driver's npucli format for one chip: codes in hex, texts one per code.
    #[test]
    fn health_reads_the_codes_and_their_texts() {
        let text = "\tHealth Status                  : Alarm\n\tError Code                     : 80E01801 80C98002\n\tError Information              : HBM multi-bit ECC error on access\n\n\t                               : AI Core external input error\n";
        let h = parse_health(text).unwrap();
        assert_eq!(h.health, "Alarm");
        assert_eq!(h.codes, [0x80E0_1801, 0x80C9_8002]);
        assert_eq!(
            h.texts,
            [
                "HBM multi-bit ECC error on access",
                "AI Core external input error"
            ]
        );
        let ok = parse_health("\tHealth                         : OK\n\tError Code                     : NA\n\tError Information              : NA\n").unwrap();
        assert_eq!(
            (ok.health.as_str(), ok.codes.len(), ok.texts.len()),
            ("OK", 0, 0)
        );
    }

    #[test]
    fn health_garbage_is_an_error_naming_the_line() {
        let e = parse_health("error: driver not ready\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a `key : value` line"), "{e}");
        let e = parse_health("\tHealth Status : OK\n\tError Code : 80E0180Z\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not hex"), "{e}");
        // Issue 48, N8: a signed code is not read as the code.
        let e = parse_health("\tHealth Status : OK\n\tError Code : +80E18402\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"+80E18402\" is not hex: a sign is not part of a hex code"),
            "{e}"
        );
        let e = parse_health("\tHealth Status : OK\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no Error Code line"), "{e}");
        assert!(parse_health("").is_err());
    }
    use super::*;
    use proptest::prelude::*;

    fn row(npu: u32, chip: Option<u32>, v: u8) -> WatchLine {
        WatchLine::Row(WatchRow {
            npu,
            chip,
            cube: Cube::Percent(v),
        })
    }

    // virtual-inference-reference §2.4: the reference parser's test cases.
    #[test]
    fn reference_parser_cases() {
        assert_eq!(parse_watch_line(""), WatchLine::Blank);
        for h in [
            "NpuID  ChipID  AI Core(%)",
            "NpuID(Idx)  AI Core(%)",
            "NpuID(Idx)  ChipId(Idx) AI Core(%)",
        ] {
            assert!(
                matches!(parse_watch_line(h), WatchLine::Header { .. }),
                "{h}"
            );
        }
        assert_eq!(parse_watch_line("0           0"), row(0, None, 0));
        assert_eq!(
            parse_watch_line("0           0           3"),
            row(0, Some(0), 3)
        );
        assert_eq!(parse_watch_line("0  0  37"), row(0, Some(0), 37));
    }

    // driver-reference §2.4 / virtual-inference-reference §2.6: the real layouts.
    #[test]
    fn real_layouts() {
        assert_eq!(
            parse_watch_line("NpuID(Idx)  ChipId(Idx)  AI Cube(%)"),
            WatchLine::Header {
                chip_column: true,
                cube_column: true
            }
        );
        assert_eq!(
            parse_watch_line("NpuID(Idx)   AI Cube(%)"),
            WatchLine::Header {
                chip_column: false,
                cube_column: true
            }
        );
        assert_eq!(
            parse_watch_line("2           1            87"),
            row(2, Some(1), 87)
        );
        assert_eq!(parse_watch_line("3            45"), row(3, None, 45));
        // 950 full watch row: the last column is AI Cube.
        assert_eq!(
            parse_watch_line(
                "0           290.4       51          0           0           16          3           0              0              9"
            ),
            WatchLine::Row(WatchRow {
                npu: 0,
                chip: None,
                cube: Cube::Percent(9)
            })
        );
        assert_eq!(
            parse_watch_line("0           0            NA"),
            WatchLine::Row(WatchRow {
                npu: 0,
                chip: Some(0),
                cube: Cube::Na
            })
        );
        assert_eq!(
            parse_watch_line("0           0            101"),
            WatchLine::Row(WatchRow {
                npu: 0,
                chip: Some(0),
                cube: Cube::OutOfRange
            })
        );
        assert!(matches!(
            parse_watch_line("error: driver not ready"),
            WatchLine::Text(_)
        ));
        assert!(matches!(
            parse_watch_line("This device does not support querying watch info."),
            WatchLine::Text(_)
        ));
    }

    fn collect(p: &mut WatchParser, chunks: &[&[u8]]) -> Vec<WatchEvent> {
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, |e| out.push(e));
        }
        p.finish(|e| out.push(e));
        out
    }

    #[test]
    fn header_and_rows_in_one_write() {
        let mut p = WatchParser::new();
        let ev = collect(
            &mut p,
            &[b"NpuID(Idx)  ChipId(Idx)  AI Cube(%)\n0           0            37\n0           0            38\n"],
        );
        assert_eq!(ev.len(), 2);
        assert!(matches!(
            ev[1],
            WatchEvent::Row(WatchRow {
                cube: Cube::Percent(38),
                ..
            })
        ));
    }

    #[test]
    fn partial_lines_are_joined_and_a_trailing_partial_is_parsed_at_eof() {
        let mut p = WatchParser::new();
        let ev = collect(
            &mut p,
            &[
                b"NpuID(Idx)  ChipId(Idx)  AI",
                b" Cube(%)\n0    0    4",
                b"2\n1  0  5",
            ],
        );
        assert_eq!(
            ev,
            vec![
                WatchEvent::Row(WatchRow {
                    npu: 0,
                    chip: Some(0),
                    cube: Cube::Percent(42)
                }),
                WatchEvent::Row(WatchRow {
                    npu: 1,
                    chip: Some(0),
                    cube: Cube::Percent(5)
                }),
            ]
        );
    }

    // The reference reads the chip id as the figure when the tool drops `-s u` silently.
    #[test]
    fn rows_under_a_header_without_cube_column_are_not_readings() {
        let mut p = WatchParser::new();
        let ev = collect(&mut p, &[b"NpuID(Idx)  ChipId(Idx)\n0           0\n"]);
        assert_eq!(ev, vec![WatchEvent::RowWithoutCube]);
    }

    // driver-reference §2.4: full watch output of an older HDK has no AI Cube column, so the
    // last token is Memory BW, not a cube figure; with the 950 header it is AI Cube.
    #[test]
    fn full_watch_samples_from_the_driver_reference() {
        let mut p = WatchParser::new();
        let ev = collect(
            &mut p,
            &[b"NpuID(Idx)  ChipId(Idx) Pwr(W)      Temp(C)     AI Core(%)  AI Cpu(%)   Ctrl Cpu(%) Memory(%)   Memory BW(%)\n2           0           90.1        34          0           0           2           5           0\n0           0           4.0         44          0           0           0           32          0\n"],
        );
        assert_eq!(
            ev,
            vec![WatchEvent::RowWithoutCube, WatchEvent::RowWithoutCube]
        );
        let mut p = WatchParser::new();
        let ev = collect(
            &mut p,
            &[b"NpuID(Idx)  Pwr(W)      Temp(C)     AI Core(%)  AI Cpu(%)   Ctrl Cpu(%) Memory(%)   Memory BW(%)   NPU Util(%)    AI Cube(%)\n0           290.4       51          0           0           16          3           0              0              0\n"],
        );
        assert_eq!(
            ev,
            vec![WatchEvent::Row(WatchRow {
                npu: 0,
                chip: None,
                cube: Cube::Percent(0)
            })]
        );
    }

    #[test]
    fn overlong_lines_are_dropped_with_bounded_memory() {
        let mut p = WatchParser::new();
        let junk = vec![b'x'; MAX_LINE * 3];
        let mut ev = Vec::new();
        p.push(&junk, |e| ev.push(e));
        assert!(p.buf.len() <= MAX_LINE);
        p.push(b"\n0 0 7\n", |e| ev.push(e));
        assert_eq!(ev[0], WatchEvent::Overlong);
        assert!(matches!(
            ev[1],
            WatchEvent::Row(WatchRow {
                cube: Cube::Percent(7),
                ..
            })
        ));
    }

    #[test]
    fn mapping_910b_skips_mcu() {
        let text = format!(
            "{:<30}{:<30}{:<30}Chip Name\n{:<30}{:<30}{:<30}Ascend 910B3\n{:<30}{:<30}{:<30}Mcu\n",
            "NPU ID", "Chip ID", "Chip Logic ID", 4, 0, 4, 4, 1, "-"
        );
        assert_eq!(
            parse_mapping(&text).unwrap(),
            vec![MappedChip {
                npu: 4,
                chip: Some(0),
                logic_id: 4,
                name: "Ascend 910B3".into(),
                phy_id: None,
            }]
        );
    }

    #[test]
    fn mapping_950_uses_npu_id_as_logic_id() {
        let text = format!(
            "{:<30}{:<30}{:<30}{:<30}Chip Name\n{:<30}{:<30}{:<30}{:<30}Ascend 950PR\n",
            "NPU ID", "Slot ID", "Chip ID", "Chip Phy-ID", 3, 3, 0, 3
        );
        let chips = parse_mapping(&text).unwrap();
        assert_eq!(chips[0].logic_id, 3);
        assert_eq!(chips[0].npu, 3);
        assert_eq!(chips[0].chip, None);
        assert_eq!(chips[0].phy_id, Some(3));
    }

    #[test]
    fn mapping_errors_name_the_problem() {
        assert!(parse_mapping("").unwrap_err().0.contains("printed nothing"));
        assert!(
            parse_mapping("error: driver not ready\n")
                .unwrap_err()
                .0
                .contains("unexpected header")
        );
    }

    proptest! {
        #[test]
        fn watch_parser_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let mut p = WatchParser::new();
            for c in &chunks {
                p.push(c, |_| {});
                prop_assert!(p.buf.len() <= MAX_LINE);
            }
            p.finish(|_| {});
        }

        #[test]
        fn watch_line_never_panics(s in "\\PC*") {
            let _ = parse_watch_line(&s);
        }

        #[test]
        fn rows_round_trip(npu in 0u32..64, chip in 0u32..2, v in 0u8..=100, pad in 1usize..14) {
            let line = format!("{npu}{}{chip}{}{v}", " ".repeat(pad), " ".repeat(pad));
            prop_assert_eq!(parse_watch_line(&line), row(npu, Some(chip), v));
        }

        #[test]
        fn mapping_never_panics(s in "[ A-Za-z0-9\\-\n]{0,400}") {
            let _ = parse_mapping(&s);
        }
    }
}
