//! The sandbox's gate sockets, and their transfer from the sandbox to the gate.
//!
//! [`crate::sandbox_side::configure`] makes them inside the sandbox's network namespace; the
//! sandbox's child sends them over a Unix socketpair with `SCM_RIGHTS` ([`SandboxSockets::send`]),
//! the supervisor receives them ([`SandboxSockets::receive`]) and hands them to
//! [`crate::gate::Gate::start`]. The sockets keep their namespace: the gate accepts the
//! sandbox's connections on them from outside.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use crate::error::EgressError;
use crate::policy::MAX_CAPTURE_PORTS;

/// Descriptors per `SCM_RIGHTS` message (the kernel takes at most 253).
const FDS_PER_MESSAGE: usize = 128;
/// The largest transfer header accepted.
const MAX_HEADER: usize = 64 * 1024;

/// The sockets the gate serves for one sandbox, all made inside its network namespace.
#[derive(Debug)]
pub struct SandboxSockets {
    /// Listeners on every captured port (dual-stack when IPv6 works).
    pub capture: Vec<TcpListener>,
    /// The DNS stub's UDP sockets (`127.0.0.1:53`, and `[::1]:53` with IPv6).
    pub dns_udp: Vec<UdpSocket>,
    /// The DNS stub's TCP listeners on the same addresses.
    pub dns_tcp: Vec<TcpListener>,
    /// The proxy endpoint (HTTP and SOCKS5 on one port of 127.0.0.1).
    pub proxy: Vec<TcpListener>,
    /// IPv6 works inside the sandbox (AAAA queries get placeholders).
    pub ipv6: bool,
    /// The proxy endpoint's port.
    pub proxy_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Capture,
    DnsUdp,
    DnsTcp,
    Proxy,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    ipv6: bool,
    proxy_port: u16,
    kinds: Vec<Kind>,
}

impl SandboxSockets {
    /// The environment for programs that honour proxy variables (see [`crate::env::proxy_env`]).
    pub fn proxy_env(&self) -> Vec<(String, String)> {
        crate::env::proxy_env(self.proxy_port)
    }

