//! One call of `v1.PodResourcesLister/List` on the kubelet's Unix socket: gRPC over HTTP/2
//! (h2's client), bounded in time by the caller and in size here.
//!
//! What goes on the wire (the gRPC HTTP/2 protocol): a `POST` of
//! `/v1.PodResourcesLister/List` (the service and method of the Kubernetes repository's
//! `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`) with `content-type:
//! application/grpc` and `te: trailers`, whose body is one length-prefixed message: the empty
//! `ListPodResourcesRequest`, five zero bytes. The answer is one length-prefixed
//! `ListPodResourcesResponse`, then trailers whose `grpc-status` must be 0; an error may come
//! as trailers alone, in the headers.

use super::proto::{self, Bounds, DecodeError, ListPodResourcesResponse};
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;

/// The method's path.
pub(crate) const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// The largest header list taken from the kubelet (HTTP/2's `SETTINGS_MAX_HEADER_LIST_SIZE`;
/// h2's default is 16 MiB). A gRPC answer's headers are a content type, a status and a
/// message: a few hundred bytes. A 15 MB `content-type` once went to the log on every poll
/// (issue 48); over this, h2 refuses the answer before it is built.
pub(crate) const MAX_HEADER_LIST: u32 = 16 << 10;

/// Why a `List` failed, naming what was wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("HTTP/2 with the kubelet: {0}")]
    Http2(#[from] h2::Error),
    #[error("the kubelet answered HTTP status {0}, not 200")]
    HttpStatus(u16),
    #[error("the kubelet answered grpc-status {code}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Status { code: u32, message: String },
    #[error("the answer is not gRPC: {0}")]
    Protocol(String),
    #[error("the answer is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Calls `List` on the socket at `path`: the answer, of at most `max` bytes, decoded within
/// `bounds`. `deadline` is sent as `grpc-timeout` and bounds the whole call.
pub(crate) async fn list(
    path: &Path,
    deadline: Duration,
    max: usize,
    bounds: &Bounds,
) -> Result<ListPodResourcesResponse, CallError> {
    tokio::time::timeout(deadline, call(path, deadline, max, bounds))
        .await
        .unwrap_or(Err(CallError::Timeout(deadline)))
}

async fn call(
    path: &Path,
    deadline: Duration,
    max: usize,
    bounds: &Bounds,
) -> Result<ListPodResourcesResponse, CallError> {
    let io = UnixStream::connect(path)
        .await
        .map_err(|source| CallError::Connect {
            path: path.to_owned(),
            source,
        })?;
    let (client, conn) = h2::client::Builder::new()
        .max_header_list_size(MAX_HEADER_LIST)
        .handshake(io)
        .await?;
    // The connection is driven here, beside the call, rather than on a task of its own: when
    // the call ends (or its deadline drops it) the socket goes with it, whatever the kubelet
    // does.
    let call = answer(client, deadline, max, bounds);
    tokio::pin!(call, conn);
    tokio::select! {
        biased;
        r = &mut call => return r,
        _ = &mut conn => {}
    }
    // The connection ended first: what it received is still read, and a lost answer is
    // h2's error.
    call.await
}

async fn answer(
    client: h2::client::SendRequest<Bytes>,
    deadline: Duration,
    max: usize,
    bounds: &Bounds,
) -> Result<ListPodResourcesResponse, CallError> {
    let mut client = client.ready().await?;
    let request = http::Request::post(format!("http://localhost{LIST_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header("grpc-timeout", format!("{}m", deadline.as_millis().max(1)))
        .body(())
        .map_err(|e| CallError::Protocol(e.to_string()))?;
    let (response, mut send) = client.send_request(request, false)?;
    // The empty ListPodResourcesRequest: not compressed, length 0.
    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)?;
    let response = response.await?;
    let (head, mut body) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(CallError::HttpStatus(head.status.as_u16()));
    }
    // Trailers-only: an error with no message.
    status(&head.headers)?;
    let content_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/grpc") {
        return Err(CallError::Protocol(format!(
            "content-type {}, not application/grpc",
            crate::logging::quote(content_type)
        )));
    }
    let mut message = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
        // The prefix says the length: refuse an answer over the bound before it arrives.
        let declared = declared_length(&message).unwrap_or(0);
        if declared > max || message.len() > max.saturating_add(5) {
            return Err(CallError::TooLarge { limit: max });
        }
    }
    match body.trailers().await? {
        Some(trailers) => status(&trailers)?,
        None => {
            return Err(CallError::Protocol(
                "the answer ended without trailers (no grpc-status)".to_owned(),
            ));
        }
    }
    unframe(&message)?;
    // Off the runtime's threads: an answer shaped for the most work (a million empty pods)
    // takes a while to walk, and the threads serving /status must not wait on it.
    let bounds = *bounds;
    let decode = move || Ok(proto::decode_list(unframe(&message)?, &bounds)?);
    tokio::task::spawn_blocking(decode)
        .await
        .map_err(|e| CallError::Protocol(format!("the decoder panicked: {e}")))?
}

