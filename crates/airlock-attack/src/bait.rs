//! Host-side bait that records what reaches it: listeners (TCP, UDP, Unix sockets) and a
//! terminal whose input queue an attack may try to fill.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::plan::Outcome;

/// Bytes received by a host listener.
#[derive(Clone, Default)]
pub struct Inbox(Arc<Mutex<Vec<u8>>>);

impl Inbox {
    fn push(&self, bytes: &[u8]) {
        self.0.lock().unwrap().extend_from_slice(bytes);
    }

    /// Evidence: the listener received bytes carrying `marker`.
    pub fn evidence(&self, marker: &str) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
        let inbox = self.clone();
        let marker = marker.to_string();
        move |_: &Outcome| {
            // Connections are read on their own threads: give the last one a moment.
            std::thread::sleep(Duration::from_millis(100));
            let bytes = inbox.0.lock().unwrap();
            let text = String::from_utf8_lossy(&bytes);
            text.contains(&marker).then(|| {
                format!(
                    "the host listener received {} bytes carrying the marker",
                    bytes.len()
                )
            })
        }
    }

    /// Accepts connections on `listener` for the rest of the process's life.
    pub fn serve_unix(listener: UnixListener) -> Inbox {
        let inbox = Inbox::default();
        let sink = inbox.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sink = sink.clone();
                std::thread::spawn(move || read_stream(stream, &sink));
            }
        });
        inbox
    }
}

fn read_stream(mut stream: impl Read, sink: &Inbox) {
    let mut buffer = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 {
            break;
        }
        sink.push(&buffer[..n]);
    }
}

/// A TCP listener on 127.0.0.1 (`port` 0: any free port).
pub fn tcp_listener(port: u16) -> Result<(u16, Inbox), String> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen on tcp 127.0.0.1:{port}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let inbox = Inbox::default();
    let sink = inbox.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let sink = sink.clone();
            std::thread::spawn(move || read_stream(stream, &sink));
        }
    });
    Ok((port, inbox))
}

/// A UDP socket on 127.0.0.1 (`port` 0: any free port).
pub fn udp_listener(port: u16) -> Result<(u16, Inbox), String> {
    let socket = std::net::UdpSocket::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot bind udp 127.0.0.1:{port}: {e}"))?;
    let port = socket.local_addr().map_err(|e| e.to_string())?.port();
    let inbox = Inbox::default();
    let sink = inbox.clone();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 65536];
        while let Ok((n, _)) = socket.recv_from(&mut buffer) {
            sink.push(&buffer[..n]);
        }
    });
    Ok((port, inbox))
}

/// A fresh pseudo-terminal in raw mode; the run gets its slave side on stdin.
pub struct Terminal {
    _master: OwnedFd,
    slave: OwnedFd,
}

impl Terminal {
    pub fn open() -> Result<Terminal, String> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
        let mut mode = tcgetattr(&pty.slave).map_err(|e| format!("tcgetattr: {e}"))?;
        cfmakeraw(&mut mode);
        tcsetattr(&pty.slave, SetArg::TCSANOW, &mode).map_err(|e| format!("tcsetattr: {e}"))?;
        Ok(Terminal {
            _master: pty.master,
            slave: pty.slave,
        })
    }

    pub fn slave(&self) -> Result<OwnedFd, String> {
        self.slave
            .try_clone()
            .map_err(|e| format!("dup the terminal: {e}"))
    }

    /// What is waiting in the terminal's input queue: what a shell would read next.
    pub fn pending_input(&self) -> String {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let _ = fcntl(self.slave.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        let mut input = Vec::new();
        let mut buffer = [0u8; 1024];
        while let Ok(n) = nix::unistd::read(self.slave.as_raw_fd(), &mut buffer) {
            if n == 0 {
                break;
            }
            input.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8_lossy(&input).into_owned()
    }
}
