//! A stand-in for the kubelet's PodResources API: gRPC over HTTP/2 on a Unix socket, the
//! method `/v1.PodResourcesLister/List`, its answer in protobuf's wire format as the
//! Kubernetes repository's `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`
//! defines it. The protobuf is written here by hand, from the wire format, not with the
//! agent's decoder; the answer also carries fields the agent does not read (the devices'
//! NUMA topology, the containers' CPU ids), as a kubelet's does.
//!
//! The pods it lists can be changed while it serves ([`PodResourcesServer::set`]); stopped,
//! its socket stays on disk with nobody listening, as a dead kubelet's does. As a hostile
//! socket it can also list the pods in another order on every call, as a real kubelet may
//! ([`PodResourcesServer::rotate`]), and answer with any `content-type`
//! ([`PodResourcesServer::set_content_type`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One pod as the stand-in lists it.
#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<Container>,
}

/// One container: its name and, per resource, the device ids assigned to it.
#[derive(Debug, Clone)]
pub struct Container {
    pub name: String,
    pub devices: Vec<(String, Vec<String>)>,
}

/// A pod with one container holding `ids` of `resource`.
pub fn pod(namespace: &str, name: &str, container: &str, resource: &str, ids: &[&str]) -> Pod {
    Pod {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        containers: vec![Container {
            name: container.to_owned(),
            devices: vec![(
                resource.to_owned(),
                ids.iter().map(|s| (*s).to_owned()).collect(),
            )],
        }],
    }
}

/// How the stand-in answers, besides the pods.
#[derive(Debug, Clone)]
struct Manner {
    /// Each call lists the pods rotated by one more place.
    rotate: bool,
    content_type: String,
}

/// The running stand-in.
pub struct PodResourcesServer {
    pub socket: PathBuf,
    pods: Arc<Mutex<Vec<Pod>>>,
    manner: Arc<Mutex<Manner>>,
    calls: Arc<AtomicU64>,
    asked: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PodResourcesServer {
    /// Listens on `socket` (created here) and lists `pods`.
    pub fn start(socket: &Path, pods: Vec<Pod>) -> PodResourcesServer {
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind the socket");
        listener.set_nonblocking(true).unwrap();
        let pods = Arc::new(Mutex::new(pods));
        let manner = Arc::new(Mutex::new(Manner {
            rotate: false,
            content_type: "application/grpc".to_owned(),
        }));
        let calls = Arc::new(AtomicU64::new(0));
        let asked = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let shared = Shared {
            pods: pods.clone(),
            manner: manner.clone(),
            calls: calls.clone(),
            asked: asked.clone(),
        };
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(serve(listener, shared, stopped));
        });
        PodResourcesServer {
            socket: socket.to_owned(),
            pods,
            manner,
            calls,
            asked,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Lists `pods` from now on.
    pub fn set(&self, pods: Vec<Pod>) {
        *self.pods.lock().unwrap() = pods;
    }

    /// Lists the pods in another order on every call (rotated by one more place each time).
    pub fn rotate(&self) {
        self.manner.lock().unwrap().rotate = true;
    }

    /// Answers with `content_type` from now on.
    pub fn set_content_type(&self, content_type: String) {
        self.manner.lock().unwrap().content_type = content_type;
    }

    /// `List` calls answered so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Requests received so far, answered or not.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }

    /// Stops listening and drops every connection; the socket file stays, with nobody
    /// behind it.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the serving thread shares with the handle.
#[derive(Clone)]
struct Shared {
    pods: Arc<Mutex<Vec<Pod>>>,
    manner: Arc<Mutex<Manner>>,
    calls: Arc<AtomicU64>,
    asked: Arc<AtomicU64>,
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    shared: Shared,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::UnixListener::from_std(listener).unwrap();
    loop {
        let conn = tokio::select! {
            _ = &mut stopped => return,
            c = listener.accept() => c,
        };
        let Ok((io, _)) = conn else { continue };
        let shared = shared.clone();
        // Connections end with the runtime when the stand-in stops.
        tokio::spawn(async move {
            let Ok(mut h2) = h2::server::handshake(io).await else {
                return;
            };
            while let Some(Ok((request, respond))) = h2.accept().await {
                tokio::spawn(answer(request, respond, shared.clone()));
            }
        });
    }
}

/// One gRPC call: `List` answers the pods; any other method is UNIMPLEMENTED (12), as a
/// gRPC server answers it.
async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
    shared: Shared,
) {
    shared.asked.fetch_add(1, Ordering::SeqCst);
    let (head, mut body) = request.into_parts();
    let grpc = head
        .headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let mut received = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    let trailers_only = |code: &str, message: &str| {
        http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .header("grpc-status", code)
            .header("grpc-message", message)
            .body(())
            .unwrap()
    };
    if head.uri.path() != "/v1.PodResourcesLister/List" || !grpc {
        let _ = respond.send_response(trailers_only("12", "unknown method"), true);
        return;
    }
    // The empty ListPodResourcesRequest: a 5-byte prefix declaring 0 bytes.
    if received != [0, 0, 0, 0, 0] {
        let _ = respond.send_response(
            trailers_only("13", "grpc: failed to unmarshal the request"),
            true,
        );
        return;
    }
    let manner = shared.manner.lock().unwrap().clone();
    let message = {
        let mut pods = shared.pods.lock().unwrap().clone();
        if manner.rotate && !pods.is_empty() {
            let n = shared.calls.load(Ordering::SeqCst) as usize % pods.len();
            pods.rotate_left(n);
        }
        encode_list(&pods)
    };
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let head = http::Response::builder()
        .status(200)
        .header("content-type", manner.content_type)
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    shared.calls.fetch_add(1, Ordering::SeqCst);
    let _ = send.send_data(framed.into(), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let _ = send.send_trailers(trailers);
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field `number` with wire type 2 (length-delimited) holding `body`.
fn len_field(number: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// `ListPodResourcesResponse { pod_resources = 1 }`, each `PodResources { name = 1,
/// namespace = 2, containers = 3 }`, each `ContainerResources { name = 1, devices = 2,
/// cpu_ids = 3 }`, each `ContainerDevices { resource_name = 1, device_ids = 2, topology = 3 }`.
pub fn encode_list(pods: &[Pod]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pods {
        let mut pod = Vec::new();
        len_field(1, p.name.as_bytes(), &mut pod);
        len_field(2, p.namespace.as_bytes(), &mut pod);
        for c in &p.containers {
            let mut ctr = Vec::new();
            len_field(1, c.name.as_bytes(), &mut ctr);
            for (resource, ids) in &c.devices {
                let mut devs = Vec::new();
                len_field(1, resource.as_bytes(), &mut devs);
                for id in ids {
                    len_field(2, id.as_bytes(), &mut devs);
                }
                // topology: TopologyInfo { nodes = 1: NUMANode { ID = 1: 0 } }
                let mut node = Vec::new();
                varint(1 << 3, &mut node);
                varint(0, &mut node);
                let mut topology = Vec::new();
                len_field(1, &node, &mut topology);
                len_field(3, &topology, &mut devs);
                len_field(2, &devs, &mut ctr);
            }
            // cpu_ids, packed: 2, 3
            len_field(3, &[2, 3], &mut ctr);
            len_field(3, &ctr, &mut pod);
        }
        len_field(1, &pod, &mut out);
    }
    out
}
