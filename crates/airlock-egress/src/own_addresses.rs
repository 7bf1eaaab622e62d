//! The addresses of the machine running the gate: a name resolving to one of them is refused
//! like loopback (self-connection, as smokescreen refuses it). Read from route netlink, kept
//! for a second so a burst of connections reads them once.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a read of the host's addresses is trusted.
const FRESH_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct OwnAddresses {
    cache: Mutex<Option<(Instant, Vec<IpAddr>)>>,
}

impl OwnAddresses {
    /// True when the address is one of this machine's (in the gate's network namespace).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let stale = cache
            .as_ref()
            .is_none_or(|(read, _)| read.elapsed() > FRESH_FOR);
        if stale {
            *cache = Some((Instant::now(), read_addresses()));
        }
        cache
            .as_ref()
            .is_some_and(|(_, addresses)| addresses.contains(&ip))
    }
}

#[cfg(target_os = "linux")]
fn read_addresses() -> Vec<IpAddr> {
    linux::dump().unwrap_or_default()
}

#[cfg(not(target_os = "linux"))]
fn read_addresses() -> Vec<IpAddr> {
    Vec::new()
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::net::IpAddr;

    use netlink_packet_core::{
        NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
    };
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

    /// `ip address show`, as a list of addresses.
    pub(super) fn dump() -> io::Result<Vec<IpAddr>> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let payload = RouteNetlinkMessage::GetAddress(AddressMessage::default());
        let mut request = NetlinkMessage::new(header, NetlinkPayload::from(payload));
        request.finalize();
        let mut buffer = vec![0u8; request.buffer_len()];
        request.serialize(&mut buffer);
        socket.send(&buffer, 0)?;
        read_dump(&socket)
    }

    fn read_dump(socket: &Socket) -> io::Result<Vec<IpAddr>> {
        let mut addresses = Vec::new();
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            let n = socket.recv(&mut &mut buffer[..], 0)?;
            let mut offset = 0;
            while offset < n {
                let message =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[offset..n])
                        .map_err(|e| io::Error::other(e.to_string()))?;
                let len = message.header.length as usize;
                match message.payload {
                    NetlinkPayload::Done(_) | NetlinkPayload::Error(_) => return Ok(addresses),
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(address)) => {
                        addresses.extend(address.attributes.iter().filter_map(|a| match a {
                            AddressAttribute::Address(ip) | AddressAttribute::Local(ip) => {
                                Some(*ip)
                            }
                            _ => None,
                        }));
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3; // messages are 4-byte aligned
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_one_of_ours() {
        let own = OwnAddresses::default();
        assert!(own.contains("127.0.0.1".parse().unwrap()));
        assert!(own.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!own.contains("192.0.2.200".parse().unwrap()));
    }
}
