//! `airlock run --backend container` end to end, through the real binary and runc/crun.
//! Skips (with the reason printed) when not root or when no OCI runtime is installed.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const BACKEND: &str = "container";
const PYTHON: &str = "/usr/bin/python3";

fn skip_reason() -> Option<String> {
    if !nix_is_root() {
        return Some("needs root (rootful runc)".into());
    }
    let found = ["runc", "crun"].iter().any(|n| {
        ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
            .iter()
            .any(|d| Path::new(d).join(n).exists())
    });
    (!found).then(|| "no OCI runtime installed (apt-get install runc)".into())
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

macro_rules! require_runtime {
    () => {
        if let Some(reason) = skip_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// Runs `airlock run --json --backend container FLAGS -- ARGV` and returns the result object.
fn run(flags: &[&str], argv: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["run", "--json", "--backend", BACKEND])
        .args(flags)
        .arg("--")
        .args(argv)
        .output()
        .expect("airlock runs");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn stdout(result: &Value) -> &str {
    result["stdout"].as_str().unwrap_or("")
}

fn py(code: &str) -> Vec<&str> {
    vec![PYTHON, "-c", code]
}

#[test]
fn exit_codes_propagate() {
    require_runtime!();
    let result = run(&[], &["/bin/sh", "-c", "echo out; exit 7"]);
    assert_eq!(result["status"], "exited", "{result}");
    assert_eq!(result["exit_code"], 7, "{result}");
    assert_eq!(stdout(&result), "out\n");
    assert_eq!(result["backend"], BACKEND);
}

#[test]
fn python_runs_unprivileged_with_no_capabilities_and_seccomp() {
    require_runtime!();
    let code = "import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd','Seccomp:','NoNewPrivs'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); print('wrote')";
    let result = run(&[], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(
        stdout(&result),
        "65534 ['0000000000000000', '0000000000000000', '1', '2']\nwrote\n",
        "{result}"
    );
}

#[test]
fn namespaces_cannot_be_created() {
    require_runtime!();
    let code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('unshared' if libc.unshare(0x10000000) == 0 else f'refused {ctypes.get_errno()}')";
    let result = run(&[], &py(code));
    assert_eq!(stdout(&result), "refused 1\n", "{result}");
}

#[test]
fn root_filesystem_is_read_only() {
    require_runtime!();
    let result = run(&[], &["/bin/sh", "-c", "touch /usr/airlock-x 2>/dev/null && echo usr-writable; touch /airlock-x 2>/dev/null && echo root-writable; echo done"]);
    assert_eq!(stdout(&result), "done\n", "{result}");
}

#[test]
fn network_is_only_loopback() {
    require_runtime!();
    let host = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let code = "import socket\nprint(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))\ntry:\n socket.socket(socket.AF_INET, socket.SOCK_STREAM); print('inet socket')\nexcept OSError as e: print('refused', e.errno)";
    let result = run(&[], &py(code));
    assert_eq!(stdout(&result), "['lo']\nrefused 97\n", "{result}");
    if host.lines().count() <= 3 {
        eprintln!("note: the host has only loopback too, so the interface check proves less here");
    }
}

#[test]
fn host_canary_is_invisible() {
    require_runtime!();
    let dir = tempfile::Builder::new()
        .prefix("airlock-canary")
        .tempdir_in("/var/tmp")
        .unwrap();
    let canary = dir.path().join("secret");
    std::fs::write(&canary, "canary").unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = canary.display().to_string();
    let result = run(&[], &["/bin/sh", "-c", &format!("cat {path} 2>/dev/null || echo invisible; cat /etc/shadow 2>/dev/null || echo no-shadow")]);
    assert_eq!(stdout(&result), "invisible\nno-shadow\n", "{result}");
    // Control: the same file is readable with the same path when it is exposed.
    let exposed = run(
        &["--allow-degraded", "--ro", dir.path().to_str().unwrap()],
        &["/bin/cat", &path],
    );
    assert_eq!(stdout(&exposed), "canary", "{exposed}");
}

#[test]
fn memory_limit_is_reported() {
    require_runtime!();
    let result = run(
        &["--mem", "64MiB"],
        &py("b = bytearray(300 << 20); print('allocated')"),
    );
    assert_eq!(result["status"], "memory_limit", "{result}");
    assert!(!stdout(&result).contains("allocated"));
}

#[test]
fn pids_limit_refuses_forks_without_killing_the_run() {
    require_runtime!();
    let code = "import os\nn=0\ntry:\n for i in range(64):\n  if os.fork()==0:\n   import time; time.sleep(2); os._exit(0)\n  n+=1\nexcept OSError as e: print('fork refused', e.errno)\nprint('forks', n)";
    let result = run(&["--pids", "16"], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    let out = stdout(&result);
    assert!(out.starts_with("fork refused 11\nforks "), "{result}");
}

#[test]
fn wall_timeout_kills_the_container_and_leaves_nothing() {
    require_runtime!();
    let started = std::time::Instant::now();
    let result = run(&["--wall", "2s"], &["/bin/sh", "-c", "pwd; sleep 30"]);
    assert_eq!(result["status"], "timeout", "{result}");
    assert!(
        started.elapsed().as_secs() < 15,
        "took {:?}",
        started.elapsed()
    );
    let workdir = stdout(&result).trim().to_string();
    let run_dir = Path::new(&workdir)
        .parent()
        .expect("workdir is inside the run directory");
    let run_id = run_dir.file_name().unwrap().to_str().unwrap().to_string();
    assert_no_leftovers(run_dir, &run_id);
}

/// Nothing named after the run survives it: run directory, cgroups, runtime state, processes.
fn assert_no_leftovers(run_dir: &Path, run_id: &str) {
    assert!(!run_dir.exists(), "{} survived", run_dir.display());
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let leftover = hierarchy.path().join("airlock").join(run_id);
        assert!(!leftover.exists(), "{} survived", leftover.display());
    }
    for state in ["/run/runc", "/run/crun", "/var/run/runsc"] {
        let leftover = Path::new(state).join(format!("airlock-{run_id}"));
        assert!(!leftover.exists(), "{} survived", leftover.display());
    }
    for process in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(process.path().join("cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains(run_id),
            "process {:?} survived: {}",
            process.file_name(),
            String::from_utf8_lossy(&cmdline)
        );
    }
}

#[test]
fn normal_runs_leave_nothing_either() {
    require_runtime!();
    let result = run(&[], &["/bin/sh", "-c", "pwd"]);
    let workdir = stdout(&result).trim().to_string();
    let run_dir = Path::new(&workdir).parent().unwrap();
    assert_no_leftovers(run_dir, run_dir.file_name().unwrap().to_str().unwrap());
}
