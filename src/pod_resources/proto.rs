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

/// `ListPodResourcesResponse`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPodResourcesResponse {
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: the devices assigned to one pod's containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResources {
    pub name: String,
    pub namespace: String,
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub name: String,
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the ids of one resource assigned to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    pub resource_name: String,
    pub device_ids: Vec<String>,
}

/// Why an answer could not be decoded: where (the field's path and the byte offset in the
/// message) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ListPodResourcesResponse: {path} at byte {offset}: {what}")]
pub struct DecodeError {
    /// `pod_resources[2].containers[0].name`, or the message when no field is known yet.
    pub path: String,
    pub offset: usize,
    pub what: String,
}

/// Decodes a `ListPodResourcesResponse` (the gRPC message, without its 5-byte prefix).
pub fn decode_list(bytes: &[u8]) -> Result<ListPodResourcesResponse, DecodeError> {
    let mut out = ListPodResourcesResponse::default();
    let mut r = Reader::new(bytes, 0, String::new());
    while let Some(f) = r.field()? {
        if f.number == 1 {
            let name = format!("pod_resources[{}]", out.pod_resources.len());
            let (body, at) = r.len_field(&f, &name)?;
            out.pod_resources.push(pod(body, at, r.child(&name))?);
        } else {
            r.skip(&f)?;
        }
    }
    Ok(out)
}

fn pod(bytes: &[u8], base: usize, path: String) -> Result<PodResources, DecodeError> {
    let mut out = PodResources::default();
    let mut r = Reader::new(bytes, base, path);
    while let Some(f) = r.field()? {
        match f.number {
            1 => out.name = r.string(&f, "name")?,
            2 => out.namespace = r.string(&f, "namespace")?,
            3 => {
                let name = format!("containers[{}]", out.containers.len());
                let (body, at) = r.len_field(&f, &name)?;
                out.containers.push(container(body, at, r.child(&name))?);
            }
            _ => r.skip(&f)?,
        }
    }
    Ok(out)
}

fn container(bytes: &[u8], base: usize, path: String) -> Result<ContainerResources, DecodeError> {
    let mut out = ContainerResources::default();
    let mut r = Reader::new(bytes, base, path);
    while let Some(f) = r.field()? {
        match f.number {
            1 => out.name = r.string(&f, "name")?,
            2 => {
                let name = format!("devices[{}]", out.devices.len());
                let (body, at) = r.len_field(&f, &name)?;
                out.devices.push(devices(body, at, r.child(&name))?);
            }
            _ => r.skip(&f)?,
        }
    }
    Ok(out)
}

fn devices(bytes: &[u8], base: usize, path: String) -> Result<ContainerDevices, DecodeError> {
    let mut out = ContainerDevices::default();
    let mut r = Reader::new(bytes, base, path);
    while let Some(f) = r.field()? {
        match f.number {
            1 => out.resource_name = r.string(&f, "resource_name")?,
            2 => {
                let name = format!("device_ids[{}]", out.device_ids.len());
                out.device_ids.push(r.string(&f, &name)?);
            }
            _ => r.skip(&f)?,
        }
    }
    Ok(out)
}

/// Protobuf's wire types (the low three bits of a field's key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WireType {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

/// A field's key, read at `offset`.
struct Field {
    number: u64,
    wire: WireType,
    offset: usize,
}

