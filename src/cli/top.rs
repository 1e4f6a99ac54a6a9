//! `npu-health-agent top`: a terminal view of a running agent, like `npu-smi info` or nvtop.
//! It reads the admin listener's `GET /events` stream ([`crate::view`]), keeps the last
//! seconds of every NPU's samples, and draws with ratatui: per engine the verdict, level,
//! score, readiness, liveness and last probe; per NPU a sparkline of AI Cube (each column the
//! highest sample of its slice, so a 100 ms burst shows). `q`, Esc or Ctrl-C quits.
//! `--once` prints one plain-text frame and exits, for scripts.

use crate::view::{EngineLine, EnginesFrame, Hello, Npu, Samples};
use anyhow::{Context, anyhow, bail};
use clap::Args;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline, Widget};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

/// `top`'s flags.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// The agent's admin listener (`[agent] admin_listen`).
    #[arg(long, default_value = "http://127.0.0.1:9400")]
    pub admin: String,
    /// File holding the admin bearer token (`[agent] admin_token_file`).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle to verify an https:// admin listener with.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Print one plain-text frame and exit.
    #[arg(long)]
    pub once: bool,
    /// Seconds of AI Cube in each sparkline.
    #[arg(long, default_value_t = 15)]
    pub seconds: u32,
    /// Width of the `--once` frame (default: the terminal's, else 100 columns).
    #[arg(long)]
    pub width: Option<u16>,
}

/// What the view holds: the last frames and each NPU's recent samples.
#[derive(Debug, Default)]
pub struct Model {
    pub hello: Option<Hello>,
    pub engines: Option<EnginesFrame>,
    /// Per NPU (ring index): `(ring ms, value)`, oldest first.
    pub samples: Vec<VecDeque<(f64, Option<u8>)>>,
    pub now_ms: f64,
    /// Seconds kept and drawn.
    pub seconds: u32,
    pub source: String,
}

impl Model {
    /// An empty model drawing `seconds` of samples.
    pub fn new(source: String, seconds: u32) -> Model {
        Model {
            seconds: seconds.clamp(1, 60),
            source,
            ..Model::default()
        }
    }

