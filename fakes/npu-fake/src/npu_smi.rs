//! The fake `npu-smi`: prints the real output formats from the scenario.
//!
//! Supported: `info watch -h`, `info watch [-i id] [-c chip] [-d secs] [-s letters]` (910B and
//! 910_93 layouts with `ChipId(Idx)`, 950 layout without it, `NA` for missing figures) and
//! `info` (a summary table of the chips), `info -m`, `info -t usages -i card [-c chip]` (the key-value layout, `Aicore Usage
//! Rate(%)` from the AI Cube programme: MindIE's engine server samples with it), and
//! `info -t health -i card [-c chip]` (the health word and the fault codes). A fake-driver build of the agent runs this when invoked as `npu-smi` or with
//! `info …` as its first arguments.

use crate::scenario::{Device, Model, Reading, Scenario, WatchSupport, now_ms};
use std::io::Write;
use std::time::Duration;

const HELP_HEAD: &str = "Usage: npu-smi info watch [Options...]

Options:
";
const HELP_IDS_V1: &str = "       -i %d          Card ID
       -c %d          Chip ID
";
const HELP_IDS_V2: &str = "       -i %d          NPU ID
";
const HELP_TAIL: &str =
    "       -d %d          Collection delay in seconds [1~100, default is 1 second]
       -s             One or more metrics [eg. info watch -s ptaicmb]
                      Can be any of the following:
                          p - Power Usage
                          t - Temperature
                          a - AI Core Usage
                          i - AI Cpu Usage
                          c - Control Cpu Usage
                          m - Memory Usage
                          b - Memory Bandwidth Usage
                          n - NPU Utilization
";
const HELP_CUBE: &str = "                          u - AI Cube Usage
";

/// Metric letters in the fixed column order npu-smi prints them.
const LETTERS: &str = "ptaicmbnu";

/// Runs the fake with `args` (without the program name); returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let scenario = match Scenario::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fake npu-smi: {e}");
            return 2;
        }
    };
    let out = std::io::stdout();
    let mut out = out.lock();
    if scenario.npu_smi.watch == WatchSupport::NotReady {
        let _ = writeln!(out, "error: driver not ready");
        return 1;
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["info", "watch", "-h"] | ["info", "watch", "--help"] => help(&scenario, &mut out),
        ["info", "watch", rest @ ..] => watch(&scenario, rest, &mut out),
        ["info", "-m"] => mapping(&scenario, &mut out),
        ["info"] => summary(&scenario, &mut out),
        ["info", "-t", "usages", rest @ ..] => usages(&scenario, rest, &mut out),
        ["info", "-t", "health", rest @ ..] => health(&scenario, rest, &mut out),
        _ => {
            let _ = writeln!(out, "Usage: npu-smi info <watch|-h|-m> [Options...]");
            1
        }
    }
}

fn help(s: &Scenario, out: &mut impl Write) -> i32 {
    if s.npu_smi.help_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(s.npu_smi.help_delay_ms));
    }
    let ids = if s.model == Model::Ascend950 {
        HELP_IDS_V2
    } else {
        HELP_IDS_V1
    };
    let cube = if s.npu_smi.watch == WatchSupport::Supported {
        HELP_CUBE
    } else {
        ""
    };
    let _ = write!(out, "{HELP_HEAD}{ids}{HELP_TAIL}{cube}");
    0
}

struct WatchArgs {
    card: Option<i32>,
    chip: Option<i32>,
    delay_s: u64,
    letters: String,
}

fn parse_watch(s: &Scenario, args: &[&str]) -> Result<WatchArgs, String> {
    let mut w = WatchArgs {
        card: None,
        chip: None,
        delay_s: 1,
        letters: LETTERS.to_owned(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("Parameter error: {flag} needs a value"))?;
        let num = || {
            value
                .parse::<i64>()
                .map_err(|_| format!("Parameter error: {flag} {value}"))
        };
        match *flag {
            "-i" => w.card = Some(num()? as i32),
            "-c" if s.model != Model::Ascend950 => w.chip = Some(num()? as i32),
            "-d" => {
                let d = num()?;
                if !(1..=100).contains(&d) {
                    return Err(format!("Parameter error: -d {value} is not in [1, 100]"));
                }
                w.delay_s = d as u64;
            }
            "-s" => {
                let cube_ok = s.npu_smi.watch == WatchSupport::Supported;
                if value.is_empty()
                    || value
                        .chars()
                        .any(|c| !LETTERS.contains(c) || (c == 'u' && !cube_ok))
                {
                    return Err(format!("Parameter error: -s {value}"));
                }
                w.letters = LETTERS.chars().filter(|c| value.contains(*c)).collect();
            }
            other => return Err(format!("Parameter error: unknown option {other}")),
        }
    }
    if s.npu_smi.watch != WatchSupport::Supported {
        w.letters.retain(|c| c != 'u');
    }
    Ok(w)
}

