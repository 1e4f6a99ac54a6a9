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
use std::collections::{BTreeMap, BTreeSet};

/// The prefix of the Ascend device plugin's resource names.
pub(crate) const RESOURCE_PREFIX: &str = "huawei.com/";

/// Who holds an NPU: one container of one pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Holder {
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
pub(crate) enum Named {
    /// A whole NPU, by its physical id.
    Whole(u32),
    /// A resource that is not the Ascend device plugin's (another vendor's): not the agent's.
    Other,
    /// The device plugin's id, but not of one whole NPU the agent can name: why.
    Unmapped(String),
}

/// What the device id `id` of the resource `resource` names.
pub(crate) fn name_of(resource: &str, id: &str) -> Named {
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
pub(crate) struct Assignment {
    pub holders: BTreeMap<u32, Holder>,
}

impl Assignment {
    /// Who holds the NPU with logic id `id`.
    pub(crate) fn npu(&self, id: u32) -> Option<&Holder> {
        self.holders.get(&id)
    }

    /// The engine's holder: the pod that holds every NPU of `ids`, in its container when one
    /// container holds them all (else the container is empty); `None` when some NPU has no
    /// holder, they belong to different pods, or `ids` is empty.
    pub(crate) fn engine(&self, ids: &[u32]) -> Option<Holder> {
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

/// Most notes kept of one answer (and so logged of it): those first in order, so the same
/// answer gives the same notes whatever the order of its pods.
pub(crate) const MAX_NOTES: usize = 16;

/// Most holders a note names for an NPU listed more than once.
const NAMED_HOLDERS: usize = 3;

/// The notes of one answer, compared as a set: what the decoder skipped (a line per kind,
/// always kept), then the [`MAX_NOTES`] first in order of the others, and how many there
/// were in all. A note names at most a holder (names within
/// [`Bounds`](super::proto::Bounds)), a resource and a device id, so each is short.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Notes {
    over: Vec<String>,
    kept: BTreeSet<String>,
    total: usize,
}

impl Notes {
    /// Adds `note`; only the [`MAX_NOTES`] first in order are kept.
    pub(crate) fn push(&mut self, note: String) {
        self.total += 1;
        let room = self.kept.len() < MAX_NOTES;
        if room || self.kept.last().is_some_and(|last| note < *last) {
            self.kept.insert(note);
            if self.kept.len() > MAX_NOTES {
                self.kept.pop_last();
            }
        }
    }

    /// Adds a line of what the decoder skipped (at most one per kind): always kept.
    pub(crate) fn over(&mut self, line: String) {
        self.over.push(line);
    }

    /// The notes kept: what the decoder skipped, then the others in order.
    pub(crate) fn kept(&self) -> impl Iterator<Item = &str> {
        self.over.iter().chain(&self.kept).map(String::as_str)
    }

    /// Whether `note` is among those kept.
    pub(crate) fn has(&self, note: &str) -> bool {
        self.kept.contains(note) || self.over.iter().any(|o| o == note)
    }

    /// How many were added and not kept (a note added twice counts twice).
    pub(crate) fn more(&self) -> usize {
        self.total - self.kept.len()
    }
}

/// A container's names, borrowed from the answer.
type Names<'a> = (&'a str, &'a str, &'a str);

/// The holders of the agent's NPUs (`npus`: logic id and physical id, if the driver gave
/// one) in `list`, and a note for each device id of the plugin that names none of them and
/// for what the decoder skipped. Each NPU's claims are a set of borrowed names: ten thousand
/// ids of one NPU in one container are one claim, never ten thousand copies of its names.
pub(crate) fn assign(
    list: &ListPodResourcesResponse,
    npus: &[(u32, Option<u32>)],
) -> (Assignment, Notes) {
    let mut notes = Notes::default();
    for line in list.skipped.lines(&super::proto::Bounds::AGENT) {
        notes.over(line);
    }
    let no_phy = npus.iter().any(|(_, p)| p.is_none());
    let mut claims: BTreeMap<u32, BTreeSet<Names>> = BTreeMap::new();
    for pod in &list.pod_resources {
        for c in &pod.containers {
            let names = (pod.namespace.as_str(), pod.name.as_str(), c.name.as_str());
            for d in &c.devices {
                for id in &d.device_ids {
                    let phy = match name_of(&d.resource_name, id) {
                        Named::Other => continue,
                        Named::Unmapped(why) => {
                            notes.push(format!("{}: {why}; skipped", holder(names)));
                            continue;
                        }
                        Named::Whole(phy) => phy,
                    };
                    match npus.iter().find(|(_, p)| *p == Some(phy)) {
                        Some((logic, _)) => {
                            claims.entry(*logic).or_default().insert(names);
                        }
                        None => notes.push(format!(
                            "{}: {id:?} names physical id {phy}, which no NPU of this agent has{}; skipped",
                            holder(names),
                            if no_phy {
                                " (the driver did not give every NPU's physical id)"
                            } else {
                                ""
                            }
                        )),
                    }
                }
            }
        }
    }
    let mut holders = BTreeMap::new();
    for (logic, by) in claims {
        if by.len() == 1 {
            holders.insert(logic, holder(*by.first().expect("one claim")));
            continue;
        }
        let mut names: Vec<String> = by
            .iter()
            .take(NAMED_HOLDERS)
            .map(|n| holder(*n).to_string())
            .collect();
        if by.len() > NAMED_HOLDERS {
            names.push(format!("{} more", by.len() - NAMED_HOLDERS));
        }
        notes.push(format!(
            "NPU {logic} is listed for {}; no pod labels for it",
            names.join(" and ")
        ));
    }
    (Assignment { holders }, notes)
}

/// The holder of `names`.
fn holder((namespace, pod, container): Names) -> Holder {
    Holder {
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        container: container.to_owned(),
    }
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
            ..Default::default()
        };
        let (a, notes) = assign(&list, &npus);
        assert_eq!(a.npu(0), Some(&holder("serving", "vllm-a", "engine")));
        assert_eq!(a.npu(1), Some(&holder("serving", "vllm-a", "engine")));
        assert_eq!(a.npu(2), Some(&holder("serving", "vllm-b", "engine")));
        assert_eq!(a.npu(3), None);
        let notes: Vec<&str> = notes.kept().collect();
        assert_eq!(notes.len(), 2, "{notes:#?}");
        assert!(
            notes[0].contains("\"Ascend910-6-0\" of huawei.com/Ascend910 is a part of an NPU"),
            "{notes:#?}"
        );
        assert!(notes[1].starts_with("batch/job container main: \"Ascend910-7\" names physical id 7, which no NPU of this agent has (the driver did not give every NPU's physical id)"), "{notes:#?}");
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
            ..Default::default()
        };
        let (a, notes) = assign(&list, &[(0, Some(0))]);
        assert_eq!(a.npu(0), None);
        assert_eq!(
            notes.kept().collect::<Vec<_>>(),
            ["NPU 0 is listed for a/p container c and b/q container d; no pod labels for it"]
        );
    }

    // Issue 48, R4: a kubelet lists pods in any order; the notes of one answer are the same
    // set whatever the order, and at most MAX_NOTES of them are kept, however many ids are
    // unmappable (460,000 distinct ones once gave 920,000 log lines).
    #[test]
    fn the_notes_are_one_bounded_set_whatever_the_order_of_the_pods() {
        let npus = [(0, Some(0)), (1, Some(1))];
        let unmapped: Vec<String> = (0..4096).map(|i| format!("Ascend910-0-{i}")).collect();
        let unmapped: Vec<&str> = unmapped.iter().map(String::as_str).collect();
        let pods = vec![
            pod(
                "s",
                "a",
                &[("c", "huawei.com/Ascend910", &["Ascend910-0", "Ascend910-9"])],
            ),
            pod("s", "b", &[("c", "huawei.com/Ascend910", &unmapped)]),
            pod(
                "s",
                "c",
                &[("c", "huawei.com/Ascend910", &["Ascend910-1", "x"])],
            ),
        ];
        let mut reversed = pods.clone();
        reversed.reverse();
        let list = |p: Vec<PodResources>| ListPodResourcesResponse {
            pod_resources: p,
            ..Default::default()
        };
        let (a, notes) = assign(&list(pods), &npus);
        let (b, again) = assign(&list(reversed), &npus);
        assert_eq!(
            (&a, &notes),
            (&b, &again),
            "the same answer in another order"
        );
        assert_eq!(a.npu(0), Some(&holder("s", "a", "c")));
        assert_eq!(a.npu(1), Some(&holder("s", "c", "c")));
        assert_eq!(notes.kept().count(), MAX_NOTES);
        assert_eq!(notes.more(), 4096 + 2 - MAX_NOTES);
        let longest = notes.kept().map(str::len).max().unwrap();
        assert!(longest < 200, "{longest} bytes");
        // What is kept is the first in order, so a note of pod a is among them.
        assert!(notes.has("s/a container c: \"Ascend910-9\" names physical id 9, which no NPU of this agent has; skipped"), "{notes:#?}");
    }

    // Issue 48, R3: an NPU claimed by thousands of containers is one note naming three of
    // them, not a line of every name.
    #[test]
    fn an_npu_claimed_by_many_containers_names_three_and_counts_the_rest() {
        let pods: Vec<PodResources> = (0..1000)
            .map(|i| {
                pod(
                    "s",
                    &format!("p{i:04}"),
                    &[("c", "huawei.com/Ascend910", &["Ascend910-0"])],
                )
            })
            .collect();
        let (a, notes) = assign(
            &ListPodResourcesResponse {
                pod_resources: pods,
                ..Default::default()
            },
            &[(0, Some(0))],
        );
        assert_eq!(a.npu(0), None);
        assert_eq!(
            notes.kept().collect::<Vec<_>>(),
            [
                "NPU 0 is listed for s/p0000 container c and s/p0001 container c and s/p0002 container c and 997 more; no pod labels for it"
            ]
        );
    }

    // What the decoder skipped is a note too.
    #[test]
    fn what_the_decoder_skipped_is_noted() {
        let list = ListPodResourcesResponse {
            skipped: crate::pod_resources::proto::Skipped {
                ids: 7,
                ..Default::default()
            },
            ..Default::default()
        };
        let (_, notes) = assign(&list, &[]);
        assert_eq!(
            notes.kept().collect::<Vec<_>>(),
            [
                "the answer is over the agent's bounds: 7 device id(s) past the first 4096 in all skipped"
            ]
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
