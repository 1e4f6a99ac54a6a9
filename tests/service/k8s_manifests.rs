//! The agent's side of the Kubernetes manifests (deploy/kubernetes, issue 39): the agent.toml
//! in the ConfigMap goes through the agent's own loader, the DaemonSet's command line through
//! the agent's own flag parser, and every value the other manifests must agree with (the
//! probes' and the Service's port, the token's Secret, the service account token, the state
//! directory's volume, the kubelet's PodResources socket's read-only hostPath, the examples'
//! mgmt port and readiness gate) is the value those parsed.
//! The Kubernetes schemas and the rules about the manifests alone stay in
//! scripts/validate-k8s. Each rule here is shown to fail on a copy with one mistake.

use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use npu_health_agent::agent::AfterHandover;
use npu_health_agent::agent::preflight;
use npu_health_agent::cli::{Cli, Command};
use npu_health_agent::config::agent::POD_RESOURCES_SOCKET;
use npu_health_agent::integrations::kubernetes::config::{
    DEFAULT_CONDITION_TYPE, KubernetesConfig,
};
use npu_health_agent::logging::LogFormat;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The agent's path in the image: the container whose command line holds it is the agent's.
const AGENT_BIN: &str = "/usr/bin/npu-health-agent";
/// Bounds of `run --wait-for-ports`. The wait matters only in a rollout from an agent that
/// cannot hand over: the old pod goes once the new one has been ready for minReadySeconds,
/// plus the old agent's stop. Below 30 s the new agent may give up and crash-loop first;
/// above 5 min a port something else holds for good leaves the pod Running with no listener
/// instead of crash-looping with the bind error where `kubectl get pods` shows it.
const WAIT_FOR_PORTS: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(30)..=Duration::from_secs(300);

/// The manifests: path under deploy/kubernetes -> text.
type Files = BTreeMap<String, String>;

fn shipped() -> Files {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut files = Files::new();
    for sub in ["", "examples/"] {
        for entry in std::fs::read_dir(root.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let name = path.file_name().unwrap().to_string_lossy();
                files.insert(
                    format!("{sub}{name}"),
                    std::fs::read_to_string(&path).unwrap(),
                );
            }
        }
    }
    files
}

/// The one document of `kind` in `file`, as its typed Kubernetes object.
fn one<T: DeserializeOwned>(files: &Files, file: &str, kind: &str) -> Result<T, String> {
    let text = files.get(file).ok_or(format!("{file}: missing"))?;
    let mut found = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let mut v = Value::deserialize(doc).map_err(|e| format!("{file}: YAML: {e}"))?;
        octal_modes(&mut v);
        if v.get("kind").and_then(Value::as_str) == Some(kind) {
            found.push(v);
        }
    }
    match <[Value; 1]>::try_from(found) {
        Ok([v]) => serde_yaml_ng::from_value(v).map_err(|e| format!("{file}: {kind}: {e}")),
        Err(f) => Err(format!("{file}: {} {kind} documents, not one", f.len())),
    }
}

/// File modes such as `defaultMode: 0444` as numbers: Kubernetes reads YAML 1.1, where a
/// leading 0 makes an octal number; serde_yaml_ng reads YAML 1.2, where it is a string.
fn octal_modes(v: &mut Value) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m.iter_mut() {
                let mode = matches!(k.as_str(), Some("defaultMode" | "mode"));
                let octal = v.as_str().filter(|s| s.starts_with('0'));
                match octal.and_then(|s| i64::from_str_radix(s, 8).ok()) {
                    Some(n) if mode => *v = Value::from(n),
                    _ => octal_modes(v),
                }
            }
        }
        Value::Sequence(s) => s.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

fn pod_spec(template: Option<PodSpec>, file: &str) -> Result<PodSpec, String> {
    template.ok_or(format!("{file}: no pod template"))
}

fn http_port(probe: &Option<Probe>) -> Option<&IntOrString> {
    probe.as_ref()?.http_get.as_ref().map(|g| &g.port)
}

fn http_path(probe: &Option<Probe>) -> Option<&str> {
    probe.as_ref()?.http_get.as_ref()?.path.as_deref()
}

fn command_line(c: &Container) -> Vec<String> {
    let mut argv = c.command.clone().unwrap_or_default();
    argv.extend(c.args.clone().unwrap_or_default());
    argv
}

