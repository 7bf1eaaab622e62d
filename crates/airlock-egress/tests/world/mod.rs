//! A test world inside network namespaces this test creates and removes; nothing touches the
//! root namespace's routes and no packet leaves the machine.
//!
//! - `gate` namespace: stands in for the host. The gate runs here (threads of the test
//!   process moved into it); it holds 192.0.2.1, 198.51.100.1, 203.0.113.1 and 2001:db8::1 on
//!   a veth to the test hosts, no default route, and bait listeners on its loopback and own
//!   address.
//! - `hosts` namespace: the destinations: a DNS server (the gate's `resolver`, 192.0.2.53),
//!   plain TCP/HTTP servers, and a Python TLS server with a certificate for several names.
//! - `sandbox` namespace: only `lo`, configured by `sandbox_side::configure`; clients (curl,
//!   /usr/bin/python3) run there through `ip netns exec`, which also mounts the sandbox's
//!   resolv.conf (`nameserver 127.0.0.1`: the gate's DNS stub).
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::{EgressConfig, EgressPolicy, Gate, GateEvent, RunningGate, SandboxSockets};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

/// Debian's Python (the pyenv shim on PATH is not for sandboxes).
pub const PYTHON: &str = "/usr/bin/python3";

/// Why a test skipped, or `None` when the world can be built.
pub fn skip_reason() -> Option<&'static str> {
    if !rustix::process::geteuid().is_root() {
        return Some(
            "skipped: the test world needs root (it creates network namespaces and veth pairs)",
        );
    }
    for tool in ["/usr/sbin/ip", "/usr/bin/curl", "/usr/bin/openssl", PYTHON] {
        if !Path::new(tool).exists() && !Path::new(&tool.replace("/usr/sbin", "/sbin")).exists() {
            return Some("skipped: the test world needs iproute2, curl, openssl and /usr/bin/python3 (see .ci/run)");
        }
    }
    None
}

/// Builds the world, or says why the test skips.
#[macro_export]
macro_rules! world_or_skip {
    () => {
        match world::skip_reason() {
            Some(reason) => {
                eprintln!("{reason}");
                return;
            }
            None => world::World::new(),
        }
    };
}

/// What the destinations saw: evidence for the attack tests.
#[derive(Default)]
pub struct Seen {
    /// Accepted connections per (namespace role, port).
    pub accepts: Mutex<HashMap<(String, u16), usize>>,
    /// Every `Host` header the HTTP server read.
    pub hosts: Mutex<Vec<String>>,
    /// Every name the DNS server was asked.
    pub dns_names: Mutex<Vec<String>>,
    /// Bytes the sink on port 8080 received.
    pub sunk: AtomicUsize,
    /// Connections of the holding server on port 9000 that ended.
    pub held_closed: AtomicUsize,
}

impl Seen {
    pub fn accepts(&self, role: &str, port: u16) -> usize {
        *self
            .accepts
            .lock()
            .unwrap()
            .get(&(role.to_string(), port))
            .unwrap_or(&0)
    }

    fn count(&self, role: &str, port: u16) {
        *self
            .accepts
            .lock()
            .unwrap()
            .entry((role.to_string(), port))
            .or_default() += 1;
    }
}

/// Names the test DNS server knows; a name with several answer sets gives them in turn
/// (rebinding), the last one forever after.
fn dns_table() -> HashMap<&'static str, Vec<Vec<&'static str>>> {
    HashMap::from([
        ("allowed.test", vec![vec!["192.0.2.10", "2001:db8::10"]]),
        ("other.test", vec![vec!["192.0.2.11"]]),
        ("denied.test", vec![vec!["192.0.2.10"]]),
        ("git.test", vec![vec!["198.51.100.10"]]),
        ("cidr.test", vec![vec!["203.0.113.10"]]),
        ("rebind.test", vec![vec!["192.0.2.10"], vec!["127.0.0.1"]]),
        ("loop.test", vec![vec!["127.0.0.1"]]),
        ("meta.test", vec![vec!["169.254.169.254"]]),
        ("nat64.test", vec![vec!["64:ff9b::7f00:1"]]),
        ("mapped.test", vec![vec!["::ffff:127.0.0.1"]]),
        ("own.test", vec![vec!["192.0.2.1"]]),
        ("v6only.test", vec![vec!["2001:db8::10"]]),
    ])
}