fn header(s: &Scenario, letters: &str) -> String {
    let mut h = format!("{:<12}", "NpuID(Idx)");
    if s.model != Model::Ascend950 {
        h.push_str(&format!("{:<12}", "ChipId(Idx)"));
    }
    for c in letters.chars() {
        let name = match c {
            'p' => "Pwr(W)",
            't' => "Temp(C)",
            'a' => "AI Core(%)",
            'i' => "AI Cpu(%)",
            'c' => "Ctrl Cpu(%)",
            'm' => "Memory(%)",
            'b' => "Memory BW(%)",
            'n' => "NPU Util(%)",
            _ => "AI Cube(%)",
        };
        if matches!(c, 'n' | 'u') {
            h.push(' ');
        }
        h.push_str(&format!("{name:<12}"));
    }
    h.trim_end().to_owned()
}

fn cell(r: Reading) -> String {
    match r {
        Reading::Value(v) => v.to_string(),
        Reading::Na | Reading::Error(_) | Reading::Hang => "NA".to_owned(),
    }
}

fn watch(s: &Scenario, args: &[&str], out: &mut impl Write) -> i32 {
    let w = match parse_watch(s, args) {
        Ok(w) => w,
        Err(e) => {
            let _ = writeln!(out, "{e}");
            return 1;
        }
    };
    let devices: Vec<_> = s
        .devices
        .iter()
        .filter(|d| {
            let id = if s.model == Model::Ascend950 {
                d.logic_id
            } else {
                d.card
            } as i32;
            w.card.is_none_or(|c| c == id) && w.chip.is_none_or(|c| c == d.chip as i32)
        })
        .collect();
    if devices.is_empty() {
        let _ = writeln!(out, "This device does not support querying watch info.");
        return 1;
    }
    let period = Duration::from_millis(s.npu_smi.watch_period_ms.unwrap_or(w.delay_s * 1000));
    let mut pending = header(s, &w.letters) + "\n";
    for pass in 0u64.. {
        if s.npu_smi.watch_exit_after.is_some_and(|n| pass >= n) {
            let _ = out.write_all(pending.as_bytes());
            let _ = writeln!(out, "npu-smi: device lost");
            let _ = out.flush();
            return 1;
        }
        for d in &devices {
            let cube = s.aicube_at(d, now_ms());
            let id = if s.model == Model::Ascend950 {
                d.logic_id
            } else {
                d.card
            };
            let mut row = format!("{id:<12}");
            if s.model != Model::Ascend950 {
                row.push_str(&format!("{:<12}", d.chip));
            }
            for c in w.letters.chars() {
                let v = match c {
                    'p' => "90.1".to_owned(),
                    't' => "40".to_owned(),
                    'a' | 'n' | 'u' => cell(cube),
                    'm' => (d.hbm_used_mb * 100 / d.hbm_total_mb.max(1)).to_string(),
                    _ => "0".to_owned(),
                };
                if matches!(c, 'n' | 'u') {
                    row.push(' ');
                }
                row.push_str(&format!("{v:<12}"));
            }
            let row = row.trim_end().to_owned() + "\n";
            if s.npu_smi.split_rows {
                let (a, b) = row.split_at(row.len() / 2);
                pending.push_str(a);
                if out
                    .write_all(pending.as_bytes())
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    return 0;
                }
                pending.clear();
                std::thread::sleep(Duration::from_millis(5));
                pending.push_str(b);
            } else {
                pending.push_str(&row);
            }
            // Header and the first rows of a card leave in one write, as the real tool's
            // per-card fflush does.
            if out
                .write_all(pending.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return 0;
            }
            pending.clear();
        }
        std::thread::sleep(period);
    }
    0
}

