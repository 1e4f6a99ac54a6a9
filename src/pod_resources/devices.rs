//! From the kubelet's answer to who holds each NPU: which NPU a device id names, and the
//! holder of each NPU the agent samples.
//!
//! The Ascend device plugin (MindCluster's `component/ascend-device-plugin`,
//! `pkg/device/ascendcommon.go`) advertises resources `huawei.com/<kind>` and names a whole
//! NPU `<kind>-<physical id>`: `huawei.com/Ascend910` with `Ascend910-3`, `Ascend310P-0`,
//! `Ascend310P-V-2` (310P mixed mode), and `huawei.com/npu` with `npu-5` on a 950. It also
//! hands out parts of an NPU: a vNPU as `huawei.com/Ascend910-2c` with
//! `Ascend910-2c-<vdev>-<physical id>`, and in its shared mode `Ascend910-<physical id>-<n>`.
//!
//! The agent knows its NPUs by logic id, and by the physical id the driver gives for each
//! ([`crate::driver::DeviceInfo::phy_id`]). A device id is mapped only when it names a whole
//! NPU whose physical id one of the agent's NPUs has; anything else is skipped with a note,
//! never guessed: a part of an NPU (its pod shares the NPU, and no one pod owns the NPU's
//! series), an id not in the plugin's form, a physical id no NPU of the agent has (the driver
//! did not give the ids, or the NPU is not sampled). Resources of other vendors are not the
//! agent's and are passed over without a note.

use super::proto::ListPodResourcesResponse;
use std::collections::BTreeMap;

/// The prefix of the Ascend device plugin's resource names.
pub const RESOURCE_PREFIX: &str = "huawei.com/";

/// Who holds an NPU: one container of one pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} container {}",
            self.namespace, self.pod, self.container
        )
    }
}

/// What one device id of the answer names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A whole NPU, by its physical id.
    Whole(u32),
    /// A resource that is not the Ascend device plugin's (another vendor's): not the agent's.
    Other,
    /// The device plugin's id, but not of one whole NPU the agent can name: why.
    Unmapped(String),
}

/// What the device id `id` of the resource `resource` names.
pub fn name_of(resource: &str, id: &str) -> Named {
    let Some(kind) = resource
        .strip_prefix(RESOURCE_PREFIX)
        .filter(|k| k.starts_with("Ascend") || *k == "npu")
    else {
        return Named::Other;
    };
    let Some(rest) = id.strip_prefix(kind).and_then(|r| r.strip_prefix('-')) else {
        return Named::Unmapped(format!(
            "{id:?} of {resource} does not start with \"{kind}-\""
        ));
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(rest) {
        return match rest.parse() {
            Ok(phy) => Named::Whole(phy),
            Err(_) => Named::Unmapped(format!("{id:?}: physical id {rest} is out of range")),
        };
    }
    if rest.split('-').all(digits) {
        return Named::Unmapped(format!(
            "{id:?} of {resource} is a part of an NPU (a vNPU, or the device plugin's shared mode), not a whole NPU"
        ));
    }
    Named::Unmapped(format!(
        "{id:?} of {resource}: {rest:?} is not a physical id"
    ))
}

/// The holder of each NPU, by logic id, as of one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    pub holders: BTreeMap<u32, Holder>,
}

impl Assignment {
    /// Who holds the NPU with logic id `id`.
    pub fn npu(&self, id: u32) -> Option<&Holder> {
        self.holders.get(&id)
    }

    /// The engine's holder: the pod that holds every NPU of `ids`, in its container when one
    /// container holds them all (else the container is empty); `None` when some NPU has no
    /// holder, they belong to different pods, or `ids` is empty.
    pub fn engine(&self, ids: &[u32]) -> Option<Holder> {
        let mut held = ids.iter().map(|id| self.npu(*id));
        let first = held.next()??.clone();
        let mut out = first;
        for h in held {
            let h = h?;
            if (&h.namespace, &h.pod) != (&out.namespace, &out.pod) {
                return None;
            }
            if h.container != out.container {
                out.container.clear();
            }
        }
        Some(out)
    }
}

