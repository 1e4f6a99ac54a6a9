//! `compare.svg`: each policy as a point, false-kill rate across and recall up, with its 95 %
//! interval as a bar in each direction; better is up and to the left. Plain SVG text in the
//! style of the runner's timeline charts (`crate::svg`).

use super::PolicyRow;
use std::fmt::Write;

const W: f64 = 640.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Colours of the policies, in turn.
const COLOURS: [&str; 8] = [
    "#e53935", "#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41", "#546e7a",
];

/// The plot's scales: the false-kill axis spans 0 to `x_max`, recall 0 to 1.
struct Frame {
    x_max: f64,
}

impl Frame {
    fn x(&self, v: f64) -> f64 {
        LEFT + v.clamp(0.0, self.x_max) / self.x_max * (W - LEFT - RIGHT)
    }
    fn y(&self, v: f64) -> f64 {
        TOP + (1.0 - v.clamp(0.0, 1.0)) * (H - TOP - BOTTOM)
    }
}

/// The chart of the table's rows (a row without benign or fault runs is left out).
pub(super) fn chart(rows: &[PolicyRow]) -> String {
    // Round the widest false-kill interval up to the next 10 %, at least 10 %.
    let widest = rows
        .iter()
        .filter_map(|r| r.false_kills.map(|f| f.high))
        .fold(0.1f64, f64::max);
    let f = Frame {
        x_max: ((widest * 10.0).ceil() / 10.0).min(1.0),
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="13" font-weight="bold">False kills (benign runs) vs recall (fault runs), 95 % intervals</text>"#
    );
    axes(&mut s, &f);
    for (i, r) in rows.iter().enumerate() {
        point(&mut s, &f, r, COLOURS[i % COLOURS.len()], i);
    }
    s.push_str("</svg>\n");
    s
}

/// The frame, the grid and the axis labels.
fn axes(s: &mut String, f: &Frame) {
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#555"/>"##,
        W - LEFT - RIGHT,
        H - TOP - BOTTOM
    );
    for i in 0..=5 {
        let v = f64::from(i) / 5.0;
        let (x, y) = (f.x(v * f.x_max), f.y(v));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{:.0} %</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            v * f.x_max * 100.0
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0} %</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            v * 100.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">false kills, share of benign runs</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">faults detected (recall)</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0
    );
}

/// One policy: its point, its two interval bars, its name in the legend.
fn point(s: &mut String, f: &Frame, r: &PolicyRow, colour: &str, i: usize) {
    let (Some(fk), Some(rc)) = (r.false_kills, r.detected) else {
        return;
    };
    let (x, y) = (f.x(fk.rate), f.y(rc.rate));
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="2"/>"#,
        f.x(fk.low),
        f.x(fk.high)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/>"#,
        f.y(rc.low),
        f.y(rc.high)
    );
    let _ = writeln!(
        s,
        r#"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="{colour}"/>"#
    );
    let ly = TOP + 10.0 + 18.0 * i as f64;
    let _ = writeln!(
        s,
        r#"<circle cx="{:.1}" cy="{:.1}" r="5" fill="{colour}"/><text x="{:.1}" y="{:.1}">{} ({}/{}, {}/{})</text>"#,
        W - RIGHT + 14.0,
        ly - 4.0,
        W - RIGHT + 24.0,
        ly,
        r.policy.as_str(),
        fk.k,
        fk.n,
        rc.k,
        rc.n
    );
}
