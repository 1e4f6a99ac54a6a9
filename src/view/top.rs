//! What `npu-health-agent top` draws ([`crate::cli::top`] reads the stream and runs the
//! terminal): the frames of `GET /events` kept as a [`Model`], and the model drawn into a
//! ratatui buffer at the terminal's width. Per engine the verdict, level, score, readiness,
//! liveness, last probe and why; per NPU a sparkline of AI Cube (each column the highest
//! sample of its slice, so a 100 ms burst shows). Every line fits the width: long ones wrap
//! rather than being cut. When the agent is out of reach the view says since when and greys
//! the last figures, which stay on screen.

use anyhow::Context;
use npu_health_wire::{EngineLine, EnginesFrame, Hello, Npu, Samples};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline, Widget};
use std::collections::VecDeque;

/// Why and since when the agent is out of reach.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lost {
    /// When the last data came in (when the first try failed, without any), ms since the
    /// epoch: what is on screen is as of then.
    pub since_unix_ms: u64,
    /// The last failure, in words.
    pub why: String,
}

/// What the view holds: the last frames and each NPU's recent samples.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub hello: Option<Hello>,
    pub engines: Option<EnginesFrame>,
    /// Per NPU (ring index): `(ring ms, value)`, oldest first.
    pub samples: Vec<VecDeque<(f64, Option<u8>)>>,
    pub now_ms: f64,
    /// Seconds kept and drawn.
    pub seconds: u32,
    pub source: String,
    /// The agent is out of reach (`None`: live).
    pub lost: Option<Lost>,
    /// When data last came in, ms since the epoch.
    pub heard_unix_ms: Option<u64>,
    /// The wall clock at the draw, ms since the epoch (how long ago the agent was lost).
    pub clock_unix_ms: u64,
    /// Between two tries to reach a lost agent, as the view tells it.
    pub retry_s: u64,
}

impl Model {
    /// An empty model drawing `seconds` of samples.
    pub(crate) fn new(source: String, seconds: u32) -> Model {
        Model {
            seconds: seconds.clamp(1, 60),
            source,
            retry_s: 2,
            ..Model::default()
        }
    }

    /// Applies one server-sent event; an unknown event or bad JSON is an error naming it. A
    /// `hello` (a stream that begins) makes the view live again.
    pub(crate) fn apply(&mut self, event: &str, data: &str) -> anyhow::Result<()> {
        match event {
            "hello" => {
                let h: Hello = serde_json::from_str(data).context("a bad hello frame")?;
                self.samples = vec![VecDeque::new(); h.npus.len()];
                self.hello = Some(h);
                self.lost = None;
            }
            "samples" => {
                let s: Samples = serde_json::from_str(data).context("a bad samples frame")?;
                self.now_ms = s.now_ms;
                let keep_from = s.now_ms - f64::from(self.seconds) * 1e3;
                for n in s.npus {
                    let Some(q) = self.samples.get_mut(usize::from(n.i)) else {
                        continue;
                    };
                    q.extend(n.t.into_iter().zip(n.v));
                    while q.front().is_some_and(|(t, _)| *t < keep_from) {
                        q.pop_front();
                    }
                }
            }
            "engines" => {
                self.engines = Some(serde_json::from_str(data).context("a bad engines frame")?);
            }
            _ => {}
        }
        Ok(())
    }

    /// Data came in at `unix_ms`.
    pub(crate) fn heard(&mut self, unix_ms: u64) {
        self.heard_unix_ms = Some(unix_ms);
    }

    /// The agent is out of reach, `why`, seen at `unix_ms`: since the last data, or since
    /// now without any. A later failure keeps the first time and tells its own reason.
    pub(crate) fn lose(&mut self, why: String, unix_ms: u64) {
        let since_unix_ms = self
            .lost
            .as_ref()
            .map(|l| l.since_unix_ms)
            .or(self.heard_unix_ms)
            .unwrap_or(unix_ms);
        self.lost = Some(Lost { since_unix_ms, why });
    }

