//! The egress gate's costs, for `airlock-bench`: bulk throughput through the gate against a
//! direct loopback connection in both directions (the sandbox uploading and downloading),
//! added latency per connection, and memory per idle gate. Direct and gated rounds are
//! interleaved; each figure is the median of its rounds. Needs root (a sandbox thread makes
//! its own network namespace, gone with its sockets); traffic stays on loopback. The start-up
//! cost of a gated run is a row of the main table (`airlock-native-allowlist` against
//! `airlock-native`).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::policy::{ByteSize, LimitsConfig};
use airlock_egress::{EgressConfig, EgressPolicy, Gate, RunningGate, SandboxSockets};

/// Bytes sent per bulk round.
const BULK_BYTES: u64 = 1 << 30;
/// Connections per latency round.
const LATENCY_CONNECTIONS: usize = 300;
/// Gates kept idle at once to measure memory.
const IDLE_GATES: usize = 20;

/// Targets of issue 16.
const MIN_SHARE_OF_DIRECT: f64 = 0.8;
const MIN_BYTES_PER_SECOND: f64 = 1e9;
const MAX_ADDED_LATENCY_MS: f64 = 0.5;
const MAX_IDLE_BYTES: f64 = 1024.0 * 1024.0;

/// The gate's figures, each with its target's verdict; `None` (with the reason) without root.
pub fn measure(rounds: usize) -> Result<Vec<String>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "the egress gate's figures need root (a namespace per sandbox), skipped".into(),
        );
    }
    let rounds = rounds.max(1);
    let server = start_server();
    let port = server.port();
    let (gate, sandbox) = start_gate(port);
    let upload = Bulk::measure(Direction::Upload, port, &sandbox, rounds);
    let download = Bulk::measure(Direction::Download, port, &sandbox, rounds);
    let (mut direct, mut gated) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct.push(connection_latency(port, Side::Direct));
        gated.push(connection_latency(port, Side::Sandbox(&sandbox)));
    }
    let added_ms = (median(gated) - median(direct)) * 1000.0;
    drop(sandbox);
    let report = gate.finish();
    let memory = idle_gate_memory(port);
    let mut rows = upload.rows();
    rows.extend(download.rows());
    rows.extend([
        verdict(
            "egress: added latency per connection",
            &format!("{added_ms:.3} ms"),
            added_ms <= MAX_ADDED_LATENCY_MS,
            &format!("<= {MAX_ADDED_LATENCY_MS} ms"),
        ),
        verdict(
            "egress: memory per idle gate",
            &format!("{:.0} KiB", memory / 1024.0),
            memory <= MAX_IDLE_BYTES,
            "<= 1 MiB",
        ),
        format!(
            "egress: {} connections relayed, {} rounds of {} MiB and {} connections each",
            report.counters.connections_allowed,
            rounds,
            BULK_BYTES >> 20,
            LATENCY_CONNECTIONS
        ),
    ]);
    Ok(rows)
}

/// Which way the bulk bytes flow: the sandbox sending (an upload) or receiving (a download,
/// the common case of a package install). Kernel forwarding at send time could only speed
/// up the first: in a download the sender is the remote host.
#[derive(Clone, Copy)]
enum Direction {
    Upload,
    Download,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// One direction's interleaved direct and gated rounds.
struct Bulk {
    direction: Direction,
    direct_rate: f64,
    gated_rate: f64,
    /// Seconds of the bench's CPU per GB: direct, gated.
    cpu_per_gb: [f64; 2],
    host: [HostCpu; 2],
    gigabytes: f64,
}

impl Bulk {
    fn measure(direction: Direction, port: u16, sandbox: &Sandbox, rounds: usize) -> Bulk {
        let (mut direct, mut gated) = (Vec::new(), Vec::new());
        let mut cpu = [0.0; 2];
        let mut host = [HostCpu::default(); 2];
        for _ in 0..rounds {
            for (side, rates, i) in [
                (Side::Direct, &mut direct, 0),
                (Side::Sandbox(sandbox), &mut gated, 1),
            ] {
                let (before, host_before) = (cpu_seconds(), HostCpu::now());
                rates.push(bulk(port, side, direction));
                cpu[i] += cpu_seconds() - before;
                host[i].add(&HostCpu::now(), &host_before);
            }
        }
        let gigabytes = (rounds as u64 * BULK_BYTES) as f64 / 1e9;
        Bulk {
            direction,
            direct_rate: median(direct),
            gated_rate: median(gated),
            cpu_per_gb: cpu.map(|seconds| seconds / gigabytes),
            host,
            gigabytes,
        }
    }