/// `-i <card> [-c <chip>]` of an `info -t` command: the card, the chip asked, and the chips
/// they name; `Err`: the line the tool prints.
fn chips_asked<'a>(
    s: &'a Scenario,
    args: &[&str],
) -> Result<(u32, Option<u32>, Vec<&'a Device>), String> {
    let (mut card, mut chip) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(v) = it.next().and_then(|v| v.parse::<u32>().ok()) else {
            return Err(format!("Parameter error: {flag} needs a number"));
        };
        match *flag {
            "-i" => card = Some(v),
            "-c" => chip = Some(v),
            other => return Err(format!("Parameter error: unknown option {other}")),
        }
    }
    let card = card.ok_or_else(|| "Parameter error: -i is required".to_owned())?;
    let chips: Vec<&Device> = s
        .devices
        .iter()
        .filter(|d| d.card == card && chip.is_none_or(|c| c == d.chip))
        .collect();
    if chips.is_empty() {
        return Err("This device does not exist.".to_owned());
    }
    Ok((card, chip, chips))
}

/// `info -t health -i <card> [-c <chip>]`, in the driver's npucli format (`\t%-30s : %s`):
/// with `-c`, the chip's `Health Status`, `Error Code` (hex, or `NA`) and `Error
/// Information` (one text per code, later ones under an empty key; the decimal code for one
/// without text); with `-i` alone, each chip's `Health` and `Chip ID`. As the real tool, a
/// chip with no codes reads `OK` whatever its health word.
fn health(s: &Scenario, args: &[&str], out: &mut impl Write) -> i32 {
    let (card, chip, chips) = match chips_asked(s, args) {
        Ok(v) => v,
        Err(msg) => {
            let _ = writeln!(out, "{msg}");
            return 1;
        }
    };
    let line = |k: &str, v: &dyn std::fmt::Display| format!("\t{k:<30} : {v}\n");
    let word = |d: &Device| {
        let codes = s.error_codes_of(d);
        match s.health_of(d) {
            _ if codes.is_empty() => "OK",
            0 => "OK",
            1 => "Warning",
            2 => "Alarm",
            3 => "Critical",
            _ => "UNKNOWN",
        }
    };
    let mut text = String::new();
    if chip.is_none() {
        text += &line("NPU ID", &card);
        text += &line("Chip Count", &chips.len());
        for d in &chips {
            text += &line("Health", &word(d));
            text += &line("Chip ID", &d.chip);
        }
    } else {
        let d = chips[0];
        let codes = s.error_codes_of(d);
        text += &line("Health Status", &word(d));
        if codes.is_empty() {
            text += &line("Error Code", &"NA");
            text += &line("Error Information", &"NA");
        } else {
            let hex: Vec<String> = codes.iter().map(|c| format!("{c:08X}")).collect();
            text += &line("Error Code", &hex.join(" "));
            for (i, c) in codes.iter().enumerate() {
                let info = crate::dcmi::fault_text(*c).map_or_else(|| c.to_string(), str::to_owned);
                text += &line(if i == 0 { "Error Information" } else { "" }, &info);
            }
        }
    }
    let _ = out.write_all(text.as_bytes());
    0
}

/// `info -t usages -i <card> [-c <chip>]`: one key-value block per chip, as the real tool
/// prints it (keys padded to one column, `Chip ID` last).
fn usages(s: &Scenario, args: &[&str], out: &mut impl Write) -> i32 {
    let (card, _, chips) = match chips_asked(s, args) {
        Ok(v) => v,
        Err(msg) => {
            let _ = writeln!(out, "{msg}");
            return 1;
        }
    };
    let line = |k: &str, v: &dyn std::fmt::Display| format!("\t{k:<31}: {v}\n");
    let mut text = line("NPU ID", &card) + &line("Chip Count", &chips.len()) + "\n";
    for d in chips {
        let core = cell(s.aicube_at(d, now_ms()));
        let hbm_rate = d.hbm_used_mb * 100 / d.hbm_total_mb.max(1);
        for (k, v) in [
            ("DDR Capacity(MB)", "0".to_owned()),
            ("DDR Usage Rate(%)", "0".to_owned()),
            ("HBM Capacity(MB)", d.hbm_total_mb.to_string()),
            ("HBM Usage Rate(%)", hbm_rate.to_string()),
            ("Aicore Usage Rate(%)", core.clone()),
            ("Aivector Usage Rate(%)", core),
            ("Aicpu Usage Rate(%)", "0".to_owned()),
            ("Ctrlcpu Usage Rate(%)", "2".to_owned()),
            ("DDR Bandwidth Usage Rate(%)", "0".to_owned()),
            ("HBM Bandwidth Usage Rate(%)", "0".to_owned()),
            ("Chip ID", d.chip.to_string()),
        ] {
            text.push_str(&line(k, &v));
        }
        text.push('\n');
    }
    let _ = out.write_all(text.as_bytes());
    0
}