    /// Whether every kind of frame arrived once (what `--once` waits for).
    pub(crate) fn complete(&self) -> bool {
        self.hello.is_some() && self.engines.is_some() && self.now_ms > 0.0
    }

    /// The sparkline of NPU `i`, `width` columns over the last `seconds`: each column the
    /// highest valid sample of its slice (`None`: no valid sample in it).
    pub(crate) fn columns(&self, i: usize, width: usize) -> Vec<Option<u64>> {
        let mut cols = vec![None; width];
        let Some(q) = self.samples.get(i) else {
            return cols;
        };
        let span = f64::from(self.seconds) * 1e3;
        let start = self.now_ms - span;
        for &(t, v) in q {
            let Some(v) = v else { continue };
            let c = ((t - start) / span * width as f64).floor();
            if c < 0.0 || c >= width as f64 {
                continue;
            }
            let slot = &mut cols[c as usize];
            *slot = Some(slot.map_or(u64::from(v), |m: u64| m.max(u64::from(v))));
        }
        cols
    }

    /// Draws the whole view into `buf`: the title, the engines, the NPUs.
    pub(crate) fn render(&self, area: Rect, buf: &mut Buffer) {
        let [head, eng, npu_area] =
            Layout::vertical(self.rows(area.width).map(Constraint::Length)).areas(area);
        Paragraph::new(self.title_lines(area.width)).render(head, buf);
        self.render_engines(eng, buf);
        self.render_npus(npu_area, buf);
    }