    fn rows(&self) -> Vec<String> {
        let way = self.direction.name();
        let share = self.gated_rate / self.direct_rate;
        vec![
            verdict(
                &format!("egress: bulk {way} through the gate vs direct"),
                &format!(
                    "{:.2} GB/s vs {:.2} GB/s = {:.0} %",
                    self.gated_rate / 1e9,
                    self.direct_rate / 1e9,
                    share * 100.0
                ),
                share >= MIN_SHARE_OF_DIRECT,
                &format!(">= {:.0} %", MIN_SHARE_OF_DIRECT * 100.0),
            ),
            verdict(
                &format!("egress: bulk {way} through the gate"),
                &format!("{:.2} GB/s", self.gated_rate / 1e9),
                self.gated_rate >= MIN_BYTES_PER_SECOND,
                ">= 1 GB/s",
            ),
            format!(
                "egress: {way} CPU per GB moved (client, gate and server, all in the bench): direct {:.2} s, through the gate {:.2} s",
                self.cpu_per_gb[0], self.cpu_per_gb[1]
            ),
            format!(
                "egress: {way} host CPU per GB (/proc/stat, every process on the host: user / sys / softirq s): direct {}, through the gate {}",
                self.host[0].per(self.gigabytes),
                self.host[1].per(self.gigabytes)
            ),
        ]
    }
}

fn verdict(what: &str, figure: &str, met: bool, target: &str) -> String {
    let verdict = if met { "met" } else { "NOT met" };
    format!("target {what} {target}: {verdict} ({figure})")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// A loopback server: a connection sending `u64` n gets n bytes read and one byte back, or,
/// with DOWNLOAD_FLAG set in n, n bytes sent (n = 0 is the latency probe: one byte back).
struct Server(u16);

impl Server {
    fn port(&self) -> u16 {
        self.0
    }
}

fn start_server() -> Server {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || serve(stream));
        }
    });
    Server(port)
}

fn serve(mut stream: TcpStream) {
    let mut header = [0u8; 8];
    if stream.read_exact(&mut header).is_err() {
        return;
    }
    let header = u64::from_be_bytes(header);
    let mut buffer = vec![7u8; CHUNK];
    if header & DOWNLOAD_FLAG != 0 {
        let _ = send_bytes(&mut stream, header & !DOWNLOAD_FLAG, &buffer);
        return;
    }
    if receive_bytes(&mut stream, header, &mut buffer).is_ok() {
        let _ = stream.write_all(&[1]);
    }
}

/// The header bit asking the server to send the bytes instead of receiving them.
const DOWNLOAD_FLAG: u64 = 1 << 63;
/// Bytes per read or write call on either end.
const CHUNK: usize = 1 << 20;

fn send_bytes(stream: &mut TcpStream, mut left: u64, chunk: &[u8]) -> std::io::Result<()> {
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn receive_bytes(stream: &mut TcpStream, mut left: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        match stream.read(&mut buffer[..n])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => left -= n as u64,
        }
    }
    Ok(())
}

/// Where the client runs: the benchmark's own namespace, or the sandbox's.
#[derive(Clone, Copy)]
enum Side<'a> {
    Direct,
    Sandbox(&'a Sandbox),
}

/// A thread living in the sandbox's network namespace, running clients on request.
struct Sandbox {
    requests: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Sandbox {
    fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, result) = std::sync::mpsc::channel();
        self.requests
            .send(Box::new(move || {
                let _ = done.send(work());
            }))
            .unwrap();
        result.recv().unwrap()
    }
}

fn run_on<T: Send + 'static>(side: Side<'_>, work: impl FnOnce() -> T + Send + 'static) -> T {
    match side {
        Side::Direct => thread::spawn(work).join().unwrap(),
        Side::Sandbox(sandbox) => sandbox.run(work),
    }
}

/// Starts a gate allowing 127.0.0.1:port, with a sandbox thread in a fresh namespace that
/// stays to run clients.
fn start_gate(port: u16) -> (RunningGate, Sandbox) {
    let (requests, incoming) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let gate = gate_for_new_sandbox(port, move || {
        for request in incoming {
            request();
        }
    });
    (gate, Sandbox { requests })
}

