//! An SVG chart of one experiment's timeline: the fault window shaded, the QoS score and the
//! AI Cube peak as lines, `/status` as a coloured band, guard events and the kill as markers.
//! Plain SVG text, no dependency; opens in any browser.

use super::run::{Outcome, TimelinePoint};
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 320.0;
const LEFT: f64 = 50.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const PLOT_H: f64 = 200.0;
const BAND_Y: f64 = TOP + PLOT_H + 20.0;
const BAND_H: f64 = 16.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn status_colour(s: &str) -> &'static str {
    match s {
        "normal" => "#4caf50",
        "initial" => "#9e9e9e",
        "abnormal" => "#e53935",
        _ => "#212121",
    }
}

/// The plot's time axis: the timeline's first and last times, and the time scale.
#[derive(Debug, Clone, Copy)]
struct Frame {
    t_min: f64,
    t_max: f64,
    time_scale: f64,
}

impl Frame {
    fn of(o: &Outcome, time_scale: f64) -> Frame {
        let tl = &o.timeline;
        let (t_min, t_max) = match (tl.first(), tl.last()) {
            (Some(a), Some(b)) if b.t_ms > a.t_ms => (a.t_ms as f64, b.t_ms as f64),
            _ => (0.0, 1.0),
        };
        Frame {
            t_min,
            t_max,
            time_scale,
        }
    }

    /// A time's x.
    fn x(&self, t: f64) -> f64 {
        LEFT + (t - self.t_min) / (self.t_max - self.t_min) * (W - LEFT - RIGHT)
    }

    /// A value's y (0 to 1, clamped).
    fn y(&self, v: f64) -> f64 {
        TOP + PLOT_H * (1.0 - v.clamp(0.0, 1.0))
    }

    /// A time in unscaled seconds.
    fn secs(&self, t: f64) -> f64 {
        t / self.time_scale / 1000.0
    }
}

/// The chart; times on the axis are unscaled seconds (divided by `time_scale`).
pub fn chart(o: &Outcome, time_scale: f64) -> String {
    let f = Frame::of(o, time_scale);
    let mut s = String::new();
    title(&mut s, o);
    fault_windows(&mut s, &o.timeline, f);
    axes(&mut s, f);
    lines(&mut s, &o.timeline, f);
    status_band(&mut s, &o.timeline, f);
    markers(&mut s, o, f);
    legend(&mut s);
    s.push_str("</svg>\n");
    s
}

/// The opening tag and the title: the experiment, the policy, the row, the verdict.
fn title(s: &mut String, o: &Outcome) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{} — {} — {} policy, {} — {}</text>"#,
        esc(&o.experiment),
        esc(&o.fault),
        o.policy.as_str(),
        match o.row() {
            crate::run::Row::NodeManager(c) => format!("Node Manager heartbeat {}", c.label()),
            crate::run::Row::Kubelet => "the kubelet acting".to_owned(),
            crate::run::Row::Router(r) => format!("through {}, Node Manager 1s", r.as_str()),
        },
        esc(&format!("{:?}", o.verdict).to_lowercase())
    );
}

/// The fault's window(s), shaded.
fn fault_windows(s: &mut String, tl: &[TimelinePoint], f: Frame) {
    let mut start: Option<f64> = None;
    for w in tl.windows(2) {
        match (w[0].fault_active, w[1].fault_active, start) {
            (false, true, None) => start = Some(w[1].t_ms as f64),
            (true, false, Some(a)) => {
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{PLOT_H}" fill="#ffcc80" opacity="0.5"/>"##,
                    f.x(a),
                    f.x(w[1].t_ms as f64) - f.x(a)
                );
                start = None;
            }
            _ => {}
        }
    }
    if let Some(a) = start.or_else(|| tl.first().filter(|p| p.fault_active).map(|p| p.t_ms as f64))
    {
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{PLOT_H}" fill="#ffcc80" opacity="0.5"/>"##,
            f.x(a),
            f.x(f.t_max) - f.x(a)
        );
    }
}

/// The plot's frame, the score grid and the time axis.
fn axes(s: &mut String, f: Frame) {
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{PLOT_H}" fill="none" stroke="#555"/>"##,
        W - LEFT - RIGHT
    );
    for v in [0.3, 0.5, 0.7] {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#bbb" stroke-dasharray="3,3"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            W - RIGHT,
            f.y(v),
            f.y(v),
            LEFT - 4.0,
            f.y(v) + 4.0
        );
    }
    for i in 0..=5 {
        let t = f.t_min + (f.t_max - f.t_min) * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0} s</text>"#,
            f.x(t),
            BAND_Y + BAND_H + 16.0,
            f.secs(t)
        );
    }
}

