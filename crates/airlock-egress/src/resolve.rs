//! Host-side name resolution: the gate resolves allowed names itself, once per connection (or
//! from a cache that honours the answer's TTL), and dials exactly the addresses it classified.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use crate::policy::Resolver;
use crate::sniff::is_timeout;

/// How long one attempt waits for a DNS server.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts over UDP before giving up.
const ATTEMPTS: usize = 2;
/// The longest a cached answer is kept, whatever its TTL.
const MAX_CACHE_TTL: u32 = 300;

/// Resolves names for the gate.
#[derive(Debug)]
pub struct HostResolver {
    resolver: Resolver,
    cache: Mutex<HashMap<String, (Vec<IpAddr>, Instant)>>,
    /// Readable once the run ends: a lookup waiting on a DNS server gives up at once.
    cancel: Option<OwnedFd>,
}

impl HostResolver {
    /// A resolver asking the system or the given server; a lookup gives up as soon as
    /// `cancel` becomes readable (the run ended).
    pub fn new(resolver: Resolver, cancel: Option<OwnedFd>) -> HostResolver {
        HostResolver {
            resolver,
            cache: Mutex::new(HashMap::new()),
            cancel,
        }
    }

    /// Every address of a name (IPv4 first as the server or system ordered them); an empty
    /// list when the name does not exist.
    pub fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(cached) = self.cached(name) {
            return Ok(cached);
        }
        let (addresses, ttl) = match self.resolver {
            Resolver::System => {
                let name = name.to_string();
                let cancel = self.cancel.as_ref().map(AsFd::as_fd);
                (off_thread(cancel, move || resolve_system(&name))?, 0)
            }
            Resolver::Server(server) => ask(server, name, self.cancel.as_ref().map(AsFd::as_fd))?,
        };
        if ttl > 0 {
            let expiry = Instant::now() + Duration::from_secs(u64::from(ttl.min(MAX_CACHE_TTL)));
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.insert(name.to_string(), (addresses.clone(), expiry));
        }
        Ok(addresses)
    }

    fn cached(&self, name: &str) -> Option<Vec<IpAddr>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(name)
            .filter(|(_, expiry)| Instant::now() < *expiry)
            .map(|(addresses, _)| addresses.clone())
    }
}

fn resolve_system(name: &str) -> io::Result<Vec<IpAddr>> {
    match (name, 0).to_socket_addrs() {
        Ok(addresses) => {
            let mut ips: Vec<IpAddr> = Vec::new();
            for ip in addresses.map(|a| a.ip()) {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
            Ok(ips)
        }
        // getaddrinfo's "no such name" comes back as an error without an OS code.
        Err(e) if e.raw_os_error().is_none() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// System lookups running at once, across the process's gates, at most.
const MAX_SYSTEM_LOOKUPS: usize = 64;
/// Stack of a system lookup's thread (NSS modules run on it).
const LOOKUP_STACK: usize = 256 * 1024;
/// The name of a system lookup's thread: short enough (15 bytes) for the kernel to keep it
/// whole in `/proc/*/task/*/comm`, so a lookup still running can be told from the gate's
/// other threads.
pub const LOOKUP_THREAD: &str = "airlock-lookup";
static SYSTEM_LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Runs a lookup that cannot be interrupted (getaddrinfo) on a thread of its own and waits
/// for its answer or for `cancel`, whichever comes first: the run's end never waits on it.
/// A cancelled lookup's thread holds nothing of the run and ends when the lookup returns
/// (the system resolver's own timeouts bound it); at most [`MAX_SYSTEM_LOOKUPS`] run at once.
fn off_thread<T: Send + 'static>(
    cancel: Option<BorrowedFd<'_>>,
    lookup: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let Some(cancel) = cancel else {
        return lookup();
    };
    let taken = SYSTEM_LOOKUPS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < MAX_SYSTEM_LOOKUPS).then_some(n + 1)
    });
    if taken.is_err() {
        return Err(io::Error::other("too many system lookups at once"));
    }
    let done = eventfd(0, EventfdFlags::CLOEXEC)?;
    let signal = done.try_clone()?;
    let (send, answer) = mpsc::channel();
    let spawned = thread::Builder::new()
        .name(LOOKUP_THREAD.into())
        .stack_size(LOOKUP_STACK)
        .spawn(move || {
            let _ = send.send(lookup());
            let _ = rustix::io::write(&signal, &1u64.to_ne_bytes());
            SYSTEM_LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        SYSTEM_LOOKUPS.fetch_sub(1, Ordering::AcqRel);
        return Err(e);
    }
    let mut fds = [
        PollFd::new(&done, PollFlags::IN),
        PollFd::from_borrowed_fd(cancel, PollFlags::IN),
    ];
    loop {
        match poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    answer.try_recv().unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the run ended during the lookup",
        ))
    })
}