/// `npu-smi info`: the summary table, in the shape of the real one (a title row, then one
/// row per chip: its NPU and chip, its name and health), with the figures the fake knows.
fn summary(s: &Scenario, out: &mut impl Write) -> i32 {
    let mut text = String::from(
        "+--------------------------------------------------------------+\n\
         | npu-smi (fake)                                               |\n\
         | NPU   Chip   Name          Health                            |\n\
         +==============================================================+\n",
    );
    for d in &s.devices {
        text.push_str(&format!(
            "| {:<5} {:<6} {:<13} {:<33} |\n",
            d.card,
            d.chip,
            s.model.chip_name(),
            "OK"
        ));
    }
    text.push_str("+--------------------------------------------------------------+\n");
    let _ = out.write_all(text.as_bytes());
    0
}

fn mapping(s: &Scenario, out: &mut impl Write) -> i32 {
    let mut text = String::new();
    let col = |t: &mut String, v: &str| t.push_str(&format!("{v:<30}"));
    match s.model {
        Model::Ascend950 => {
            for h in ["NPU ID", "Slot ID", "Chip ID", "Chip Phy-ID"] {
                col(&mut text, h);
            }
            text.push_str("Chip Name\n");
            for d in &s.devices {
                for v in [d.logic_id, d.logic_id, 0, d.phy_id] {
                    col(&mut text, &v.to_string());
                }
                text.push_str(&format!("Ascend {}\n", s.model.chip_name()));
            }
        }
        model => {
            let a3 = model == Model::Ascend910_93;
            let heads: &[&str] = if a3 {
                &["NPU ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID"]
            } else {
                &["NPU ID", "Chip ID", "Chip Logic ID"]
            };
            for h in heads {
                col(&mut text, h);
            }
            text.push_str("Chip Name\n");
            for card in 0..s.cards {
                for d in s.devices.iter().filter(|d| d.card == card) {
                    col(&mut text, &d.card.to_string());
                    col(&mut text, &d.chip.to_string());
                    col(&mut text, &d.logic_id.to_string());
                    if a3 {
                        col(&mut text, &d.phy_id.to_string());
                    }
                    text.push_str(&format!("Ascend {}\n", model.chip_name()));
                }
                col(&mut text, &card.to_string());
                col(&mut text, &model.chips_per_card().to_string());
                col(&mut text, "-");
                if a3 {
                    col(&mut text, "-");
                }
                text.push_str("Mcu\n");
            }
        }
    }
    let _ = out.write_all(text.as_bytes());
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    // `info -t usages -i card -c chip`: the key-value block MindIE's engine server parses
    // (`Aicore Usage Rate(%) : N`), one chip or all of a card's.
    #[test]
    fn usages_print_the_aicore_rate_of_the_chip_asked() {
        let s = Scenario::parse(
            "model = \"910_93\"\ncards = 1\n[[device]]\nid = 0\naicube = { constant = 42 }\n[[device]]\nid = 1\naicube = { constant = 7 }\n",
            Path::new("."),
        )
        .unwrap();
        let run = |args: &[&str]| {
            let mut out = Vec::new();
            let rc = usages(&s, args, &mut out);
            (rc, String::from_utf8(out).unwrap())
        };
        let (rc, text) = run(&["-i", "0", "-c", "1"]);
        assert_eq!(rc, 0, "{text}");
        let rate = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .filter(|(k, _)| k.trim() == "Aicore Usage Rate(%)")
                .map(|(_, v)| v.trim().to_owned())
                .collect()
        };
        assert_eq!(rate(&text), ["7"], "{text}");
        assert!(
            text.contains("\tAicore Usage Rate(%)           : 7\n"),
            "{text}"
        );
        assert_eq!(rate(&run(&["-i", "0"]).1), ["42", "7"]);
        assert_eq!(run(&["-i", "3"]).0, 1);
        assert_eq!(run(&["-c", "0"]).0, 1, "-i is required");
    }

    #[test]
    fn header_of_s_u_matches_the_format_strings() {
        let s = Scenario::parse("model = \"910B\"", Path::new(".")).unwrap();
        assert_eq!(header(&s, "u"), "NpuID(Idx)  ChipId(Idx)  AI Cube(%)");
        let s = Scenario::parse("model = \"950\"", Path::new(".")).unwrap();
        assert_eq!(header(&s, "u"), "NpuID(Idx)   AI Cube(%)");
    }
}
