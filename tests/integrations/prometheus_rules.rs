//! The shipped Prometheus rules: the plain rules file and the PrometheusRule carry the same
//! groups; every alert has a severity, a summary naming what it is about and a runbook
//! section that exists; `promtool check rules` and the `promtool test rules` unit tests in
//! deploy/prometheus/tests/ pass (where promtool is installed; required under `CI=true`);
//! the runbook's `curl` lines carry the admin token where the route needs it.

use crate::support::prometheus::{self, repo};
use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn alerts(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

#[test]
fn the_prometheus_rule_carries_the_rules_file() {
    let plain = yaml(&prometheus::rules_file());
    let operator = yaml(&repo().join("deploy/kubernetes/prometheusrule.yaml"));
    assert_eq!(operator["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(
        operator["spec"]["groups"], plain["groups"],
        "deploy/kubernetes/prometheusrule.yaml's spec.groups differ from deploy/prometheus/npu-health-agent.rules.yml's groups: copy them under spec:, indented by two spaces"
    );
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_section() {
    let rules = yaml(&prometheus::rules_file());
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| anchor(h.trim_start_matches('#')))
        .collect();
    let list = alerts(&rules);
    let names: Vec<&str> = list.iter().filter_map(|a| a["alert"].as_str()).collect();
    // The alerts the issue asks for, at least.
    for must in [
        "NpuHealthEngineAbnormal",
        "NpuHealthEngineNotReady",
        "NpuHealthQosDegraded",
        "NpuHealthNpuStale",
        "NpuHealthNpuGone",
        "NpuHealthNpuFallbackSource",
        "NpuHealthSamplerStuck",
        "NpuHealthSamplerOverrunning",
        "NpuHealthAgentDown",
        "NpuHealthAgentAbsent",
        "NpuHealthKubernetesActionsFailing",
        "NpuHealthDriverErrorsRising",
    ] {
        assert!(names.contains(&must), "{must} missing: {names:?}");
    }
    for a in list {
        let name = a["alert"].as_str().unwrap();
        let severity = a["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        assert!(a["for"].as_str().is_some(), "{name}: no for:");
        let summary = a["annotations"]["summary"].as_str().unwrap_or_default();
        let about = [
            "$labels.engine",
            "$labels.id",
            "$labels.instance",
            "job npu-health-agent",
        ];
        assert!(
            about.iter().any(|l| summary.contains(l)),
            "{name}: the summary names no engine, NPU or node: {summary:?}"
        );
        let url = a["annotations"]["runbook_url"].as_str().unwrap_or_default();
        let (file, frag) = url.split_once('#').unwrap_or((url, ""));
        assert_eq!(file, "docs/runbook.md", "{name}: runbook_url {url:?}");
        assert_eq!(frag, name.to_lowercase(), "{name}: runbook_url {url:?}");
        assert!(
            anchors.contains(frag),
            "{name}: docs/runbook.md has no section #{frag}"
        );
        assert!(
            runbook.contains(&format!("| `{name}` |")),
            "{name}: not in docs/runbook.md's threshold table"
        );
    }
}

/// The admin listener's routes that `docs/endpoints.md` lists as guarded (its access column).
fn guarded_admin_routes() -> Vec<String> {
    let endpoints = std::fs::read_to_string(repo().join("docs/endpoints.md")).unwrap();
    let (_, admin) = endpoints
        .split_once("## The admin listener")
        .expect("docs/endpoints.md has the admin listener's section");
    let admin = admin.split("\n## ").next().unwrap_or_default();
    admin
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let access = cells.iter().rev().find(|c| !c.is_empty())?;
            let route = cells.get(1)?.strip_prefix("`GET ")?.strip_suffix('`')?;
            access.starts_with("guarded").then(|| route.to_owned())
        })
        .collect()
}

/// A value of `key = "..."` in `text`.
fn quoted_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let (_, rest) = text.split_once(&format!("{key} = \""))?;
    Some(rest.split_once('"')?.0)
}

