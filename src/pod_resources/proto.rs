//! The kubelet's answer to `List`, decoded by hand from protobuf's wire format.
//!
//! The messages and field numbers are those of the PodResources API v1, in the Kubernetes
//! repository at `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`:
//!
//! | message | fields read here |
//! |---|---|
//! | `ListPodResourcesResponse` | 1 `pod_resources` (repeated `PodResources`) |
//! | `PodResources` | 1 `name`, 2 `namespace`, 3 `containers` (repeated `ContainerResources`) |
//! | `ContainerResources` | 1 `name`, 2 `devices` (repeated `ContainerDevices`) |
//! | `ContainerDevices` | 1 `resource_name`, 2 `device_ids` (repeated string) |
//!
//! Every other field (CPU ids, memory, topology, dynamic resources, and whatever a later
//! kubelet adds) is skipped by its wire type, as protobuf requires. Four fields of a handful
//! of messages do not justify a code generator and `protoc` in the build; the decoder reads
//! bytes it is given and never trusts a length, so garbage is an error that names the field
//! and the byte offset, never a panic. The caller bounds the input's size.
//!
//! A bound in bytes is not a bound on what the bytes build: a 230 KB answer (a 100 KB pod
//! name and 10,000 device ids) once became 971 MB of notes (issue 48). So the decoder keeps at
//! most [`Bounds`] of each thing, whatever the size of the answer: a name over Kubernetes' own
//! limit drops what it names (the pod, the container, the resource's ids), an item past a
//! count is dropped, each is counted in [`Skipped`], and the rest is kept.

pub(crate) use super::protowire::DecodeError;
use super::protowire::{Name, Place, Reader};

/// `ListPodResourcesResponse`, as far as [`Bounds`] keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListPodResourcesResponse {
    pub pod_resources: Vec<PodResources>,
    /// Not a field of the message: what the decoder dropped past its bounds.
    pub skipped: Skipped,
}

/// What the decoder keeps of one answer, at most.
///
/// The names' bounds are Kubernetes' own (the "Object Names and IDs" page of
/// kubernetes.io; `k8s.io/apimachinery/pkg/util/validation/validation.go`): a pod's name is a
/// DNS subdomain, at most 253 bytes (`DNS1123SubdomainMaxLength`); a namespace and a
/// container's name are DNS labels, at most 63 (`DNS1123LabelMaxLength`); a resource's name is
/// a qualified name, a DNS subdomain prefix, `/` and at most 63 bytes (`huawei.com/Ascend910`).
/// A kubelet cannot list a longer one, so a longer one is not a kubelet's. The counts are many
/// times what a node holds: the kubelet runs 110 pods by default (`--max-pods`), and an Ascend
/// node has at most 16 NPUs, a few vNPUs each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Bytes of a pod's name.
    pub pod_name: usize,
    /// Bytes of a namespace.
    pub namespace: usize,
    /// Bytes of a container's name.
    pub container_name: usize,
    /// Bytes of a resource's name.
    pub resource_name: usize,
    /// Bytes of one device id (the device plugin API sets none; the Ascend plugin's longest,
    /// `Ascend910-2c-<vdev>-<physical id>`, is under 32).
    pub device_id: usize,
    /// Pods kept.
    pub pods: usize,
    /// Containers kept, over all pods.
    pub containers: usize,
    /// Device ids kept of one container.
    pub ids_per_container: usize,
    /// Device ids kept, over all containers.
    pub ids: usize,
}

impl Bounds {
    /// The agent's bounds: a few MB at most built from an answer, whatever its shape (the
    /// answer itself is at most 4 MiB, [`crate::pod_resources::task::MAX_ANSWER`]).
    pub(crate) const AGENT: Bounds = Bounds {
        pod_name: 253,
        namespace: 63,
        container_name: 63,
        resource_name: 253 + 1 + 63,
        device_id: 253,
        pods: 1024,
        containers: 4096,
        ids_per_container: 256,
        ids: 4096,
    };
}

/// How many of each thing an answer held past [`Bounds`], dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Skipped {
    /// Pods whose name or namespace is over its bound (their containers with them).
    pub pod_names: u64,
    /// Containers whose name is over its bound (their devices with them).
    pub container_names: u64,
    /// Device lists whose resource name is over its bound (their ids with them).
    pub resource_names: u64,
    /// Device ids over their bound.
    pub long_ids: u64,
    /// Pods past the count of pods.
    pub pods: u64,
    /// Containers past the count of containers.
    pub containers: u64,
    /// Device ids past the count of one container.
    pub ids_in_container: u64,
    /// Device ids past the count in all.
    pub ids: u64,
}

