//! A started daemon for tests: its own state and runtime directories, socket and store, three
//! tenants (alpha: admin; beta: an ordinary tenant; gamma: a tight ceiling), and an HTTP
//! client over the Unix socket (or TCP).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

pub struct Keys {
    pub alpha: String,
    pub beta: String,
    pub gamma: String,
}

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub keys: Keys,
    pub socket: PathBuf,
    pub child: Option<Child>,
    pub config: PathBuf,
    pub tcp: Option<String>,
    /// The inter-node listener's address (`server.internal_listen`), when asked for.
    pub internal: Option<String>,
    pub netns: Option<String>,
}

/// The `airlockd` binary under test.
pub fn airlockd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlockd"))
}

/// The `airlock` CLI, next to `airlockd` (built here if missing: it is another package).
pub fn airlock_bin() -> PathBuf {
    let bin = airlockd_bin().with_file_name("airlock");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "airlock-cli", "--bin", "airlock"])
            .status()
            .expect("cargo runs");
        assert!(
            status.success(),
            "cannot build the airlock CLI the daemon runs as each run's init"
        );
    }
    bin
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Options of a test daemon.
#[derive(Default, Clone)]
pub struct Options {
    /// Extra TOML appended to the generated configuration (before the tenants).
    pub extra: String,
    /// Replaces the `[pool]` section.
    pub pool: Option<String>,
    /// A store URL (default: SQLite in the state directory).
    pub store_url: Option<String>,
    /// Listen on a loopback TCP port too.
    pub tcp: bool,
    pub node: Option<String>,
    /// A PEM certificate and key: TCP listeners speak TLS.
    pub tls: Option<(String, String)>,
    /// Extra lines in tenant gamma's table.
    pub gamma: String,
    /// A PEM CA certificate: the node advertises https:// and verifies its peers with it.
    pub peer_ca: Option<String>,
    /// The node's own certificate and key (`node.cert`, `node.key`), presented to peers.
    pub node_identity: Option<(String, String)>,
    /// Serve an inter-node listener (`server.internal_listen`) on a loopback port.
    pub internal: bool,
    /// A network namespace (under /run/netns) the daemon runs in: a test world's gate
    /// namespace, so its gates reach only the world's hosts.
    pub netns: Option<String>,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestDaemon {
    pub fn start(options: Options) -> TestDaemon {
        let dir = tempfile::Builder::new()
            .prefix("airlockd-test-")
            .tempdir()
            .unwrap();
        let keys = Keys {
            alpha: airlockd::auth::new_key(),
            beta: airlockd::auth::new_key(),
            gamma: airlockd::auth::new_key(),
        };
        let mut daemon = TestDaemon {
            socket: dir.path().join("run/airlockd.sock"),
            config: dir.path().join("airlockd.toml"),
            dir,
            keys,
            child: None,
            tcp: None,
            internal: None,
            netns: options.netns.clone(),
        };
        daemon.write_config(&options);
        daemon.spawn();
        daemon
    }

    pub fn write_config(&mut self, options: &Options) {
        let root = self.dir.path();
        std::fs::create_dir_all(root.join("tools")).unwrap();
        std::fs::write(root.join("tools/text.py"), TOOLS).unwrap();
        std::fs::write(
            root.join("small.toml"),
            "extends = \"untrusted\"\n[limits]\nmemory = \"128MiB\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = options
            .store_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}/state/airlockd.db", root.display()));
        let tcp = if options.tcp {
            let addr = format!("127.0.0.1:{}", free_port());
            self.tcp = Some(addr.clone());
            format!("listen = [\"{addr}\"]")
        } else {
            String::new()
        };
        let tls = options
            .tls
            .as_ref()
            .map(|(cert, key)| format!("tls_cert = \"{cert}\"\ntls_key = \"{key}\""))
            .unwrap_or_default();
        // With a certificate the node is reached over TLS, its peers verified against the
        // test's CA; without, plain HTTP is declared trusted (loopback).
        let advertise = match (&self.tcp, &options.peer_ca) {
            (Some(a), Some(ca)) => format!("advertise = \"https://{a}\"\npeer_ca = \"{ca}\""),
            (Some(a), None) => format!("advertise = \"http://{a}\"\nplain_http_peers = true"),
            (None, Some(ca)) => format!("peer_ca = \"{ca}\""),
            (None, None) => String::new(),
        };
        let identity = options
            .node_identity
            .as_ref()
            .map(|(cert, key)| format!("cert = \"{cert}\"\nkey = \"{key}\""))
            .unwrap_or_default();
        let internal = if options.internal {
            let addr = format!("127.0.0.1:{}", free_port());
            self.internal = Some(addr.clone());
            format!("internal_listen = [\"{addr}\"]")
        } else {
            String::new()
        };
        let node = options.node.clone().unwrap_or_else(|| "test-node".into());
        let pool = options.pool.clone().unwrap_or_else(|| {
            "[pool]\nmax_concurrent = 4\nmax_queued = 50\nqueue_timeout = \"30s\"".into()
        });
        let text = format!(
            r#"[server]
socket = "{root}/run/airlockd.sock"
{tcp}
{internal}
{tls}
max_wait = "60s"
stall_timeout = "5s"
shutdown_grace = "3s"
stream_keepalive = "1s"

[paths]
state_dir = "{root}/state"
runtime_dir = "{root}/run"
init_program = "{airlock}"

[store]
url = "{store}"

[node]
id = "{node}"
heartbeat = "1s"
dead_after = "5s"
{advertise}
{identity}

{pool}

[sessions]
sweep_every = "200ms"
max_file_bytes = "1MiB"
max_per_tenant = 4

[sandbox]
cgroup_parent = "{cgroup_parent}"

[toolsets.text]
path = "{root}/tools"

{extra}

[[tenants]]
name = "alpha"
admin = true
keys = [{{ name = "alpha-ci", hash = "{alpha}" }}]
profiles = ["trusted"]
toolsets = ["text"]
priority = {{ min = 0, max = 10, default = 5 }}
[tenants.ceiling]
network = "host"
min_isolation = "process"
allow_degraded = true
memory = "1GiB"
wall_time = "10m"

[[tenants]]
name = "beta"
keys = [{{ name = "beta-ci", hash = "{beta}" }}]
toolsets = ["text"]

[[tenants]]
name = "gamma"
keys = [{{ name = "gamma-ci", hash = "{gamma}" }}]
profile = "{root}/small.toml"
share = 1
{gamma_extra}
[tenants.ceiling]
memory = "256MiB"
"#,
            root = root.display(),
            airlock = airlock_bin().display(),
            extra = options.extra,
            alpha = airlockd::auth::hash_line(&self.keys.alpha),
            beta = airlockd::auth::hash_line(&self.keys.beta),
            gamma = airlockd::auth::hash_line(&self.keys.gamma),
            gamma_extra = options.gamma,
            cgroup_parent = self.cgroup_parent(),
        );
        std::fs::write(&self.config, text).unwrap();
    }

    pub fn spawn(&mut self) {
        // The socket file a killed daemon left: connecting to it can succeed while a child of
        // the dead daemon, caught between fork and exec, still holds the listening socket,
        // and fail with a reset once that child goes. Ready means the new daemon's own file.
        let stale = socket_inode(&self.socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .unwrap();
        // Only the network namespace changes (`nsenter --net`): /sys and its cgroups stay the
        // host's, and the socket is a path in the test's directory.
        let mut command = match &self.netns {
            Some(ns) => {
                let mut nsenter = Command::new("nsenter");
                nsenter
                    .arg(format!("--net=/run/netns/{ns}"))
                    .arg("--")
                    .arg(airlockd_bin());
                nsenter
            }
            None => Command::new(airlockd_bin()),
        };
        let child = command
            .arg("--config")
            .arg(&self.config)
            .env("AIRLOCKD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("airlockd starts");
        self.child = Some(child);
        self.wait_ready(stale);
    }

    fn wait_ready(&mut self, stale: Option<(u64, i64, i64)>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("airlockd exited early ({status}):\n{}", self.log());
            }
            let fresh = socket_inode(&self.socket).is_some_and(|file| Some(file) != stale);
            if fresh && std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("airlockd did not start:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap()
    }

    /// SIGTERM, then wait (bounded).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::TERM,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }

    /// SIGKILL the daemon only (its runs' inits live on and clean up after themselves).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn client(&self, key: &str) -> Client {
        Client {
            socket: self.socket.clone(),
            tcp: None,
            key: Some(key.to_string()),
        }
    }

    pub fn anonymous(&self) -> Client {
        Client {
            socket: self.socket.clone(),
            tcp: None,
            key: None,
        }
    }

    /// This daemon's own cgroup directory name (one per test daemon, so that checks for
    /// leftovers see only this daemon's runs).
    pub fn cgroup_parent(&self) -> String {
        let name = self
            .dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        name.replace(['.', ' '], "-")
    }

    /// This daemon's cgroups left in any hierarchy.
    pub fn leftover_cgroups(&self) -> Vec<PathBuf> {
        let parent = self.cgroup_parent();
        let mut found = Vec::new();
        let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
        roots.extend(
            std::fs::read_dir("/sys/fs/cgroup")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
        for root in roots {
            for entry in std::fs::read_dir(root.join(&parent))
                .into_iter()
                .flatten()
                .flatten()
            {
                if entry.file_name().to_string_lossy().starts_with("run-") {
                    found.push(entry.path());
                }
            }
        }
        found
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// This daemon's run directories left (`run-*` in its runtime directory).
    pub fn leftover_run_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.runs_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("run-"))
            .map(|e| e.path())
            .collect()
    }

    pub fn runs_dir(&self) -> PathBuf {
        self.dir.path().join("run/runs")
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop();
        let parent = self.cgroup_parent();
        for entry in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir(entry.path().join(&parent));
        }
        let _ = std::fs::remove_dir(PathBuf::from("/sys/fs/cgroup").join(&parent));
        // Sessions outlive the daemon by design (their tmpfs stays mounted): unmount them.
        for sub in ["sessions", "work"] {
            for entry in std::fs::read_dir(self.state().join(sub))
                .into_iter()
                .flatten()
                .flatten()
            {
                let _ = airlockd::workspace::remove_workspace_dir(&entry.path());
            }
        }
    }
}

/// A response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error kind of an error response.
    pub fn kind(&self) -> String {
        self.json()["error"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

#[derive(Clone)]
pub struct Client {
    pub socket: PathBuf,
    pub tcp: Option<String>,
    pub key: Option<String>,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Client {
    async fn connect(&self) -> Sender {
        let (sender, connection) = match &self.tcp {
            Some(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    let _ = c.await;
                });
                return s;
            }
            None => {
                let stream = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap()
            }
        };
        tokio::spawn(async move {
            let _ = connection.await;
        });
        sender
    }

    pub fn request(&self, method: &str, path: &str) -> hyper::http::request::Builder {
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "airlockd");
        if let Some(key) = &self.key {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        builder
    }

    pub async fn send(&self, request: hyper::Request<Full<Bytes>>) -> Response {
        let mut sender = self.connect().await;
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Response {
            status,
            headers,
            body,
        }
    }

    /// Sends a request whose body the server may refuse before reading it all: the body is
    /// written by another task and write errors are ignored, so the answer is still read.
    pub async fn send_tolerant(&self, request: hyper::Request<Full<Bytes>>) -> Response {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (parts, body) = request.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let mut head = format!(
            "{} {} HTTP/1.1\r\ncontent-length: {}\r\nconnection: close\r\n",
            parts.method,
            parts.uri,
            body.len()
        );
        for (name, value) in &parts.headers {
            head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap()));
        }
        head.push_str("\r\n");
        let stream = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let writing = tokio::spawn(async move {
            let _ = writer.write_all(head.as_bytes()).await;
            let _ = writer.write_all(&body).await;
            writer
        });
        let mut raw = Vec::new();
        let _ = reader.read_to_end(&mut raw).await;
        writing.abort();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Response {
            status,
            headers: hyper::HeaderMap::new(),
            body: Bytes::from(body.to_string()),
        }
    }

