//! The seed's levels through a real HAProxy (2.6): the agent answers HAProxy's agent check
//! for the main engine (the fake engine, model `m`), a draft engine (the fake engine serving
//! `m` as an alias, answering as `draft`) is the `backup` server, and the client's requests
//! go through HAProxy. Faults on the main engine move its QoS level; each level's routing is
//! read from the answers (which engine served) and HAProxy's own stats socket.
//!
//! Runs where `haproxy` is installed (`scripts/routers install`); prints the figures the
//! closing note and docs/degradation.md quote (`--nocapture`).

#![cfg(feature = "fake-driver")]

use crate::support::Figures;
use crate::support::routers::{self, Answer, Draft, Haproxy, complete};
use crate::support::stack::{Launch, Stack, free_ports};
use std::io::{Read, Write};
use std::time::Duration;

// The shipped example passes HAProxy's own check as it is (the router tests below run it,
// on local ports); the check can fail: a misspelt keyword on the main server's line.
#[test]
fn the_shipped_haproxy_config_passes_haproxys_own_check() {
    let Some(bin) = routers::haproxy("the_shipped_haproxy_config") else {
        return;
    };
    let shipped =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy/haproxy.cfg");
    let (ok, out) = routers::haproxy_check(&bin, &shipped);
    assert!(ok, "{}:\n{out}", shipped.display());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cfg");
    std::fs::write(
        &bad,
        routers::example(
            "deploy/haproxy/haproxy.cfg",
            &[("agent-send \"main\\n\"", "agent-sned \"main\\n\"", 1)],
        ),
    )
    .unwrap();
    let (ok, out) = routers::haproxy_check(&bin, &bad);
    assert!(!ok, "haproxy accepted a misspelt keyword:\n{out}");
    assert!(out.contains("agent-sned"), "{out}");
}

struct Rig {
    stack: Stack,
    haproxy: Haproxy,
    _draft: Draft,
}

