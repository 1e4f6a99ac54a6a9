//! `npu-health-agent top`: a terminal view of a running agent, like `npu-smi info` or nvtop.
//! It reads the admin listener's `GET /events` stream ([`crate::view`]) into the view's model
//! ([`crate::view::top`], which also draws it), in the terminal's width. `q`, Esc or Ctrl-C
//! quits. When the stream breaks or goes silent, the view stays up: it says since when the
//! agent is out of reach, greys the last figures, and tries again every 2 s until a new
//! stream begins. `--once` prints one plain-text frame and exits, for scripts.

use crate::view::top::{Model, buffer_text};
use anyhow::{Context, anyhow, bail};
use clap::Args;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

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

/// How long the live view waits for a byte of the stream before it calls the agent out of
/// reach: the agent sends a frame every 250 ms, so this much silence is a hung agent or a
/// link gone without a reset.
const SILENT: Duration = Duration::from_secs(5);
/// Between two tries to reach a lost agent.
const RETRY: Duration = Duration::from_secs(2);
/// The first try after the agent ended the stream itself (a stop, a reload, a handover: the
/// next agent may already listen).
const RETRY_SOON: Duration = Duration::from_millis(250);

/// Where the live view's connection is.
enum Link {
    /// Reading the stream.
    Open(reqwest::Response, SseParser),
    /// No stream: the next try at this instant.
    Down(Instant),
}

/// What happened on the link: what to show, and the link after it.
enum Step {
    /// Events from the stream, each `(event, data)`.
    Events(Vec<(String, String)>, Link),
    /// The agent is out of reach, in words; the next try is set.
    Lost(String, Link),
}

impl Link {
    /// Waits for the next thing on the link: a chunk of the stream, its end or silence, or a
    /// new stream after a try.
    async fn step(self, args: &TopArgs) -> Step {
        match self {
            Link::Open(mut resp, mut parser) => {
                let down = |why: String, after: Duration| {
                    Step::Lost(why, Link::Down(Instant::now() + after))
                };
                match tokio::time::timeout(SILENT, resp.chunk()).await {
                    Err(_) => down(format!("no data for {} s", SILENT.as_secs()), RETRY),
                    Ok(Ok(None)) => down(
                        "the agent ended the stream (it stopped, reloads or hands over)".into(),
                        RETRY_SOON,
                    ),
                    // The body's error names the client's layer ("error decoding response
                    // body"); its cause says what happened ("unexpected EOF").
                    Ok(Err(e)) => down(
                        format!("the connection broke ({})", anyhow!(e).root_cause()),
                        RETRY,
                    ),
                    Ok(Ok(Some(chunk))) => match parser.feed(&chunk) {
                        Ok(events) => Step::Events(events, Link::Open(resp, parser)),
                        Err(e) => down(e, RETRY),
                    },
                }
            }
            Link::Down(at) => {
                tokio::time::sleep_until(at).await;
                match open(args).await {
                    Ok(resp) => Step::Events(Vec::new(), Link::Open(resp, SseParser::default())),
                    Err(e) => Step::Lost(words(&e), Link::Down(Instant::now() + RETRY)),
                }
            }
        }
    }
}

/// Applies what happened on the link to `model`; the link to wait on next. A frame the
/// model cannot read ends the stream like a broken link: said, and tried again.
fn apply(model: &mut Model, step: Step) -> Link {
    match step {
        Step::Events(events, link) => {
            model.heard(unix_ms());
            for (e, d) in events {
                if let Err(err) = model.apply(&e, &d) {
                    model.lose(format!("{err:#}"), unix_ms());
                    return Link::Down(Instant::now() + RETRY);
                }
            }
            link
        }
        Step::Lost(why, link) => {
            model.lose(why, unix_ms());
            link
        }
    }
}

/// An error in words: what failed, then its first cause when that says more (not the whole
/// chain of the HTTP client's layers).
fn words(e: &anyhow::Error) -> String {
    let (top, root) = (e.to_string(), e.root_cause().to_string());
    if top == root {
        top
    } else {
        format!("{top}: {root}")
    }
}