/// What the manifests get wrong about the agent, one line each (none for good manifests).
/// `scratch` is a directory of the test's own, where agent.toml is written to be loaded.
fn problems(files: &Files, scratch: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(e) = check(files, scratch, &mut out) {
        out.push(e);
    }
    out
}

/// The rules: a broken step that the later ones need returns its error; the others push.
fn check(files: &Files, scratch: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let ds: DaemonSet = one(files, "daemonset.yaml", "DaemonSet")?;
    let pod = pod_spec(ds.spec.and_then(|s| s.template.spec), "daemonset.yaml")?;
    let agent = pod
        .containers
        .iter()
        .find(|c| command_line(c).iter().any(|a| a == AGENT_BIN))
        .ok_or(format!("daemonset.yaml: no container runs {AGENT_BIN}"))?;
    let at = format!("daemonset.yaml: container {}", agent.name);

    // The command line, read by the agent's own parser (what the agent in the pod will do).
    let argv = command_line(agent);
    let tail = &argv[argv.iter().position(|a| a == AGENT_BIN).unwrap() + 1..];
    let cli = Cli::try_parse_from(
        std::iter::once("npu-health-agent").chain(tail.iter().map(String::as_str)),
    )
    .map_err(|e| {
        format!(
            "{at}: the agent refuses its command line {tail:?}: {}",
            e.to_string().lines().next().unwrap_or_default()
        )
    })?;
    if cli.driver.log_format != LogFormat::Json {
        out.push(format!(
            "{at}: --log-format is {:?}, not json",
            cli.driver.log_format
        ));
    }
    let Command::Run(run) = &cli.command else {
        return Err(format!("{at}: does not run `npu-health-agent run`"));
    };
    // Once handed over, the old agent must idle until its pod is deleted: an exit would
    // restart its container, which would take the sockets back.
    if run.after_handover != AfterHandover::Wait {
        out.push(format!(
            "{at}: `run --after-handover` is {:?}, not wait",
            run.after_handover
        ));
    }
    match run.wait_for_ports {
        Some(d) if WAIT_FOR_PORTS.contains(&d) => {}
        other => out.push(format!(
            "{at}: `run --wait-for-ports` is {other:?}, not within {:?}",
            WAIT_FOR_PORTS
        )),
    }

    // agent.toml: the ConfigMap key that --config names, through a directory mount (no
    // subPath, so the kubelet's updates reach the pod).
    let config = run
        .config
        .config
        .clone()
        .ok_or(format!("{at}: `run` has no --config"))?;
    let (dir, key) = (
        config.parent().unwrap_or(Path::new("/")),
        config.file_name().unwrap_or_default(),
    );
    let volumes = pod.volumes.clone().unwrap_or_default();
    let mounts = agent.volume_mounts.clone().unwrap_or_default();
    let map_name = mounts
        .iter()
        .filter(|m| {
            Path::new(&m.mount_path) == dir && m.sub_path.is_none() && m.sub_path_expr.is_none()
        })
        .find_map(|m| {
            let v = volumes.iter().find(|v| v.name == m.name)?;
            Some(v.config_map.as_ref()?.name.clone())
        })
        .ok_or(format!(
            "{at}: --config {} is not in a ConfigMap mounted as a directory",
            config.display()
        ))?;
    let cm: ConfigMap = one(files, "configmap.yaml", "ConfigMap")?;
    if cm.metadata.name.as_deref() != Some(map_name.as_str()) {
        return Err(format!(
            "{at}: mounts ConfigMap {map_name}, not configmap.yaml's {:?}",
            cm.metadata.name
        ));
    }
    let text = cm
        .data
        .unwrap_or_default()
        .remove(&*key.to_string_lossy())
        .ok_or(format!("configmap.yaml: no key {}", key.to_string_lossy()))?;

    // The agent's loader: the file alone, then as `run` loads it with the DaemonSet's flags
    // (--state-dir and the driver flags applied, the checks across tables), then the host
    // checks `check-config` makes of the files it names. Not the rest of `check-config`: the
    // NPUs and the free ports are this machine's, not the manifests'.
    let path = scratch.join("agent.toml");
    std::fs::write(&path, &text).unwrap();
    let file = npu_health_agent::config::file::load(&path)
        .map_err(|e| format!("configmap.yaml: agent.toml: {e}"))?;
    let mut args = run.config.clone();
    args.config = Some(path);
    let mut cfg = args
        .load(&cli.driver)
        .map_err(|e| format!("{at}: `run` refuses agent.toml with the DaemonSet's flags: {e:?}"))?;
    if cfg.agent.admin_auth.token_file.is_some() {
        // The Secret is the cluster's: a stand-in token where the check reads one.
        let stand_in = scratch.join("token");
        std::fs::write(&stand_in, "k8s-manifests-stand-in-token\n").unwrap();
        cfg.agent.admin_auth.token_file = Some(stand_in);
    }
    preflight::host(&cfg, None).map_err(|e| format!("configmap.yaml: agent.toml: {e}"))?;

    // admin_listen: on the node's address, where the kubelet probes and Prometheus scrapes.
    let admin_port = match cfg.agent.admin_listen {
        None => return Err("configmap.yaml: agent.toml sets no [agent] admin_listen (the probes' and the Service's port)".into()),
        Some(a) => {
            if a.ip().is_loopback() {
                out.push(format!("configmap.yaml: admin_listen {a} is loopback; the kubelet probes the node's address"));
            }
            IntOrString::Int(a.port().into())
        }
    };
    for (name, probe) in [
        ("readinessProbe", &agent.readiness_probe),
        ("livenessProbe", &agent.liveness_probe),
    ] {
        if http_port(probe) != Some(&admin_port) {
            out.push(format!(
                "{at}: {name} port {:?} is not admin_listen's {admin_port:?}",
                http_port(probe)
            ));
        }
    }
    let svc: Service = one(files, "service.yaml", "Service")?;
    let metrics = svc
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.name.as_deref() == Some("metrics"));
    match metrics {
        Some(p)
            if IntOrString::Int(p.port) == admin_port
                && p.target_port.as_ref().is_none_or(|t| *t == admin_port) => {}
        other => out.push(format!(
            "service.yaml: port metrics {other:?} does not reach admin_listen's {admin_port:?}"
        )),
    }

    // admin_token_file: admin_listen is on every interface, so the admin routes need the
    // token, from the Secret volume mounted where the file says.
    match &file.agent.admin_auth.token_file {
        None => out.push("configmap.yaml: agent.toml sets no [agent] admin_token_file, and admin_listen is on every interface".into()),
        Some(t) => {
            let in_secret = mounts.iter().any(|m| {
                Some(Path::new(&m.mount_path)) == t.parent()
                    && volumes.iter().any(|v| v.name == m.name && v.secret.is_some())
            });
            if !in_secret {
                out.push(format!("{at}: admin_token_file {} is not in a mounted Secret", t.display()));
            }
        }
    }

    // The service account token is mounted exactly when the Kubernetes API mode is on.
    let api_mode = KubernetesConfig::of(&cfg.agent).is_some();
    if pod.automount_service_account_token != Some(api_mode) {
        out.push(format!(
            "daemonset.yaml: automountServiceAccountToken is {:?}, and [agent.kubernetes] is {}",
            pod.automount_service_account_token,
            if api_mode { "set" } else { "not set" }
        ));
    }

    // The state directory: the next agent pod on the node finds the state file and the
    // handover socket there, so it is a hostPath, mounted writable in the agent only. (That
    // this hostPath is the only writable one, under /run/, whole and typed, is the script's.)
    match &file.agent.state_dir {
        None => out.push("configmap.yaml: agent.toml sets no [agent] state_dir".into()),
        Some(dir) => {
            if cfg.agent.state_dir.as_ref() != Some(dir) {
                out.push(format!(
                    "{at}: `run --state-dir` {:?} overrides agent.toml's state_dir {}",
                    cfg.agent.state_dir,
                    dir.display()
                ));
            }
            let at_dir: Vec<(&Container, _)> = pod
                .containers
                .iter()
                .chain(pod.init_containers.iter().flatten())
                .flat_map(|c| c.volume_mounts.iter().flatten().map(move |m| (c, m)))
                .filter(|(_, m)| Path::new(&m.mount_path) == dir)
                .collect();
            match at_dir.as_slice() {
                [(c, m)] => {
                    if c.name != agent.name {
                        out.push(format!("daemonset.yaml: state_dir {} is mounted in container {}, not the agent's", dir.display(), c.name));
                    }
                    if !volumes
                        .iter()
                        .any(|v| v.name == m.name && v.host_path.is_some())
                    {
                        out.push(format!(
                            "daemonset.yaml: volume {} at state_dir {} is not a hostPath",
                            m.name,
                            dir.display()
                        ));
                    }
                    if m.read_only == Some(true) {
                        out.push(format!(
                            "daemonset.yaml: state_dir {} is mounted read-only",
                            dir.display()
                        ));
                    }
                }
                other => out.push(format!(
                    "daemonset.yaml: {} volume mounts at state_dir {}, not one",
                    other.len(),
                    dir.display()
                )),
            }
        }
    }

    // pod_resources_socket (issue 42): the kubelet's socket in its directory on the host,
    // mounted read-only in the agent: the directory, not the socket, whose inode a restarted
    // kubelet replaces.
    let kubelet = Path::new(POD_RESOURCES_SOCKET);
    match &file.agent.pod_resources {
        None => out.push("configmap.yaml: agent.toml sets no [agent] pod_resources_socket (the pod labels of /metrics)".into()),
        Some(p) => {
            let host_dir = |m: &&k8s_openapi::api::core::v1::VolumeMount| {
                let v = volumes.iter().find(|v| v.name == m.name)?;
                Some(Path::new(&v.host_path.as_ref()?.path).to_owned())
            };
            let mount = mounts
                .iter()
                .find(|m| Some(Path::new(&m.mount_path)) == p.socket.parent());
            match mount.map(|m| (m, host_dir(&m))) {
                Some((m, Some(dir)))
                    if Some(dir.as_path()) == kubelet.parent()
                        && p.socket.file_name() == kubelet.file_name()
                        && m.sub_path.is_none() =>
                {
                    if m.read_only != Some(true) {
                        out.push(format!("{at}: the kubelet's {} is mounted writable", dir.display()));
                    }
                }
                _ => out.push(format!(
                    "{at}: pod_resources_socket {} is not the kubelet's {} through a hostPath of its directory",
                    p.socket.display(),
                    kubelet.display()
                )),
            }
        }
    }

    // The examples: the engine's probes on the mgmt_port of the [[engine]] whose port is the
    // startupProbe's, and the readiness gate on the condition the agent sets.
    let file_name = "examples/vllm-with-agent-probes.yaml";
    let dep: Deployment = one(files, file_name, "Deployment")?;
    let pod = pod_spec(dep.spec.and_then(|s| s.template.spec), file_name)?;
    let engine = pod
        .containers
        .iter()
        .find(|c| http_path(&c.readiness_probe) == Some("/readyz"))
        .ok_or(format!(
            "{file_name}: no container has a readinessProbe on /readyz"
        ))?;
    let (start, ready) = (
        http_port(&engine.startup_probe),
        http_port(&engine.readiness_probe),
    );
    let matching = cfg.engines.iter().any(|e| {
        start == Some(&IntOrString::Int(e.port.into()))
            && ready == Some(&IntOrString::Int(e.mgmt_listen.port().into()))
    });
    if !matching {
        out.push(format!("{file_name}: the probes' port {ready:?} is not the mgmt_port of an [[engine]] on the startupProbe's port {start:?}"));
    }
    let file_name = "examples/vllm-with-readiness-gate.yaml";
    let dep: Deployment = one(files, file_name, "Deployment")?;
    let pod = pod_spec(dep.spec.and_then(|s| s.template.spec), file_name)?;
    let condition = KubernetesConfig::of(&cfg.agent)
        .map_or(DEFAULT_CONDITION_TYPE, |k| k.condition_type.as_str());
    if !pod
        .readiness_gates
        .iter()
        .flatten()
        .any(|g| g.condition_type == condition)
    {
        out.push(format!("{file_name}: no readinessGate has conditionType {condition} (the agent's condition_type)"));
    }
    Ok(())
}

