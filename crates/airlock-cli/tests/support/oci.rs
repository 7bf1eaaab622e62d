//! The end-to-end tests shared by the OCI backends (`container` and `gvisor`): the same
//! promises checked the same way through the real binary, with the few expected values that
//! differ between runtimes given by each backend's [`Oci`] description.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{is_root, PYTHON, UNPRIVILEGED_UID};

/// Who runs the airlock CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// The test process itself; the backend is rootful, so the test needs root.
    Root,
    /// A non-root user: [`UNPRIVILEGED_UID`] when the tests run as root, else the caller.
    /// The runtime runs rootless.
    Unprivileged,
}

/// What differs between the OCI backends' tests.
pub struct Oci {
    /// The `--backend` value.
    pub backend: &'static str,
    /// Runtime binaries, any of which makes the backend usable.
    pub runtimes: &'static [&'static str],
    /// How to install one, for the skip message.
    pub install: &'static str,
    /// Where the runtime keeps container state (must hold nothing of a finished run).
    pub state_dirs: &'static [&'static str],
    /// The errno of `socket(AF_INET)` with the network off: runc applies our EAFNOSUPPORT,
    /// gVisor turns every seccomp refusal into EPERM.
    pub inet_refusal_errno: i32,
    /// Flags every run gets after `--backend` (e.g. `--container-runtime crun`, or
    /// `--allow-degraded` for a backend whose known gap the untrusted profile refuses).
    pub flags: &'static [&'static str],
    /// Who runs the CLI.
    pub user: User,
    /// Text the runtime's own message contains when it refuses a bundle whose bind source it
    /// cannot find (see [`a_refused_bundle_is_a_sandbox_error_not_the_programs_exit`]).
    pub refusal_message: &'static str,
}

/// The rootful defaults of the fields most backends share.
pub const ROOTFUL: Oci = Oci {
    backend: "",
    runtimes: &[],
    install: "",
    state_dirs: &[],
    inet_refusal_errno: 97,
    flags: &[],
    user: User::Root,
    refusal_message: "",
};

impl Oci {
    /// The reason to skip, printed, or `None` when the backend can run here.
    pub fn skip_reason(&self) -> Option<String> {
        let root = is_root();
        if self.user == User::Root && !root {
            return Some(format!("needs root (rootful {})", self.runtimes.join("/")));
        }
        if self.user == User::Unprivileged && root && !Path::new(SETPRIV).exists() {
            return Some(format!(
                "setpriv (util-linux) is needed to run airlock as uid {UNPRIVILEGED_UID}"
            ));
        }
        let found = self.runtimes.iter().any(|name| {
            ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
                .iter()
                .any(|dir| Path::new(dir).join(name).exists())
        });
        (!found).then(|| {
            format!(
                "no {} installed ({})",
                self.runtimes.join(" or "),
                self.install
            )
        })
    }

    /// The runtime runs without root.
    pub fn rootless(&self) -> bool {
        self.user == User::Unprivileged || !is_root()
    }

    /// The uid the CLI runs as.
    pub fn cli_uid(&self) -> u32 {
        match (self.user, is_root()) {
            (User::Unprivileged, true) => UNPRIVILEGED_UID,
            _ => nix::unistd::geteuid().as_raw(),
        }
    }

    /// `airlock` as this backend's user (through setpriv when the tests run as root).
    pub fn airlock(&self) -> Command {
        if self.user == User::Root || !is_root() {
            return Command::new(env!("CARGO_BIN_EXE_airlock"));
        }
        let id = UNPRIVILEGED_UID.to_string();
        let mut command = Command::new(SETPRIV);
        command
            .args(["--reuid", &id, "--regid", &id, "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_airlock"))
            // Root's runtime directory is not the unprivileged user's.
            .env_remove("XDG_RUNTIME_DIR")
            .current_dir("/");
        command
    }

    /// Runs `airlock run --json --backend BACKEND FLAGS -- ARGV` and returns the result object.
    pub fn run(&self, flags: &[&str], argv: &[&str]) -> Value {
        self.run_output(flags, argv).0
    }

    /// [`Oci::run`], with the CLI's own output too.
    pub fn run_output(&self, flags: &[&str], argv: &[&str]) -> (Value, std::process::Output) {
        let output = self
            .airlock()
            .args(["run", "--json", "--backend", self.backend])
            .args(self.flags.iter().filter(|f| !flags.contains(f)))
            .args(flags)
            .arg("--")
            .args(argv)
            .output()
            .expect("airlock runs");
        let result = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON result ({e}); stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (result, output)
    }