/// A gate for a fresh network namespace made by a thread, which then runs `then`.
fn gate_for_new_sandbox(port: u16, then: impl FnOnce() + Send + 'static) -> RunningGate {
    let unlimited = LimitsConfig {
        connections: Some(u64::MAX),
        concurrent: Some(1024),
        bytes_out: Some(ByteSize::Bytes(u64::MAX)),
        bytes_in: Some(ByteSize::Bytes(u64::MAX)),
        dns_queries: None,
    };
    let config = EgressConfig {
        allow: vec![format!("127.0.0.1:{port}")],
        limits: unlimited,
        ..Default::default()
    };
    let policy = EgressPolicy::parse(&config).unwrap();
    let plan = policy.sandbox_plan().unwrap();
    let (sandbox_end, gate_end) = UnixStream::pair().unwrap();
    thread::spawn(move || {
        // unshare(CLONE_NEWNET) moves only this thread; rustix deprecates `unshare` for the
        // flags that change shared state (CLONE_FILES, CLONE_FS), which are not used here.
        #[allow(deprecated)]
        rustix::thread::unshare(rustix::thread::UnshareFlags::NEWNET)
            .expect("unshare(CLONE_NEWNET)");
        airlock_egress::sandbox_side::configure(&plan)
            .unwrap()
            .send(&sandbox_end)
            .unwrap();
        then();
    });
    let sockets = SandboxSockets::receive(&gate_end).unwrap();
    Gate::start(policy, sockets, None).unwrap()
}

/// Bytes per second moving BULK_BYTES between the client and the server, `direction` seen
/// from the client; timed until the last byte is known to have arrived.
fn bulk(port: u16, side: Side<'_>, direction: Direction) -> f64 {
    run_on(side, move || {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        let mut buffer = vec![7u8; CHUNK];
        let start = Instant::now();
        match direction {
            Direction::Upload => {
                stream.write_all(&BULK_BYTES.to_be_bytes()).unwrap();
                send_bytes(&mut stream, BULK_BYTES, &buffer).unwrap();
                stream.read_exact(&mut buffer[..1]).unwrap();
            }
            Direction::Download => {
                stream
                    .write_all(&(BULK_BYTES | DOWNLOAD_FLAG).to_be_bytes())
                    .unwrap();
                receive_bytes(&mut stream, BULK_BYTES, &mut buffer).unwrap();
            }
        }
        BULK_BYTES as f64 / start.elapsed().as_secs_f64()
    })
}

/// Median seconds for connect + one round trip.
fn connection_latency(port: u16, side: Side<'_>) -> f64 {
    run_on(side, move || {
        let mut times = Vec::with_capacity(LATENCY_CONNECTIONS);
        for _ in 0..LATENCY_CONNECTIONS {
            let start = Instant::now();
            let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
            stream.write_all(&0u64.to_be_bytes()).unwrap();
            let mut done = [0u8; 1];
            stream.read_exact(&mut done).unwrap();
            times.push(start.elapsed().as_secs_f64());
        }
        median(times)
    })
}

/// Resident bytes added per idle gate (each with its own sandbox namespace and sockets).
fn idle_gate_memory(port: u16) -> f64 {
    let before = resident_bytes();
    let gates: Vec<RunningGate> = (0..IDLE_GATES)
        .map(|_| gate_for_new_sandbox(port, || {}))
        .collect();
    thread::sleep(Duration::from_millis(200));
    let after = resident_bytes();
    drop(gates);
    (after.saturating_sub(before)) as f64 / IDLE_GATES as f64
}

/// User + system CPU seconds of this process (every thread), from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The whole host's CPU time by kind, in ticks (/proc/stat's first line).
#[derive(Clone, Copy, Default)]
struct HostCpu {
    user: u64,
    system: u64,
    softirq: u64,
}

impl HostCpu {
    fn now() -> HostCpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|t| t.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
        HostCpu {
            user: at(0) + at(1),
            system: at(2),
            softirq: at(6),
        }
    }

    fn add(&mut self, after: &HostCpu, before: &HostCpu) {
        self.user += after.user - before.user;
        self.system += after.system - before.system;
        self.softirq += after.softirq - before.softirq;
    }

    fn per(&self, gigabytes: f64) -> String {
        let seconds = |ticks: u64| ticks as f64 / 100.0 / gigabytes;
        format!(
            "{:.2} / {:.2} / {:.2}",
            seconds(self.user),
            seconds(self.system),
            seconds(self.softirq)
        )
    }
}