static NEXT_WORLD: AtomicUsize = AtomicUsize::new(0);

/// One test's namespaces, servers and files; everything goes when it drops.
pub struct World {
    pub gate_ns: String,
    pub hosts_ns: String,
    pub sandbox_ns: String,
    pub dir: tempfile::TempDir,
    pub seen: Arc<Seen>,
    children: Vec<Child>,
    listeners: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
    etc_netns: PathBuf,
}

impl World {
    pub fn new() -> World {
        let id = format!(
            "{:x}{}",
            std::process::id() % 0xfffff,
            NEXT_WORLD.fetch_add(1, Ordering::Relaxed)
        );
        let mut world = World {
            gate_ns: format!("aeg{id}"),
            hosts_ns: format!("aeh{id}"),
            sandbox_ns: format!("aes{id}"),
            dir: tempfile::tempdir().expect("temp dir"),
            seen: Arc::new(Seen::default()),
            children: Vec::new(),
            listeners: Vec::new(),
            udp: Vec::new(),
            etc_netns: PathBuf::from(format!("/etc/netns/aes{id}")),
        };
        world.build_network(&id);
        world.start_servers();
        world
    }

    fn build_network(&mut self, id: &str) {
        for ns in [&self.gate_ns, &self.hosts_ns, &self.sandbox_ns] {
            ip(&["netns", "add", ns]);
        }
        let (gate_if, hosts_if) = (format!("veg{id}"), format!("veh{id}"));
        ip(&[
            "link",
            "add",
            &gate_if,
            "netns",
            &self.gate_ns,
            "type",
            "veth",
            "peer",
            "name",
            &hosts_if,
            "netns",
            &self.hosts_ns,
        ]);
        let gate_addresses = ["192.0.2.1/24", "198.51.100.1/24", "203.0.113.1/24"];
        let host_addresses = [
            "192.0.2.10/24",
            "192.0.2.11/24",
            "192.0.2.53/24",
            "198.51.100.10/24",
            "203.0.113.10/24",
        ];
        for (ns, dev, v4, v6) in [
            (
                &self.gate_ns,
                &gate_if,
                &gate_addresses[..],
                "2001:db8::1/64",
            ),
            (
                &self.hosts_ns,
                &hosts_if,
                &host_addresses[..],
                "2001:db8::10/64",
            ),
        ] {
            for address in v4 {
                ip(&["-n", ns, "addr", "add", address, "dev", dev]);
            }
            ip(&["-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        fs::create_dir_all(&self.etc_netns).unwrap();
        fs::write(
            self.etc_netns.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n",
        )
        .unwrap();
    }

    fn start_servers(&mut self) {
        let hosts = self.hosts_ns.clone();
        let seen = Arc::clone(&self.seen);
        // Bound to its own address: a wildcard socket would answer from the primary address.
        let udp = in_netns(&hosts, || {
            UdpSocket::bind("192.0.2.53:53").expect("dns bind")
        });
        self.udp.push(udp.try_clone().unwrap());
        let dns_seen = Arc::clone(&seen);
        thread::spawn(move || serve_dns(udp, dns_seen));
        type Handler = fn(TcpStream, &Seen);
        let servers: [(u16, Handler); 5] = [
            (80, serve_http),
            (22, serve_banner_echo),
            (8080, serve_sink),
            (8081, serve_source),
            (9000, serve_hold),
        ];
        for (port, handler) in servers {
            self.listen("hosts", &hosts, &format!("[::]:{port}"), handler);
        }
        let gate = self.gate_ns.clone();
        for bait in [
            "127.0.0.1:80",
            "127.0.0.1:8080",
            "192.0.2.1:80",
            "192.0.2.1:443",
            "[::1]:80",
        ] {
            self.listen("gate", &gate, bait, |_, _| {});
        }
        self.start_tls_server();
    }

    /// A TCP server in a namespace; each accept is counted under (role, port).
    fn listen(&mut self, role: &str, ns: &str, address: &str, handler: fn(TcpStream, &Seen)) {
        let address = address.to_string();
        let listener = in_netns(ns, move || {
            TcpListener::bind(&address).unwrap_or_else(|e| panic!("bind {address}: {e}"))
        });
        self.listeners.push(listener.try_clone().unwrap());
        let (seen, role) = (Arc::clone(&self.seen), role.to_string());
        thread::spawn(move || {
            let port = listener.local_addr().unwrap().port();
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                seen.count(&role, port);
                let seen = Arc::clone(&seen);
                thread::spawn(move || handler(stream, &seen));
            }
        });
    }

    fn start_tls_server(&mut self) {
        let dir = self.dir.path();
        let status = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
            .args(["-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=allowed.test"])
            .args(["-addext", "subjectAltName=DNS:allowed.test,DNS:other.test,DNS:denied.test,DNS:rebind.test,DNS:v6only.test"])
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(
            status.success(),
            "openssl could not make the test certificate"
        );
        fs::write(dir.join("tls_server.py"), TLS_SERVER).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.hosts_ns, PYTHON, "tls_server.py"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("tls server");
        let mut child = child;
        let mut ready = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut ready)
            .expect("tls server ready");
        self.children.push(child);
    }

    /// Every SNI the TLS server saw (`-` for none), in order.
    pub fn tls_snis(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("sni.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The CA file clients trust.
    pub fn ca(&self) -> String {
        self.dir.path().join("cert.pem").display().to_string()
    }

    /// Starts a gate for the sandbox: configure inside the sandbox namespace, send the
    /// descriptors over a socketpair, receive them, start the gate inside the gate namespace.
    pub fn start_gate(&self, config: EgressConfig) -> StartedGate {
        let mut config = config;
        config
            .resolver
            .get_or_insert_with(|| "192.0.2.53".to_string());
        let policy = EgressPolicy::parse(&config).expect("policy");
        let plan = policy.sandbox_plan().expect("plan");
        let (sandbox_end, gate_end) = UnixStream::pair().unwrap();
        in_netns(&self.sandbox_ns, move || {
            airlock_egress::sandbox_side::configure(&plan)
                .expect("configure")
                .send(&sandbox_end)
                .expect("send")
        });
        let sockets = SandboxSockets::receive(&gate_end).expect("receive");
        let proxy_port = sockets.proxy_port;
        let (sender, events) = mpsc::channel();
        let sink = Box::new(move |event: &GateEvent| {
            let _ = sender.send(event.clone());
        });
        let gate = in_netns(&self.gate_ns, move || {
            Gate::start(policy, sockets, Some(sink)).expect("gate")
        });
        StartedGate {
            gate,
            proxy_port,
            events,
        }
    }

    /// Runs a command inside the sandbox namespace with a clean environment, bounded in time.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.sandbox_ns, "timeout", "30"])
            .args(["env", "-i", "PATH=/usr/bin:/bin"])
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("ip netns exec")
    }

    /// Runs Python code inside the sandbox; returns its stdout (stderr on failure).
    pub fn python(&self, code: &str) -> String {
        let out = self.run(&[PYTHON, "-c", code]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.is_empty() {
            return format!("stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        text
    }

    /// curl inside the sandbox; returns (stdout, exit code).
    pub fn curl(&self, args: &[&str]) -> (String, i32) {
        let ca = self.ca();
        let mut all = vec!["curl", "-sS", "--max-time", "15", "--cacert", &ca];
        all.extend_from_slice(args);
        let out = self.run(&all);
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (text, out.status.code().unwrap_or(-1))
    }

    /// A counter of the hosts namespace's /proc/net/snmp (e.g. ("Icmp", "InEchos")).
    pub fn host_snmp(&self, group: &str, field: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.hosts_ns, "cat", "/proc/net/snmp"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{group}:")))
            .collect();
        let names: Vec<&str> = lines[0].split_whitespace().collect();
        let values: Vec<&str> = lines[1].split_whitespace().collect();
        let index = names.iter().position(|n| *n == field).expect("snmp field");
        values[index].parse().unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for listener in &self.listeners {
            let _ = rustix::net::shutdown(listener, rustix::net::Shutdown::Read);
        }
        for socket in &self.udp {
            let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Read);
        }
        for ns in [&self.gate_ns, &self.hosts_ns, &self.sandbox_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = fs::remove_dir_all(&self.etc_netns);
    }
}

/// A gate serving the world's sandbox.
pub struct StartedGate {
    pub gate: RunningGate,
    pub proxy_port: u16,
    pub events: mpsc::Receiver<GateEvent>,
}

impl StartedGate {
    pub fn proxy(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy_port)
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `work` on a thread moved into a named network namespace. Threads it spawns stay there.
pub fn in_netns<T: Send + 'static>(ns: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .expect("setns");
        work()
    })
    .join()
    .expect("netns thread")
}

fn serve_dns(socket: UdpSocket, seen: Arc<Seen>) {
    let table = dns_table();
    let mut asked: HashMap<String, usize> = HashMap::new();
    let mut buffer = [0u8; 2048];
    while let Ok((n, peer)) = socket.recv_from(&mut buffer) {
        if n == 0 {
            return;
        }
        let Ok(query) = Message::from_vec(&buffer[..n]) else {
            continue;
        };
        let Some(question) = query.queries().first().cloned() else {
            continue;
        };
        let name = question
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_lowercase();
        seen.dns_names.lock().unwrap().push(name.clone());
        let mut reply = Message::new();
        reply
            .set_id(query.id())
            .set_message_type(MessageType::Response)
            .set_recursion_available(true);
        reply.add_query(question.clone());
        match table.get(name.as_str()) {
            None => {
                reply.set_response_code(ResponseCode::NXDomain);
            }
            Some(sets) => {
                let turn = asked
                    .entry(format!("{name}/{}", question.query_type()))
                    .or_default();
                let set = &sets[(*turn).min(sets.len() - 1)];
                *turn += 1;
                for ip in set.iter().map(|a| a.parse::<IpAddr>().unwrap()) {
                    let data = match (ip, question.query_type()) {
                        (IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
                        (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
                        _ => continue,
                    };
                    reply.add_answer(Record::from_rdata(question.name().clone(), 0, data));
                }
            }
        }
        let _ = socket.send_to(&reply.to_vec().unwrap(), peer);
    }
}

/// HTTP: answers `host=<Host>`; an `Upgrade` request gets 101 and an echo.
fn serve_http(mut stream: TcpStream, seen: &Seen) {
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let host = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    seen.hosts.lock().unwrap().push(host.clone());
    if head.to_ascii_lowercase().contains("upgrade: websocket") {
        let _ = stream.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
        return serve_echo(stream);
    }
    let body = format!("host={host}\n");
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).to_string())
}

fn serve_echo(mut stream: TcpStream) {
    let mut buffer = [0u8; 16384];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
}

fn serve_banner_echo(mut stream: TcpStream, _: &Seen) {
    let _ = stream.write_all(b"SSH-2.0-airlock-test\r\n");
    serve_echo(stream);
}

fn serve_sink(mut stream: TcpStream, seen: &Seen) {
    let mut buffer = [0u8; 65536];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 {
            break;
        }
        seen.sunk.fetch_add(n, Ordering::Relaxed);
    }
}

/// Sends 8 MiB, then closes.
fn serve_source(mut stream: TcpStream, _: &Seen) {
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..8 {
        if stream.write_all(&chunk).is_err() {
            return;
        }
    }
}

/// Holds the connection until the peer closes it; counts the close.
fn serve_hold(mut stream: TcpStream, seen: &Seen) {
    let _ = stream.write_all(b"held\n");
    let mut buffer = [0u8; 1024];
    while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
    seen.held_closed.fetch_add(1, Ordering::Relaxed);
}

/// Waits until `check` holds, up to `timeout`.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// The TLS server: logs each SNI (or `-`), answers `sni=<name>`, echoes after an Upgrade.
const TLS_SERVER: &str = r#"
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("cert.pem", "key.pem")
def remember(sock, name, _):
    sock.airlock_sni = name
ctx.sni_callback = remember
log = open("sni.log", "a", buffering=1)
srv = socket.socket(socket.AF_INET6)
srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("::", 443))
srv.listen(64)
def serve(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except Exception:
        log.write("handshake-failed\n")
        return
    sni = getattr(tls, "airlock_sni", None) or "-"
    log.write(sni + "\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(4096)
        if not chunk:
            return
        data += chunk
    if b"upgrade: websocket" in data.lower():
        tls.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        while True:
            chunk = tls.recv(4096)
            if not chunk:
                return
            tls.sendall(chunk)
    body = ("sni=" + sni + "\n").encode()
    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    tls.close()
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"#;