impl Skipped {
    /// Whether nothing was dropped (the tests read it).
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        *self == Skipped::default()
    }

    /// One line per kind dropped, saying how many, past which bound (`b`).
    pub(crate) fn lines(&self, b: &Bounds) -> Vec<String> {
        let rows = [
            (
                self.pod_names,
                format!(
                    "pod(s) whose name is over {} bytes or namespace over {} (Kubernetes' limits), with their containers",
                    b.pod_name, b.namespace
                ),
            ),
            (
                self.container_names,
                format!(
                    "container(s) whose name is over {} bytes (Kubernetes' limit), with their devices",
                    b.container_name
                ),
            ),
            (
                self.resource_names,
                format!(
                    "device list(s) whose resource name is over {} bytes, with their ids",
                    b.resource_name
                ),
            ),
            (
                self.long_ids,
                format!("device id(s) over {} bytes", b.device_id),
            ),
            (self.pods, format!("pod(s) past the first {}", b.pods)),
            (
                self.containers,
                format!("container(s) past the first {} in all", b.containers),
            ),
            (
                self.ids_in_container,
                format!(
                    "device id(s) past the first {} of a container",
                    b.ids_per_container
                ),
            ),
            (
                self.ids,
                format!("device id(s) past the first {} in all", b.ids),
            ),
        ];
        rows.into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("the answer is over the agent's bounds: {n} {what} skipped"))
            .collect()
    }
}

/// `PodResources`: the devices assigned to one pod's containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodResources {
    pub name: String,
    pub namespace: String,
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerResources {
    pub name: String,
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the ids of one resource assigned to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerDevices {
    pub resource_name: String,
    pub device_ids: Vec<String>,
}

/// Decodes a `ListPodResourcesResponse` (the gRPC message, without its 5-byte prefix),
/// keeping at most `bounds` of it.
pub(crate) fn decode_list(
    bytes: &[u8],
    bounds: &Bounds,
) -> Result<ListPodResourcesResponse, DecodeError> {
    let mut out = ListPodResourcesResponse::default();
    let mut kept = Kept::default();
    let mut r = Reader::new(bytes, 0, None);
    let mut at = 0;
    while let Some(f) = r.field()? {
        if f.number != 1 {
            r.skip(&f)?;
            continue;
        }
        let name = Name::Item("pod_resources", at);
        at += 1;
        let (body, base) = r.len_field(&f, name)?;
        let place = Place { up: None, name };
        if out.pod_resources.len() >= bounds.pods {
            out.skipped.pods += 1;
            // Still read: a malformed pod is a malformed answer, kept or not.
            let mut none = (Kept::full(), Skipped::default());
            pod(body, base, place, bounds, &mut none.0, &mut none.1)?;
            continue;
        }
        if let Some(p) = pod(body, base, place, bounds, &mut kept, &mut out.skipped)? {
            out.pod_resources.push(p);
        }
    }
    Ok(out)
}

/// What the decoder has kept so far of the counts bounded over the whole answer.
#[derive(Debug, Default)]
struct Kept {
    containers: usize,
    ids: usize,
    /// Keep nothing more (what is read now is only checked).
    full: bool,
}

impl Kept {
    fn full() -> Kept {
        Kept {
            full: true,
            ..Kept::default()
        }
    }
}

/// One pod, or `None` when its name or namespace is over its bound. Its names are read
/// first, wherever they are in the message, so a dropped pod builds nothing.
fn pod(
    bytes: &[u8],
    base: usize,
    place: Place<'_>,
    b: &Bounds,
    kept: &mut Kept,
    skipped: &mut Skipped,
) -> Result<Option<PodResources>, DecodeError> {
    let mut out = PodResources::default();
    let mut long = false;
    let mut r = Reader::new(bytes, base, Some(place));
    while let Some(f) = r.field()? {
        let (slot, max, name) = match f.number {
            1 => (&mut out.name, b.pod_name, "name"),
            2 => (&mut out.namespace, b.namespace, "namespace"),
            _ => {
                r.skip(&f)?;
                continue;
            }
        };
        match r.bounded_string(&f, Name::Plain(name), max)? {
            Some(s) => *slot = s.to_owned(),
            None => long = true,
        }
    }
    skipped.pod_names += u64::from(long && !kept.full);
    let mut r = Reader::new(bytes, base, Some(place));
    let mut at = 0;
    while let Some(f) = r.field()? {
        if f.number != 3 {
            r.skip(&f)?;
            continue;
        }
        let name = Name::Item("containers", at);
        at += 1;
        let (body, base) = r.len_field(&f, name)?;
        let inner = Place {
            up: Some(&place),
            name,
        };
        if long || kept.full || kept.containers >= b.containers {
            skipped.containers += u64::from(!long && !kept.full);
            let mut none = (Kept::full(), Skipped::default());
            container(body, base, inner, b, &mut none.0, &mut none.1)?;
            continue;
        }
        if let Some(c) = container(body, base, inner, b, kept, skipped)? {
            kept.containers += 1;
            out.containers.push(c);
        }
    }
    Ok((!long).then_some(out))
}

/// One container, or `None` when its name is over its bound (or `kept` is full).
fn container(
    bytes: &[u8],
    base: usize,
    place: Place<'_>,
    b: &Bounds,
    kept: &mut Kept,
    skipped: &mut Skipped,
) -> Result<Option<ContainerResources>, DecodeError> {
    let mut out = ContainerResources::default();
    let mut long = false;
    let mut r = Reader::new(bytes, base, Some(place));
    while let Some(f) = r.field()? {
        if f.number != 1 {
            r.skip(&f)?;
            continue;
        }
        match r.bounded_string(&f, Name::Plain("name"), b.container_name)? {
            Some(s) => out.name = s.to_owned(),
            None => long = true,
        }
    }
    let keep = !long && !kept.full;
    skipped.container_names += u64::from(long && !kept.full);
    let mut ids = Ids {
        own: 0,
        keep,
        kept,
        skipped,
    };
    let mut r = Reader::new(bytes, base, Some(place));
    let mut at = 0;
    while let Some(f) = r.field()? {
        if f.number != 2 {
            r.skip(&f)?;
            continue;
        }
        let name = Name::Item("devices", at);
        at += 1;
        let (body, base) = r.len_field(&f, name)?;
        let inner = Place {
            up: Some(&place),
            name,
        };
        // A list left without an id (all dropped, or none sent) says nothing: not kept, so
        // the lists kept are at most the ids kept.
        if let Some(d) =
            devices(body, base, inner, b, &mut ids)?.filter(|d| !d.device_ids.is_empty())
        {
            out.devices.push(d);
        }
    }
    Ok(keep.then_some(out))
}

/// The ids of one container as they are kept: how many so far, whether at all, and the
/// answer's counts.
struct Ids<'k> {
    own: usize,
    keep: bool,
    kept: &'k mut Kept,
    skipped: &'k mut Skipped,
}

