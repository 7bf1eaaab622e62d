//! What the host and a template say on the control socket (`SOCK_SEQPACKET`, one JSON
//! message per packet, descriptors alongside), and what the host writes on a run's report
//! socket.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::spec::InitSpec;

/// The largest request (code, arguments, environment) a child reads.
pub(crate) const MAX_REQUEST: u64 = 16 << 20;
/// The largest control message.
const MAX_MESSAGE: usize = 1 << 20;

/// The host's first message: the cold plan's spec the children are confined by, and the
/// modules the template imports.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct TemplateSpec {
    pub init: InitSpec,
    pub preload: Vec<String>,
}

/// A run: sent on the control socket with its descriptors (stdin, stdout, stderr, the report
/// socket, the request pipe, then the cgroup's files), its fields written on the request pipe.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct RunRequest {
    pub code: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The template's one message: its interpreter and preloads are ready, or why not.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TemplateStatus {
    Ready,
    Failed(String),
}

/// Sends one message with `fds` alongside.
pub(crate) fn send<T: Serialize>(
    socket: &OwnedFd,
    message: &T,
    fds: &[RawFd],
) -> Result<(), Error> {
    let body = serde_json::to_vec(message)
        .map_err(|e| Error::io("cannot encode a zygote message", std::io::Error::other(e)))?;
    let rights = [ControlMessage::ScmRights(fds)];
    let control: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(&body)],
        control,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| Error::io("cannot send to the zygote", e.into()))?;
    Ok(())
}

/// Receives one message and up to `max_fds` descriptors; `None` at EOF.
pub(crate) fn receive<T: DeserializeOwned>(
    socket: &OwnedFd,
    max_fds: usize,
) -> Result<Option<(T, Vec<OwnedFd>)>, Error> {
    receive_into(socket, max_fds, &mut MessageBuffer::new())
}

/// Room for one message, made once by a process that receives many (the template): a buffer
/// made (and zeroed) per message would write a whole MiB of the template's heap each time,
/// a copy of every page of it while children forked before share them, which those children
/// then keep, charged to the owner, until they end.
pub(crate) struct MessageBuffer(Vec<u8>);

impl MessageBuffer {
    pub(crate) fn new() -> MessageBuffer {
        MessageBuffer(vec![0u8; MAX_MESSAGE])
    }
}

/// [`receive`], into `buffer` (only the message's own bytes are written).
pub(crate) fn receive_into<T: DeserializeOwned>(
    socket: &OwnedFd,
    max_fds: usize,
    buffer: &mut MessageBuffer,
) -> Result<Option<(T, Vec<OwnedFd>)>, Error> {
    let body = &mut buffer.0;
    let message = crate::linux::receive_with_fds::<64>(socket.as_fd(), body)
        .map_err(|e| Error::io("cannot read from the zygote's control socket", e.into()))?;
    let (size, mut fds) = (message.bytes, message.fds);
    if size == 0 {
        return Ok(None);
    }
    fds.truncate(max_fds);
    let value = serde_json::from_slice(&body[..size])
        .map_err(|e| Error::io("malformed zygote message", std::io::Error::other(e)))?;
    Ok(Some((value, fds)))
}