/// Milliseconds since the epoch, now.
fn unix_ms() -> u64 {
    crate::clock::unix_ms()
}

/// Runs `top`. The first connection must succeed (a wrong address or token is a one-line
/// error and exit 1); after it, the live view never exits on its own.
pub(crate) async fn run(args: TopArgs) -> anyhow::Result<()> {
    let resp = open(&args).await?;
    let model = Model::new(args.admin.clone(), args.seconds);
    if args.once {
        return once(&args, resp, model).await;
    }
    live(&args, Link::Open(resp, SseParser::default()), model).await
}

/// `--once`: waits for one complete frame and prints it as plain text.
async fn once(args: &TopArgs, mut resp: reqwest::Response, mut model: Model) -> anyhow::Result<()> {
    let mut parser = SseParser::default();
    let deadline = Instant::now() + Duration::from_secs(10);
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
    let width = once_width(args.width, terminal_width());
    let area = Rect::new(0, 0, width, model.height(width));
    let mut buf = Buffer::empty(area);
    model.render(area, &mut buf);
    print!("{}", buffer_text(&buf));
    Ok(())
}

/// The terminal's width, when stdout is a terminal that tells it: piped, crossterm would
/// answer a fallback (80, or `tput cols`), narrower than the documented 100; a terminal
/// that answers 0 columns (a pseudo-terminal nobody sized) tells nothing.
fn terminal_width() -> Option<u16> {
    std::io::IsTerminal::is_terminal(&std::io::stdout())
        .then(|| ratatui::crossterm::terminal::size().ok())
        .flatten()
        .map(|(w, _)| w)
}

/// The `--once` frame's width: `--width`, else the terminal's, else 100; at least 60.
fn once_width(flag: Option<u16>, terminal: Option<u16>) -> u16 {
    flag.or(terminal.filter(|&w| w > 0)).unwrap_or(100).max(60)
}

/// The live view: redraws at every chunk, key and second, until `q`, Esc or Ctrl-C.
async fn live(args: &TopArgs, mut link: Link, mut model: Model) -> anyhow::Result<()> {
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
    model.retry_s = RETRY.as_secs();
    let mut terminal = ratatui::init();
    // The "since" of a lost agent counts on screen while nothing else happens.
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let result = async {
        loop {
            model.clock_unix_ms = unix_ms();
            terminal.draw(|f| model.render(f.area(), f.buffer_mut()))?;
            let step = link.step(args);
            tokio::pin!(step);
            let next = loop {
                tokio::select! {
                    k = keys.recv() => match k {
                        Some(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                            let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                            if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                                return Ok(());
                            }
                        }
                        // A resize: drawn again at the new size below.
                        Some(_) => {}
                        None => return Ok(()),
                    },
                    s = &mut step => break s,
                    _ = second.tick() => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                model.clock_unix_ms = unix_ms();
                terminal.draw(|f| model.render(f.area(), f.buffer_mut()))?;
            };
            link = apply(&mut model, next);
        }
    }
    .await;
    ratatui::restore();
    result
}

