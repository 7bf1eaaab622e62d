//! A network test world inside network namespaces a test creates and removes: nothing touches
//! the root namespace's routes and no packet leaves the machine.
//!
//! - `gate` namespace: stands in for the host. The egress gate runs here (the `airlock` CLI
//!   under test, or threads of a test process moved in); it holds 192.0.2.1, 198.51.100.1,
//!   203.0.113.1 and 2001:db8::1 on a veth to the test hosts, no default route, and bait
//!   listeners on its loopback and own address.
//! - `hosts` namespace: the destinations: a DNS server (the gate's `resolver`, 192.0.2.53),
//!   plain TCP/HTTP servers, and a TLS server with one certificate for every test name, which
//!   also serves a package index (`pypi.test`), an npm registry (`registry.test`) and a git
//!   repository (`gitsrv.test`) from files ([`World::serve_packages`]).
//! - `sandbox` namespace: only `lo`, for tests of the gate crate that configure it themselves;
//!   clients run there through `ip netns exec`, which also mounts the sandbox's resolv.conf
//!   (`nameserver 127.0.0.1`: the gate's DNS stub).
//!
//! Needs root (namespaces and veth pairs), iproute2, util-linux (nsenter), curl, openssl and
//! Debian's /usr/bin/python3; [`skip_reason`] says when they are missing.

pub mod certs;
mod dns;
pub use dns::SILENT;
mod servers;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Debian's Python (the pyenv shim on PATH is not for sandboxes).
pub const PYTHON: &str = "/usr/bin/python3";

/// The test DNS server, which the gate is pointed at with `resolver`.
pub const RESOLVER: &str = "192.0.2.53";

/// Why a test skipped, or `None` when the world can be built.
pub fn skip_reason() -> Option<&'static str> {
    if !rustix::process::geteuid().is_root() {
        return Some(
            "skipped: the test world needs root (it creates network namespaces and veth pairs)",
        );
    }
    let tools = [
        "/usr/sbin/ip",
        "/usr/bin/nsenter",
        "/usr/bin/curl",
        "/usr/bin/openssl",
        PYTHON,
    ];
    for tool in tools {
        if !Path::new(tool).exists() && !Path::new(&tool.replace("/usr/sbin", "/sbin")).exists() {
            return Some("skipped: the test world needs iproute2, util-linux (nsenter), curl, openssl and /usr/bin/python3 (see .ci/run)");
        }
    }
    None
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
    /// Connections of the holding server on port 9000 open now.
    pub held_open: AtomicUsize,
    /// Every TLS record carrying a ClientHello that the retrying front on port 4433 read (as
    /// lossy text: a test looks for the names in it).
    pub client_hellos: Mutex<Vec<String>>,
}

impl Seen {
    /// Whether the DNS server was asked for `name`.
    pub fn asked(&self, name: &str) -> bool {
        self.dns_names.lock().unwrap().iter().any(|n| n == name)
    }

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

static NEXT_WORLD: AtomicUsize = AtomicUsize::new(0);

/// The gate namespace's own addresses, on the veth to the test hosts.
const GATE_ADDRESSES: [&str; 3] = ["192.0.2.1/24", "198.51.100.1/24", "203.0.113.1/24"];
/// The test hosts' addresses (see the DNS table in `dns.rs`).
const HOST_ADDRESSES: [&str; 8] = [
    "192.0.2.10/24",
    "192.0.2.11/24",
    "192.0.2.53/24",
    "198.51.100.10/24",
    "203.0.113.10/24",
    "203.0.113.30/24",
    "203.0.113.31/24",
    "203.0.113.32/24",
];

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
        let dir = tempfile::tempdir().expect("temp dir");
        // The sandbox user reads the test CA from here.
        let _ = fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
        let mut world = World {
            gate_ns: format!("aeg{id}"),
            hosts_ns: format!("aeh{id}"),
            sandbox_ns: format!("aes{id}"),
            dir,
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
        let sides = [
            (
                &self.gate_ns,
                &gate_if,
                &GATE_ADDRESSES[..],
                "2001:db8::1/64",
            ),
            (
                &self.hosts_ns,
                &hosts_if,
                &HOST_ADDRESSES[..],
                "2001:db8::10/64",
            ),
        ];
        for (ns, dev, v4, v6) in sides {
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
        // Bound to its own address: a wildcard socket would answer from the primary address.
        let udp = in_netns(&hosts, || {
            UdpSocket::bind(format!("{RESOLVER}:53")).expect("dns bind")
        });
        self.udp.push(udp.try_clone().unwrap());
        let seen = Arc::clone(&self.seen);
        thread::spawn(move || dns::serve(udp, seen));
        for (port, handler) in servers::HANDLERS {
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
    fn listen(&mut self, role: &str, ns: &str, address: &str, handler: servers::Handler) {
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
        let names: Vec<String> = dns::TLS_NAMES.iter().map(|n| format!("DNS:{n}")).collect();
        if let Err(e) = certs::self_signed(dir, "cert", "allowed.test", &names, None) {
            panic!("openssl could not make the test certificate: {e}");
        }
        fs::set_permissions(
            dir.join("cert.pem"),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        fs::create_dir_all(dir.join("static")).unwrap();
        fs::write(dir.join("tls_server.py"), include_str!("tls_server.py")).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.hosts_ns, PYTHON, "tls_server.py"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("tls server");
        let mut ready = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut ready)
            .expect("tls server ready");
        self.children.push(child);
    }

    /// Builds the package index (`pypi.test`: the wheel `demo-pkg` 1.0), the npm registry
    /// (`registry.test`: `demo-pkg` 1.0.0) and the git repository
    /// (`https://gitsrv.test/demo.git`, dumb HTTP) the TLS server then serves.
    pub fn serve_packages(&self) {
        fs::write(
            self.dir.path().join("packages.py"),
            include_str!("packages.py"),
        )
        .unwrap();
        let out = Command::new(PYTHON)
            .arg("packages.py")
            .current_dir(self.dir.path())
            .output()
            .expect("packages.py");
        assert!(
            out.status.success(),
            "building the test packages failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every SNI the TLS server saw (`-` for none), in order.
    pub fn tls_snis(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("sni.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The CA file clients trust (world-readable).
    pub fn ca(&self) -> String {
        self.dir.path().join("cert.pem").display().to_string()
    }

    /// A command run in the gate namespace (where the CLI under test runs its gate): only the
    /// network namespace changes (`nsenter --net`), so /sys and its cgroups stay the host's.
    pub fn in_gate(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.gate_ns))
            .arg("--")
            .arg(program);
        command
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

    /// Established TCP connections in the gate namespace (both directions counted).
    pub fn gate_established(&self) -> usize {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.gate_ns,
                "cat",
                "/proc/net/tcp",
                "/proc/net/tcp6",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(3) == Some("01"))
            .count()
    }
}

impl Default for World {
    fn default() -> Self {
        World::new()
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