    pub async fn put_tolerant(&self, path: &str, bytes: impl Into<Bytes>) -> Response {
        let request = self
            .request("PUT", path)
            .body(Full::new(bytes.into()))
            .unwrap();
        self.send_tolerant(request).await
    }

    /// Sends and returns the streaming response.
    pub async fn open(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let mut sender = self.connect().await;
        sender.send_request(request).await.unwrap()
    }

    /// Opens a run's event stream.
    pub async fn open_events(&self, id: &str) -> hyper::body::Incoming {
        let path = format!("/v1/runs/{id}/events");
        self.open(self.request("GET", &path).body(Full::default()).unwrap())
            .await
            .into_body()
    }

    pub async fn get(&self, path: &str) -> Response {
        self.send(self.request("GET", path).body(Full::default()).unwrap())
            .await
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.send(self.request("DELETE", path).body(Full::default()).unwrap())
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> Response {
        let request = self
            .request("POST", path)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        self.send(request).await
    }

    pub async fn put(&self, path: &str, bytes: impl Into<Bytes>) -> Response {
        let request = self
            .request("PUT", path)
            .body(Full::new(bytes.into()))
            .unwrap();
        self.send(request).await
    }

    /// Starts a run and waits for it (wait = 30 s).
    pub async fn run(&self, body: Value) -> Response {
        let mut body = body;
        if body.get("wait").is_none() {
            body["wait"] = Value::from(30);
        }
        self.post("/v1/runs", body).await
    }

    /// Polls a run until it is terminal.
    pub async fn wait_terminal(&self, id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let run = self.get(&format!("/v1/runs/{id}")).await.json();
            let status = run["status"].as_str().unwrap_or_default();
            if status != "queued" && status != "running" {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} still {status} after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Tools for `/v1/calls`.
const TOOLS: &str = r#"
def word_count(text):
    return len(text.split())

def spin():
    while True:
        pass

def boom():
    raise ValueError("no good")
"#;

/// Processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == std::process::id().to_string() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(format!("{name}: {text}"));
            }
        }
    }
    found
}