/// Longest event `top` accepts from the agent (a `hello` with hundreds of NPUs is tens of
/// kilobytes); a longer one ends the stream with an error (`--once`: exit 1; live: said, and
/// tried again) rather than growing without bound.
pub(crate) const MAX_EVENT: usize = 4 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;

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

    // `--once`'s width: the flag, else the terminal's, else 100 (a piped stdout has none; a
    // terminal nobody sized answers 0), never under 60.
    #[test]
    fn the_once_width_is_the_flag_then_the_terminal_then_100() {
        let rows = [
            ((Some(120), Some(200)), 120),
            ((None, Some(200)), 200),
            ((None, None), 100),
            ((None, Some(0)), 100),
            ((None, Some(40)), 60),
        ];
        for ((flag, terminal), want) in rows {
            assert_eq!(once_width(flag, terminal), want, "{flag:?} {terminal:?}");
        }
    }

    // What the live view says when the link fails: the failure and its first cause, not the
    // HTTP client's whole chain.
    #[test]
    fn an_error_reads_as_what_failed_and_why() {
        let e = anyhow!(std::io::Error::other("unexpected EOF"))
            .context("error sending request")
            .context("cannot reach the agent at http://x/events");
        assert_eq!(
            words(&e),
            "cannot reach the agent at http://x/events: unexpected EOF"
        );
        assert_eq!(words(&anyhow!("no data")), "no data");
    }

    /// `top`'s flags for an agent at `url`.
    fn args(url: &str) -> TopArgs {
        TopArgs {
            admin: url.to_owned(),
            token_file: None,
            ca_file: None,
            once: false,
            seconds: 10,
            width: None,
        }
    }

    /// An "agent" on a real socket that answers one `/events` with `answer`, then holds the
    /// connection open (`hold`) or closes it; its URL.
    async fn agent(answer: &'static [u8], hold: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                if s.read(&mut b).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push(b[0]);
            }
            s.write_all(answer).await.unwrap();
            if hold {
                std::future::pending::<()>().await;
            }
        });
        url
    }

    const HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

    /// The step after opening the stream of an agent that answers `answer`.
    async fn step_after(answer: &'static [u8], hold: bool) -> (String, Duration) {
        let a = args(&agent(answer, hold).await);
        let mut link = Link::Open(open(&a).await.unwrap(), SseParser::default());
        // The bytes before a break come first, as a chunk without a whole event.
        loop {
            // Paused time: a step that waits for ever fails here instead of hanging.
            let step = tokio::time::timeout(SILENT * 2, link.step(&a)).await;
            match step.expect("a step within twice the silence") {
                Step::Lost(why, Link::Down(at)) => return (why, at - Instant::now()),
                Step::Lost(..) => panic!("lost, and not down"),
                Step::Events(e, next) => {
                    assert!(e.is_empty(), "{e:?}");
                    link = next;
                }
            }
        }
    }

    // Issue 48: the link's failures, on a real socket (time paused: the 5 s of silence pass
    // at once). Each is said in words and tried again, none ends `top`: an agent that says
    // nothing for 5 s (hung, or a link gone without a reset), one that ends its stream (a
    // stop, a reload, a handover: tried again soon), one whose connection breaks mid-frame.
    #[tokio::test(start_paused = true)]
    async fn a_silent_an_ended_and_a_broken_stream_are_each_told_and_tried_again() {
        let (why, retry) = step_after(HEAD, true).await;
        assert_eq!(why, "no data for 5 s");
        assert_eq!(retry, RETRY);
        let ended: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        let (why, retry) = step_after(ended, false).await;
        assert!(why.starts_with("the agent ended the stream"), "{why}");
        assert_eq!(retry, RETRY_SOON);
        let broken: &[u8] =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n40\r\nevent: hel";
        let (why, retry) = step_after(broken, false).await;
        assert!(why.starts_with("the connection broke ("), "{why}");
        assert!(!why.contains("error decoding response body"), "{why}");
        assert_eq!(retry, RETRY);
    }

    // A try that fails says why, in words, and sets the next try; one that succeeds opens a
    // stream.
    #[tokio::test]
    async fn a_try_that_fails_is_told_and_one_that_succeeds_opens_the_stream() {
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let a = args(&refused);
        match Link::Down(Instant::now()).step(&a).await {
            Step::Lost(why, Link::Down(_)) => {
                assert!(
                    why.starts_with(&format!("cannot reach the agent at {refused}/events: ")),
                    "{why}"
                );
                assert!(
                    !why.contains("client error"),
                    "one cause, not the chain: {why}"
                );
            }
            _ => panic!("not lost"),
        }
        let a = args(&agent(HEAD, true).await);
        assert!(matches!(
            Link::Down(Instant::now()).step(&a).await,
            Step::Events(e, Link::Open(..)) if e.is_empty()
        ));
    }
}
