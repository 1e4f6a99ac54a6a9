//! Which pod is the engine's (pure): exactly one candidate, or an error that says why none
//! or which ones; the mode never guesses.

use super::api::PodInfo;
use crate::integrations::kubernetes::config::PodSelector;

/// How the engine is reached, for the match by port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EngineAddr<'a> {
    pub host: &'a str,
    pub port: u16,
}

/// Whether `p` serves the engine's port: a container port of a host-network pod, a host port,
/// or a container port of the pod whose IP is the engine's host.
pub(crate) fn serves(p: &PodInfo, e: &EngineAddr<'_>) -> bool {
    p.ports.iter().any(|&(container, host)| {
        host == Some(e.port)
            || (container == e.port && (p.host_network || p.pod_ip.as_deref() == Some(e.host)))
    })
}

/// Whether `p` can be the engine's pod at all: not being deleted, not finished.
fn live(p: &PodInfo) -> bool {
    !p.deleting && !matches!(p.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// Picks the engine's pod among `candidates` (this node's pods, listed with the selector's
/// namespace and labels already applied by the API server).
pub(crate) fn pick<'p>(
    candidates: &'p [PodInfo],
    sel: &PodSelector,
    e: &EngineAddr<'_>,
) -> Result<&'p PodInfo, String> {
    let live: Vec<&PodInfo> = candidates.iter().filter(|p| live(p)).collect();
    let (matched, how): (Vec<&PodInfo>, String) = match &sel.pod_selector {
        Some(s) => (live, format!("labels {s:?}")),
        None => (
            live.into_iter().filter(|p| serves(p, e)).collect(),
            format!("port {}", e.port),
        ),
    };
    let scope = sel
        .namespace
        .as_deref()
        .map(|ns| format!(" in namespace {ns}"))
        .unwrap_or_default();
    match matched.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "no running pod on this node{scope} matches {how} ({} pods looked at); set [engine.kubernetes] pod or pod_selector",
            candidates.len()
        )),
        many => Err(format!(
            "{} pods on this node{scope} match {how} ({}); the mode does not guess: set [engine.kubernetes] pod or a narrower pod_selector",
            many.len(),
            many.iter().map(|p| p.key()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Checks a pod named in the config: it exists (the caller read it), is not being deleted,
/// and runs on this node when the node is known.
pub(crate) fn check_named(p: &PodInfo, node: Option<&str>) -> Result<(), String> {
    if !live(p) {
        return Err(format!(
            "pod {} is {}",
            p.key(),
            if p.deleting {
                "being deleted".to_owned()
            } else {
                p.phase.as_deref().unwrap_or("finished").to_owned()
            }
        ));
    }
    if let (Some(want), Some(on)) = (node, p.node.as_deref())
        && want != on
    {
        return Err(format!(
            "pod {} runs on node {on}, not on this node ({want})",
            p.key()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, host_network: bool, ip: &str, ports: &[(u16, Option<u16>)]) -> PodInfo {
        PodInfo {
            namespace: "inference".into(),
            name: name.into(),
            node: Some("n1".into()),
            host_network,
            pod_ip: Some(ip.into()),
            ports: ports.to_vec(),
            phase: Some("Running".into()),
            ..PodInfo::default()
        }
    }

    const E: EngineAddr<'static> = EngineAddr {
        host: "127.0.0.1",
        port: 8000,
    };

    #[test]
    fn the_port_finds_host_network_host_port_and_pod_ip_pods() {
        assert!(serves(&pod("a", true, "10.0.0.5", &[(8000, None)]), &E));
        assert!(serves(
            &pod("b", false, "10.1.2.3", &[(80, Some(8000))]),
            &E
        ));
        let by_ip = EngineAddr {
            host: "10.1.2.3",
            port: 8000,
        };
        assert!(serves(
            &pod("c", false, "10.1.2.3", &[(8000, None)]),
            &by_ip
        ));
        // A pod network's container port is not the node's port.
        assert!(!serves(&pod("d", false, "10.1.2.4", &[(8000, None)]), &E));
        assert!(!serves(&pod("e", true, "10.0.0.5", &[(8001, None)]), &E));
    }

    #[test]
    fn exactly_one_or_an_error_naming_them() {
        let sel = PodSelector::default();
        let pods = vec![
            pod("vllm-0", true, "10.0.0.5", &[(8000, None)]),
            pod("other", true, "10.0.0.5", &[(9000, None)]),
        ];
        assert_eq!(pick(&pods, &sel, &E).unwrap().name, "vllm-0");
        let mut two = pods.clone();
        two.push(pod("vllm-1", true, "10.0.0.5", &[(8000, None)]));
        let err = pick(&two, &sel, &E).unwrap_err();
        assert!(
            err.contains("2 pods") && err.contains("inference/vllm-1"),
            "{err}"
        );
        let err = pick(&pods[1..], &sel, &E).unwrap_err();
        assert!(
            err.contains("no running pod") && err.contains("port 8000"),
            "{err}"
        );
        // A pod being deleted, or finished, is not a candidate.
        let mut gone = two.clone();
        gone[2].deleting = true;
        assert_eq!(pick(&gone, &sel, &E).unwrap().name, "vllm-0");
        gone[0].phase = Some("Failed".into());
        assert!(pick(&gone, &sel, &E).is_err());
    }

    #[test]
    fn a_label_selector_takes_what_the_api_matched() {
        let sel = PodSelector {
            pod_selector: Some("app=vllm".into()),
            ..PodSelector::default()
        };
        // The API server applied the labels; the port does not matter then.
        let pods = vec![pod("vllm-0", false, "10.1.1.1", &[])];
        assert_eq!(pick(&pods, &sel, &E).unwrap().name, "vllm-0");
        let err = pick(&[], &sel, &E).unwrap_err();
        assert!(err.contains("labels \"app=vllm\""), "{err}");
    }

    #[test]
    fn a_named_pod_must_be_live_and_here() {
        let p = pod("vllm-0", true, "10.0.0.5", &[]);
        assert!(check_named(&p, Some("n1")).is_ok());
        assert!(check_named(&p, None).is_ok());
        assert!(
            check_named(&p, Some("n2"))
                .unwrap_err()
                .contains("runs on node n1")
        );
        let mut d = p.clone();
        d.deleting = true;
        assert!(
            check_named(&d, Some("n1"))
                .unwrap_err()
                .contains("being deleted")
        );
    }
}