/// The AI Cube peak and the QoS score.
fn lines(s: &mut String, tl: &[TimelinePoint], f: Frame) {
    let line = |pts: Vec<(f64, f64)>, colour: &str| -> String {
        if pts.is_empty() {
            return String::new();
        }
        let d: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        format!(
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            d.join(" ")
        )
    };
    let _ = writeln!(
        s,
        "{}",
        line(
            tl.iter()
                .filter_map(|p| p.ai_cube_peak.map(|v| (f.x(p.t_ms as f64), f.y(v / 100.0))))
                .collect(),
            "#7e57c2"
        )
    );
    let _ = writeln!(
        s,
        "{}",
        line(
            tl.iter()
                .filter_map(|p| p.qos_score.map(|v| (f.x(p.t_ms as f64), f.y(v))))
                .collect(),
            "#1e88e5"
        )
    );
}

/// `/status` as a coloured band.
fn status_band(s: &mut String, tl: &[TimelinePoint], f: Frame) {
    for w in tl.windows(2) {
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{BAND_Y}" width="{:.1}" height="{BAND_H}" fill="{}" shape-rendering="crispEdges"/>"#,
            f.x(w[0].t_ms as f64),
            (f.x(w[1].t_ms as f64) - f.x(w[0].t_ms as f64)).max(0.5),
            status_colour(&w[0].status)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">/status</text>"#,
        LEFT - 4.0,
        BAND_Y + 12.0
    );
}

/// The guards' events and the kill.
fn markers(s: &mut String, o: &Outcome, f: Frame) {
    for g in &o.guard_events {
        let gx = f.x(g.t_ms as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="{TOP}" y2="{}" stroke="#f57c00" stroke-width="2"><title>{}</title></line>"##,
            TOP + PLOT_H,
            esc(&format!("{} {}: {}", g.guard, g.action, g.detail))
        );
    }
    if let Some(k) = o.killed_at_ms {
        let kx = f.x(k as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{kx:.1}" x2="{kx:.1}" y1="{TOP}" y2="{}" stroke="#b71c1c" stroke-width="2"/><text x="{kx:.1}" y="{}" fill="#b71c1c" text-anchor="middle">kill</text>"##,
            BAND_Y + BAND_H,
            TOP - 4.0
        );
    }
}

fn legend(s: &mut String) {
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="end"><tspan fill="#1e88e5">— QoS score</tspan>  <tspan fill="#7e57c2">— AI Cube peak (0–100 %)</tspan>  <tspan fill="#f57c00">| guard</tspan>  <tspan fill="#ef6c00">▮ fault</tspan></text>"##,
        W - RIGHT,
        18.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::Target;
    use crate::run::{GuardEvent, Policy, TimelinePoint, Verdict};

    fn sample(t_ms: i64, status: &str, active: bool) -> TimelinePoint {
        TimelinePoint {
            t_ms,
            status: status.into(),
            qos_score: Some(0.9),
            qos_level: Some("normal".into()),
            ai_cube_peak: Some(50.0),
            fault_active: active,
            driver_flagged: false,
            queue_depth: Some(0.0),
        }
    }

    #[test]
    fn chart_has_the_window_lines_band_and_markers() {
        let o = Outcome {
            experiment: "x<y".into(),
            target: Target::Engine,
            fault: "engine_hang".into(),
            policy: Policy::Agent,
            integration: crate::run::Integration::NodeManager,
            cadence: Some(crate::run::Cadence::PYMOTOR),
            router: None,
            node_manager: crate::run::NodeManagerKind::Emulator,
            expect: "healthy".into(),
            verdict: Verdict::FalseKill,
            detected_after_ms: None,
            abnormal_after_ms: None,
            killed_at_ms: Some(300),
            escalated_at_ms: None,
            shadow: None,
            first_injected_ms: Some(0),
            injected_ms: 200,
            guard_events: vec![GuardEvent {
                t_ms: 150,
                guard: "abort_if_health < 0.5".into(),
                action: "aborted",
                detail: "QoS score 0.4 < 0.5".into(),
            }],
            load: Default::default(),
            load_after_abnormal: None,
            router_actions: Vec::new(),
            error: None,
            ran_again_after: None,
            kubelet: None,
            kill_evidence: Vec::new(),
            agent_supervisor: crate::agent::Supervisor::Direct,
            agent_supervisor_note: None,
            agent_ops: Vec::new(),
            polls: Vec::new(),
            timeline: vec![
                sample(-100, "normal", false),
                sample(0, "normal", true),
                sample(200, "abnormal", true),
                sample(400, "abnormal", false),
            ],
            rounds: Vec::new(),
        };
        let svg = chart(&o, 0.1);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("x&lt;y"), "names are escaped");
        assert!(svg.contains("#ffcc80"), "fault window");
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("#e53935"), "abnormal band");
        assert!(svg.contains(">kill<"));
        assert!(svg.contains("QoS score 0.4 &lt; 0.5"));
        assert!(
            svg.contains(">4 s<"),
            "axis in unscaled seconds: 400 ms at 0.1"
        );
    }
}
