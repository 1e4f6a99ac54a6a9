//! `npu-health-agent disagreements`: per engine, when the policy in force and the shadow
//! each said `abnormal`, and every time they disagreed, read from the agent's state file
//! (docs/policy.md, "The shadow policy"). It reads the file as it is, of any age and while
//! the agent runs: a report, not a state to resume from.

use crate::continuity::statefile::{MAX_BYTES, StateFile};
use crate::monitor::saved::EngineState;
use anyhow::{Context, bail};
use clap::Args;
use npu_health_wire::{Disagreement, Status, Turn};
use std::fmt::Write as _;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

/// `disagreements`' flags.
#[derive(Debug, Clone, Args)]
pub struct DisagreementsArgs {
    /// The agent's state directory (`[agent] state_dir`; the packaged unit's
    /// `RuntimeDirectory=`).
    #[arg(long, default_value = "/run/npu-health-agent")]
    pub state_dir: PathBuf,
    /// Only this engine.
    #[arg(long)]
    pub engine: Option<String>,
    /// Print the records as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reads the state file and prints the report.
pub(crate) fn run(args: &DisagreementsArgs) -> anyhow::Result<()> {
    let path = args.state_dir.join(crate::continuity::STATE_NAME);
    let file = std::fs::File::open(&path).with_context(|| {
        format!(
            "no state file at {} (the agent writes it in [agent] state_dir, or the unit's RuntimeDirectory; --state-dir names another)",
            path.display()
        )
    })?;
    let mut text = Vec::new();
    file.take(MAX_BYTES + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_BYTES {
        bail!(
            "{} is over the {MAX_BYTES} bytes a state file may hold",
            path.display()
        );
    }
    let state: StateFile = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not an agent state file", path.display()))?;
    let engines: Vec<&EngineState> = state
        .engines
        .iter()
        .filter(|e| args.engine.as_ref().is_none_or(|n| *n == e.name))
        .collect();
    if let Some(name) = &args.engine
        && engines.is_empty()
    {
        bail!("no engine {name:?} in {}", path.display());
    }
    if args.json {
        let out: Vec<serde_json::Value> = engines
            .iter()
            .map(|e| serde_json::json!({"engine": e.name, "turns": e.shadow.turns, "disagreements": e.shadow.disagreements}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report(&state, &engines));
    }
    Ok(())
}

fn at(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn rule(r: Option<u8>) -> String {
    r.map_or_else(
        || "the reference's own".to_owned(),
        |id| format!("rule {id} {}", crate::config::policy::rule_name(id)),
    )
}

fn side(t: &Turn) -> String {
    let who = if t.side == "shadow" {
        "shadow"
    } else {
        "in force"
    };
    format!("{who} ({})", t.policy.as_str())
}

/// The report in plain text.
pub(crate) fn report(state: &StateFile, engines: &[&EngineState]) -> String {
    let mut out = format!(
        "state file saved {} by agent {} (pid {})\n",
        at(state.saved_at_unix_ms),
        state.agent,
        state.pid
    );
    for e in engines {
        let (turns, dis) = (&e.shadow.turns, &e.shadow.disagreements);
        let _ = writeln!(out, "\nengine {}", e.name);
        if turns.is_empty() && dis.is_empty() {
            let _ = writeln!(
                out,
                "  nothing recorded: no rule in observe and no shadow_policy, or no verdict yet"
            );
            continue;
        }
        let _ = writeln!(out, "  when each said abnormal:");
        let abnormal: Vec<&Turn> = turns
            .iter()
            .filter(|t| t.status == Status::Abnormal)
            .collect();
        if abnormal.is_empty() {
            let _ = writeln!(out, "    never, in the {} turns kept", turns.len());
        }
        for t in abnormal {
            let _ = writeln!(
                out,
                "    {}  {:<20} {}: {}",
                at(t.at_unix_ms),
                side(t),
                rule(t.rule),
                t.reason
            );
        }
        let _ = writeln!(out, "  disagreements: {}", dis.len());
        for d in dis {
            let _ = writeln!(out, "    {}", disagreement(d));
        }
    }
    out
}

fn disagreement(d: &Disagreement) -> String {
    let span = match d.ended_unix_ms {
        Some(end) => format!(
            "{} for {:.1} s",
            at(d.began_unix_ms),
            end.saturating_sub(d.began_unix_ms) as f64 / 1e3
        ),
        None => format!("{} (still)", at(d.began_unix_ms)),
    };
    format!(
        "{span}: /status {}, would have answered {} ({}): {}",
        d.status.as_str(),
        d.would_status.as_str(),
        rule(d.rule),
        d.reason
    )
}