// Issue 48: every `curl` line of the runbook that reads a route the admin token guards
// carries the token, and the runbook says how to get it where the shipped Kubernetes
// config keeps it (the Secret the DaemonSet mounts, the file the ConfigMap names).
#[test]
fn the_runbooks_curl_lines_carry_the_admin_token() {
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    let guarded = guarded_admin_routes();
    for must in ["/status/detail", "/qos", "/metrics"] {
        assert!(guarded.iter().any(|r| r == must), "{must}: {guarded:?}");
    }
    let mut checked = 0;
    for line in runbook.lines().filter(|l| l.contains("curl ")) {
        let reads = |route: &String| {
            line.match_indices(route.as_str()).any(|(at, _)| {
                let after = &line[at + route.len()..];
                line[..at].ends_with(":9400") && !after.starts_with(|c: char| c.is_alphanumeric())
            })
        };
        if guarded.iter().any(reads) {
            assert!(
                line.contains(r#"-H "Authorization: Bearer $TOKEN""#),
                "docs/runbook.md: a guarded route read without the token: {line}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} curl lines of guarded routes");
    let configmap =
        std::fs::read_to_string(repo().join("deploy/kubernetes/configmap.yaml")).unwrap();
    let token_file = quoted_value(&configmap, "admin_token_file").expect("admin_token_file");
    let daemonset =
        std::fs::read_to_string(repo().join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let secret = daemonset
        .lines()
        .find_map(|l| l.trim().strip_prefix("secretName: "))
        .expect("the admin token's Secret");
    assert!(
        runbook.contains(&format!("get secret {secret} ")) && runbook.contains(token_file),
        "docs/runbook.md says how to read the token: the Secret {secret}, mounted as {token_file}"
    );
    assert!(runbook.contains("TOKEN=$("), "docs/runbook.md sets TOKEN");
}

// Issue 48: the README sends a reader to the runbook for how an `abnormal` clears; every
// link into the runbook, from the README and the other docs, names a section it has.
#[test]
fn every_link_into_the_runbook_names_a_section_it_has() {
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| anchor(h.trim_start_matches('#')))
        .collect();
    let mut docs = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            docs.push(e.path());
        }
    }
    let mut links = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (at, _) in text.match_indices("runbook.md#") {
            let frag: String = text[at + "runbook.md#".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            assert!(
                anchors.contains(&frag),
                "{}: a link to docs/runbook.md#{frag}, a section it does not have",
                doc.display()
            );
            links.push(frag);
        }
    }
    assert!(
        links.iter().any(|l| l == "how-an-abnormal-clears"),
        "the README or a doc links to how an abnormal clears: {links:?}"
    );
}

fn promtool(args: &[&str], test: &str) -> Option<(bool, String)> {
    let bin = prometheus::binary("promtool", test)?;
    let out = Command::new(bin)
        .args(args)
        .current_dir(repo().join("deploy/prometheus/tests"))
        .output()
        .expect("run promtool");
    Some((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

// promtool's own checks. The unit tests fire each alert on a fault and keep it quiet on the
// measured benign case that bounds its `for:`; a rules file with one `for:` shortened fails
// them (so they can fail).
#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let test = "promtool_checks_the_rules_and_runs_their_unit_tests";
    let rules = prometheus::rules_file();
    let Some((ok, said)) = promtool(&["check", "rules", rules.to_str().unwrap()], test) else {
        return;
    };
    assert!(ok, "{said}");
    let tests: Vec<String> = std::fs::read_dir(repo().join("deploy/prometheus/tests"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.yml"))
        .collect();
    assert!(tests.len() >= 3, "{tests:?}");
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let (ok, said) = promtool(&args, test).unwrap();
    assert!(ok, "{said}");
    println!("{said}");

    // The same unit tests against a copy whose abnormal alert waits 15 s, not 1 min.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&rules).unwrap();
    let shortened = text.replacen(
        "expr: npu_health_agent_status{status=\"abnormal\"} == 1\n        for: 1m",
        "expr: npu_health_agent_status{status=\"abnormal\"} == 1\n        for: 15s",
        1,
    );
    assert_ne!(shortened, text, "the abnormal alert's for: moved");
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(dir.path().join("npu-health-agent.rules.yml"), shortened).unwrap();
    for t in &tests {
        std::fs::copy(
            repo().join("deploy/prometheus/tests").join(t),
            dir.path().join("tests").join(t),
        )
        .unwrap();
    }
    let bin = prometheus::binary("promtool", test).unwrap();
    let out = Command::new(bin)
        .args(&args)
        .current_dir(dir.path().join("tests"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && said.contains("NpuHealthEngineAbnormal"),
        "a 15 s for: passed the unit tests: {said}"
    );
}

#[test]
fn grafana_variables_are_filled_as_all() {
    assert_eq!(
        prometheus::fill(
            "rate(x{instance=~\"$node\", engine=~\"${engine}\"}[$__rate_interval])",
            "1m"
        ),
        "rate(x{instance=~\".*\", engine=~\".*\"}[1m])"
    );
    assert_eq!(prometheus::encode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
}
