//! The gate: serves one sandbox's sockets from outside its network namespace, on std threads.
//!
//! One acceptor thread polls every listener and the DNS stub's UDP sockets (an idle gate is
//! that one thread); each accepted connection gets a thread, and a relayed one a second
//! thread for its other direction. [`RunningGate::finish`] stops accepting, shuts every open
//! connection down, cancels lookups waiting on a DNS server, joins every thread that ends
//! within [`FINISH_GRACE`] and returns the run's [`NetworkReport`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};

use crate::audit::{Audit, EventSink};
use crate::dns::{self, PlaceholderBook, StubContext};
use crate::error::EgressError;
use crate::meter::Meter;
use crate::own_addresses::OwnAddresses;
use crate::policy::{EgressPolicy, GateMode};
use crate::report::{suggest_allow, Channel, LimitKind, NetworkReport, Reason};
use crate::resolve::HostResolver;
use crate::sockets::SandboxSockets;

/// Stack of connection threads: they hold small buffers only.
const CONNECTION_STACK: usize = 256 * 1024;
/// How long a DNS-over-TCP client may stay idle.
const DNS_TCP_IDLE: Duration = Duration::from_secs(5);
/// The most queries one DNS-over-TCP connection may ask.
const DNS_TCP_QUERIES: usize = 64;
/// How long the end of a run waits for the gate's threads once every connection is shut
/// down. Relays end at once; a thread still blocked past it is in the system resolver
/// (getaddrinfo cannot be interrupted): it is left to end on its own, its connection
/// refused (nothing is dialled once the run is closing) and its decision no longer streamed.
pub const FINISH_GRACE: Duration = Duration::from_millis(100);

/// State shared by the gate's threads.
pub(crate) struct Shared {
    pub(crate) policy: EgressPolicy,
    pub(crate) resolver: HostResolver,
    pub(crate) book: Mutex<PlaceholderBook>,
    pub(crate) ipv6: bool,
    pub(crate) meter: Meter,
    pub(crate) audit: Audit,
    pub(crate) own: OwnAddresses,
    live: Mutex<Live>,
    next_stream: AtomicU64,
}

/// Open streams (to shut them down at the end) and running threads (to join them).
#[derive(Default)]
struct Live {
    closing: bool,
    streams: HashMap<u64, Vec<TcpStream>>,
    threads: Vec<JoinHandle<()>>,
}

/// A registration of a connection's streams; dropping it forgets them.
pub(crate) struct StreamKey<'a> {
    shared: &'a Shared,
    key: u64,
}

impl Drop for StreamKey<'_> {
    fn drop(&mut self) {
        self.shared.lock_live().streams.remove(&self.key);
    }
}

impl StreamKey<'_> {
    /// Adds a stream of this connection (the destination, before it is dialled); false (and
    /// the stream shut down) when the run is already ending.
    pub(crate) fn add(&self, stream: &TcpStream) -> bool {
        let mut live = self.shared.lock_live();
        if live.closing {
            let _ = stream.shutdown(Shutdown::Both);
            return false;
        }
        if let (Some(list), Ok(clone)) = (live.streams.get_mut(&self.key), stream.try_clone()) {
            list.push(clone);
        }
        true
    }
}

impl Shared {
    fn lock_live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a connection's first stream so that `finish` can shut it down.
    pub(crate) fn register(&self, stream: &TcpStream) -> StreamKey<'_> {
        let key = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let mut live = self.lock_live();
        live.streams.insert(key, Vec::new());
        drop(live);
        let registration = StreamKey { shared: self, key };
        registration.add(stream);
        registration
    }

    /// True once the run is ending.
    pub(crate) fn closing(&self) -> bool {
        self.lock_live().closing
    }

    fn spawn(self: &Arc<Self>, work: impl FnOnce(Arc<Shared>) + Send + 'static) {
        let shared = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("airlock-egress".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || work(shared));
        if let Ok(handle) = spawned {
            let mut live = self.lock_live();
            live.threads.retain(|t| !t.is_finished());
            live.threads.push(handle);
        }
    }

    /// Answers one DNS query, counting and recording it.
    pub(crate) fn answer_dns(&self, query: &[u8]) -> Option<Vec<u8>> {
        let over_limit = !self.meter.admit_dns_query();
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let context = StubContext {
            policy: &self.policy,
            book: &mut book,
            ipv6: self.ipv6,
            over_limit,
        };
        let outcome = dns::answer(query, context)?;
        drop(book);
        let mut record = self.audit.new_record(Channel::Dns);
        record.name = outcome.name;
        record.decision = outcome.decision;
        record.reason = outcome.reason;
        record.detail = Some(outcome.query_type);
        self.audit.decide(record);
        Some(outcome.reply)
    }

    fn report(&self) -> NetworkReport {
        let (counters, decisions, dropped) = self.audit.snapshot();
        let suggested_allow = match self.policy.mode {
            GateMode::Report => suggest_allow(&decisions),
            GateMode::Allowlist => Vec::new(),
        };
        NetworkReport {
            mode: self.policy.mode,
            counters,
            limits_hit: self.meter.limits_hit(),
            decisions,
            decisions_dropped: dropped,
            suggested_allow,
        }
    }
}