    /// Nothing named after the run survives it: run directory, cgroups, runtime state, processes.
    pub fn assert_no_leftovers(&self, run_dir: &Path, run_id: &str) {
        let leftovers = self.leftovers(run_dir, run_id);
        assert!(leftovers.is_empty(), "survived the run: {leftovers:?}");
    }

    /// Waits up to `patience` for a run whose supervisor was killed to be cleaned up by its
    /// init, then asserts that nothing survived.
    pub fn assert_cleaned_up_within(&self, run_dir: &Path, run_id: &str, patience: Duration) {
        let deadline = Instant::now() + patience;
        while !self.leftovers(run_dir, run_id).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.assert_no_leftovers(run_dir, run_id);
    }

    fn leftovers(&self, run_dir: &Path, run_id: &str) -> Vec<String> {
        let mut found = Vec::new();
        if run_dir.exists() {
            found.push(run_dir.display().to_string());
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let leftover = hierarchy.path().join("airlock").join(run_id);
            if leftover.exists() {
                found.push(leftover.display().to_string());
            }
        }
        for state in self.state_dirs {
            let leftover = Path::new(state).join(format!("airlock-{run_id}"));
            if leftover.exists() {
                found.push(leftover.display().to_string());
            }
        }
        for process in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = std::fs::read(process.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains(run_id) {
                found.push(format!("process {:?}: {cmdline}", process.file_name()));
            }
        }
        found
    }
}

const SETPRIV: &str = "/usr/bin/setpriv";

pub fn stdout(result: &Value) -> &str {
    result["stdout"].as_str().unwrap_or("")
}

pub fn py(code: &str) -> Vec<&str> {
    vec![PYTHON, "-c", code]
}

