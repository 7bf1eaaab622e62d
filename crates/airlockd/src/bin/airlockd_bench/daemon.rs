//! The daemon under measurement and the bench's connection to it: started from the binary
//! beside this one on a socket of its own, stopped with the bench. Apart from the parts, which
//! all share it (the warm part starts daemons of its own with other settings).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

pub(super) struct Daemon {
    pub(super) child: Child,
    pub(super) dir: tempfile::TempDir,
    socket: PathBuf,
    key: String,
    pub(super) init: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid"),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        // The daemon's log goes with its directory unless asked for (with
        // `AIRLOCKD_BENCH_LOG=airlockd=debug`, its `answered ... timeline=` lines).
        if let Some(keep) = std::env::var_os("AIRLOCKD_BENCH_KEEP_LOG") {
            let _ = std::fs::copy(self.dir.path().join("daemon.log"), keep);
        }
        for entry in std::fs::read_dir(self.dir.path().join("state/sessions"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = airlockd::workspace::remove_workspace_dir(&entry.path());
        }
    }
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build it first (cargo build --release -p airlockd -p airlock-cli)",
            path.display()
        );
    }
    Ok(path)
}

pub(super) fn start_daemon() -> anyhow::Result<Daemon> {
    start_daemon_with("")
}

/// A daemon with `extra` configuration (e.g. `[warm]`) before its tenant.
pub(super) fn start_daemon_with(extra: &str) -> anyhow::Result<Daemon> {
    let dir = tempfile::Builder::new()
        .prefix("airlockd-bench-")
        .tempdir()?;
    let key = airlockd::auth::new_key();
    let init = sibling("airlock")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = format!(
        r#"[server]
socket = "{root}/run/airlockd.sock"
max_wait = "600s"
[paths]
state_dir = "{root}/state"
runtime_dir = "{root}/run"
init_program = "{init}"
[pool]
max_concurrent = {cpus}
max_queued = 5000
queue_timeout = "600s"
[sessions]
max_per_tenant = 100000
[sandbox]
cgroup_parent = "airlockd-bench"
{extra}
[[tenants]]
name = "bench"
keys = [{{ name = "bench", hash = "{hash}" }}]
max_queued = 5000
"#,
        root = dir.path().display(),
        init = init.display(),
        hash = airlockd::auth::hash_line(&key),
        extra = extra,
    );
    std::fs::write(dir.path().join("airlockd.toml"), config)?;
    let child = Command::new(sibling("airlockd")?)
        .arg("--config")
        .arg(dir.path().join("airlockd.toml"))
        .env(
            "AIRLOCKD_LOG",
            std::env::var("AIRLOCKD_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("daemon.log"))?)
        .spawn()?;
    let socket = dir.path().join("run/airlockd.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!("airlockd did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Daemon {
        child,
        dir,
        socket,
        key,
        init,
    })
}

/// One keep-alive connection to the daemon.
pub(super) struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    key: String,
}

impl Connection {
    pub(super) async fn open(daemon: &Daemon) -> anyhow::Result<Connection> {
        let stream = tokio::net::UnixStream::connect(&daemon.socket).await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Connection {
            sender,
            key: daemon.key.clone(),
        })
    }

    pub(super) async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let (status, value, _) = self.call_timed(method, path, body).await?;
        Ok((status, value))
    }

    /// Also returns the daemon's `Server-Timing` metrics (`sandbox`: the library's share of
    /// the answer's time; `daemon`: the request's time in the daemon's router), ms.
    pub(super) async fn call_timed(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value, ServerTiming)> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "airlockd")
            .header("authorization", format!("Bearer {}", self.key));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        self.sender.ready().await?;
        let response = self
            .sender
            .send_request(request.body(Full::new(body))?)
            .await?;
        let status = response.status().as_u16();
        let timing = ServerTiming::parse(response.headers());
        let bytes = response.into_body().collect().await?.to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, value, timing))
    }
}

/// The metrics of a `Server-Timing` header the bench reads, ms.
#[derive(Default)]
pub(super) struct ServerTiming {
    pub(super) sandbox: Option<f64>,
    pub(super) daemon: Option<f64>,
}

impl ServerTiming {
    fn parse(headers: &hyper::HeaderMap) -> ServerTiming {
        let mut timing = ServerTiming::default();
        let values = headers.get_all("server-timing").iter();
        let metrics = values
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for metric in metrics {
            let Some((name, ms)) = metric.trim().split_once(";dur=") else {
                continue;
            };
            let ms = ms.parse().ok();
            match name {
                "sandbox" => timing.sandbox = ms,
                "daemon" => timing.daemon = ms,
                _ => {}
            }
        }
        timing
    }
}
