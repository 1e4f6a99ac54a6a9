//! The hand-over's messages on the wire: each a 4-byte big-endian length, then the JSON, the
//! listening sockets riding along (`SCM_RIGHTS`); every read and write bounded by a deadline,
//! and the peer's user id checked (`SO_PEERCRED`).

use super::{HandoverError, MAX_MESSAGE, MAX_SOCKETS, STEP};
use serde::{Deserialize, Serialize};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::time::Instant;

/// One message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub(super) enum Message {
    Hello {
        protocol: u32,
        pid: u32,
        agent: String,
    },
    Offer {
        protocol: u32,
        pid: u32,
        agent: String,
        /// The address of each socket attached, in order.
        listeners: Vec<SocketAddr>,
    },
    Take,
    Released,
    Serving,
    Refused {
        why: String,
    },
}

impl Message {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Offer { .. } => "offer",
            Message::Take => "take",
            Message::Released => "released",
            Message::Serving => "serving",
            Message::Refused { .. } => "refused",
        }
    }
}

/// Whether a peer running as uid `peer` may hand over to, or take over from, an agent
/// running as uid `me`: the same user, or root.
pub(super) fn trusted(peer: u32, me: u32) -> bool {
    peer == me || peer == 0
}

/// The uid of the process at the other end of `sock`, with this process's.
pub(super) fn peer_uid(sock: &UnixStream) -> Result<(u32, u32), HandoverError> {
    let cred = rustix::net::sockopt::socket_peercred(sock)
        .map_err(|e| HandoverError::io("reading the peer's credentials")(e.into()))?;
    Ok((cred.uid.as_raw(), rustix::process::geteuid().as_raw()))
}

/// Sends `m` with `fds` attached.
pub(super) async fn send(sock: &UnixStream, m: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(m).map_err(io::Error::other)?;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let sent = sock
        .async_io(Interest::WRITABLE, || {
            let mut space =
                vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(rustix::net::SendAncillaryMessage::ScmRights(fds)) {
                return Err(io::Error::other("too many sockets for one message"));
            }
            Ok(rustix::net::sendmsg(
                sock,
                &[IoSlice::new(&frame)],
                &mut control,
                rustix::net::SendFlags::NOSIGNAL,
            )?)
        })
        .await?;
    // The descriptors went with the first byte; the rest of a long frame follows plainly.
    let mut rest = &frame[sent..];
    while !rest.is_empty() {
        let n = sock
            .async_io(Interest::WRITABLE, || {
                Ok(rustix::net::send(
                    sock,
                    rest,
                    rustix::net::SendFlags::NOSIGNAL,
                )?)
            })
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        rest = &rest[n..];
    }
    Ok(())
}

pub(super) fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the other agent closed the connection",
    )
}

/// Receives one message and the descriptors that came with it.
pub(super) async fn recv(sock: &UnixStream) -> io::Result<(Message, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    // The descriptors come with the frame's first bytes: read the header with recvmsg.
    while got < head.len() {
        let n = sock
            .async_io(Interest::READABLE, || {
                let mut space =
                    vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
                let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
                let r = rustix::net::recvmsg(
                    sock,
                    &mut [IoSliceMut::new(&mut head[got..])],
                    &mut control,
                    rustix::net::RecvFlags::CMSG_CLOEXEC,
                )?;
                for m in control.drain() {
                    if let rustix::net::RecvAncillaryMessage::ScmRights(it) = m {
                        fds.extend(it);
                    }
                }
                Ok(r.bytes)
            })
            .await?;
        if n == 0 {
            return Err(closed());
        }
        got += n;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {len} bytes (at most {MAX_MESSAGE})"),
        ));
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = sock
            .async_io(Interest::READABLE, || {
                let (n, _) =
                    rustix::net::recv(sock, &mut body[got..], rustix::net::RecvFlags::empty())?;
                Ok(n)
            })
            .await?;
        if n == 0 {
            return Err(closed());
        }
        got += n;
    }
    let m =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((m, fds))
}

/// Receives the message `want` (by name) by `deadline` (`limit` from the step's start, for
/// the error); a `refused` or any other message is an error naming it.
pub(super) async fn expect_by(
    sock: &UnixStream,
    want: &'static str,
    deadline: Instant,
    limit: Duration,
) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
    let Ok(got) = tokio::time::timeout_at(deadline, recv(sock)).await else {
        return Err(HandoverError::Timeout { want, limit });
    };
    match got {
        Ok((m, fds)) if m.name() == want => Ok((m, fds)),
        Ok((Message::Refused { why }, _)) => Err(HandoverError::Refused { why }),
        Ok((m, _)) => Err(HandoverError::Unexpected {
            want,
            got: m.name(),
        }),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(HandoverError::Closed { want }),
        Err(e) => Err(HandoverError::Io {
            during: format!("waiting for `{want}`"),
            source: e,
        }),
    }
}

/// [`expect_by`] within `limit` from now.
pub(super) async fn expect(
    sock: &UnixStream,
    want: &'static str,
    limit: Duration,
) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
    expect_by(sock, want, Instant::now() + limit, limit).await
}

/// Sends `m` with `fds`, within [`STEP`].
pub(super) async fn say(
    sock: &UnixStream,
    m: &Message,
    fds: &[BorrowedFd<'_>],
) -> Result<(), HandoverError> {
    if fds.len() > MAX_SOCKETS {
        return Err(HandoverError::Sockets(format!(
            "{} sockets, and one offer carries at most {MAX_SOCKETS}",
            fds.len()
        )));
    }
    let during = || format!("sending `{}`", m.name());
    match tokio::time::timeout(STEP, send(sock, m, fds)).await {
        Ok(r) => r.map_err(HandoverError::io(during())),
        Err(_) => Err(HandoverError::Io {
            during: during(),
            source: io::Error::new(io::ErrorKind::TimedOut, format!("not sent within {STEP:?}")),
        }),
    }
}

/// Tells the other agent why this one will not go on, as well as it can (it may be gone).
pub(super) async fn refuse(sock: &UnixStream, why: &str) {
    let _ = say(
        sock,
        &Message::Refused {
            why: why.to_owned(),
        },
        &[],
    )
    .await;
}