/// Returns from the test, saying why, when the backend cannot run here.
#[macro_export]
macro_rules! require_runtime {
    ($oci:expr) => {
        if let Some(reason) = $oci.skip_reason() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

pub fn exit_codes_propagate(oci: &Oci) {
    let result = oci.run(&[], &["/bin/sh", "-c", "echo out; exit 7"]);
    assert_eq!(result["status"], "exited", "{result}");
    assert_eq!(result["exit_code"], 7, "{result}");
    assert_eq!(stdout(&result), "out\n");
    assert_eq!(result["backend"], oci.backend);
}

pub fn namespaces_cannot_be_created(oci: &Oci) {
    let code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('unshared' if libc.unshare(0x10000000) == 0 else f'refused {ctypes.get_errno()}')";
    let result = oci.run(&[], &py(code));
    assert_eq!(stdout(&result), "refused 1\n", "{result}");
}

pub fn root_filesystem_is_read_only(oci: &Oci) {
    let result = oci.run(&[], &["/bin/sh", "-c", "touch /usr/airlock-x 2>/dev/null && echo usr-writable; touch /airlock-x 2>/dev/null && echo root-writable; echo done"]);
    assert_eq!(stdout(&result), "done\n", "{result}");
}

pub fn network_is_only_loopback(oci: &Oci) {
    let host = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let code = "import socket\nprint(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))\ntry:\n socket.socket(socket.AF_INET, socket.SOCK_STREAM); print('inet socket')\nexcept OSError as e: print('refused', e.errno)";
    let result = oci.run(&[], &py(code));
    assert_eq!(
        stdout(&result),
        format!("['lo']\nrefused {}\n", oci.inet_refusal_errno),
        "{result}"
    );
    if host.lines().count() <= 3 {
        eprintln!("note: the host has only loopback too, so the interface check proves less here");
    }
}

pub fn host_canary_is_invisible(oci: &Oci) {
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
    let result = oci.run(&[], &["/bin/sh", "-c", &format!("cat {path} 2>/dev/null || echo invisible; cat /etc/shadow 2>/dev/null || echo no-shadow")]);
    assert_eq!(stdout(&result), "invisible\nno-shadow\n", "{result}");
    // Control: the same file is readable with the same path when it is exposed.
    let exposed = oci.run(
        &["--allow-degraded", "--ro", dir.path().to_str().unwrap()],
        &["/bin/cat", &path],
    );
    assert_eq!(stdout(&exposed), "canary", "{exposed}");
}

/// With a cgroup, an allocation past the limit is an OOM kill reported as `memory_limit`.
/// Rootless there is no cgroup: the address-space rlimit makes the allocation fail inside the
/// program (Python's MemoryError, exit 1), and the result claims no cgroup.
pub fn memory_limit_is_reported(oci: &Oci) {
    let result = oci.run(
        &["--mem", "64MiB"],
        &py("b = bytearray(300 << 20); print('allocated')"),
    );
    assert!(!stdout(&result).contains("allocated"), "{result}");
    if !oci.rootless() {
        assert_eq!(result["status"], "memory_limit", "{result}");
        return;
    }
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("MemoryError"),
        "{result}"
    );
    let isolation = result["isolation"].as_array().unwrap();
    assert!(!isolation.contains(&"cgroup".into()), "{result}");
    assert!(
        result["warnings"].to_string().contains("RLIMIT_AS"),
        "{result}"
    );
}

/// Forks past the limit fail and the run survives (under gVisor the limit is RLIMIT_NPROC in
/// the sentry: a host pids limit would kill the whole sandbox on the ptrace platform).
pub fn pids_limit_refuses_forks_without_killing_the_run(oci: &Oci) {
    let code = "import os\nn=0\ntry:\n for i in range(64):\n  if os.fork()==0:\n   import time; time.sleep(2); os._exit(0)\n  n+=1\nexcept OSError as e: print('fork refused', e.errno)\nprint('forks', n)";
    let result = oci.run(&["--pids", "16"], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    assert!(
        stdout(&result).starts_with("fork refused 11\nforks "),
        "{result}"
    );
}

pub fn wall_timeout_kills_the_container_and_leaves_nothing(oci: &Oci) {
    let started = std::time::Instant::now();
    let result = oci.run(&["--wall", "2s"], &["/bin/sh", "-c", "pwd; sleep 30"]);
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
    oci.assert_no_leftovers(run_dir, &run_id);
}

pub fn normal_runs_leave_nothing_either(oci: &Oci) {
    let result = oci.run(&[], &["/bin/sh", "-c", "pwd"]);
    let workdir = stdout(&result).trim().to_string();
    let run_dir = Path::new(&workdir).parent().unwrap();
    oci.assert_no_leftovers(run_dir, run_dir.file_name().unwrap().to_str().unwrap());
}

/// A python program that makes up to 400 files in its workdir, then writes 40 MiB, saying
/// where each stopped: `files refused 28`, the number made, `bytes refused 28` when capped.
pub const FILL_WORKDIR: &str = "import os\nn = 0\ntry:\n    for i in range(400):\n        open(f'f{i}', 'w').close(); n += 1\nexcept OSError as e:\n    print('files refused', e.errno)\nprint(n)\ntry:\n    open('big', 'wb').write(b'x' * (40 << 20))\n    print('wrote 40MiB')\nexcept OSError as e:\n    print('bytes refused', e.errno)";

/// The limits [`FILL_WORKDIR`] runs under.
pub const FILL_LIMITS: [&str; 4] = ["--files", "100", "--disk", "16MiB"];

/// The workdir the sandbox creates caps both size and files (its own tmpfs, or the init's
/// capped mount for tools whose tmpfs cannot cap inodes), and the result claims both.
pub fn sandbox_workdir_caps_size_and_files(oci: &Oci) {
    let result = oci.run(&FILL_LIMITS, &py(FILL_WORKDIR));
    // The tmpfs root is one of the 100 inodes.
    assert_eq!(
        stdout(&result),
        "files refused 28\n99\nbytes refused 28\n",
        "{result}"
    );
    let isolation = result["isolation"].as_array().unwrap();
    for layer in ["disk_quota", "inode_quota"] {
        assert!(isolation.contains(&layer.into()), "{layer}: {result}");
    }
}

/// A SIGKILLed supervisor leaves nothing once its init notices: no process, no cgroup, no
/// runtime state and no run directory on the host (which, in memory, never appears there).
pub fn killed_supervisor_leaves_nothing(oci: &Oci) {
    use std::io::BufRead;
    let mut child = oci
        .airlock()
        .args(["run", "--backend", oci.backend])
        .args(oci.flags)
        .args(["--", "/bin/sh", "-c", "pwd; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("airlock starts");
    let mut workdir = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut workdir)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let run_dir = Path::new(workdir.trim()).parent().expect("a run directory");
    let run_id = run_dir.file_name().unwrap().to_str().unwrap();
    oci.assert_cleaned_up_within(run_dir, run_id, Duration::from_secs(10));
}

/// A runtime that refuses the bundle never starts the program, and its exit code (runc and
/// crun 1, runsc 128) must not pass for the program's. The bundle binds
/// `/proc/self/cwd/marker`: the caller sees the marker in its own working directory, the
/// runtime (whose cwd is the workdir) does not find it. airlock learns that the program never
/// started from the runtime's pid file (and runsc's log): status `sandbox_error`, exit 125,
/// the runtime's message kept in stderr. The program's own `exit 1` stays `exited 1`.
pub fn a_refused_bundle_is_a_sandbox_error_not_the_programs_exit(oci: &Oci) {
    let dir = tempfile::Builder::new()
        .prefix("airlock-refused")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(dir.path().join("marker"), "m").unwrap();
    let public = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(dir.path(), public).unwrap();
    let output = oci
        .airlock()
        .current_dir(dir.path())
        .args([
            "run",
            "--json",
            "--backend",
            oci.backend,
            "--allow-degraded",
        ])
        .args(oci.flags.iter().filter(|f| **f != "--allow-degraded"))
        .args(["--ro", "/proc/self/cwd/marker", "--", "/bin/true"])
        .output()
        .expect("airlock runs");
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.code(), Some(125), "{result}");
    assert_eq!(result["status"], "sandbox_error", "{result}");
    let error = result["error"].as_str().unwrap_or("");
    assert!(
        error.contains("failed before the program started"),
        "{result}"
    );
    let stderr = result["stderr"].as_str().unwrap_or("");
    assert!(
        stderr.contains(oci.refusal_message),
        "the runtime's own message: {result}"
    );
    let own = oci.run(&[], &["/bin/sh", "-c", "exit 1"]);
    assert_eq!(own["status"], "exited", "{own}");
    assert_eq!(own["exit_code"], 1, "{own}");
}

/// Rootless, there is no uid drop and no cgroup. A profile that requires either is refused by
/// default, naming the layer and the opt-in (`uid_drop` before anything starts, `cgroup` by
/// the init, which finds it could not make one); accepted with `--allow-degraded`, the run's
/// result does not claim it.
pub fn required_layers_rootless_lacks_are_refused_then_reported(oci: &Oci) {
    assert!(oci.rootless(), "a rootless check");
    let dir = tempfile::Builder::new()
        .prefix("airlock-profile")
        .tempdir_in("/var/tmp")
        .unwrap();
    let public = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(dir.path(), public).unwrap();
    for layer in ["uid_drop", "cgroup"] {
        let profile = dir.path().join(format!("{layer}.toml"));
        std::fs::write(
            &profile,
            format!("require = [\"env_scrub\", \"{layer}\"]\n"),
        )
        .unwrap();
        let readable = std::os::unix::fs::PermissionsExt::from_mode(0o644);
        std::fs::set_permissions(&profile, readable).unwrap();
        let profile = profile.to_str().unwrap();
        let output = oci
            .airlock()
            .args([
                "run",
                "--json",
                "--backend",
                oci.backend,
                "--profile",
                profile,
            ])
            .args(oci.flags.iter().filter(|f| **f != "--allow-degraded"))
            .args(["--", "/bin/true"])
            .output()
            .expect("airlock runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(125), "{layer}: {said}");
        assert!(
            said.contains(layer) && said.contains("--allow-degraded"),
            "{layer}: {said}"
        );
        let accepted = oci.run(&["--profile", profile, "--allow-degraded"], &["/bin/true"]);
        assert_eq!(accepted["status"], "exited", "{layer}: {accepted}");
        let isolation = accepted["isolation"].as_array().unwrap();
        assert!(!isolation.contains(&layer.into()), "{layer}: {accepted}");
        assert!(
            accepted["warnings"].to_string().contains("degraded"),
            "{accepted}"
        );
    }
}

/// One `#[test]` per shared check, for the backend described by `$oci`.
#[macro_export]
macro_rules! shared_oci_tests {
    // Every shared check.
    ($oci:expr) => {
        shared_oci_tests!($oci;
            exit_codes_propagate,
            namespaces_cannot_be_created,
            root_filesystem_is_read_only,
            network_is_only_loopback,
            host_canary_is_invisible,
            memory_limit_is_reported,
            pids_limit_refuses_forks_without_killing_the_run,
            wall_timeout_kills_the_container_and_leaves_nothing,
            normal_runs_leave_nothing_either,
            killed_supervisor_leaves_nothing,
            sandbox_workdir_caps_size_and_files,
            a_refused_bundle_is_a_sandbox_error_not_the_programs_exit,
        );
    };
    ($oci:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                $crate::require_runtime!($oci);
                $crate::support::oci::$check(&$oci);
            }
        )*
    };
}