/// One device list, or `None` when its resource name is over its bound (or its container
/// is not kept).
fn devices(
    bytes: &[u8],
    base: usize,
    place: Place<'_>,
    b: &Bounds,
    ids: &mut Ids<'_>,
) -> Result<Option<ContainerDevices>, DecodeError> {
    let mut out = ContainerDevices::default();
    let mut long = false;
    let mut r = Reader::new(bytes, base, Some(place));
    while let Some(f) = r.field()? {
        if f.number != 1 {
            r.skip(&f)?;
            continue;
        }
        match r.bounded_string(&f, Name::Plain("resource_name"), b.resource_name)? {
            Some(s) => out.resource_name = s.to_owned(),
            None => long = true,
        }
    }
    let keep = !long && ids.keep;
    ids.skipped.resource_names += u64::from(long && ids.keep);
    let mut r = Reader::new(bytes, base, Some(place));
    let mut at = 0;
    while let Some(f) = r.field()? {
        if f.number != 2 {
            r.skip(&f)?;
            continue;
        }
        let name = Name::Item("device_ids", at);
        at += 1;
        let Some(id) = r.bounded_string(&f, name, b.device_id)? else {
            ids.skipped.long_ids += u64::from(keep);
            continue;
        };
        if !keep {
            continue;
        }
        if ids.own >= b.ids_per_container {
            ids.skipped.ids_in_container += 1;
        } else if ids.kept.ids >= b.ids {
            ids.skipped.ids += 1;
        } else {
            ids.own += 1;
            ids.kept.ids += 1;
            out.device_ids.push(id.to_owned());
        }
    }
    Ok(keep.then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A protobuf writer for the tests, written from the wire format (not from the decoder).
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn len(field: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(field << 3 | 2, &mut out);
        varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
        out
    }
    fn s(field: u64, v: &str) -> Vec<u8> {
        len(field, v.as_bytes())
    }
    fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    fn one_pod() -> Vec<u8> {
        let devs = cat(&[
            s(1, "huawei.com/Ascend910"),
            s(2, "Ascend910-0"),
            s(2, "Ascend910-1"),
            // topology (3): TopologyInfo{nodes: [NUMANode{ID: 1}]}, skipped
            len(3, &len(1, &[8, 1])),
        ]);
        let ctr = cat(&[
            s(1, "engine"),
            len(2, &devs),
            // cpu_ids (3), packed int64s, skipped
            len(3, &[2, 3]),
        ]);
        let pod = cat(&[s(1, "vllm-0"), s(2, "serving"), len(3, &ctr)]);
        len(1, &pod)
    }

    #[test]
    fn a_pod_with_its_containers_and_devices_is_read_and_unknown_fields_skipped() {
        let mut bytes = one_pod();
        // A second pod, fields out of order, with a varint and fixed fields unknown here.
        let pod = cat(&[
            s(2, "kube-system"),
            vec![9 << 3, 0x96, 0x01],
            vec![10 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8],
            vec![11 << 3 | 5, 1, 2, 3, 4],
            s(1, "other"),
        ]);
        bytes.extend(len(1, &pod));
        let got = decode_list(&bytes, &Bounds::AGENT).unwrap();
        assert_eq!(
            got,
            ListPodResourcesResponse {
                pod_resources: vec![
                    PodResources {
                        name: "vllm-0".into(),
                        namespace: "serving".into(),
                        containers: vec![ContainerResources {
                            name: "engine".into(),
                            devices: vec![ContainerDevices {
                                resource_name: "huawei.com/Ascend910".into(),
                                device_ids: vec!["Ascend910-0".into(), "Ascend910-1".into()],
                            }],
                        }],
                    },
                    PodResources {
                        name: "other".into(),
                        namespace: "kube-system".into(),
                        containers: vec![],
                    },
                ],
                skipped: Skipped::default(),
            }
        );
        assert_eq!(
            decode_list(&[], &Bounds::AGENT).unwrap(),
            ListPodResourcesResponse::default()
        );
    }

    #[test]
    fn garbage_is_an_error_that_names_the_field_and_the_offset() {
        let good = one_pod();
        // Cut inside the first device id: the length runs past the end.
        let cut = &good[..good.len() - 12];
        let e = decode_list(cut, &Bounds::AGENT).unwrap_err();
        assert_eq!(e.path, "pod_resources[0]", "{e}");
        assert!(e.what.contains("past the"), "{e}");

        let bad_utf8 = len(1, &len(2, &[0xff, 0xfe]));
        let e = decode_list(&bad_utf8, &Bounds::AGENT).unwrap_err();
        assert_eq!(e.path, "pod_resources[0].namespace");
        assert_eq!(e.offset, 2);
        assert!(e.to_string().contains("not UTF-8"), "{e}");

        let wrong_type = len(1, &[1 << 3, 5]);
        let e = decode_list(&wrong_type, &Bounds::AGENT).unwrap_err();
        assert_eq!(e.path, "pod_resources[0].name");
        assert!(e.what.contains("not length-delimited"), "{e}");

        let group = [3 << 3 | 3];
        assert!(
            decode_list(&group, &Bounds::AGENT)
                .unwrap_err()
                .what
                .contains("wire type 3")
        );
        let endless = [
            0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(
            decode_list(&endless, &Bounds::AGENT)
                .unwrap_err()
                .what
                .contains("longer than 10 bytes")
        );
        assert!(
            decode_list(&[0x0a], &Bounds::AGENT)
                .unwrap_err()
                .what
                .contains("ends inside a varint")
        );
        assert!(
            decode_list(&[0x00], &Bounds::AGENT)
                .unwrap_err()
                .what
                .contains("field number 0")
        );
        let huge = [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
        let e = decode_list(&huge, &Bounds::AGENT).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ListPodResourcesResponse: pod_resources[0] at byte 0: a length of 4294967295 bytes, past the 0 left"
        );
    }

    /// A container's device lists: a resource and its ids.
    type Lists<'a> = &'a [(&'a str, Vec<String>)];

    /// A pod of `containers`, each a name and its lists.
    fn pod_bytes(ns: &str, name: &str, containers: &[(&str, Lists)]) -> Vec<u8> {
        let mut pod = cat(&[s(1, name), s(2, ns)]);
        for (c, lists) in containers {
            let mut ctr = s(1, c);
            for (resource, ids) in *lists {
                let mut devs = s(1, resource);
                for id in ids {
                    devs.extend(s(2, id));
                }
                ctr.extend(len(2, &devs));
            }
            pod.extend(len(3, &ctr));
        }
        len(1, &pod)
    }

    fn ids(n: usize, f: impl Fn(usize) -> String) -> Vec<String> {
        (0..n).map(f).collect()
    }

    const ASCEND: &str = "huawei.com/Ascend910";

    // Issue 48, R3: a name over Kubernetes' own limit is not a kubelet's; what it names is
    // dropped and counted, and everything else in the answer is kept.
    #[test]
    fn a_name_over_kubernetes_limits_drops_what_it_names_and_the_rest_is_kept() {
        let b = Bounds::AGENT;
        let one = || ids(1, |_| "Ascend910-0".to_owned());
        let long_id = "A".repeat(b.device_id + 1);
        let bytes = cat(&[
            pod_bytes("ns", &"p".repeat(b.pod_name), &[("c", &[(ASCEND, one())])]),
            pod_bytes(
                "ns",
                &"p".repeat(b.pod_name + 1),
                &[("c", &[(ASCEND, one())])],
            ),
            pod_bytes(
                &"n".repeat(b.namespace + 1),
                "q",
                &[("c", &[(ASCEND, one())])],
            ),
            pod_bytes(
                "ns",
                "r",
                &[
                    (&"c".repeat(b.container_name + 1), &[(ASCEND, one())]),
                    ("kept", &[(ASCEND, vec!["Ascend910-1".into(), long_id])]),
                    ("c2", &[(&"huawei.com/".repeat(40), one())]),
                ],
            ),
        ]);
        let got = decode_list(&bytes, &b).unwrap();
        let names: Vec<usize> = got.pod_resources.iter().map(|p| p.name.len()).collect();
        assert_eq!(names, [b.pod_name, 1], "the pods within the limits");
        let r = &got.pod_resources[1];
        let containers: Vec<&str> = r.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(containers, ["kept", "c2"]);
        assert_eq!(r.containers[0].devices[0].device_ids, ["Ascend910-1"]);
        assert!(
            r.containers[1].devices.is_empty(),
            "the list of a long resource name"
        );
        assert_eq!(
            got.skipped,
            Skipped {
                pod_names: 2,
                container_names: 1,
                resource_names: 1,
                long_ids: 1,
                ..Skipped::default()
            }
        );
        let lines = got.skipped.lines(&b);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert_eq!(
            lines[0],
            "the answer is over the agent's bounds: 2 pod(s) whose name is over 253 bytes or namespace over 63 (Kubernetes' limits), with their containers skipped"
        );
        // A name over its bound must still be text: garbage is an error, kept or not.
        let bad = len(1, &cat(&[len(1, &vec![0xff; b.pod_name + 1])]));
        assert!(
            decode_list(&bad, &b)
                .unwrap_err()
                .what
                .contains("not UTF-8")
        );
    }

    /// What `l` holds in memory: every struct, string and vector by its capacity.
    fn built(l: &ListPodResourcesResponse) -> usize {
        use std::mem::size_of;
        let ids = |d: &ContainerDevices| -> usize {
            d.device_ids.capacity() * size_of::<String>()
                + d.device_ids.iter().map(String::capacity).sum::<usize>()
        };
        let lists = |c: &ContainerResources| -> usize {
            c.devices.capacity() * size_of::<ContainerDevices>()
                + c.devices
                    .iter()
                    .map(|d| d.resource_name.capacity() + ids(d))
                    .sum::<usize>()
        };
        let containers = |p: &PodResources| -> usize {
            p.containers.capacity() * size_of::<ContainerResources>()
                + p.containers
                    .iter()
                    .map(|c| c.name.capacity() + lists(c))
                    .sum::<usize>()
        };
        l.pod_resources.capacity() * size_of::<PodResources>()
            + l.pod_resources
                .iter()
                .map(|p| p.name.capacity() + p.namespace.capacity() + containers(p))
                .sum::<usize>()
    }

    // Issue 48, R3: answers under the 4 MiB a call reads, each shaped to build the most per
    // byte, build a few MB at most, and never more than the bounds' counts.
    #[test]
    fn a_hostile_answer_builds_no_more_than_the_bounds() {
        let b = Bounds::AGENT;
        let four_mib = 4 << 20;
        // One-byte ids in one container; in many containers; many empty pods; many pods
        // of a container each; the 100 KB pod name with 10,000 ids of the attack. Written
        // as bytes, repeated: building them field by field takes seconds in a debug build.
        let list_of = |ids: &[u8]| len(2, &cat(&[s(1, ASCEND), ids.to_vec()]));
        let tiny_ids = len(
            1,
            &cat(&[
                s(1, "p"),
                s(2, "n"),
                len(3, &cat(&[s(1, "c"), list_of(&s(2, "A").repeat(1_300_000))])),
            ]),
        );
        let container = len(3, &cat(&[s(1, "c"), list_of(&s(2, "7").repeat(20))]));
        let many_containers = len(1, &cat(&[s(1, "p"), s(2, "n"), container.repeat(40_000)]));
        let empty_pods = len(1, &[]).repeat(1_000_000);
        let small_pods = len(
            1,
            &cat(&[
                s(1, "p"),
                s(2, "n"),
                len(3, &cat(&[s(1, "c"), list_of(&s(2, "A"))])),
            ]),
        )
        .repeat(80_000);
        let attack = pod_bytes(
            "n",
            &"p".repeat(100_000),
            &[(
                "c",
                &[(ASCEND, ids(10_000, |i| format!("Ascend910-{i}-x")))],
            )],
        );
        for (what, bytes) in [
            ("1.3 M one-byte ids", tiny_ids),
            ("40,000 containers of 20 ids", many_containers),
            ("a million empty pods", empty_pods),
            ("80,000 pods of one container", small_pods),
            ("a 100 KB pod name and 10,000 ids", attack),
        ] {
            assert!(bytes.len() <= four_mib, "{what}: {} bytes", bytes.len());
            let got = decode_list(&bytes, &b).unwrap();
            let kept_ids: usize = got
                .pod_resources
                .iter()
                .flat_map(|p| &p.containers)
                .flat_map(|c| &c.devices)
                .map(|d| d.device_ids.len())
                .sum();
            let kept_containers: usize = got.pod_resources.iter().map(|p| p.containers.len()).sum();
            let mb = built(&got) as f64 / 1e6;
            assert!(
                mb < 8.0,
                "{what}: {mb:.1} MB built from {} bytes",
                bytes.len()
            );
            assert!(got.pod_resources.len() <= b.pods, "{what}");
            assert!(kept_containers <= b.containers, "{what}");
            assert!(kept_ids <= b.ids, "{what}");
            assert!(!got.skipped.is_empty(), "{what}: something was over");
        }
    }

    #[test]
    fn device_ids_are_kept_up_to_their_count_per_container_and_in_all() {
        let b = Bounds {
            ids_per_container: 3,
            ids: 5,
            containers: 3,
            pods: 2,
            ..Bounds::AGENT
        };
        let n = |k| ids(k, |i| format!("Ascend910-{i}"));
        let bytes = cat(&[
            pod_bytes(
                "n",
                "p",
                &[
                    ("a", &[(ASCEND, n(2)), (ASCEND, n(2))]),
                    ("b", &[(ASCEND, n(4))]),
                ],
            ),
            pod_bytes(
                "n",
                "q",
                &[("c", &[(ASCEND, n(1))]), ("d", &[(ASCEND, n(1))])],
            ),
            pod_bytes("n", "r", &[("e", &[(ASCEND, n(1))])]),
        ]);
        let got = decode_list(&bytes, &b).unwrap();
        let kept: Vec<Vec<usize>> = got
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .map(|c| c.devices.iter().map(|d| d.device_ids.len()).collect())
            .collect();
        // a: 2 + 1 (its third id ends it); b: 2 (5 in all); c: none left, its list not kept.
        assert_eq!(kept, [vec![2, 1], vec![2], vec![]]);
        assert_eq!(
            got.skipped,
            Skipped {
                ids_in_container: 1,
                ids: 3,
                containers: 1,
                pods: 1,
                ..Skipped::default()
            }
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = decode_list(&bytes, &Bounds::AGENT);
        }

        #[test]
        fn any_cut_of_a_good_answer_decodes_or_fails_without_a_panic(cut in 0usize..200) {
            let good = one_pod();
            let _ = decode_list(&good[..cut.min(good.len())], &Bounds::AGENT);
        }
    }
}