/// The length a gRPC message's 5-byte prefix declares, once the prefix is there.
fn declared_length(frame: &[u8]) -> Option<usize> {
    let len: [u8; 4] = frame.get(1..5)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(len)).ok()
}

/// The one message of a gRPC body: a compressed-flag byte (0: the agent asks for no
/// compression), a big-endian u32 length, the message.
fn unframe(body: &[u8]) -> Result<&[u8], CallError> {
    let (Some(&flag), Some(len)) = (body.first(), declared_length(body)) else {
        return Err(CallError::Protocol(format!(
            "{} bytes, shorter than a message's 5-byte prefix",
            body.len()
        )));
    };
    if flag != 0 {
        return Err(CallError::Protocol(format!(
            "compressed flag {flag}: the answer is compressed, and no compression was offered"
        )));
    }
    let message = &body[5..];
    if message.len() != len {
        return Err(CallError::Protocol(format!(
            "the prefix declares {len} bytes and {} follow (one message expected)",
            message.len()
        )));
    }
    Ok(message)
}

/// `grpc-status` and `grpc-message` of headers or trailers: an error unless absent or 0.
fn status(headers: &http::HeaderMap) -> Result<(), CallError> {
    let Some(code) = headers.get("grpc-status") else {
        return Ok(());
    };
    let code = code
        .to_str()
        .ok()
        .and_then(|c| c.parse::<u32>().ok())
        .ok_or_else(|| {
            CallError::Protocol(format!(
                "grpc-status {} is not a number",
                crate::logging::quote(&String::from_utf8_lossy(code.as_bytes()))
            ))
        })?;
    if code == 0 {
        return Ok(());
    }
    let message: String = headers
        .get("grpc-message")
        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    Err(CallError::Status { code, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_one_uncompressed_message_of_the_declared_length() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 8, 1]).unwrap(), &[8, 1]);
        assert_eq!(unframe(&[0, 0, 0, 0, 0]).unwrap(), &[] as &[u8]);
        let e = unframe(&[0, 0, 0]).unwrap_err().to_string();
        assert!(e.contains("shorter than a message's 5-byte prefix"), "{e}");
        let e = unframe(&[1, 0, 0, 0, 1, 8]).unwrap_err().to_string();
        assert!(e.contains("compressed flag 1"), "{e}");
        let e = unframe(&[0, 0, 0, 0, 3, 8]).unwrap_err().to_string();
        assert!(e.contains("declares 3 bytes and 1 follow"), "{e}");
        let e = unframe(&[0, 0, 0, 0, 1, 8, 0, 0, 0, 0, 0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("declares 1 bytes and 6 follow"), "{e}");
    }

    /// Serves one call on a fresh socket: headers, then `data` (if any), then `grpc-status`
    /// in trailers, or in the headers when `data` is `None` (trailers-only).
    async fn one_answer(
        data: Option<Vec<u8>>,
        status: &'static str,
    ) -> (tempfile::TempDir, PathBuf) {
        answer_typed("application/grpc".to_owned(), data, status).await
    }

    /// [`one_answer`] with `content_type`.
    async fn answer_typed(
        content_type: String,
        data: Option<Vec<u8>>,
        status: &'static str,
    ) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (io, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(io).await.unwrap();
            let (_, mut respond) = conn.accept().await.unwrap().unwrap();
            let mut head = http::Response::builder().header("content-type", content_type);
            if data.is_none() {
                head = head.header("grpc-status", status);
            }
            let mut send = respond
                .send_response(head.body(()).unwrap(), data.is_none())
                .unwrap();
            if let Some(d) = data {
                let _ = send.send_data(d.into(), false);
                let mut t = http::HeaderMap::new();
                t.insert("grpc-status", status.parse().unwrap());
                let _ = send.send_trailers(t);
            }
            // Serve until the client goes.
            while conn.accept().await.is_some() {}
        });
        (dir, path)
    }

    // Issue 42: an answer larger than the bound is refused from its 5-byte prefix, before
    // its bytes arrive; a gRPC error comes back with its code and message.
    #[tokio::test]
    async fn an_oversized_answer_or_a_grpc_error_is_refused_by_name() {
        let second = Duration::from_secs(10);
        let mut big = vec![0];
        big.extend_from_slice(&(5u32 << 20).to_be_bytes());
        big.extend_from_slice(&[0; 64]);
        let (_dir, path) = one_answer(Some(big), "0").await;
        let e = list(&path, second, 4 << 20, &Bounds::AGENT)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "the answer is larger than 4194304 bytes");

        let (_dir, path) = one_answer(Some(vec![0, 0, 0, 0, 2, 0x0a, 0x00]), "0").await;
        assert_eq!(
            list(&path, second, 1024, &Bounds::AGENT).await.unwrap(),
            ListPodResourcesResponse {
                pod_resources: vec![Default::default()],
                ..Default::default()
            }
        );
        let (_dir, path) = one_answer(Some(vec![0, 0, 0, 0, 2, 0x0a, 0x00]), "0").await;
        let e = list(&path, second, 1, &Bounds::AGENT).await.unwrap_err();
        assert!(matches!(e, CallError::TooLarge { limit: 1 }), "{e}");

        let (_dir, path) = one_answer(None, "12").await;
        let e = list(&path, second, 1024, &Bounds::AGENT).await.unwrap_err();
        assert_eq!(e.to_string(), "the kubelet answered grpc-status 12");
        let (_dir, path) = one_answer(Some(vec![0, 0, 0, 0, 0]), "14").await;
        let e = list(&path, second, 1024, &Bounds::AGENT).await.unwrap_err();
        assert_eq!(e.to_string(), "the kubelet answered grpc-status 14");
    }

    // Issue 48, R4: a 15 MB content-type went uncut into the log on every poll. A header
    // list over MAX_HEADER_LIST is refused by h2 before it is built; a smaller odd header is
    // quoted, cut.
    #[tokio::test]
    async fn a_huge_or_odd_header_is_refused_and_what_is_said_of_it_is_cut() {
        let second = Duration::from_secs(10);
        let ok = Some(vec![0, 0, 0, 0, 0]);
        let (_dir, path) = answer_typed("x".repeat(4 << 20), ok.clone(), "0").await;
        let e = list(&path, second, 1024, &Bounds::AGENT)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.len() < 1024,
            "{} bytes: {}",
            e.len(),
            crate::logging::clip(&e)
        );
        let (_dir, path) = answer_typed("y".repeat(10_000), ok, "0").await;
        let e = list(&path, second, 1024, &Bounds::AGENT)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the answer is not gRPC: content-type \"yyy"),
            "{e}"
        );
        assert!(e.contains("more bytes)"), "cut: {e}");
        assert!(e.len() < 1024, "{} bytes", e.len());
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", "7".repeat(100_000).parse().unwrap());
        let e = status(&h).unwrap_err().to_string();
        assert!(e.len() < 1024, "{} bytes", e.len());
    }

    #[test]
    fn grpc_status_other_than_zero_is_an_error_with_its_message() {
        let mut h = http::HeaderMap::new();
        assert!(status(&h).is_ok());
        h.insert("grpc-status", "0".parse().unwrap());
        assert!(status(&h).is_ok());
        h.insert("grpc-status", "12".parse().unwrap());
        h.insert("grpc-message", "unknown method".parse().unwrap());
        assert_eq!(
            status(&h).unwrap_err().to_string(),
            "the kubelet answered grpc-status 12: unknown method"
        );
        h.insert("grpc-status", "twelve".parse().unwrap());
        assert!(
            status(&h)
                .unwrap_err()
                .to_string()
                .contains("is not a number")
        );
    }
}