/// Asks a DNS server for A and AAAA, over UDP with a retry, and over TCP when truncated;
/// gives up once `cancel` is readable. Returns the addresses and the smallest TTL among them.
fn ask(
    server: SocketAddr,
    name: &str,
    cancel: Option<BorrowedFd<'_>>,
) -> io::Result<(Vec<IpAddr>, u32)> {
    let mut addresses = Vec::new();
    let mut ttl = u32::MAX;
    for record_type in [RecordType::A, RecordType::AAAA] {
        let reply = exchange(server, name, record_type, cancel)?;
        for record in reply.answers() {
            let ip = match record.data() {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
                _ => continue,
            };
            ttl = ttl.min(record.ttl());
            addresses.push(ip);
        }
    }
    let ttl = if addresses.is_empty() { 0 } else { ttl };
    Ok((addresses, ttl))
}

fn exchange(
    server: SocketAddr,
    name: &str,
    record_type: RecordType,
    cancel: Option<BorrowedFd<'_>>,
) -> io::Result<Message> {
    let query = build_query(random_id()?, name, record_type)?;
    let reply = exchange_udp(server, &query, cancel)?;
    let reply = if reply.truncated() {
        exchange_tcp(server, &query)?
    } else {
        reply
    };
    match reply.response_code() {
        ResponseCode::NoError | ResponseCode::NXDomain => Ok(reply),
        code => Err(io::Error::other(format!(
            "DNS server {server} answered {code} for {name}"
        ))),
    }
}

fn build_query(id: u16, name: &str, record_type: RecordType) -> io::Result<Vec<u8>> {
    let fqdn = Name::from_ascii(format!("{name}."))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut message = Message::new();
    message.set_id(id).set_recursion_desired(true);
    message.add_query(Query::query(fqdn, record_type));
    message.to_vec().map_err(io::Error::other)
}

fn exchange_udp(
    server: SocketAddr,
    query: &[u8],
    cancel: Option<BorrowedFd<'_>>,
) -> io::Result<Message> {
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(server)?;
    let mut buffer = [0u8; 4096];
    for _ in 0..ATTEMPTS {
        socket.send(query)?;
        let deadline = Instant::now() + ATTEMPT_TIMEOUT;
        while Instant::now() < deadline {
            if !wait_readable(&socket, cancel, deadline)? {
                break;
            }
            let n = match socket.recv(&mut buffer) {
                Ok(n) => n,
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e),
            };
            if let Some(reply) = matching_reply(&buffer[..n], query) {
                return Ok(reply);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("DNS server {server} did not answer"),
    ))
}

/// Waits until the socket is readable (true) or the deadline passes (false); an error once
/// `cancel` is readable (the run ended).
fn wait_readable(
    socket: &UdpSocket,
    cancel: Option<BorrowedFd<'_>>,
    deadline: Instant,
) -> io::Result<bool> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let timeout = Timespec::try_from(remaining).map_err(io::Error::other)?;
    let mut fds = vec![PollFd::new(socket, PollFlags::IN)];
    if let Some(cancel) = cancel {
        fds.push(PollFd::from_borrowed_fd(cancel, PollFlags::IN));
    }
    loop {
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    if fds.get(1).is_some_and(|fd| !fd.revents().is_empty()) {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the run ended during the lookup",
        ));
    }
    Ok(!fds[0].revents().is_empty())
}

fn exchange_tcp(server: SocketAddr, query: &[u8]) -> io::Result<Message> {
    let mut stream = TcpStream::connect_timeout(&server, ATTEMPT_TIMEOUT)?;
    stream.set_read_timeout(Some(ATTEMPT_TIMEOUT))?;
    let len = u16::try_from(query.len()).map_err(io::Error::other)?;
    stream.write_all(&[&len.to_be_bytes()[..], query].concat())?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut reply)?;
    matching_reply(&reply, query)
        .ok_or_else(|| io::Error::other(format!("DNS server {server} sent a mismatched reply")))
}

/// The reply to our query: same id, a response, and the same question (a spoofed or stale
/// datagram is ignored).
fn matching_reply(bytes: &[u8], query: &[u8]) -> Option<Message> {
    let asked = Message::from_vec(query).ok()?;
    Message::from_vec(bytes).ok().filter(|m| {
        m.id() == asked.id()
            && m.message_type() == MessageType::Response
            && m.queries() == asked.queries()
    })
}

fn random_id() -> io::Result<u16> {
    let mut bytes = [0u8; 2];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(u16::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_that_hangs_is_left_at_the_end_of_the_run_and_its_thread_ends_later() {
        let cancel = eventfd(0, EventfdFlags::CLOEXEC).unwrap();
        let answered = off_thread(Some(cancel.as_fd()), || Ok(7)).unwrap();
        assert_eq!(answered, 7);
        let before = SYSTEM_LOOKUPS.load(Ordering::Acquire);
        rustix::io::write(&cancel, &1u64.to_ne_bytes()).unwrap();
        let started = Instant::now();
        let hung = off_thread(Some(cancel.as_fd()), || {
            thread::sleep(Duration::from_millis(500));
            Ok(8)
        });
        assert_eq!(hung.unwrap_err().kind(), io::ErrorKind::Interrupted);
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "the end waited"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while SYSTEM_LOOKUPS.load(Ordering::Acquire) > before && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            SYSTEM_LOOKUPS.load(Ordering::Acquire),
            before,
            "the lookup's thread ended"
        );
    }
}