    /// The title (where from, the node, the version, the sampling period) and, while the
    /// agent is out of reach, since when and why; wrapped to `width`.
    fn title_lines(&self, width: u16) -> Vec<Line<'static>> {
        let title = match &self.hello {
            Some(h) => format!(
                "npu-health-agent top · {} · {} · v{} · sampling every {} ms · q quits",
                node(h),
                self.source,
                h.version,
                h.period_ms
            ),
            None => format!("npu-health-agent top · {} · connecting…", self.source),
        };
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let mut lines = styled(wrap(&title, width), bold);
        if let Some(l) = &self.lost {
            let ago = self.clock_unix_ms.saturating_sub(l.since_unix_ms) / 1000;
            let text = format!(
                "AGENT UNREACHABLE since {} ({ago} s ago): {}. The figures below are as of then, not live; retrying every {} s.",
                clock_utc(l.since_unix_ms),
                l.why,
                self.retry_s
            );
            let red = Style::new()
                .fg(Color::White)
                .bg(Color::Red)
                .add_modifier(Modifier::BOLD);
            lines.extend(styled(wrap(&text, width), red));
        }
        lines
    }

    /// A box's border and title: grey, and saying as of when, while the agent is out of
    /// reach.
    fn frame(&self, title: &str) -> Block<'static> {
        match &self.lost {
            None => Block::bordered().title(format!(" {title} ")),
            Some(l) => Block::bordered()
                .title(format!(
                    " {title} · stale, as of {} ",
                    clock_utc(l.since_unix_ms)
                ))
                .border_style(Style::new().fg(Color::DarkGray)),
        }
    }

    /// The engines box: a header, then each engine's lines.
    fn render_engines(&self, area: Rect, buf: &mut Buffer) {
        let inner = usize::from(area.width.saturating_sub(2));
        let mut lines = header_lines(inner);
        for e in self.engine_list() {
            lines.extend(engine_lines(e, inner, self.lost.is_some()));
        }
        let p = Paragraph::new(lines).block(self.frame("engines"));
        match self.lost {
            None => p,
            Some(_) => p.style(Style::new().fg(Color::DarkGray)),
        }
        .render(area, buf);
    }

    fn engine_list(&self) -> &[EngineLine] {
        self.engines
            .as_ref()
            .map(|e| e.engines.as_slice())
            .unwrap_or_default()
    }

    /// The NPU box: per NPU a label and a sparkline of AI Cube, as many as fit.
    fn render_npus(&self, area: Rect, buf: &mut Buffer) {
        let block = self.frame(&format!("AI Cube, last {} s", self.seconds));
        let npu_inner = block.inner(area);
        block.render(area, buf);
        let Some(h) = &self.hello else { return };
        for (k, n) in h.npus.iter().enumerate() {
            let y = npu_inner.y + (k as u16) * 2;
            if y >= npu_inner.bottom() {
                break;
            }
            let row = Rect::new(
                npu_inner.x,
                y,
                npu_inner.width,
                2.min(npu_inner.bottom() - y),
            );
            self.render_npu(n, row, buf);
        }
    }

    /// One NPU's row: now (the last figure, while out of reach), peak and the backend's
    /// flags, then its sparkline.
    fn render_npu(&self, n: &Npu, row: Rect, buf: &mut Buffer) {
        let label_w = 26u16;
        let [label, spark] =
            Layout::horizontal([Constraint::Length(label_w), Constraint::Min(10)]).areas(row);
        let last = self
            .samples
            .get(usize::from(n.index))
            .and_then(|q| q.iter().rev().find_map(|(_, v)| *v));
        let cols = self.columns(usize::from(n.index), usize::from(spark.width));
        let peak = cols.iter().flatten().max().copied();
        let state = self
            .engines
            .as_ref()
            .and_then(|e| e.npus.iter().find(|s| s.i == n.index));
        let flags = state.map_or(String::new(), |s| {
            format!(
                "{}{}{}",
                s.backend,
                if s.stale { " STALE" } else { "" },
                if s.hung { " HUNG" } else { "" }
            )
        });
        let (word, fg) = match self.lost {
            None => ("now", Color::Cyan),
            Some(_) => ("last", Color::DarkGray),
        };
        let figure = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        Paragraph::new(vec![
            Line::from(format!(
                "NPU {:<3} {word:<4}{:>3}  peak {:>3}",
                n.id,
                figure(last.map(u64::from)),
                figure(peak)
            )),
            Line::from(format!("  {flags}")).style(Style::new().add_modifier(Modifier::DIM)),
        ])
        .render(label, buf);
        Sparkline::default()
            .data(cols)
            .max(100)
            .style(Style::new().fg(fg))
            .render(spark, buf);
    }

    /// Rows at `width` of the title, the engines box (borders, header, each engine's lines)
    /// and the NPU box (borders, two lines per NPU).
    fn rows(&self, width: u16) -> [u16; 3] {
        let inner = usize::from(width.saturating_sub(2));
        let engines: usize = self
            .engine_list()
            .iter()
            .map(|e| engine_lines(e, inner, false).len())
            .sum::<usize>()
            + header_lines(inner).len();
        let n = self.hello.as_ref().map_or(0, |h| h.npus.len());
        let rows = |r: usize| u16::try_from(r).unwrap_or(u16::MAX);
        [
            rows(self.title_lines(width).len()),
            rows(2 + engines),
            rows(2 + n * 2),
        ]
    }

    /// Rows the view needs at `width`.
    pub(crate) fn height(&self, width: u16) -> u16 {
        self.rows(width).iter().fold(0, |a, r| a.saturating_add(*r))
    }
}

/// The node's name as the title shows it (an agent from before it was sent: none).
fn node(h: &Hello) -> &str {
    if h.node.is_empty() {
        "node not named"
    } else {
        &h.node
    }
}

/// `16:07:12 UTC` (the agent's log is in UTC too).
pub(crate) fn clock_utc(unix_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    let stamp = humantime::format_rfc3339_seconds(t).to_string();
    // `2026-12-06T16:07:12Z`: the time of day.
    format!("{} UTC", stamp.get(11..19).unwrap_or(&stamp))
}