/// Starts gates.
pub struct Gate;

/// A gate serving one sandbox.
pub struct RunningGate {
    shared: Arc<Shared>,
    wake: OwnedFd,
    acceptor: Option<JoinHandle<()>>,
}

impl Gate {
    /// Serves the sandbox's sockets under the policy; `on_event` receives every decision as
    /// it is made and every allowed stream when it closes.
    pub fn start(
        policy: EgressPolicy,
        sockets: SandboxSockets,
        on_event: Option<EventSink>,
    ) -> Result<RunningGate, EgressError> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC)
            .map_err(|e| EgressError::setup("creating the gate's wake-up eventfd")(e.into()))?;
        let cancel = wake
            .try_clone()
            .map_err(EgressError::setup("duplicating the wake-up eventfd"))?;
        let shared = Arc::new(Shared {
            resolver: HostResolver::new(policy.resolver, Some(cancel)),
            meter: Meter::new(policy.limits),
            policy,
            book: Mutex::new(PlaceholderBook::default()),
            ipv6: sockets.ipv6,
            audit: Audit::new(on_event),
            own: OwnAddresses::default(),
            live: Mutex::new(Live::default()),
            next_stream: AtomicU64::new(0),
        });
        let acceptor_wake = wake
            .try_clone()
            .map_err(EgressError::setup("duplicating the wake-up eventfd"))?;
        let listening = Listening::new(sockets)?;
        let acceptor_shared = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name("airlock-egress-accept".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || listening.serve(&acceptor_shared, &acceptor_wake))
            .map_err(EgressError::setup("starting the gate's acceptor thread"))?;
        Ok(RunningGate {
            shared,
            wake,
            acceptor: Some(acceptor),
        })
    }
}

impl RunningGate {
    /// The report so far (the run goes on).
    pub fn report(&self) -> NetworkReport {
        self.shared.report()
    }

    /// Ends the run: closes the sandbox's listeners, shuts every open connection down, waits
    /// for every gate thread, and returns the report.
    pub fn finish(mut self) -> NetworkReport {
        self.stop();
        self.shared.report()
    }

    fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        let _ = acceptor.join();
        let threads = {
            let mut live = self.shared.lock_live();
            live.closing = true;
            for stream in live.streams.values().flatten() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut live.threads)
        };
        join_within(threads, Instant::now() + FINISH_GRACE);
        self.shared.audit.seal();
    }
}

/// Joins the threads that end by the deadline; the others are left to end on their own.
fn join_within(mut threads: Vec<JoinHandle<()>>, deadline: Instant) {
    loop {
        let (done, running): (Vec<_>, Vec<_>) = threads.into_iter().partition(|t| t.is_finished());
        for thread in done {
            let _ = thread.join();
        }
        if running.is_empty() || Instant::now() >= deadline {
            return;
        }
        threads = running;
        thread::sleep(Duration::from_millis(2));
    }
}

impl Drop for RunningGate {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The sockets the acceptor polls.
struct Listening {
    capture: Vec<TcpListener>,
    dns_udp: Vec<UdpSocket>,
    dns_tcp: Vec<TcpListener>,
    proxy: Vec<TcpListener>,
}

/// What a ready socket is for.
#[derive(Debug, Clone, Copy)]
enum Ready {
    Capture(usize),
    DnsUdp(usize),
    DnsTcp(usize),
    Proxy(usize),
}

impl Listening {
    fn new(sockets: SandboxSockets) -> Result<Listening, EgressError> {
        let nonblocking = EgressError::setup("making the sandbox's sockets non-blocking");
        let listening = Listening {
            capture: sockets.capture,
            dns_udp: sockets.dns_udp,
            dns_tcp: sockets.dns_tcp,
            proxy: sockets.proxy,
        };
        let listeners = listening
            .capture
            .iter()
            .chain(&listening.dns_tcp)
            .chain(&listening.proxy);
        let result: io::Result<()> = listeners
            .map(|l| l.set_nonblocking(true))
            .chain(listening.dns_udp.iter().map(|s| s.set_nonblocking(true)))
            .collect();
        result.map_err(nonblocking)?;
        Ok(listening)
    }