/// The holders of the agent's NPUs (`npus`: logic id and physical id, if the driver gave
/// one) in `list`, and a note for each device id of the plugin that names none of them.
pub fn assign(
    list: &ListPodResourcesResponse,
    npus: &[(u32, Option<u32>)],
) -> (Assignment, Vec<String>) {
    let mut notes = Vec::new();
    let mut claims: BTreeMap<u32, Vec<Holder>> = BTreeMap::new();
    for pod in &list.pod_resources {
        for c in &pod.containers {
            let holder = Holder {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: c.name.clone(),
            };
            for d in &c.devices {
                for id in &d.device_ids {
                    match name_of(&d.resource_name, id) {
                        Named::Other => {}
                        Named::Unmapped(why) => notes.push(format!("{holder}: {why}; skipped")),
                        Named::Whole(phy) => match npus.iter().find(|(_, p)| *p == Some(phy)) {
                            Some((logic, _)) => claims.entry(*logic).or_default().push(holder.clone()),
                            None => notes.push(format!(
                                "{holder}: {id:?} names physical id {phy}, which no NPU of this agent has{}; skipped",
                                if npus.iter().any(|(_, p)| p.is_none()) {
                                    " (the driver did not give every NPU's physical id)"
                                } else {
                                    ""
                                }
                            )),
                        },
                    }
                }
            }
        }
    }
    let mut holders = BTreeMap::new();
    for (logic, mut by) in claims {
        by.sort();
        by.dedup();
        match by.as_slice() {
            [one] => {
                holders.insert(logic, one.clone());
            }
            many => {
                let names: Vec<String> = many.iter().map(ToString::to_string).collect();
                notes.push(format!(
                    "NPU {logic} is listed for {}; no pod labels for it",
                    names.join(" and ")
                ));
            }
        }
    }
    (Assignment { holders }, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_resources::proto::{ContainerDevices, ContainerResources, PodResources};

    #[test]
    fn a_device_id_names_a_whole_npu_by_physical_id_or_is_skipped_with_the_reason() {
        let whole = [
            ("huawei.com/Ascend910", "Ascend910-3", 3),
            ("huawei.com/Ascend910", "Ascend910-15", 15),
            ("huawei.com/Ascend310P", "Ascend310P-0", 0),
            ("huawei.com/Ascend310P-V", "Ascend310P-V-2", 2),
            ("huawei.com/npu", "npu-5", 5),
        ];
        for (resource, id, phy) in whole {
            assert_eq!(name_of(resource, id), Named::Whole(phy), "{resource} {id}");
        }
        for (resource, id) in [
            ("nvidia.com/gpu", "GPU-1234"),
            ("huawei.com/other", "x-1"),
            ("cpu", "0"),
        ] {
            assert_eq!(name_of(resource, id), Named::Other, "{resource} {id}");
        }
        let unmapped = [
            (
                "huawei.com/Ascend910-2c",
                "Ascend910-2c-100-3",
                "a part of an NPU",
            ),
            ("huawei.com/Ascend910", "Ascend910-3-1", "a part of an NPU"),
            (
                "huawei.com/Ascend910",
                "Ascend310P-3",
                "does not start with \"Ascend910-\"",
            ),
            (
                "huawei.com/Ascend910",
                "Ascend910-",
                "\"\" is not a physical id",
            ),
            (
                "huawei.com/Ascend910",
                "Ascend910-x",
                "\"x\" is not a physical id",
            ),
            (
                "huawei.com/Ascend910",
                "Ascend910-99999999999",
                "out of range",
            ),
        ];
        for (resource, id, why) in unmapped {
            match name_of(resource, id) {
                Named::Unmapped(w) => assert!(w.contains(why), "{id}: {w}"),
                other => panic!("{id}: {other:?}"),
            }
        }
    }

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, resource, ids)| ContainerResources {
                    name: (*c).into(),
                    devices: vec![ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.iter().map(|s| (*s).into()).collect(),
                    }],
                })
                .collect(),
        }
    }

    fn holder(ns: &str, pod: &str, c: &str) -> Holder {
        Holder {
            namespace: ns.into(),
            pod: pod.into(),
            container: c.into(),
        }
    }

    // Four NPUs whose physical ids are not their logic ids: the labels follow the physical
    // id; the rest is skipped with a note, and the note says why.
    #[test]
    fn holders_follow_the_physical_id_and_everything_else_is_a_note() {
        let npus = [(0, Some(4)), (1, Some(5)), (2, Some(6)), (3, None)];
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "serving",
                    "vllm-a",
                    &[(
                        "engine",
                        "huawei.com/Ascend910",
                        &["Ascend910-5", "Ascend910-4"],
                    )],
                ),
                pod(
                    "serving",
                    "vllm-b",
                    &[
                        ("engine", "huawei.com/Ascend910", &["Ascend910-6"]),
                        ("sidecar", "nvidia.com/gpu", &["GPU-1"]),
                    ],
                ),
                pod(
                    "batch",
                    "job",
                    &[(
                        "main",
                        "huawei.com/Ascend910",
                        &["Ascend910-7", "Ascend910-6-0"],
                    )],
                ),
            ],
        };
        let (a, notes) = assign(&list, &npus);
        assert_eq!(a.npu(0), Some(&holder("serving", "vllm-a", "engine")));
        assert_eq!(a.npu(1), Some(&holder("serving", "vllm-a", "engine")));
        assert_eq!(a.npu(2), Some(&holder("serving", "vllm-b", "engine")));
        assert_eq!(a.npu(3), None);
        assert_eq!(notes.len(), 2, "{notes:#?}");
        assert!(notes[0].starts_with("batch/job container main: \"Ascend910-7\" names physical id 7, which no NPU of this agent has (the driver did not give every NPU's physical id)"), "{notes:#?}");
        assert!(
            notes[1].contains("\"Ascend910-6-0\" of huawei.com/Ascend910 is a part of an NPU"),
            "{notes:#?}"
        );
    }

    // An NPU listed for two containers (which the plugin does not do for a whole NPU) gets no
    // label rather than one picked at random.
    #[test]
    fn an_npu_listed_twice_gets_no_label() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "p", &[("c", "huawei.com/Ascend910", &["Ascend910-0"])]),
                pod("b", "q", &[("d", "huawei.com/Ascend910", &["Ascend910-0"])]),
            ],
        };
        let (a, notes) = assign(&list, &[(0, Some(0))]);
        assert_eq!(a.npu(0), None);
        assert_eq!(
            notes,
            ["NPU 0 is listed for a/p container c and b/q container d; no pod labels for it"]
        );
    }

    #[test]
    fn an_engine_has_the_pod_that_holds_all_its_npus() {
        let mut a = Assignment::default();
        a.holders.insert(0, holder("s", "p", "engine"));
        a.holders.insert(1, holder("s", "p", "engine"));
        a.holders.insert(2, holder("s", "p", "helper"));
        a.holders.insert(3, holder("s", "q", "engine"));
        assert_eq!(a.engine(&[0, 1]), Some(holder("s", "p", "engine")));
        assert_eq!(a.engine(&[0, 2]), Some(holder("s", "p", "")));
        assert_eq!(a.engine(&[0, 3]), None, "two pods");
        assert_eq!(a.engine(&[0, 4]), None, "an NPU without a holder");
        assert_eq!(a.engine(&[]), None);
    }
}