/// `text` cut into lines of at most `width` columns, at spaces where it can be (a word
/// longer than a line is cut where the line ends).
pub(crate) fn wrap(text: &str, width: u16) -> Vec<String> {
    let width = usize::from(width.max(1));
    let cols = |s: &str| Line::raw(s.to_owned()).width();
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let sep = usize::from(!line.is_empty());
        if !line.is_empty() && cols(&line) + sep + cols(word) > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        for ch in word.chars() {
            if cols(&line) + cols(ch.encode_utf8(&mut [0; 4])) > width {
                lines.push(std::mem::take(&mut line));
            }
            line.push(ch);
        }
    }
    lines.push(line);
    lines
}

fn styled(lines: Vec<String>, style: Style) -> Vec<Line<'static>> {
    lines
        .into_iter()
        .map(|l| Line::from(l).style(style))
        .collect()
}

/// The engine table's columns: each cell padded to its column, with the space after it.
fn cells(
    name: &str,
    verdict: &str,
    level: &str,
    score: &str,
    ready: &str,
    live: &str,
) -> [String; 6] {
    [
        format!("{name:<14} "),
        format!("{verdict:<9} "),
        format!("{level:<9} "),
        format!("{score:>6}  "),
        format!("{ready:<9} "),
        format!("{live:<8} "),
    ]
}

/// `cells` in lines of at most `width` columns, each cell whole, a line after the first
/// indented by two spaces. The header and every row break at the same cells, so the
/// columns stay aligned at any width.
fn lay_out(cells: Vec<Span<'static>>, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let mut line: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    for c in cells {
        // A cell fits without its separator: a column's width, whatever its content.
        let column = c.content.strip_suffix(' ').unwrap_or(&c.content).to_owned();
        let fits = used + Line::raw(column).width() <= width;
        if used > 0 && !fits {
            lines.push(Line::from(std::mem::take(&mut line)));
            line.push(Span::raw("  "));
            used = 2;
        }
        used += c.width();
        line.push(c);
    }
    lines.push(Line::from(line));
    lines
}

/// The engine table's header at `width`.
fn header_lines(width: usize) -> Vec<Line<'static>> {
    let mut cells: Vec<Span<'static>> =
        cells("ENGINE", "VERDICT", "LEVEL", "SCORE", "READY", "LIVE")
            .into_iter()
            .map(Span::raw)
            .collect();
    cells.push(Span::raw("LAST PROBE"));
    let dim = Style::new().add_modifier(Modifier::DIM);
    lay_out(cells, width)
        .into_iter()
        .map(|l| l.style(dim))
        .collect()
}

/// One engine's lines at `width`: verdict, level, score, readiness, liveness and last probe
/// (the probe on a line of its own when it does not fit after them); then what the routers
/// were told and why, wrapped. Grey while `stale`.
fn engine_lines(e: &EngineLine, width: usize, stale: bool) -> Vec<Line<'static>> {
    let verdict_color = match (stale, e.status.as_str()) {
        (true, _) => Color::DarkGray,
        (false, "normal") => Color::Green,
        (false, "abnormal") => Color::Red,
        _ => Color::Yellow,
    };
    let probe = match &e.last_probe {
        Some(p) => format!("{} in {:.1} ms", p.outcome, p.latency_ms),
        None => "none yet".to_owned(),
    };
    let score = e
        .score
        .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}"));
    let [name, verdict, rest @ ..] = cells(
        &e.name,
        e.status.as_str(),
        e.level.as_str(),
        &score,
        if e.ready { "ready" } else { "NOT READY" },
        if e.live { "live" } else { "RESTART" },
    );
    let mut row = vec![
        Span::raw(name),
        Span::styled(verdict, Style::new().fg(verdict_color)),
    ];
    row.extend(rest.into_iter().map(Span::raw));
    let mut lines = lay_out(row, width);
    let inner = u16::try_from(width.saturating_sub(2)).unwrap_or(u16::MAX);
    let indent = |l: String| format!("  {l}");
    let last = lines.last_mut().expect("one line at least");
    if last.width() + Line::raw(probe.clone()).width() <= width {
        last.push_span(Span::raw(probe));
    } else {
        let probe_lines = wrap(&format!("last probe: {probe}"), inner);
        lines.extend(probe_lines.into_iter().map(|l| Line::from(indent(l))));
    }
    let routers: Vec<String> = e
        .routers
        .iter()
        .map(|(r, state)| format!("{r} {state}"))
        .collect();
    let reason = if routers.is_empty() {
        e.reason.clone()
    } else {
        format!("{} · {}", routers.join(", "), e.reason)
    };
    let dim = Style::new().add_modifier(Modifier::DIM);
    let reason_lines = wrap(&reason, inner).into_iter().map(indent).collect();
    lines.extend(styled(reason_lines, dim));
    lines
}