#[test]
fn the_shipped_manifests_agree_with_the_agents_own_reading_of_agent_toml() {
    let scratch = tempfile::tempdir().unwrap();
    let found = problems(&shipped(), scratch.path());
    assert!(found.is_empty(), "{found:#?}");
}

/// A copy of the shipped manifests with one mistake, and a phrase of the problem it must give.
struct Mistake {
    file: &'static str,
    from: &'static str,
    to: &'static str,
    says: &'static str,
}

const fn mistake(
    file: &'static str,
    from: &'static str,
    to: &'static str,
    says: &'static str,
) -> Mistake {
    Mistake {
        file,
        from,
        to,
        says,
    }
}

#[test]
fn each_mistake_about_the_agent_in_the_manifests_is_found() {
    let cm = "configmap.yaml";
    let ds = "daemonset.yaml";
    let mistakes = [
        mistake(
            cm,
            "sample_period = \"50ms\"",
            "sample_period = 50ms",
            "agent.toml: ",
        ),
        mistake(cm, "mgmt_port = 9002", "mgmt_prot = 9002", "unknown key"),
        mistake(
            cm,
            "npu_usage_threshold = 10\n\n    [[engine]]",
            "npu_usage_threshold = 10\n    health_collector_timeout = 0\n\n    [[engine]]",
            "health_collector_timeout must be >= 1",
        ),
        mistake(
            cm,
            "admin_listen = \"0.0.0.0:9400\"",
            "admin_listen = \"0.0.0.0:9500\"",
            "not admin_listen's",
        ),
        mistake(
            cm,
            "admin_listen = \"0.0.0.0:9400\"",
            "admin_listen = \"127.0.0.1:9400\"",
            "is loopback",
        ),
        mistake(
            cm,
            "    admin_listen = \"0.0.0.0:9400\"\n",
            "",
            "there is no admin listener",
        ),
        mistake(
            cm,
            "    admin_token_file = \"/etc/npu-health-agent-admin/token\"\n",
            "",
            "sets no [agent] admin_token_file",
        ),
        mistake(
            cm,
            "admin_token_file = \"/etc/npu-health-agent-admin/token\"",
            "admin_token_file = \"/etc/npu-health-agent/token\"",
            "is not in a mounted Secret",
        ),
        mistake(
            cm,
            "state_dir = \"/run/npu-health-agent\"",
            "state_dir = \"/run/npu-health-agent-2\"",
            "0 volume mounts at state_dir",
        ),
        mistake(
            cm,
            "    state_dir = \"/run/npu-health-agent\"\n",
            "",
            "sets no [agent] state_dir",
        ),
        mistake(
            cm,
            "state_dir = \"/run/npu-health-agent\"",
            "state_dir = \"run/npu-health-agent\"",
            "state_dir",
        ),
        mistake(
            cm,
            "mgmt_port = 9001",
            "mgmt_port = 9011",
            "is not the mgmt_port of an [[engine]]",
        ),
        mistake(
            cm,
            "    # [agent.kubernetes]\n",
            "    [agent.kubernetes]\n    condition_type = \"example.com/npu-ready\"\n",
            "no readinessGate has conditionType example.com/npu-ready",
        ),
        mistake(
            cm,
            "    # [agent.kubernetes]\n",
            "    [agent.kubernetes]\n",
            "automountServiceAccountToken is Some(false), and [agent.kubernetes] is set",
        ),
        mistake(
            cm,
            "    pod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"\n",
            "",
            "sets no [agent] pod_resources_socket",
        ),
        mistake(
            cm,
            "pod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"",
            "pod_resources_socket = \"/var/lib/kubelet/kubelet.sock\"",
            "is not the kubelet's /var/lib/kubelet/pod-resources/kubelet.sock",
        ),
        mistake(
            cm,
            "pod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"",
            "pod_resources_socket = \"/var/lib/kubelet/pod-resources/other.sock\"",
            "is not the kubelet's",
        ),
        mistake(
            ds,
            "            path: /var/lib/kubelet/pod-resources\n",
            "            path: /var/lib/kubelet/device-plugins\n",
            "is not the kubelet's",
        ),
        mistake(
            ds,
            "mountPath: /var/lib/kubelet/pod-resources\n              readOnly: true",
            "mountPath: /var/lib/kubelet/pod-resources",
            "the kubelet's /var/lib/kubelet/pod-resources is mounted writable",
        ),
        mistake(
            ds,
            "automountServiceAccountToken: false",
            "automountServiceAccountToken: true",
            "[agent.kubernetes] is not set",
        ),
        mistake(
            ds,
            "- --log-format\n            - json",
            "- --log-format\n            - text",
            "--log-format is Text",
        ),
        mistake(
            ds,
            "            - --after-handover\n            - wait\n",
            "",
            "--after-handover` is Exit",
        ),
        mistake(
            ds,
            "- --after-handover\n            - wait",
            "- --after-handover\n            - exit",
            "--after-handover` is Exit",
        ),
        mistake(
            ds,
            "- --after-handover\n            - wait",
            "- --after-handover\n            - stay",
            "refuses its command line",
        ),
        mistake(ds, "- 120s", "- 10s", "--wait-for-ports` is Some(10s)"),
        mistake(ds, "- 120s", "- 1h", "--wait-for-ports` is Some(3600s)"),
        mistake(ds, "- 120s", "- \"120\"", "refuses its command line"),
        mistake(
            ds,
            "            - --wait-for-ports\n            - 120s\n",
            "",
            "--wait-for-ports` is None",
        ),
        mistake(
            ds,
            "- json\n            - run\n",
            "- json\n            - check-config\n",
            "unexpected argument '--after-handover'",
        ),
        mistake(
            ds,
            "- /etc/npu-health-agent/agent.toml",
            "- /etc/npu-health-agent/agent.toml\n            - --state-dir\n            - /run/other",
            "overrides agent.toml's state_dir",
        ),
        mistake(
            ds,
            "- /etc/npu-health-agent/agent.toml",
            "- /etc/npu-health-agent-admin/agent.toml",
            "is not in a ConfigMap mounted as a directory",
        ),
        mistake(
            ds,
            "- /etc/npu-health-agent/agent.toml",
            "- /etc/npu-health-agent/other.toml",
            "no key other.toml",
        ),
        mistake(
            ds,
            "mountPath: /etc/npu-health-agent\n",
            "mountPath: /etc/npu-health-agent\n              subPath: agent.toml\n",
            "is not in a ConfigMap mounted as a directory",
        ),
        mistake(
            ds,
            "port: 9400\n            periodSeconds: 10\n            timeoutSeconds: 2\n            failureThreshold: 3",
            "port: 9401\n            periodSeconds: 10\n            timeoutSeconds: 2\n            failureThreshold: 3",
            "readinessProbe port",
        ),
        mistake(
            ds,
            "mountPath: /run/npu-health-agent",
            "mountPath: /run/npu-health-agent\n              readOnly: true",
            "is mounted read-only",
        ),
        mistake(
            ds,
            "- name: tmp\n              mountPath: /tmp",
            "- name: tmp\n              mountPath: /run/npu-health-agent",
            "2 volume mounts at state_dir",
        ),
        mistake(
            ds,
            "          hostPath:\n            path: /run/npu-health-agent\n            type: DirectoryOrCreate",
            "          emptyDir:\n            medium: Memory",
            "is not a hostPath",
        ),
        mistake(
            "service.yaml",
            "targetPort: 9400",
            "targetPort: 9401",
            "does not reach admin_listen's",
        ),
        mistake(
            "examples/vllm-with-agent-probes.yaml",
            "path: /readyz\n              port: 9001",
            "path: /readyz\n              port: 9002",
            "is not the mgmt_port",
        ),
        mistake(
            "examples/vllm-with-readiness-gate.yaml",
            "conditionType: npu-health-agent.io/qos-ready",
            "conditionType: npu-health-agent.io/qos-raedy",
            "no readinessGate has conditionType npu-health-agent.io/qos-ready",
        ),
    ];
    let scratch = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for m in &mistakes {
        let mut files = shipped();
        let text = files.get_mut(m.file).unwrap();
        assert_eq!(
            text.matches(m.from).count(),
            1,
            "{}: {:?} must occur once",
            m.file,
            m.from
        );
        *text = text.replacen(m.from, m.to, 1);
        let found = problems(&files, scratch.path());
        if !found.iter().any(|p| p.contains(m.says)) {
            failures.push(format!(
                "{} {:?} -> {:?}: want {:?}, found {found:#?}",
                m.file, m.from, m.to, m.says
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