/// Waits until `check` returns nothing, at most `timeout`; returns what it last returned.
pub fn settle<T: std::fmt::Debug>(timeout: Duration, mut check: impl FnMut() -> Vec<T>) -> Vec<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = check();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A fresh PostgreSQL database for one test, from `AIRLOCKD_TEST_POSTGRES` (an admin URL,
/// set by `.ci/daemon`). `None` (the test then says why it skipped) when the variable is
/// unset outside CI; in CI its absence is a failure.
pub async fn postgres_database() -> Option<String> {
    let Ok(admin) = std::env::var("AIRLOCKD_TEST_POSTGRES") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must set AIRLOCKD_TEST_POSTGRES (.ci/daemon starts PostgreSQL)"
        );
        eprintln!("skipped: AIRLOCKD_TEST_POSTGRES is not set (bash .ci/daemon sets it after starting PostgreSQL)");
        return None;
    };
    sqlx::any::install_default_drivers();
    let name = format!("airlockd_test_{:016x}", airlockd::workspace::random_u64());
    let pool = sqlx::AnyPool::connect(&admin)
        .await
        .expect("the test PostgreSQL answers");
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let base = admin
        .rsplit_once('/')
        .map(|(base, _)| base)
        .unwrap_or(&admin);
    Some(format!("{base}/{name}"))
}

/// Reads `stream` until its text so far contains `needle` (each frame within 20 s); returns
/// the text.
pub async fn read_until(stream: &mut hyper::body::Incoming, needle: &str) -> String {
    use http_body_util::BodyExt;
    let mut seen = String::new();
    while !seen.contains(needle) {
        let frame = tokio::time::timeout(Duration::from_secs(20), stream.frame())
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} within 20 s; seen: {seen}"))
            .expect("the stream goes on")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    seen
}

/// Which file is at `path`: its inode and change time (an inode number alone may be reused
/// by the file that replaces it).
fn socket_inode(path: &std::path::Path) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}