fn rig(bin: &std::path::Path) -> Rig {
    let [agent_port] = free_ports();
    let agent_extra = format!("haproxy_agent_listen = \"127.0.0.1:{agent_port}\"");
    // Latency budget 1 s, evaluated every 500 ms: 700 ms more per first token is throttle,
    // 1.5 s more with the KV cache nearly full is degrade.
    let stack = Stack::start_launch(Launch {
        engine_extra: "[engine.qos]\nperiod = \"500ms\"\nmetrics_period = \"500ms\"\nttft_budget = \"1s\"\n",
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    let [draft_port, draft_control, front] = free_ports();
    let draft = Draft::start(draft_port, draft_control, stack.dir.path());
    let config = routers::main_and_draft(front, stack.engine_port, agent_port, "e2e", draft_port);
    let haproxy = Haproxy::start(bin, stack.dir.path(), &config, front);
    Rig {
        stack,
        haproxy,
        _draft: draft,
    }
}

/// Sends `n` requests of `tokens` tokens at once through the router; their answers.
fn burst(front: &str, n: usize, tokens: u32) -> Vec<Answer> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let f = front.to_owned();
            std::thread::spawn(move || complete(&f, "m", tokens))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn count(answers: &[Answer], model: &str) -> usize {
    answers.iter().filter(|a| a.model == model).count()
}

fn failed(answers: &[Answer]) -> Vec<&Answer> {
    answers.iter().filter(|a| a.code != 200).collect()
}

fn status(s: &std::collections::BTreeMap<String, String>) -> String {
    s.get("status").cloned().unwrap_or_default()
}

#[test]
fn haproxy_follows_each_level_and_the_draft_serves_while_main_is_out() {
    let fig = Figures::new("haproxy_follows_each_level_and_the_draft_serves_while_main_is_out");
    let Some(bin) = routers::haproxy("haproxy_follows_each_level") else {
        return;
    };
    // The draft is bound by name: `..` would drop (and kill) it here.
    let Rig {
        stack,
        haproxy,
        _draft: _keep,
    } = rig(&bin);
    let front = haproxy.front.clone();
    let wait = Duration::from_secs(30);
    let qos_level = |stack: &Stack| stack.qos()["level"].as_str().unwrap_or_default().to_owned();

    // normal: the agent says `up ready`; everything goes to main.
    haproxy.wait_server("llm", "main", wait, |s| {
        s.get("last_agt")
            .is_some_and(|a| a.starts_with("via agent : up"))
    });
    let normal = burst(&front, 12, 4);
    assert!(failed(&normal).is_empty(), "{normal:?}");
    assert_eq!(count(&normal, "m"), 12, "{normal:?}");
    fig.line(format!(
        "normal: main {} draft {}",
        count(&normal, "m"),
        count(&normal, "draft")
    ));

    // throttle: three long streams run on main; the first token slows by 700 ms. The agent
    // caps main at what ran when throttle began; a burst of new requests waits in HAProxy's
    // queue for the streams to finish, none fails, none goes to the draft, and main never
    // has more than the cap from HAProxy.
    let long: Vec<_> = (0..3)
        .map(|_| {
            let f = front.clone();
            std::thread::spawn(move || complete(&f, "m", 600))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    stack.faults(r#"{"latency_ms": 700}"#);
    stack.wait_until("level throttle", wait, |d| d["qos"]["level"] == "throttle");
    let capped = haproxy.wait_server("llm", "main", wait, |s| {
        s.get("slim")
            .is_some_and(|v| !v.is_empty() && v != "100000")
    });
    let cap: usize = capped["slim"].parse().unwrap();
    let agent_cap = stack.qos()["admission_cap"].as_u64().unwrap() as usize;
    assert_eq!(cap, agent_cap, "HAProxy's maxconn is the agent's cap");
    assert!(cap >= 1, "{capped:?}");
    haproxy.command("clear counters");
    let queued = burst(&front, 6, 4);
    let mut stats = haproxy.servers("llm");
    let main_stats = stats.remove("main").unwrap();
    // Requests no server can take wait in the backend's queue.
    let queue_stats = stats.remove("BACKEND").unwrap();
    let longest_wait = queued.iter().map(|a| a.took).max().unwrap();
    assert!(failed(&queued).is_empty(), "{queued:?}");
    assert_eq!(
        count(&queued, "m"),
        6,
        "queued on main, not sent to the draft: {queued:?}"
    );
    let smax: usize = main_stats["smax"].parse().unwrap();
    assert!(smax <= cap, "main had {smax} at once, over the cap {cap}");
    let qmax: usize = queue_stats["qmax"].parse().unwrap();
    for t in long {
        let a = t.join().unwrap();
        assert_eq!((a.code, a.model.as_str()), (200, "m"), "{a:?}");
    }
    fig.line(format!(
        "throttle: cap {cap} (running when it began), burst of 6: main {} draft {} failed {}, HAProxy's queue held up to {qmax}, main at most {smax} at once, longest wait {:?}",
        count(&queued, "m"),
        count(&queued, "draft"),
        failed(&queued).len(),
        longest_wait
    ));
    assert!(
        qmax >= 1,
        "nothing queued: the cap held nothing back ({queue_stats:?})"
    );

    // Recovery: back to normal, the cap is lifted (`maxconn:100000`, the open cap).
    stack.faults(r#"{"latency_ms": 0}"#);
    stack.wait_until("level normal", wait, |d| d["qos"]["level"] == "normal");
    haproxy.wait_server("llm", "main", wait, |s| {
        s.get("slim").is_some_and(|v| v == "100000") && status(s) == "no check"
    });

    // degrade: two long streams run on main, then its first token slows by 1.5 s with the
    // KV cache nearly full. The agent drains main: new requests are answered by the draft,
    // the streams already on main finish there.
    let long: Vec<_> = (0..2)
        .map(|_| {
            let f = front.clone();
            std::thread::spawn(move || complete(&f, "m", 800))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    stack.faults(r#"{"latency_ms": 1500, "kv_cache_usage": 0.97}"#);
    // HAProxy's view every 25 ms: how long after the level changed main was drained.
    haproxy.wait_server("llm", "main", wait, |s| status(s) == "DRAIN (agent)");
    let drained_at = now_ms();
    assert_eq!(qos_level(&stack), "degrade");
    let since = stack.qos()["level_since_unix_ms"].as_u64().unwrap();
    let drained = burst(&front, 8, 4);
    assert!(failed(&drained).is_empty(), "{drained:?}");
    assert_eq!(count(&drained, "draft"), 8, "{drained:?}");
    for t in long {
        let a = t.join().unwrap();
        assert_eq!(
            (a.code, a.model.as_str()),
            (200, "m"),
            "a stream running on main when it drained: {a:?}"
        );
    }
    fig.line(format!(
        "degrade: HAProxy drained main {} ms after the level changed (agent-inter 200 ms); burst of 8 after: main {} draft {} failed {}; the 2 streams on main completed",
        drained_at.saturating_sub(since),
        count(&drained, "m"),
        count(&drained, "draft"),
        failed(&drained).len()
    ));
    let detail = stack.detail();
    assert_eq!(detail["routers"]["haproxy"]["state"], "drain", "{detail}");
    // The record of actions has HAProxy's changes beside the others, in one shape.
    let actions = detail["actions"].as_array().unwrap();
    let drain = actions
        .iter()
        .rev()
        .find(|a| a["integration"] == "haproxy")
        .unwrap_or_else(|| panic!("no haproxy action: {detail}"));
    assert_eq!(
        (
            drain["action"].as_str(),
            drain["from"].as_str(),
            drain["to"].as_str(),
            drain["level"].as_str()
        ),
        (
            Some("agent_check"),
            Some("ready"),
            Some("drain"),
            Some("degrade")
        ),
        "{drain}"
    );
    assert!(
        actions
            .iter()
            .any(|a| a["integration"] == "agent" && a["to"] == "degrade"),
        "{detail}"
    );
    let metrics = stack.metrics();
    for (state, v) in [("drain", 1), ("ready", 0), ("down", 0)] {
        let line = format!(
            "npu_health_agent_router_state{{engine=\"e2e\",router=\"haproxy\",state=\"{state}\"}} {v}"
        );
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }

    // Recovery: traffic returns to main.
    stack.faults(r#"{"latency_ms": 0, "kv_cache_usage": 0.1}"#);
    stack.wait_until("level normal", wait, |d| d["qos"]["level"] == "normal");
    haproxy.wait_server("llm", "main", wait, |s| status(s) == "no check");
    let back = burst(&front, 8, 4);
    assert!(failed(&back).is_empty(), "{back:?}");
    assert_eq!(count(&back, "m"), 8, "{back:?}");
    fig.line(format!(
        "recovery: main {} draft {}",
        count(&back, "m"),
        count(&back, "draft")
    ));

    // abnormal: the engine hangs; once the verdict is abnormal, HAProxy marks main down with
    // the agent's reason, and main gets nothing.
    stack.faults(r#"{"hang": true}"#);
    stack.wait_for_status("abnormal", wait);
    let down = haproxy.wait_server("llm", "main", wait, |s| status(s) == "DOWN (agent)");
    assert!(
        down["last_agt"].starts_with("via agent : down (abnormal: "),
        "the reason on HAProxy's stats page: {down:?}"
    );
    let out = burst(&front, 8, 4);
    assert!(failed(&out).is_empty(), "{out:?}");
    assert_eq!(count(&out, "draft"), 8, "{out:?}");
    fig.line(format!(
        "abnormal: main {} draft {} failed {}; HAProxy shows {:?}",
        count(&out, "m"),
        count(&out, "draft"),
        failed(&out).len(),
        down["last_agt"]
    ));
}

// evict: the engine is busy but stuck with its KV cache nearly full and requests held on
// it, so the score stays below 0.3 with progress stalled and the level reaches a held
// `evict` (`[engine.actions.haproxy] evict = "down"`). HAProxy marks main down with the
// level as the reason; the draft answers every new request and main gets none.
#[test]
fn a_held_evict_takes_main_down_and_the_draft_serves() {
    let fig = Figures::new("a_held_evict_takes_main_down_and_the_draft_serves");
    let Some(bin) = routers::haproxy("a_held_evict") else {
        return;
    };
    let Rig {
        stack,
        haproxy,
        _draft: _keep,
    } = rig(&bin);
    let wait = Duration::from_secs(60);
    haproxy.wait_server("llm", "main", wait, |s| {
        s.get("last_agt")
            .is_some_and(|a| a.starts_with("via agent : up"))
    });
    stack.faults(r#"{"npu_busy_stuck": true, "kv_cache_usage": 0.97}"#);
    let _held = stack.hold_requests(4, r#"{"model": "m", "prompt": "stuck", "max_tokens": 100}"#);
    stack.wait_until("level evict", wait, |d| d["qos"]["level"] == "evict");
    let down = haproxy.wait_server("llm", "main", wait, |s| status(s) == "DOWN (agent)");
    assert!(
        down["last_agt"].starts_with("via agent : down (QoS level evict"),
        "the reason on HAProxy's stats page: {down:?}"
    );
    haproxy.command("clear counters");
    let out = burst(&haproxy.front, 8, 4);
    let main = haproxy.servers("llm").remove("main").unwrap();
    assert!(failed(&out).is_empty(), "{out:?}");
    assert_eq!(count(&out, "draft"), 8, "{out:?}");
    assert_eq!(main["stot"], "0", "main got requests while down: {main:?}");
    let detail = stack.detail();
    assert_eq!(
        detail["status"], "normal",
        "evicted by the level, not the verdict: {detail}"
    );
    assert_eq!(detail["routers"]["haproxy"]["state"], "down", "{detail}");
    fig.line(format!(
        "evict: main {} draft {} failed {}; HAProxy shows {:?}",
        count(&out, "m"),
        count(&out, "draft"),
        failed(&out).len(),
        down["last_agt"]
    ));
}

fn now_ms() -> u64 {
    npu_health_agent::clock::unix_ms()
}

// A server line that names no engine of this agent (or none) is out of rotation, and
// HAProxy's stats page says why, naming neither the name asked nor the engines here.
#[test]
fn an_unknown_engine_name_takes_the_server_out_and_names_no_engine() {
    let Some(bin) = routers::haproxy("an_unknown_engine_name") else {
        return;
    };
    let [agent_port, front, draft] = free_ports();
    let agent_extra = format!("haproxy_agent_listen = \"127.0.0.1:{agent_port}\"");
    let stack = Stack::start_launch(Launch {
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    let config = routers::main_and_draft(front, stack.engine_port, agent_port, "prefill-7", draft);
    let haproxy = Haproxy::start(&bin, stack.dir.path(), &config, front);
    let s = haproxy.wait_server("llm", "main", Duration::from_secs(10), |s| {
        status(s) == "DOWN (agent)"
    });
    assert_eq!(
        s["last_agt"],
        "via agent : down (no engine of that name here)"
    );
}

/// Sends `bytes` to the agent-check listener and reads the answer line.
fn ask(addr: &str, bytes: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

// The listener's bounds, without HAProxy: garbage and an over-long line are answered `down`
// with the reason, a sender that says nothing is answered once the name's wait is over, a
// flood of silent connections past the cap does not keep a real poll from its answer, and
// the engine's own listener answers `/status` throughout.
#[test]
fn garbage_slow_senders_and_floods_never_block_the_agent_check() {
    let [agent_port] = free_ports();
    let agent_extra =
        format!("haproxy_agent_listen = \"127.0.0.1:{agent_port}\"\nmax_connections = 16");
    let stack = Stack::start_launch(Launch {
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    let addr = format!("127.0.0.1:{agent_port}");
    let ok = ask(&addr, b"e2e\n");
    assert!(ok.starts_with("up ready 100% maxconn:100000 #"), "{ok:?}");
    assert_eq!(ok.matches('\n').count(), 1, "{ok:?}");
    let a = ask(&addr, b"\xff\xfe\xfd\n");
    assert!(
        a.starts_with("down ready") && a.contains("not UTF-8"),
        "{a:?}"
    );
    let a = ask(&addr, &[b'x'; 4096]);
    assert!(
        a.starts_with("down ready") && a.contains("without a newline"),
        "{a:?}"
    );
    let a = ask(&addr, b"");
    assert!(
        a.starts_with("down ready") && a.contains("agent-send"),
        "{a:?}"
    );
    // 64 connections that send nothing, held open: four times the cap.
    let flood: Vec<std::net::TcpStream> = (0..64)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    for _ in 0..5 {
        let a = ask(&addr, b"e2e\n");
        assert!(a.starts_with("up ready"), "a poll during the flood: {a:?}");
        let (code, body) = stack
            .get(&stack.status_url())
            .expect("/status during the flood");
        assert_eq!((code, body.as_str()), (200, r#"{"status":"normal"}"#));
    }
    drop(flood);
    let log = stack.agent_log();
    assert!(log.contains("agent check answered down"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

// Issue 41: 20,000 polls naming no engine here (a distinct unknown name each, some over-long
// lines, some not UTF-8, some empty) are each answered `down` with the fixed line of their
// kind, which names neither the engine here nor what was sent, and write a few log lines in
// all (they wrote one each, 2.89 MB), none with the client's text.
#[test]
fn twenty_thousand_bad_polls_write_a_few_log_lines_and_echo_nothing() {
    let [agent_port] = free_ports();
    let agent_extra = format!("haproxy_agent_listen = \"127.0.0.1:{agent_port}\"");
    let stack = Stack::start_launch(Launch {
        agent_extra: &agent_extra,
        ..Launch::default()
    });
    let addr = format!("127.0.0.1:{agent_port}");
    assert!(ask(&addr, b"e2e\n").starts_with("up ready"));
    let before = stack.agent_log().len();
    const THREADS: usize = 4;
    const POLLS: usize = 20_000;
    let answers: Vec<String> = (0..THREADS)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut odd = Vec::new();
                for i in (t..POLLS).step_by(THREADS) {
                    let sent: Vec<u8> = match i % 100 {
                        0 => vec![b'x'; 600],
                        1 => b"\xff\xfe-secret\n".to_vec(),
                        2 => b"\n".to_vec(),
                        _ => format!("secret-{i}\n").into_bytes(),
                    };
                    let a = ask(&addr, &sent);
                    let fixed = [
                        "down ready 100% maxconn:100000 #no engine of that name here\n",
                        "down ready 100% maxconn:100000 #no engine name: more than 512 bytes without a newline\n",
                        "down ready 100% maxconn:100000 #no engine name: not UTF-8 text\n",
                    ];
                    if !fixed.contains(&a.as_str()) && !a.contains("agent-send") {
                        odd.push(a);
                    }
                }
                odd
            })
        })
        .flat_map(|t| t.join().unwrap())
        .collect();
    let log = stack.agent_log();
    let added = &log[before..];
    let lines: Vec<&str> = added
        .lines()
        .filter(|l| l.contains("agent check"))
        .collect();
    println!(
        "{POLLS} bad polls: {} log lines about them, the log grew by {} bytes",
        lines.len(),
        added.len()
    );
    assert!(
        answers.is_empty(),
        "answers other than the fixed ones: {:?}",
        &answers[..answers.len().min(5)]
    );
    assert!(
        !added.contains("secret") && !added.contains("xxxx"),
        "{added}"
    );
    assert!(
        (1..=8).contains(&lines.len()),
        "{} lines:\n{}",
        lines.len(),
        lines.join("\n")
    );
    for kind in ["unknown name", "over-long line", "not UTF-8", "no name"] {
        assert!(
            lines.iter().any(|l| l.contains(kind)),
            "no line of kind {kind:?}:\n{}",
            lines.join("\n")
        );
    }
}