/// Reads the fields of one message: `bytes` is the message, `base` its offset in the whole
/// answer (for errors), `path` its place in the answer.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: usize,
    path: String,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], base: usize, path: String) -> Reader<'a> {
        Reader {
            bytes,
            pos: 0,
            base,
            path,
        }
    }

    fn error(&self, field: &str, at: usize, what: impl Into<String>) -> DecodeError {
        let path = match (self.path.is_empty(), field.is_empty()) {
            (true, true) => "the message".to_owned(),
            (_, true) => self.path.clone(),
            (_, false) => self.child(field),
        };
        DecodeError {
            path,
            offset: self.base + at,
            what: what.into(),
        }
    }

    /// The next field's key, or `None` at the end of the message.
    fn field(&mut self) -> Result<Option<Field>, DecodeError> {
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        let offset = self.pos;
        let key = self.varint("")?;
        let number = key >> 3;
        let wire = match key & 7 {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            5 => WireType::Fixed32,
            // 3 and 4 are proto2's groups, which no field of this API uses.
            w => {
                return Err(self.error(
                    "",
                    offset,
                    format!("field key {key} has wire type {w}, which this API never uses"),
                ));
            }
        };
        if number == 0 {
            return Err(self.error("", offset, "field number 0 is not a field"));
        }
        Ok(Some(Field {
            number,
            wire,
            offset,
        }))
    }

    fn varint(&mut self, field: &str) -> Result<u64, DecodeError> {
        let start = self.pos;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(self.error(field, start, "the message ends inside a varint"));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.error(field, start, "a varint longer than 10 bytes"))
    }

    /// The next `n` bytes, and their offset in this message.
    fn take(&mut self, n: u64, field: &str, at: usize) -> Result<(&'a [u8], usize), DecodeError> {
        let left = self.bytes.len() - self.pos;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                self.error(
                    field,
                    at,
                    format!("a length of {n} bytes, past the {left} left"),
                )
            })?;
        let start = self.pos;
        self.pos += n;
        Ok((&self.bytes[start..start + n], start))
    }

    /// A length-delimited field's bytes, and their offset in the whole answer.
    fn len_field(&mut self, f: &Field, field: &str) -> Result<(&'a [u8], usize), DecodeError> {
        if f.wire != WireType::Len {
            return Err(self.error(
                field,
                f.offset,
                format!("wire type {:?}, not length-delimited", f.wire),
            ));
        }
        let n = self.varint(field)?;
        let (b, at) = self.take(n, field, f.offset)?;
        Ok((b, self.base + at))
    }

    /// The path of this message's field `name`.
    fn child(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn string(&mut self, f: &Field, field: &str) -> Result<String, DecodeError> {
        let (b, _) = self.len_field(f, field)?;
        String::from_utf8(b.to_vec()).map_err(|e| {
            self.error(
                field,
                f.offset,
                format!(
                    "not UTF-8 (at byte {} of the string)",
                    e.utf8_error().valid_up_to()
                ),
            )
        })
    }

    /// Skips a field this decoder does not read.
    fn skip(&mut self, f: &Field) -> Result<(), DecodeError> {
        let name = format!("field {}", f.number);
        match f.wire {
            WireType::Varint => self.varint(&name).map(|_| ()),
            WireType::Fixed64 => self.take(8, &name, f.offset).map(|_| ()),
            WireType::Fixed32 => self.take(4, &name, f.offset).map(|_| ()),
            WireType::Len => {
                let n = self.varint(&name)?;
                self.take(n, &name, f.offset).map(|_| ())
            }
        }
    }
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
        let got = decode_list(&bytes).unwrap();
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
            }
        );
        assert_eq!(
            decode_list(&[]).unwrap(),
            ListPodResourcesResponse::default()
        );
    }

    #[test]
    fn garbage_is_an_error_that_names_the_field_and_the_offset() {
        let good = one_pod();
        // Cut inside the first device id: the length runs past the end.
        let cut = &good[..good.len() - 12];
        let e = decode_list(cut).unwrap_err();
        assert_eq!(e.path, "pod_resources[0]", "{e}");
        assert!(e.what.contains("past the"), "{e}");

        let bad_utf8 = len(1, &len(2, &[0xff, 0xfe]));
        let e = decode_list(&bad_utf8).unwrap_err();
        assert_eq!(e.path, "pod_resources[0].namespace");
        assert_eq!(e.offset, 2);
        assert!(e.to_string().contains("not UTF-8"), "{e}");

        let wrong_type = len(1, &[1 << 3, 5]);
        let e = decode_list(&wrong_type).unwrap_err();
        assert_eq!(e.path, "pod_resources[0].name");
        assert!(e.what.contains("not length-delimited"), "{e}");

        let group = [3 << 3 | 3];
        assert!(
            decode_list(&group)
                .unwrap_err()
                .what
                .contains("wire type 3")
        );
        let endless = [
            0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(
            decode_list(&endless)
                .unwrap_err()
                .what
                .contains("longer than 10 bytes")
        );
        assert!(
            decode_list(&[0x0a])
                .unwrap_err()
                .what
                .contains("ends inside a varint")
        );
        assert!(
            decode_list(&[0x00])
                .unwrap_err()
                .what
                .contains("field number 0")
        );
        let huge = [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
        let e = decode_list(&huge).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ListPodResourcesResponse: pod_resources[0] at byte 0: a length of 4294967295 bytes, past the 0 left"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = decode_list(&bytes);
        }

        #[test]
        fn any_cut_of_a_good_answer_decodes_or_fails_without_a_panic(cut in 0usize..200) {
            let good = one_pod();
            let _ = decode_list(&good[..cut.min(good.len())]);
        }
    }
}