    fn parts(&self) -> Vec<(Kind, BorrowedFd<'_>)> {
        let mut parts: Vec<(Kind, BorrowedFd<'_>)> = Vec::new();
        parts.extend(self.capture.iter().map(|l| (Kind::Capture, l.as_fd())));
        parts.extend(self.dns_udp.iter().map(|s| (Kind::DnsUdp, s.as_fd())));
        parts.extend(self.dns_tcp.iter().map(|l| (Kind::DnsTcp, l.as_fd())));
        parts.extend(self.proxy.iter().map(|l| (Kind::Proxy, l.as_fd())));
        parts
    }

    /// Sends the sockets over a Unix stream (one end of a socketpair): a length-prefixed JSON
    /// header naming each descriptor's role, then the descriptors with `SCM_RIGHTS`. The
    /// sender's copies close when `self` drops.
    pub fn send(self, channel: &UnixStream) -> Result<(), EgressError> {
        let parts = self.parts();
        let header = Header {
            ipv6: self.ipv6,
            proxy_port: self.proxy_port,
            kinds: parts.iter().map(|(kind, _)| *kind).collect(),
        };
        let header =
            serde_json::to_vec(&header).map_err(|e| EgressError::Transfer(e.to_string()))?;
        let mut writer = channel;
        let len = u32::try_from(header.len()).map_err(|e| EgressError::Transfer(e.to_string()))?;
        writer
            .write_all(&[&len.to_be_bytes()[..], &header].concat())
            .map_err(EgressError::setup("sending the egress header"))?;
        let fds: Vec<BorrowedFd<'_>> = parts.iter().map(|(_, fd)| *fd).collect();
        for chunk in fds.chunks(FDS_PER_MESSAGE) {
            send_fds(channel, chunk)?;
        }
        Ok(())
    }

    /// Receives the sockets [`SandboxSockets::send`] sent, checking each descriptor is the
    /// kind of socket its role needs.
    pub fn receive(channel: &UnixStream) -> Result<SandboxSockets, EgressError> {
        let header = read_header(channel)?;
        if header.kinds.len() > MAX_CAPTURE_PORTS + 8 {
            return Err(EgressError::Transfer(format!(
                "{} descriptors announced",
                header.kinds.len()
            )));
        }
        let mut fds = Vec::with_capacity(header.kinds.len());
        while fds.len() < header.kinds.len() {
            let wanted = (header.kinds.len() - fds.len()).min(FDS_PER_MESSAGE);
            fds.extend(receive_fds(channel, wanted)?);
        }
        assemble(header, fds)
    }
}

fn read_header(channel: &UnixStream) -> Result<Header, EgressError> {
    let mut reader = channel;
    let mut len = [0u8; 4];
    reader
        .read_exact(&mut len)
        .map_err(EgressError::setup("receiving the egress header"))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_HEADER {
        return Err(EgressError::Transfer(format!("a {len}-byte header")));
    }
    let mut header = vec![0u8; len];
    reader
        .read_exact(&mut header)
        .map_err(EgressError::setup("receiving the egress header"))?;
    serde_json::from_slice(&header).map_err(|e| EgressError::Transfer(format!("header: {e}")))
}

fn send_fds(channel: &UnixStream, fds: &[BorrowedFd<'_>]) -> Result<(), EgressError> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(EgressError::Transfer("descriptor batch too large".into()));
    }
    sendmsg(
        channel,
        &[IoSlice::new(&[1])],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(|e| EgressError::Transfer(format!("sendmsg: {e}")))?;
    Ok(())
}

fn receive_fds(channel: &UnixStream, wanted: usize) -> Result<Vec<OwnedFd>, EgressError> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let received = recvmsg(
        channel,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| EgressError::Transfer(format!("recvmsg: {e}")))?;
    if received.bytes == 0 {
        return Err(EgressError::Transfer(
            "the sandbox closed the channel early".into(),
        ));
    }
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if fds.is_empty() || fds.len() > wanted {
        return Err(EgressError::Transfer(format!(
            "{} descriptors where {wanted} were due",
            fds.len()
        )));
    }
    Ok(fds)
}

fn assemble(header: Header, fds: Vec<OwnedFd>) -> Result<SandboxSockets, EgressError> {
    if fds.len() != header.kinds.len() {
        return Err(EgressError::Transfer(format!(
            "{} descriptors for {} roles",
            fds.len(),
            header.kinds.len()
        )));
    }
    let mut sockets = SandboxSockets {
        capture: Vec::new(),
        dns_udp: Vec::new(),
        dns_tcp: Vec::new(),
        proxy: Vec::new(),
        ipv6: header.ipv6,
        proxy_port: header.proxy_port,
    };
    for (kind, fd) in header.kinds.into_iter().zip(fds) {
        check_kind(kind, &fd)?;
        match kind {
            Kind::Capture => sockets.capture.push(TcpListener::from(fd)),
            Kind::DnsUdp => sockets.dns_udp.push(UdpSocket::from(fd)),
            Kind::DnsTcp => sockets.dns_tcp.push(TcpListener::from(fd)),
            Kind::Proxy => sockets.proxy.push(TcpListener::from(fd)),
        }
    }
    Ok(sockets)
}

/// A listener role needs a listening stream socket, the DNS role a datagram socket.
fn check_kind(kind: Kind, fd: &OwnedFd) -> Result<(), EgressError> {
    let wrong = |what: &str| EgressError::Transfer(format!("a {kind:?} descriptor is {what}"));
    let socket_type = sockopt::socket_type(fd).map_err(|_| wrong("not a socket"))?;
    let domain = sockopt::socket_domain(fd).map_err(|_| wrong("unreadable"))?;
    if domain != AddressFamily::INET && domain != AddressFamily::INET6 {
        return Err(wrong("not an IP socket"));
    }
    let listening = kind != Kind::DnsUdp;
    let expected = if listening {
        SocketType::STREAM
    } else {
        SocketType::DGRAM
    };
    if socket_type != expected {
        return Err(wrong("of the wrong socket type"));
    }
    if listening && !sockopt::socket_acceptconn(fd).map_err(|_| wrong("unreadable"))? {
        return Err(wrong("not listening"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").unwrap()
    }

    #[test]
    fn sockets_cross_a_socketpair_with_their_roles() {
        let capture: Vec<TcpListener> = (0..300).map(|_| listener()).collect();
        let ports: Vec<u16> = capture
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let sockets = SandboxSockets {
            capture,
            dns_udp: vec![UdpSocket::bind("127.0.0.1:0").unwrap()],
            dns_tcp: vec![listener()],
            proxy: vec![listener()],
            ipv6: true,
            proxy_port: 3128,
        };
        let (a, b) = UnixStream::pair().unwrap();
        let sender = std::thread::spawn(move || sockets.send(&a));
        let received = SandboxSockets::receive(&b).unwrap();
        sender.join().unwrap().unwrap();
        let received_ports: Vec<u16> = received
            .capture
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert_eq!(
            received_ports, ports,
            "in order, across several SCM_RIGHTS messages"
        );
        assert_eq!(
            (
                received.dns_udp.len(),
                received.dns_tcp.len(),
                received.proxy.len()
            ),
            (1, 1, 1)
        );
        assert!(received.ipv6 && received.proxy_port == 3128);
    }

    #[test]
    fn a_descriptor_of_the_wrong_kind_is_refused() {
        let sockets = SandboxSockets {
            capture: vec![],
            dns_udp: vec![],
            dns_tcp: vec![],
            proxy: vec![listener()],
            ipv6: false,
            proxy_port: 1,
        };
        let (a, b) = UnixStream::pair().unwrap();
        // Announce the listener as a DNS datagram socket.
        let header = br#"{"ipv6":false,"proxy_port":1,"kinds":["dns_udp"]}"#;
        let mut writer = &a;
        writer
            .write_all(&(header.len() as u32).to_be_bytes())
            .unwrap();
        writer.write_all(header).unwrap();
        send_fds(&a, &[sockets.proxy[0].as_fd()]).unwrap();
        let error = SandboxSockets::receive(&b).unwrap_err().to_string();
        assert!(error.contains("wrong socket type"), "{error}");
    }
}