    /// Applies one server-sent event; an unknown event or bad JSON is an error naming it.
    pub fn apply(&mut self, event: &str, data: &str) -> anyhow::Result<()> {
        match event {
            "hello" => {
                let h: Hello = serde_json::from_str(data).context("a bad hello frame")?;
                self.samples = vec![VecDeque::new(); h.npus.len()];
                self.hello = Some(h);
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

    /// Whether every kind of frame arrived once (what `--once` waits for).
    pub fn complete(&self) -> bool {
        self.hello.is_some() && self.engines.is_some() && self.now_ms > 0.0
    }

    /// The sparkline of NPU `i`, `width` columns over the last `seconds`: each column the
    /// highest valid sample of its slice (`None`: no valid sample in it).
    pub fn columns(&self, i: usize, width: usize) -> Vec<Option<u64>> {
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
    pub fn render(&self, area: Rect, buf: &mut Buffer) {
        let [head, eng, npu_area] =
            Layout::vertical(self.rows().map(Constraint::Length)).areas(area);
        self.render_title(head, buf);
        self.render_engines(eng, buf);
        self.render_npus(npu_area, buf);
    }

    /// The title line: where from, which version, the sampling period.
    fn render_title(&self, area: Rect, buf: &mut Buffer) {
        let title = match &self.hello {
            Some(h) => format!(
                "npu-health-agent top · {} · v{} · sampling every {} ms · q quits",
                self.source, h.version, h.period_ms
            ),
            None => format!("npu-health-agent top · {} · connecting…", self.source),
        };
        Paragraph::new(title)
            .style(Style::new().add_modifier(Modifier::BOLD))
            .render(area, buf);
    }

    /// The engines box: a header, then two lines per engine.
    fn render_engines(&self, area: Rect, buf: &mut Buffer) {
        let mut lines = vec![
            Line::from(format!(
                "{:<14} {:<9} {:<9} {:>6}  {:<9} {:<8} {}",
                "ENGINE", "VERDICT", "LEVEL", "SCORE", "READY", "LIVE", "LAST PROBE"
            ))
            .style(Style::new().add_modifier(Modifier::DIM)),
        ];
        let engines = self.engines.as_ref();
        for e in engines.map(|e| e.engines.as_slice()).unwrap_or_default() {
            lines.extend(engine_lines(e));
        }
        Paragraph::new(lines)
            .block(Block::bordered().title(" engines "))
            .render(area, buf);
    }

    /// The NPU box: per NPU a label and a sparkline of AI Cube, as many as fit.
    fn render_npus(&self, area: Rect, buf: &mut Buffer) {
        let inner = Block::bordered().title(format!(" AI Cube, last {} s ", self.seconds));
        let npu_inner = inner.inner(area);
        inner.render(area, buf);
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

    /// One NPU's row: now, peak and the backend's flags, then its sparkline.
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
        Paragraph::new(vec![
            Line::from(format!(
                "NPU {:<3} now {:>3}  peak {:>3}",
                n.id,
                last.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                peak.map_or_else(|| "-".to_owned(), |v| v.to_string())
            )),
            Line::from(format!("  {flags}")).style(Style::new().add_modifier(Modifier::DIM)),
        ])
        .render(label, buf);
        Sparkline::default()
            .data(cols)
            .max(100)
            .style(Style::new().fg(Color::Cyan))
            .render(spark, buf);
    }

    /// Rows of the title, the engines box (borders, header, two lines per engine) and the
    /// NPU box (borders, two lines per NPU).
    fn rows(&self) -> [u16; 3] {
        let e = self.engines.as_ref().map_or(0, |e| e.engines.len()) as u16;
        let n = self.hello.as_ref().map_or(0, |h| h.npus.len()) as u16;
        [1, 3 + e * 2, 2 + n * 2]
    }

    /// Rows the view needs.
    pub fn height(&self) -> u16 {
        self.rows().iter().sum()
    }
}

/// One engine's two lines: verdict, level, score, readiness, liveness and last probe; then
/// what the routers were told and why.
fn engine_lines(e: &EngineLine) -> [Line<'static>; 2] {
    let verdict_color = match e.status.as_str() {
        "normal" => Color::Green,
        "abnormal" => Color::Red,
        _ => Color::Yellow,
    };
    let probe = match &e.last_probe {
        Some(p) => format!("{} in {:.1} ms", p.outcome, p.latency_ms),
        None => "none yet".to_owned(),
    };
    let status = Line::from(vec![
        Span::raw(format!("{:<14} ", e.name)),
        Span::styled(
            format!("{:<9} ", e.status.as_str()),
            Style::new().fg(verdict_color),
        ),
        Span::raw(format!(
            "{:<9} {:>6}  {:<9} {:<8} {probe}",
            e.level.as_str(),
            e.score
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            if e.ready { "ready" } else { "NOT READY" },
            if e.live { "live" } else { "RESTART" },
        )),
    ]);
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
    let reason = Line::from(format!("  {reason}")).style(Style::new().add_modifier(Modifier::DIM));
    [status, reason]
}

/// Longest event `top` accepts from the agent (a `hello` with hundreds of NPUs is tens of
/// kilobytes); a longer one ends the view with an error rather than growing without bound.
pub const MAX_EVENT: usize = 4 << 20;

/// Splits a server-sent event stream into `(event, data)` pairs.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: String,
    /// The start of a character split across reads.
    split: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the events completed by them, or an error once more than
    /// [`MAX_EVENT`] bytes are pending without an event's end.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
        self.split.extend_from_slice(bytes);
        let whole = match std::str::from_utf8(&self.split) {
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            _ => self.split.len(),
        };
        let rest = self.split.split_off(whole);
        self.buf
            .push_str(&String::from_utf8_lossy(&self.split).replace("\r\n", "\n"));
        self.split = rest;
        let mut out = Vec::new();
        while let Some(i) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..i + 2).collect();
            let (mut name, mut data) = ("message".to_owned(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if !data.is_empty() {
                out.push((name, data));
            }
        }
        if self.buf.len() > MAX_EVENT {
            return Err(format!(
                "an event of over {MAX_EVENT} bytes without its end; not an agent's stream"
            ));
        }
        Ok(out)
    }
}

/// The plain text of a buffer, one line per row, trailing spaces cut.
pub fn buffer_text(buf: &Buffer) -> String {
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

fn client(args: &TopArgs) -> anyhow::Result<reqwest::Client> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &args.ca_file {
        for c in crate::tls::load_certs(ca).map_err(|e| anyhow!("--ca-file: {e}"))? {
            roots
                .add(c)
                .map_err(|e| anyhow!("--ca-file {}: {e}", ca.display()))?;
        }
    } else if args.admin.starts_with("https://") {
        bail!("{} is https: give its CA with --ca-file", args.admin);
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .build()?)
}

async fn open(args: &TopArgs) -> anyhow::Result<reqwest::Response> {
    let base = args.admin.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        bail!("--admin {base:?} is not an http:// or https:// URL");
    }
    let url = format!("{base}/events");
    let mut req = client(args)?.get(&url);
    if let Some(f) = &args.token_file {
        let token = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read --token-file {}", f.display()))?;
        req = req.bearer_auth(token.trim());
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach the agent at {url}"))?;
    match resp.status().as_u16() {
        200 => Ok(resp),
        401 => bail!("{url} answered 401: give the admin token with --token-file"),
        403 => bail!("{url} answered 403: this client is not allowed"),
        code => bail!(
            "{url} answered {code}: {}",
            crate::logging::quote(body_start(resp).await.trim())
        ),
    }
}

/// At most the first 4 KiB of an error answer's body, for the message.
async fn body_start(mut resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < 4096
        && let Ok(Ok(Some(c))) = tokio::time::timeout(Duration::from_secs(2), resp.chunk()).await
    {
        body.extend_from_slice(&c);
    }
    body.truncate(4096);
    String::from_utf8_lossy(&body).into_owned()
}

/// Runs `top`.
pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    let mut resp = open(&args).await?;
    let mut model = Model::new(args.admin.clone(), args.seconds);
    let mut parser = SseParser::default();
    if args.once {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !model.complete() {
            let chunk = tokio::time::timeout_at(deadline, resp.chunk())
                .await
                .map_err(|_| anyhow!("no complete frame from {} within 10 s", args.admin))??
                .ok_or_else(|| anyhow!("{} closed the stream", args.admin))?;
            for (e, d) in parser
                .feed(&chunk)
                .map_err(|e| anyhow!("{}: {e}", args.admin))?
            {
                model.apply(&e, &d)?;
            }
        }
        // The terminal's width only when stdout is one: piped, crossterm would answer a
        // fallback (80, or `tput cols`), narrower than the documented 100.
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        let width = args
            .width
            .or_else(|| {
                terminal
                    .then(|| ratatui::crossterm::terminal::size().ok().map(|(w, _)| w))
                    .flatten()
            })
            .unwrap_or(100)
            .max(60);
        let area = Rect::new(0, 0, width, model.height());
        let mut buf = Buffer::empty(area);
        model.render(area, &mut buf);
        print!("{}", buffer_text(&buf));
        return Ok(());
    }
    live(resp, model, parser).await
}

/// The live view: redraws at every frame and key, until `q`, Esc or Ctrl-C.
async fn live(
    mut resp: reqwest::Response,
    mut model: Model,
    mut parser: SseParser,
) -> anyhow::Result<()> {
    use ratatui::crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Event>(16);
    // crossterm's reads block: a thread of their own, ended with the process.
    std::thread::spawn(move || {
        while let Ok(e) = ratatui::crossterm::event::read() {
            if keys_tx.blocking_send(e).is_err() {
                return;
            }
        }
    });
    let mut terminal = ratatui::init();
    let result = async {
        loop {
            terminal.draw(|f| model.render(f.area(), f.buffer_mut()))?;
            tokio::select! {
                k = keys.recv() => match k {
                    Some(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                        let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                        if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                            return Ok(());
                        }
                    }
                    Some(_) => {}
                    None => return Ok(()),
                },
                chunk = resp.chunk() => match chunk? {
                    Some(c) => {
                        for (e, d) in parser.feed(&c).map_err(|e| anyhow!("{e}"))? {
                            model.apply(&e, &d)?;
                        }
                    }
                    None => bail!("the agent closed the stream"),
                },
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
    .await;
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = r#"{"version":"0.1.0","period_ms":50.0,"frame_interval_ms":250,"history_s":60.0,"npus":[{"index":0,"id":0,"name":"910B","engines":["a"]}],"engines":["a"]}"#;

    #[test]
    fn sse_blocks_split_across_reads_are_joined() {
        let mut p = SseParser::default();
        assert!(p.feed(b"event: hello\ndata: {\"x\"").unwrap().is_empty());
        let got = p
            .feed(b":1}\n\n: keep-alive\n\nevent: samples\r\ndata: 2\r\n\r\n")
            .unwrap();
        assert_eq!(
            got,
            vec![
                ("hello".to_owned(), "{\"x\":1}".to_owned()),
                ("samples".to_owned(), "2".to_owned())
            ]
        );
    }

    // A character split across two reads is joined, not replaced.
    #[test]
    fn sse_a_character_split_across_reads_is_kept() {
        let mut p = SseParser::default();
        let frame = "event: engines\ndata: {\"name\":\"推理\"}\n\n".as_bytes();
        let cut = frame.iter().position(|&b| b >= 0x80).unwrap() + 1;
        assert!(p.feed(&frame[..cut]).unwrap().is_empty());
        let got = p.feed(&frame[cut..]).unwrap();
        assert_eq!(got[0].1, "{\"name\":\"推理\"}");
    }

    // A peer that never ends an event is refused at MAX_EVENT, not buffered without bound.
    #[test]
    fn sse_an_endless_event_is_refused() {
        let mut p = SseParser::default();
        let chunk = vec![b'x'; 64 << 10];
        let mut fed = 0;
        let err = loop {
            match p.feed(&chunk) {
                Ok(v) => assert!(v.is_empty()),
                Err(e) => break e,
            }
            fed += chunk.len();
            assert!(
                fed <= MAX_EVENT + chunk.len(),
                "still buffering at {fed} bytes"
            );
        };
        assert!(err.contains("without its end"), "{err}");
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
    fn a_frame_renders_the_engine_and_the_npu() {
        let mut m = Model::new("http://x".into(), 10);
        m.apply("hello", HELLO).unwrap();
        m.apply(
            "samples",
            r#"{"now_ms": 1000.0, "npus": [{"i": 0, "t": [900.0, 950.0], "v": [85, 7]}]}"#,
        )
        .unwrap();
        m.apply("engines", r#"{"at_unix_ms": 1, "engines": [{"name": "a", "status": "abnormal", "reason": "virtual inference is abnormal", "policy": "agent", "level": "degrade", "score": 0.41, "ready": false, "ready_reason": "r", "live": false, "live_reason": "l", "failure_count": 6, "max_failure_count": 6, "last_probe": {"at_unix_ms": 1, "success": false, "outcome": "failed: timed out", "latency_ms": 2000.0}}], "recent": [], "npus": [{"i": 0, "backend": "dcmi", "stale": false, "hung": false, "health": 0, "hbm_used_mb": 1, "hbm_total_mb": 2}]}"#).unwrap();
        assert!(m.complete());
        let area = Rect::new(0, 0, 100, m.height());
        let mut buf = Buffer::empty(area);
        m.render(area, &mut buf);
        let text = buffer_text(&buf);
        assert!(text.contains("abnormal"), "{text}");
        assert!(
            text.contains("degrade    0.410  NOT READY RESTART"),
            "{text}"
        );
        assert!(text.contains("failed: timed out in 2000.0 ms"), "{text}");
        assert!(text.contains("NPU 0   now   7  peak  85"), "{text}");
        assert!(text.contains("dcmi"), "{text}");
    }
}