    /// Polls until woken; dispatches each ready socket.
    fn serve(self, shared: &Arc<Shared>, wake: &OwnedFd) {
        loop {
            let ready = match self.wait(wake) {
                Some(ready) => ready,
                None => return,
            };
            for which in ready {
                self.dispatch(shared, which);
            }
        }
    }

    /// The ready sockets; `None` once woken to stop.
    fn wait(&self, wake: &OwnedFd) -> Option<Vec<Ready>> {
        let mut roles = Vec::new();
        let mut fds = vec![PollFd::new(wake, PollFlags::IN)];
        let listeners = [
            (&self.capture, Ready::Capture as fn(usize) -> Ready),
            (&self.dns_tcp, Ready::DnsTcp),
            (&self.proxy, Ready::Proxy),
        ];
        for (list, role) in listeners {
            for (i, listener) in list.iter().enumerate() {
                fds.push(PollFd::from_borrowed_fd(listener.as_fd(), PollFlags::IN));
                roles.push(role(i));
            }
        }
        for (i, socket) in self.dns_udp.iter().enumerate() {
            fds.push(PollFd::from_borrowed_fd(socket.as_fd(), PollFlags::IN));
            roles.push(Ready::DnsUdp(i));
        }
        loop {
            match poll(&mut fds, None) {
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return None,
            }
        }
        if !fds[0].revents().is_empty() {
            return None;
        }
        Some(
            fds[1..]
                .iter()
                .zip(roles)
                .filter(|(fd, _)| !fd.revents().is_empty())
                .map(|(_, role)| role)
                .collect(),
        )
    }

    fn dispatch(&self, shared: &Arc<Shared>, ready: Ready) {
        match ready {
            Ready::Capture(i) => accept_all(
                &self.capture[i],
                shared,
                Channel::Capture,
                crate::flow::serve_captured,
            ),
            Ready::Proxy(i) => accept_all(
                &self.proxy[i],
                shared,
                Channel::HttpProxy,
                crate::proxy::serve_proxy,
            ),
            Ready::DnsTcp(i) => accept_all(&self.dns_tcp[i], shared, Channel::Dns, serve_dns_tcp),
            Ready::DnsUdp(i) => serve_dns_udp(&self.dns_udp[i], shared),
        }
    }
}

/// Accepts every pending connection, each served on its own thread while it holds one of
/// the run's concurrent slots; past the cap a connection is reset at once and recorded.
fn accept_all(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    channel: Channel,
    serve: fn(Arc<Shared>, TcpStream),
) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => match shared.meter.open_slot() {
                Ok(slot) if stream.set_nonblocking(false).is_ok() => shared.spawn(move |shared| {
                    serve(shared, stream);
                    drop(slot);
                }),
                Ok(_) => {}
                Err(kind) => refuse_over_cap(shared, channel, &stream, kind),
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            // Out of descriptors or memory: leave the rest queued, try again on the next poll.
            Err(_) => {
                thread::sleep(Duration::from_millis(10));
                return;
            }
        }
    }
}

fn refuse_over_cap(shared: &Shared, channel: Channel, stream: &TcpStream, kind: LimitKind) {
    let mut record = shared.audit.new_record(channel);
    record.port = stream.local_addr().ok().map(|a| a.port());
    record.reason = Reason::limit(kind);
    shared.audit.decide(record);
    crate::flow::reset(stream);
}

fn serve_dns_udp(socket: &UdpSocket, shared: &Arc<Shared>) {
    let mut buffer = [0u8; 4096];
    loop {
        let (n, peer): (usize, SocketAddr) = match socket.recv_from(&mut buffer) {
            Ok(received) => received,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if let Some(reply) = shared.answer_dns(&buffer[..n]) {
            let _ = socket.send_to(&reply, peer);
        }
    }
}

fn serve_dns_tcp(shared: Arc<Shared>, mut stream: TcpStream) {
    let _registration = shared.register(&stream);
    if stream.set_read_timeout(Some(DNS_TCP_IDLE)).is_err() {
        return;
    }
    for _ in 0..DNS_TCP_QUERIES {
        let mut len = [0u8; 2];
        if stream.read_exact(&mut len).is_err() {
            return;
        }
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if stream.read_exact(&mut query).is_err() {
            return;
        }
        let Some(reply) = shared.answer_dns(&query) else {
            return;
        };
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        if stream
            .write_all(&[&reply_len.to_be_bytes()[..], &reply].concat())
            .is_err()
        {
            return;
        }
    }
}