/// The plain text of a buffer, one line per row, trailing spaces cut.
pub(crate) fn buffer_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = r#"{"node":"node-7","version":"0.1.0","period_ms":50.0,"frame_interval_ms":250,"history_s":60.0,"npus":[{"index":0,"id":0,"name":"910B","engines":["a"]}],"engines":["a"]}"#;

    const ENGINES: &str = r#"{"at_unix_ms": 1, "engines": [{"name": "a", "status": "abnormal", "reason": "virtual inference is abnormal", "policy": "agent", "level": "degrade", "score": 0.41, "ready": false, "ready_reason": "r", "live": false, "live_reason": "l", "failure_count": 2, "max_failure_count": 6, "failure_limit": 2, "last_probe": {"at_unix_ms": 1, "success": false, "outcome": "failed: timed out", "latency_ms": 2000.0}}], "recent": [], "npus": [{"i": 0, "backend": "dcmi", "stale": false, "hung": false, "health": 0, "hbm_used_mb": 1, "hbm_total_mb": 2}]}"#;

    /// A model with the hello, one samples frame and `engines`.
    fn model(engines: &str) -> Model {
        let mut m = Model::new("http://x".into(), 10);
        m.apply("hello", HELLO).unwrap();
        m.apply(
            "samples",
            r#"{"now_ms": 1000.0, "npus": [{"i": 0, "t": [900.0, 950.0], "v": [85, 7]}]}"#,
        )
        .unwrap();
        m.apply("engines", engines).unwrap();
        m
    }

    fn text(m: &Model, width: u16) -> String {
        let area = Rect::new(0, 0, width, m.height(width));
        let mut buf = Buffer::empty(area);
        m.render(area, &mut buf);
        buffer_text(&buf)
    }

    // A 100 ms burst among 50 ms samples shows in its column (each column is the highest
    // sample of its slice); failed readings are gaps, not zeros; old samples are dropped.
    #[test]
    fn a_short_burst_shows_in_the_sparkline() {
        let mut m = Model::new("test".into(), 10);
        m.apply("hello", HELLO).unwrap();
        let mut t = Vec::new();
        let mut v = Vec::new();
        for k in 0..400u32 {
            let ms = f64::from(k) * 50.0;
            t.push(ms);
            v.push(match k {
                300 | 301 => Some(90),
                310 => None,
                _ => Some(5),
            });
        }
        let frame = serde_json::json!({"now_ms": 19_999.0, "npus": [{"i": 0, "t": t, "v": v}]});
        m.apply("samples", &frame.to_string()).unwrap();
        assert_eq!(m.samples[0].len(), 200, "10 s of 50 ms samples kept");
        let cols = m.columns(0, 20);
        assert_eq!(
            cols.iter().filter(|c| **c == Some(90)).count(),
            1,
            "{cols:?}"
        );
        assert!(cols.iter().all(|c| c.is_some()));
        assert!(m.apply("samples", "{not json").is_err());
    }

    #[test]
    fn a_frame_renders_the_node_the_engine_and_the_npu() {
        let m = model(ENGINES);
        assert!(m.complete());
        let text = text(&m, 100);
        assert!(
            text.starts_with("npu-health-agent top · node-7 · http://x · v0.1.0"),
            "{text}"
        );
        assert!(text.contains("abnormal"), "{text}");
        assert!(
            text.contains("degrade    0.410  NOT READY RESTART"),
            "{text}"
        );
        assert!(text.contains("failed: timed out in 2000.0 ms"), "{text}");
        assert!(text.contains("NPU 0   now   7  peak  85"), "{text}");
        assert!(text.contains("dcmi"), "{text}");
        assert!(!text.contains("UNREACHABLE"), "{text}");
    }

    // Issue 48: at 80 columns top cut its lines (the title, the last probe, a long reason).
    // Every line now fits the terminal's width, and every word is on screen.
    #[test]
    fn every_line_fits_the_width_and_nothing_is_cut() {
        let reason = "virtual inference is abnormal: 2 consecutive virtual requests failed and were counted, confirmed (last: AI Cube peak 0 below 3; the NPU stayed idle and no token advanced since the first)";
        let m = model(&ENGINES.replace("virtual inference is abnormal", reason));
        for width in [60u16, 80, 100, 200] {
            let text = text(&m, width);
            for line in text.lines() {
                assert!(
                    Line::raw(line.to_owned()).width() <= usize::from(width),
                    "{width}: {line}"
                );
            }
            let words: String = text
                .lines()
                .map(|l| l.trim_matches(|c| c == '│' || c == ' '))
                .collect::<Vec<_>>()
                .join(" ");
            let row = ["a", "abnormal", "degrade", "0.410", "NOT READY", "RESTART"];
            for whole in [reason, "failed: timed out in 2000.0 ms", "q quits"]
                .into_iter()
                .chain(row)
            {
                assert!(
                    words.contains(whole),
                    "{width}: {whole:?} not whole in\n{text}"
                );
            }
        }
    }

    #[test]
    fn wrap_cuts_at_spaces_and_long_words_where_the_line_ends() {
        assert_eq!(wrap("a bb ccc", 4), ["a bb", "ccc"]);
        assert_eq!(wrap("abcdefg h", 3), ["abc", "def", "g h"]);
        assert_eq!(wrap("", 5), [""]);
        // Wide characters take two columns.
        assert_eq!(wrap("推理推理", 4), ["推理", "推理"]);
    }

    // Issue 48: top exited with a raw `error decoding response body` when the agent went
    // away. It keeps the last figures, greyed and said to be stale, and says since when the
    // agent is out of reach and why; a new stream's hello makes it live again.
    #[test]
    fn a_lost_agent_is_told_with_since_when_and_the_figures_kept() {
        let mut m = model(ENGINES);
        m.heard(1_800_000_000_000);
        m.lose(
            "the connection broke (unexpected EOF)".into(),
            1_800_000_000_500,
        );
        m.lose(
            "cannot connect (Connection refused)".into(),
            1_800_000_002_500,
        );
        m.clock_unix_ms = 1_800_000_042_000;
        let lost = m.lost.clone().unwrap();
        assert_eq!(lost.since_unix_ms, 1_800_000_000_000, "since the last data");
        let text = text(&m, 120);
        assert!(
            text.contains("AGENT UNREACHABLE since 08:00:00 UTC (42 s ago): cannot connect (Connection refused)."),
            "{text}"
        );
        assert!(
            text.contains("engines · stale, as of 08:00:00 UTC"),
            "{text}"
        );
        assert!(text.contains("NPU 0   last  7  peak  85"), "{text}");
        assert!(
            text.contains("degrade    0.410"),
            "the figures kept:\n{text}"
        );
        m.apply("hello", HELLO).unwrap();
        assert_eq!(m.lost, None);
        assert!(!text_of(&m).contains("UNREACHABLE"));
    }

    fn text_of(m: &Model) -> String {
        text(m, 100)
    }

    // Without any data (the first try failed), the view is lost since that try.
    #[test]
    fn lost_before_any_data_is_since_the_first_failure() {
        let mut m = Model::new("http://x".into(), 10);
        m.lose("cannot connect".into(), 5_000);
        m.lose("cannot connect".into(), 7_000);
        assert_eq!(m.lost.unwrap().since_unix_ms, 5_000);
    }
}
