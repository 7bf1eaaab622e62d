//! `unix_sockets`: exactly the listed host sockets (globs expanded at start) appear at their
//! paths, and no other host socket, named or abstract, is reachable. Tier 0 (which refuses
//! `unix_sockets`) reaches them all: the check can fail.

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::Path;
use std::thread;

use airlock_testworld::in_netns;

use crate::{flags, stdout_ok};

/// A host socket answering `hello from NAME` to whoever connects, open to every user.
fn serve(listener: UnixListener, name: &'static str) {
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(format!("hello from {name}").as_bytes());
            let _ = stream.read(&mut [0u8; 1]);
        }
    });
}

fn listen_at(path: &Path, name: &'static str) {
    let listener = UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    serve(listener, name);
}

const CLIENT: &str = r#"
import os, socket, sys
def ask(address):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(address); return s.recv(100).decode()
    except OSError as e:
        return type(e).__name__
directory, abstract = sys.argv[1], sys.argv[2]
print(ask(os.path.join(directory, "a.sock")))
print(ask(os.path.join(directory, "b.sock")))
print(ask("\0" + abstract))
print(sorted(found_sockets()))
"#;

#[test]
fn only_the_listed_host_sockets_are_reachable() {
    let Some(world) = crate::world() else { return };
    let dir = world.dir.path().join("sockets");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    listen_at(&dir.join("a.sock"), "a");
    listen_at(&dir.join("b.sock"), "b");
    let abstract_name = format!("airlock-test-{}", world.gate_ns);
    let name = abstract_name.clone();
    let abstract_listener = in_netns(&world.gate_ns, move || {
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap()
    });
    serve(abstract_listener, "abstract");
    let directory = dir.display().to_string();
    let client = format!("{}{CLIENT}", crate::FOUND_SOCKETS);
    let listed = format!("{directory}/a*.sock");
    for network in [&["--network", "none"][..], &["--allow-net", "allowed.test"]] {
        let mut rules = flags(network);
        rules.extend(flags(&["--unix-socket", &listed]));
        let result = crate::run(
            &world,
            &rules,
            &[
                airlock_testworld::PYTHON,
                "-c",
                &client,
                &directory,
                &abstract_name,
            ],
        );
        let out = stdout_ok(&result);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "hello from a", "{network:?}: {out}");
        assert_eq!(lines[1], "FileNotFoundError", "{network:?}: {out}");
        assert!(lines[2].ends_with("Error"), "{network:?}: abstract: {out}");
        assert_eq!(
            lines[3],
            format!("['{directory}/a.sock']"),
            "{network:?}: {out}"
        );
    }
    // Tier 0 sees the host's filesystem and network: every socket answers.
    let mut command = world.in_gate(crate::support::airlock_bin());
    command
        .args(["run", "--json", "--dev", "--backend", "none", "--"])
        .args([
            airlock_testworld::PYTHON,
            "-c",
            &client,
            &directory,
            &abstract_name,
        ]);
    let escaped: serde_json::Value =
        serde_json::from_slice(&command.output().unwrap().stdout).unwrap();
    let out = stdout_ok(&escaped);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..3],
        ["hello from a", "hello from b", "hello from abstract"],
        "{out}"
    );
}

#[test]
fn a_missing_or_wrong_socket_is_refused_before_the_run() {
    let dir = crate::support::shared_tempdir();
    std::fs::write(dir.path().join("plain.sock"), "").unwrap();
    for (entry, problem) in [
        (
            format!("{}/none*.sock", dir.path().display()),
            "no socket matches",
        ),
        (
            format!("{}/plain.sock", dir.path().display()),
            "is not a socket",
        ),
        ("relative.sock".to_string(), "absolute"),
    ] {
        let out = crate::support::airlock(&["run", "--unix-socket", &entry, "--", "/bin/true"]);
        let stderr = crate::support::stderr_text(&out);
        assert_eq!(out.status.code(), Some(125), "{entry}: {stderr}");
        assert!(
            stderr.contains(problem) && stderr.contains("unix_sockets"),
            "{entry}: {stderr}"
        );
    }
}
