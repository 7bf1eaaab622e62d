//! Run inside the sandbox's fresh network namespace, while the process still holds
//! CAP_NET_ADMIN there: bring `lo` up, make the placeholder and allowed ranges local, and bind
//! the gate's sockets. Everything else stays unroutable, so any other destination fails at
//! once with ENETUNREACH (no route) or ECONNREFUSED (a local address with no listener).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;

use ipnet::IpNet;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkFlags, LinkMessage};
use netlink_packet_route::route::{
    RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily as NlFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NlAddr};
use rustix::net::{bind, listen, socket_with, sockopt, AddressFamily, SocketFlags, SocketType};

use crate::error::EgressError;
use crate::plan::SandboxPlan;
use crate::sockets::SandboxSockets;

/// The local routing table (where `ip route add local ...` goes).
const RT_TABLE_LOCAL: u8 = 255;
/// Pending connections per listener.
const BACKLOG: i32 = 128;
/// The DNS port.
const DNS_PORT: u16 = 53;

/// Configures the calling thread's network namespace for the plan and returns the gate's
/// sockets. Call it in the sandbox's child, inside its new network namespace, before it
/// drops CAP_NET_ADMIN; send the result to the gate with [`SandboxSockets::send`].
pub fn configure(plan: &SandboxPlan) -> Result<SandboxSockets, EgressError> {
    let mut netlink = Netlink::open()?;
    let lo = loopback_index()?;
    netlink.link_up(lo)?;
    let mut ipv6 = true;
    for range in plan.local_routes() {
        match netlink.add_local_route(range, lo) {
            Ok(()) => {}
            // IPv6 disabled in this namespace or kernel: the sandbox gets IPv4 only.
            Err(e) if range.addr().is_ipv6() && is_ipv6_unavailable(&e) => ipv6 = false,
            Err(e) => {
                return Err(EgressError::setup(format!(
                    "adding the local route {range}"
                ))(e))
            }
        }
    }
    bind_sockets(plan, ipv6)
}

/// EAFNOSUPPORT without IPv6 in the kernel; EACCES when `disable_ipv6` is set.
fn is_ipv6_unavailable(e: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(e),
        Some(Errno::AFNOSUPPORT | Errno::ACCESS)
    )
}

fn loopback_index() -> Result<u32, EgressError> {
    let probe = socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| EgressError::setup("opening a socket to find lo")(e.into()))?;
    rustix::net::netdevice::name_to_index(&probe, "lo")
        .map_err(|e| EgressError::setup("finding lo")(e.into()))
}

fn bind_sockets(plan: &SandboxPlan, ipv6: bool) -> Result<SandboxSockets, EgressError> {
    let mut loopbacks: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into()];
    if ipv6 {
        loopbacks.push(Ipv6Addr::LOCALHOST.into());
    }
    let dns_addresses: Vec<SocketAddr> = loopbacks
        .iter()
        .map(|&ip| SocketAddr::new(ip, DNS_PORT))
        .collect();
    let dns_udp = dns_addresses
        .iter()
        .map(|a| bind_udp(*a))
        .collect::<Result<_, _>>()?;
    let dns_tcp = dns_addresses
        .iter()
        .map(|a| bind_listener(*a, false))
        .collect::<Result<_, _>>()?;
    let proxy = vec![bind_listener(
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), plan.proxy_port),
        false,
    )?];
    let wildcard: IpAddr = if ipv6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let capture = plan
        .capture_ports
        .iter()
        .map(|&port| bind_listener(SocketAddr::new(wildcard, port), true))
        .collect::<Result<_, _>>()?;
    Ok(SandboxSockets {
        capture,
        dns_udp,
        dns_tcp,
        proxy,
        ipv6,
        proxy_port: plan.proxy_port,
    })
}

fn family_of(address: SocketAddr) -> AddressFamily {
    if address.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    }
}

/// A listener; `dual_stack` makes an IPv6 wildcard listener take IPv4 connections too, so one
/// socket captures a port on every local address of both families.
fn bind_listener(address: SocketAddr, dual_stack: bool) -> Result<TcpListener, EgressError> {
    let step = || format!("listening on {address}");
    let fd = socket_with(
        family_of(address),
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| EgressError::setup(step())(e.into()))?;
    if address.is_ipv6() {
        sockopt::set_ipv6_v6only(&fd, !dual_stack)
            .map_err(|e| EgressError::setup(step())(e.into()))?;
    }
    bind(&fd, &address).map_err(|e| EgressError::setup(step())(e.into()))?;
    listen(&fd, BACKLOG).map_err(|e| EgressError::setup(step())(e.into()))?;
    Ok(TcpListener::from(fd))
}

fn bind_udp(address: SocketAddr) -> Result<UdpSocket, EgressError> {
    let step = || format!("binding the DNS stub on {address}");
    let fd: OwnedFd = socket_with(
        family_of(address),
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| EgressError::setup(step())(e.into()))?;
    bind(&fd, &address).map_err(|e| EgressError::setup(step())(e.into()))?;
    Ok(UdpSocket::from(fd))
}

/// A route-netlink socket with acknowledged requests.
struct Netlink {
    socket: Socket,
    sequence: u32,
}

impl Netlink {
    fn open() -> Result<Netlink, EgressError> {
        let mut socket =
            Socket::new(NETLINK_ROUTE).map_err(EgressError::setup("opening route netlink"))?;
        socket
            .bind_auto()
            .map_err(EgressError::setup("binding route netlink"))?;
        socket
            .connect(&NlAddr::new(0, 0))
            .map_err(EgressError::setup("connecting route netlink"))?;
        Ok(Netlink {
            socket,
            sequence: 0,
        })
    }

    fn link_up(&mut self, index: u32) -> Result<(), EgressError> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        message.header.flags = LinkFlags::Up;
        message.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(message), 0)
            .map_err(EgressError::setup("bringing lo up"))
    }

    /// `ip route add local RANGE dev lo table local`: every address of the range is this
    /// namespace's own, so a connection to it lands on the capture listeners.
    fn add_local_route(&mut self, range: IpNet, lo: u32) -> io::Result<()> {
        let mut message = RouteMessage::default();
        let header = &mut message.header;
        header.address_family = if range.addr().is_ipv4() {
            NlFamily::Inet
        } else {
            NlFamily::Inet6
        };
        header.destination_prefix_length = range.prefix_len();
        header.table = RT_TABLE_LOCAL;
        header.protocol = RouteProtocol::Static;
        header.scope = RouteScope::Host;
        header.kind = RouteType::Local;
        message.attributes = vec![
            RouteAttribute::Destination(range.network().into()),
            RouteAttribute::Oif(lo),
        ];
        self.request(
            RouteNetlinkMessage::NewRoute(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
    }

    fn request(&mut self, payload: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.sequence;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::from(payload));
        message.finalize();
        let mut buffer = vec![0u8; message.buffer_len()];
        message.serialize(&mut buffer);
        self.socket.send(&buffer, 0)?;
        self.await_ack()
    }

    fn await_ack(&mut self) -> io::Result<()> {
        let mut buffer = vec![0u8; 8192];
        loop {
            let n = self.socket.recv(&mut &mut buffer[..], 0)?;
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[..n])
                .map_err(|e| io::Error::other(format!("netlink reply: {e}")))?;
            if reply.header.sequence_number != self.sequence {
                continue;
            }
            return match reply.payload {
                NetlinkPayload::Error(error) => match error.code {
                    None => Ok(()),
                    Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                },
                _ => Ok(()),
            };
        }
    }
}
