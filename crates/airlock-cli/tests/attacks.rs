//! The attack suite: every program in `tests/attacks/` tries one escape, and each is judged by
//! evidence gathered on the host (a listener that got bytes, a file that appeared, a victim
//! process that died, a process that outlived its run, a secret in the output).
//!
//! Two modes per attack:
//! - `escape`: the attack must WORK without the sandbox (Tier 0, `--dev --backend none`, or a
//!   bare process where Tier 0 itself already defends), which proves its check can fail;
//!   resource attacks that Tier 0 already contains assert containment here too.
//! - `contained`: under the default `untrusted` profile the evidence must be absent and airlock
//!   must return a sane result.
//!
//! After each suite: no process carrying the suite's marker, no new mount, no cgroup and no run
//! directory left by any airlock the suite started. See docs/attacks.md for the table.

#![cfg(target_os = "linux")]

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The uid root runs drop to (the untrusted profile's default).
const NOBODY: u32 = 65534;
/// The uid the "unprivileged user" suite runs the CLI as when the tests run as root: a uid of
/// its own, because without cgroups the process cap is RLIMIT_NPROC, which counts every
/// process of the uid on the host (other test suites run things as 65534 too).
const UNPRIVILEGED_UID: u32 = 64123;
const PYTHON: &str = "/usr/bin/python3";
/// Attacks run this many at a time; resource attacks run alone afterwards.
const PARALLEL: usize = 3;

/// What a backend cannot enforce under the untrusted profile when airlock cannot mount (the
/// CLI runs unprivileged): the tool's own tmpfs mounts lack the caps that the init's capped
/// mounts (its in-memory run directory) give it as root. Such runs must be refused by default
/// naming exactly these layers; the suite then accepts the degradation (`--allow-degraded`)
/// and judges every attack, so an attack on a gap must be reported as not enforced (the layer
/// absent from the result) and every other attack contained. Keyed by backend and its extra
/// flags.
type GapEntry = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);
const GAPS_WITHOUT_MOUNTS: &[GapEntry] = &[
    ("bwrap", &[], &["inode_quota"]),
    ("gvisor", &[], &["inode_quota"]),
    // podman 4 refuses `nr_inodes` on its tmpfs and binds the workdir.
    (
        "container",
        &["--container-runtime", "podman"],
        &["disk_quota", "inode_quota"],
    ),
];

fn known_gaps(backend: Option<&str>, flags: &[&str], user: User) -> &'static [&'static str] {
    if user == User::Root {
        return &[];
    }
    GAPS_WITHOUT_MOUNTS
        .iter()
        .find(|(name, with, _)| Some(*name) == backend && *with == flags)
        .map_or(&[][..], |(_, _, gaps)| *gaps)
}

/// Suites share host-wide state (cgroups, /run/airlock, uid 65534's process count): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn attacks_escape_without_sandbox_as_root() {
    run_suite(Mode::Escape, User::Root);
}

#[test]
fn attacks_contained_as_root() {
    run_suite(Mode::Contained, User::Root);
}

#[test]
fn attacks_contained_as_unprivileged_user() {
    run_suite(Mode::Contained, User::Unprivileged);
}

/// The untrusted profile with one layer switched off by a flag: the checks must see the attacks
/// that layer alone stopped, and keep seeing containment where another layer also stops them.
/// The same table on every other backend that can run here: the conformance matrix. Each
/// backend must stop every attack with the same default profile (or be skipped, saying why).
#[test]
fn attacks_contained_on_bwrap_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("bwrap"));
}

/// bwrap as an unprivileged user (no in-memory run directory: its tmpfs mounts have no inode
/// cap, a gap refused by default and then reported).
#[test]
fn attacks_contained_on_bwrap_as_unprivileged_user() {
    run_suite_on(Mode::Contained, User::Unprivileged, Some("bwrap"));
}

#[test]
fn attacks_contained_on_container_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("container"));
}

/// Rootless runc: the CLI runs unprivileged, so runc runs rootless (the program is the root
/// of a user namespace mapping only the caller, no cgroup: memory and processes are capped
/// by rlimits); runc's own tmpfs mounts, made in that user namespace, keep both caps.
#[test]
fn attacks_contained_on_container_as_unprivileged_user() {
    let flags = &["--container-runtime", "runc"];
    run_suite_on_with(
        Mode::Contained,
        User::Unprivileged,
        Some("container"),
        flags,
    );
}

#[test]
fn attacks_contained_on_crun_as_root() {
    if runtime_missing("crun") {
        return;
    }
    let flags = &["--container-runtime", "crun"];
    run_suite_on_with(Mode::Contained, User::Root, Some("container"), flags);
}

#[test]
fn attacks_contained_on_podman_as_root() {
    if runtime_missing("podman") {
        return;
    }
    let flags = &["--container-runtime", "podman"];
    run_suite_on_with(Mode::Contained, User::Root, Some("container"), flags);
}

fn runtime_missing(name: &str) -> bool {
    let missing = !["/usr/bin", "/usr/sbin"]
        .iter()
        .any(|dir| Path::new(dir).join(name).exists());
    if missing {
        eprintln!("skipped: {name} is not installed (apt-get install {name})");
    }
    missing
}

#[test]
fn attacks_contained_on_gvisor_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("gvisor"));
}

/// Rootless gVisor (`runsc --rootless`): no capped mounts from airlock, and runsc's own tmpfs
/// has no inode cap, a gap refused by default and then reported.
#[test]
fn attacks_contained_on_gvisor_as_unprivileged_user() {
    run_suite_on(Mode::Contained, User::Unprivileged, Some("gvisor"));
}

#[test]
fn attacks_against_weakened_untrusted_profiles_as_root() {
    run_suite(Mode::Weakened, User::Root);
}

/// Tier 0 without root runs the program as the caller's own uid: the env scrub means nothing if
/// the program can read the supervisor's /proc/PID/environ (or ptrace it) instead.
#[test]
fn tier0_without_root_keeps_the_supervisors_environment_private() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = nix::unistd::geteuid().is_root();
    if !Path::new(PYTHON).exists() || (root && !Path::new("/usr/bin/setpriv").exists()) {
        eprintln!("skipped: needs {PYTHON} and, as root, setpriv");
        return;
    }
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/attacks")
        .canonicalize()
        .expect("tests/attacks exists");
    let script = scripts.join("parent_env.py").display().to_string();
    let secret = format!("secret-{}", random_hex());
    let run = |argv: &[String]| {
        let mut line: Vec<String> = Vec::new();
        if root {
            line.extend([
                "/usr/bin/setpriv".to_string(),
                format!("--reuid={UNPRIVILEGED_UID}"),
                format!("--regid={UNPRIVILEGED_UID}"),
                "--clear-groups".into(),
            ]);
        }
        line.extend(argv.iter().cloned());
        let output = Command::new(&line[0])
            .args(&line[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("AIRLOCK_ATTACK_SECRET", &secret)
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .expect("start the run");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let attack = [
        PYTHON.to_string(),
        "-B".into(),
        script,
        "AIRLOCK_ATTACK_SECRET".into(),
    ];
    let bare = run(&attack);
    assert!(
        bare.contains(&secret),
        "the bare attack must find the secret, or this test proves nothing: {bare}"
    );
    let mut tier0 = vec![
        env!("CARGO_BIN_EXE_airlock").to_string(),
        "run".into(),
        "--json".into(),
        "--dev".into(),
        "--backend".into(),
        "none".into(),
    ];
    tier0.extend([
        "--ro".to_string(),
        scripts.display().to_string(),
        "--".into(),
    ]);
    tier0.extend(attack);
    let result: Value = serde_json::from_str(&run(&tier0)).expect("airlock prints a JSON result");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        stdout.contains("BLOCKED"),
        "the attack must have tried: {result}"
    );
    assert!(
        !stdout.contains(&secret),
        "a Tier 0 program read the supervisor's environment: {stdout}"
    );
}

/// One layer removed from the untrusted profile for one attack.
struct Weakening {
    attack: &'static str,
    /// Extra flags; `{dir}` is the attack's own host directory.
    flags: &'static [&'static str],
    /// Whether the attack must now get through.
    escapes: bool,
    why: &'static str,
}

const WEAKENINGS: &[Weakening] = &[
    Weakening {
        attack: "tcp_to_host_listener",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: true,
        why: "host network: no net namespace, Landlock TCP rules or socket-family filter",
    },
    Weakening {
        attack: "netlink_host_interfaces",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: true,
        why: "host network: the host's interfaces are visible",
    },
    Weakening {
        attack: "host_unix_abstract_socket",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: false,
        why:
            "host network shares the abstract socket namespace, but Landlock's scope still refuses",
    },
    Weakening {
        attack: "read_host_tmp_canary",
        flags: &["--ro", "{dir}"],
        escapes: true,
        why: "a read-only bind of the canary's directory makes it visible",
    },
    Weakening {
        attack: "write_caller_dir",
        flags: &["--ro", "{dir}"],
        escapes: false,
        why: "the directory is bound read-only: visible, still not writable",
    },
    Weakening {
        attack: "inode_bomb",
        flags: &["--backend", "bwrap", "--disk-run-dir", "--allow-degraded"],
        escapes: true,
        why: "bwrap's own tmpfs has no inode cap: only the init's capped mounts stop it",
    },
    Weakening {
        attack: "memory_bomb",
        flags: &["--no-cgroup"],
        escapes: false,
        why: "no cgroup: RLIMIT_AS still caps each process (status exited, MemoryError)",
    },
];

// ---------------------------------------------------------------------------------------------
// The table.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Escape,
    Contained,
    /// The untrusted profile minus one layer ([`WEAKENINGS`]).
    Weakened,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum User {
    /// The airlock CLI runs as root (the program itself runs as uid 65534).
    Root,
    /// The airlock CLI runs as uid 65534 (or as the caller when the tests are not run as root).
    Unprivileged,
}

/// What proves, in `escape` mode, that the attack works at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// `airlock run --dev --backend none`.
    Tier0,
    /// Tier 0 without the uid drop (a profile with `drop_root = false`): root inside Tier 0.
    Tier0AsRoot,
    /// Tier 0 already stops it (uid drop, no_new_privs, fd closing, tree kill): a bare process.
    Bare,
    /// A bare process as uid 65534 without no_new_privs (for setuid binaries).
    BareAsNobody,
    /// A resource attack Tier 0 already contains: assert containment in both modes.
    ContainedToo,
}

/// Threat classes (docs/attacks.md): A secrets, B host integrity and privilege, C network and
/// IPC egress, D resources and lifetime.
#[derive(Debug, Clone, Copy)]
enum Class {
    A,
    B,
    C,
    D,
}

struct Attack {
    name: &'static str,
    class: Class,
    baseline: Baseline,
    /// Resource-hungry: runs alone after the parallel batch.
    exclusive: bool,
    /// Why the attack cannot be set up for an unprivileged CLI, if it cannot.
    root_only: Option<&'static str>,
    prepare: fn(&mut Scene) -> Result<Plan, String>,
}

const fn attack(
    name: &'static str,
    class: Class,
    baseline: Baseline,
    prepare: fn(&mut Scene) -> Result<Plan, String>,
) -> Attack {
    Attack {
        name,
        class,
        baseline,
        exclusive: false,
        root_only: None,
        prepare,
    }
}

impl Attack {
    const fn exclusive(mut self) -> Attack {
        self.exclusive = true;
        self
    }

    const fn root_only(mut self, reason: &'static str) -> Attack {
        self.root_only = Some(reason);
        self
    }
}

fn attacks() -> Vec<Attack> {
    use Baseline::*;
    use Class::*;
    vec![
        attack("read_root_canary", A, Tier0AsRoot, read_root_canary)
            .root_only("a canary in /root is unreadable to uid 65534 anyway"),
        attack("read_host_tmp_canary", A, Tier0, read_host_tmp_canary),
        attack("read_home_canary", A, Tier0, read_home_canary),
        attack("read_etc_canary", A, Tier0, read_etc_canary),
        attack("read_caller_cwd_canary", A, Tier0, read_caller_cwd_canary),
        attack("read_dev_shm_canary", A, Tier0, read_dev_shm_canary),
        attack("read_via_proc_1_root", A, Bare, read_via_proc_1_root),
        attack("read_host_pid_environ", A, Tier0, read_host_pid_environ),
        attack("read_host_pid_cmdline", A, Tier0, read_host_pid_cmdline),
        attack("read_via_host_pid_root", A, Tier0, read_via_host_pid_root),
        attack(
            "read_through_planted_symlink",
            A,
            Tier0,
            read_through_planted_symlink,
        ),
        attack(
            "read_through_own_symlink",
            A,
            Tier0,
            read_through_own_symlink,
        ),
        attack("read_through_hardlink", A, Tier0, read_through_hardlink),
        attack("read_sysv_shm_segment", A, Tier0, read_sysv_shm_segment),
        attack("read_parent_env", A, Bare, read_parent_env),
        attack("read_inherited_fd", A, Bare, read_inherited_fd),
        attack("open_by_handle_shocker", A, Bare, open_by_handle_shocker),
        attack("write_host_tmp", B, Tier0, write_host_tmp),
        attack("write_caller_dir", B, Tier0, write_caller_dir),
        attack("write_read_only_bind", B, Tier0, write_read_only_bind),
        attack("write_proc_sys", B, Bare, write_proc_sys),
        attack("write_sys", B, Bare, write_sys),
        attack(
            "raise_own_cgroup_limits",
            B,
            Tier0AsRoot,
            raise_own_cgroup_limits,
        )
        .exclusive()
        .root_only("without root there is no cgroup"),
        attack("signal_host_process", B, Tier0, signal_host_process),
        attack("ptrace_host_process", B, Tier0, ptrace_host_process),
        attack("ptrace_own_parent", B, Tier0AsRoot, ptrace_own_parent),
        attack("tiocsti_injection", B, Bare, tiocsti_injection),
        attack("setuid_binary", B, BareAsNobody, setuid_binary)
            .root_only("planting a setuid-root binary needs root"),
        attack("mount_tmpfs", B, Bare, mount_tmpfs),
        attack(
            "nested_userns_then_mount",
            B,
            Tier0,
            nested_userns_then_mount,
        ),
        attack("nested_userns_clone3", B, Tier0, nested_userns_clone3),
        attack("keyctl_add_key", B, Tier0, keyctl_add_key),
        attack("bpf_map_create", B, Bare, bpf_map_create),
        attack("perf_event_open", B, Tier0, perf_event_open),
        attack("io_uring_setup", B, Tier0, io_uring_setup),
        attack("block_device_read", B, Bare, block_device_read),
        attack("dev_kvm_open", B, Bare, dev_kvm_open),
        attack("mknod_dev_mem", B, Bare, mknod_dev_mem),
        attack("dev_kmsg_write", B, Bare, dev_kmsg_write),
        attack("tcp_to_host_listener", C, Tier0, tcp_to_host_listener),
        attack("udp_to_host_listener", C, Tier0, udp_to_host_listener),
        attack("dns_exfiltration", C, Tier0, dns_exfiltration),
        attack("raw_socket_forgery", C, Bare, raw_socket_forgery),
        attack("host_unix_path_socket", C, Tier0, host_unix_path_socket),
        attack(
            "host_unix_abstract_socket",
            C,
            Tier0,
            host_unix_abstract_socket,
        ),
        attack("netlink_host_interfaces", C, Tier0, netlink_host_interfaces),
        attack(
            "double_fork_setsid_survivor",
            D,
            Bare,
            double_fork_setsid_survivor,
        ),
        attack(
            "supervisor_killed_mid_run",
            D,
            Bare,
            supervisor_killed_mid_run,
        ),
        attack(
            "supervisor_and_init_killed",
            D,
            Tier0,
            supervisor_and_init_killed,
        ),
        attack("fork_bomb", D, ContainedToo, fork_bomb).exclusive(),
        attack("memory_bomb", D, ContainedToo, memory_bomb).exclusive(),
        attack("cpu_loop", D, ContainedToo, cpu_loop).exclusive(),
        attack("disk_fill", D, Tier0, disk_fill).exclusive(),
        attack("inode_bomb", D, Tier0, inode_bomb).exclusive(),
    ]
}

// ---------------------------------------------------------------------------------------------
// The attacks: host setup, the program and its flags, and the evidence.

fn read_root_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/root/airlock-canary-{}", s.marker));
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_host_tmp_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_home_canary(s: &mut Scene) -> Result<Plan, String> {
    let dir = PathBuf::from(format!("/home/airlock-attack-{}", s.marker));
    s.make_dir(&dir, 0o755)?;
    let path = dir.join(".ssh-id_ed25519");
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_etc_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/etc/airlock-canary-{}", s.marker));
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_caller_cwd_canary(s: &mut Scene) -> Result<Plan, String> {
    let cwd = s.dir.join("caller-cwd");
    s.make_dir(&cwd, 0o755)?;
    let path = cwd.join(".env");
    let secret = s.plant(&path, 0o644)?;
    let mut plan = Plan::new(
        s.python("read_path.py", [path.display().to_string(), ".env".into()]),
        output_has(secret),
    );
    plan.cwd = Some(cwd);
    Ok(plan)
}

fn read_dev_shm_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/dev/shm/airlock-canary-{}", s.marker));
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_via_proc_1_root(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o644)?;
    let via_pid_1 = format!("/proc/1/root{}", path.display());
    if s.suite.mode == Mode::Escape && std::fs::read(&via_pid_1).is_err() {
        return Err(format!("this host refuses even root the path {via_pid_1}, so the attack cannot be shown to work here"));
    }
    Ok(Plan::new(
        s.python("read_path.py", [via_pid_1]),
        output_has(secret),
    ))
}

fn read_host_pid_environ(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let victim = s.victim("", &secret)?;
    Ok(Plan::new(
        s.python("read_path.py", [format!("/proc/{}/environ", victim.pid)]),
        output_has(secret),
    ))
}

fn read_host_pid_cmdline(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let victim = s.victim(&secret, "")?;
    Ok(Plan::new(
        s.python("read_path.py", [format!("/proc/{}/cmdline", victim.pid)]),
        output_has(secret),
    ))
}

fn read_via_host_pid_root(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o644)?;
    let victim = s.victim("", "")?;
    Ok(Plan::new(
        s.python(
            "read_path.py",
            [format!("/proc/{}/root{}", victim.pid, path.display())],
        ),
        output_has(secret),
    ))
}

fn read_through_planted_symlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    let exposed = s.dir.join("exposed");
    s.make_dir(&exposed, 0o755)?;
    let link = exposed.join("config.json");
    symlink(&target, &link)
        .map_err(|e| format!("cannot plant the symlink {}: {e}", link.display()))?;
    let plan = Plan::new(
        s.python("read_path.py", [link.display().to_string()]),
        output_has(secret),
    );
    Ok(plan.flags(["--ro".to_string(), exposed.display().to_string()]))
}

fn read_through_own_symlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [target.display().to_string()]),
        output_has(secret),
    )
    .argv(s.python("symlink_own.py", [target.display().to_string()])))
}

fn read_through_hardlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    // Linking needs ownership (fs.protected_hardlinks): the file belongs to the sandbox's user,
    // as another job's file of that user would.
    s.chown_to_sandbox_user(&target)?;
    let link = PathBuf::from(format!("/tmp/airlock-link-{}", s.marker));
    s.remove_later(&link);
    Ok(Plan::new(
        s.python(
            "hardlink.py",
            [target.display().to_string(), link.display().to_string()],
        ),
        output_has(secret),
    ))
}

fn read_sysv_shm_segment(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let key = 0x4149_0000 + (s.index as i64);
    let created = run_host(&[
        PYTHON,
        "-B",
        &s.script("host/shm_segment.py"),
        "create",
        &key.to_string(),
        &secret,
    ])?;
    let id = created.trim().to_string();
    let script = s.script("host/shm_segment.py");
    s.on_cleanup(move || {
        let _ = run_host(&[PYTHON, "-B", &script, "remove", &id]);
    });
    Ok(Plan::new(
        s.python("sysv_shm.py", [key.to_string()]),
        output_has(secret),
    ))
}

fn read_parent_env(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let mut plan = Plan::new(
        s.python("parent_env.py", ["AIRLOCK_ATTACK_SECRET".to_string()]),
        output_has(secret.clone()),
    );
    plan.env.push(("AIRLOCK_ATTACK_SECRET".into(), secret));
    Ok(plan)
}

fn read_inherited_fd(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("opened-by-the-caller");
    let secret = s.plant(&path, 0o600)?;
    let mut plan = Plan::new(
        s.python("inherited_fds.py", Vec::<String>::new()),
        output_has(secret),
    );
    plan.inherit_fd7 = Some(path);
    Ok(plan)
}

fn open_by_handle_shocker(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o600)?;
    let handle = run_host(&[
        PYTHON,
        "-B",
        &s.script("open_by_handle.py"),
        "--make-handle",
        &path.display().to_string(),
    ])?;
    // Any directory of the same filesystem the sandbox can open serves as the mount reference:
    // the exposed attack scripts live on it.
    let mount_dir = s.suite.scripts.display().to_string();
    Ok(Plan::new(
        s.python("open_by_handle.py", [handle.trim().to_string(), mount_dir]),
        output_has(secret),
    ))
}

fn write_host_tmp(s: &mut Scene) -> Result<Plan, String> {
    let target = PathBuf::from(format!("/tmp/airlock-pwned-{}", s.marker));
    s.remove_later(&target);
    Ok(Plan::new(
        s.python(
            "write_file.py",
            [target.display().to_string(), s.marker.clone()],
        ),
        file_exists(target),
    ))
}

fn write_caller_dir(s: &mut Scene) -> Result<Plan, String> {
    let cwd = s.dir.join("caller-cwd");
    s.make_dir(&cwd, 0o777)?;
    let target = cwd.join("pwned");
    let mut plan = Plan::new(
        s.python(
            "write_file.py",
            [target.display().to_string(), s.marker.clone()],
        ),
        file_exists(target),
    );
    plan.cwd = Some(cwd);
    Ok(plan)
}

fn write_read_only_bind(s: &mut Scene) -> Result<Plan, String> {
    let exposed = s.dir.join("read-only");
    s.make_dir(&exposed, 0o777)?;
    let target = exposed.join("pwned");
    let plan = Plan::new(
        s.python(
            "write_file.py",
            [target.display().to_string(), s.marker.clone()],
        ),
        file_exists(target),
    );
    Ok(plan.flags(["--ro".to_string(), exposed.display().to_string()]))
}

fn write_proc_sys(s: &mut Scene) -> Result<Plan, String> {
    let knob = "/proc/sys/kernel/domainname";
    let original = std::fs::read_to_string(knob).map_err(|e| format!("cannot read {knob}: {e}"))?;
    let value = format!("pwned-{}", &s.marker[s.marker.len() - 8..]);
    s.on_cleanup(move || {
        if std::fs::read_to_string(knob).is_ok_and(|now| now != original) {
            let _ = std::fs::write(knob, original.trim_end());
        }
    });
    let expected = value.clone();
    let evidence = move |_: &Outcome| {
        let now = std::fs::read_to_string(knob).unwrap_or_default();
        (now.trim() == expected).then(|| format!("host {knob} is now {expected:?}"))
    };
    Ok(Plan::new(
        s.python("write_file.py", [knob.to_string(), value]),
        evidence,
    ))
}

fn write_sys(s: &mut Scene) -> Result<Plan, String> {
    let knob = "/sys/module/printk/parameters/time";
    let original = std::fs::read_to_string(knob)
        .map_err(|e| format!("cannot read {knob}: {e}"))?
        .trim()
        .to_string();
    let flipped = if original == "Y" { "N" } else { "Y" };
    let restore = original.clone();
    s.on_cleanup(move || {
        let _ = std::fs::write(knob, &restore);
    });
    let evidence = move |_: &Outcome| {
        let now = std::fs::read_to_string(knob).unwrap_or_default();
        (now.trim() != original)
            .then(|| format!("host {knob} flipped from {original} to {}", now.trim()))
    };
    Ok(Plan::new(
        s.python("write_file.py", [knob.to_string(), flipped.to_string()]),
        evidence,
    ))
}

fn raise_own_cgroup_limits(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("cgroup_raise.py", ["192".to_string()]),
        escaped_line,
    );
    Ok(plan
        .flags(["--mem", "96MiB"])
        .expect(|o| status_in(o, &["exited", "memory_limit"])))
}

fn signal_host_process(s: &mut Scene) -> Result<Plan, String> {
    let victim = s.victim("", "")?;
    let pid = victim.pid;
    let evidence = move |_: &Outcome| (!victim.alive()).then(|| format!("victim {pid} is dead"));
    Ok(Plan::new(
        s.python("signal_pid.py", [pid.to_string()]),
        evidence,
    ))
}

fn ptrace_host_process(s: &mut Scene) -> Result<Plan, String> {
    let victim = s.victim("", "")?;
    let pid = victim.pid;
    let mut plan = Plan::new(
        s.python("ptrace_pid.py", [pid.to_string()]),
        |o: &Outcome| o.watched.clone(),
    );
    plan.watch = Some(Box::new(move || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))?
            .trim()
            .to_string();
        (tracer != "0").then(|| format!("victim {pid} was traced by host pid {tracer}"))
    }));
    Ok(plan)
}

fn ptrace_own_parent(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("ptrace_pid.py", ["parent".to_string()]),
        escaped_line,
    ))
}

fn tiocsti_injection(s: &mut Scene) -> Result<Plan, String> {
    let command = format!("echo {}", s.marker);
    let marker = s.marker.clone();
    let evidence = move |o: &Outcome| {
        let input = o.pty_input.as_deref()?;
        input
            .contains(&marker)
            .then(|| format!("the terminal's input queue now holds {input:?}"))
    };
    let mut plan = Plan::new(s.python("tiocsti.py", [command]), evidence);
    plan.lifecycle = Lifecycle::Terminal;
    Ok(plan)
}

fn setuid_binary(s: &mut Scene) -> Result<Plan, String> {
    let dir = s.dir.join("setuid");
    s.make_dir(&dir, 0o755)?;
    let binary = dir.join("id");
    std::fs::copy("/usr/bin/id", &binary).map_err(|e| format!("cannot copy /usr/bin/id: {e}"))?;
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o4755))
        .map_err(|e| format!("chmod u+s: {e}"))?;
    let evidence = |o: &Outcome| {
        o.text
            .lines()
            .next()
            .filter(|l| l.trim() == "0")
            .map(|_| "the setuid binary ran with euid 0".to_string())
    };
    let plan = Plan::new(vec![binary.display().to_string(), "-u".into()], evidence);
    let ran = |o: &Outcome| match o.text.lines().next().map(str::trim) {
        Some(uid) if uid.parse::<u32>().is_ok() => Ok(()),
        other => Err(format!("the setuid binary did not run: {other:?}")),
    };
    Ok(plan
        .flags(["--ro".to_string(), dir.display().to_string()])
        .expect(ran))
}

fn mount_tmpfs(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("mountpoint");
    s.make_dir(&target, 0o777)?;
    let unmount = target.clone();
    s.on_cleanup(move || {
        let _ = run_host(&["umount", "-l", &unmount.display().to_string()]);
    });
    let host_target = target.display().to_string();
    let evidence = move |o: &Outcome| {
        let host_sees = host_mountinfo()
            .iter()
            .any(|l| l.split(' ').nth(4) == Some(host_target.as_str()));
        if host_sees {
            return Some(format!("host mount table has {host_target}"));
        }
        escaped_line(o)
    };
    Ok(Plan::new(
        s.python(
            "mount_tmpfs.py",
            [target.display().to_string(), s.marker.clone()],
        ),
        evidence,
    ))
}

fn nested_userns_then_mount(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("userns_mount.py", [s.marker.clone()]),
        escaped_line,
    ))
}

fn nested_userns_clone3(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("clone3_userns.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn keyctl_add_key(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("keyctl.py", [s.marker.clone()]),
        escaped_line,
    ))
}

fn bpf_map_create(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("bpf.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn perf_event_open(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("perf_event.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn io_uring_setup(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("io_uring.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn block_device_read(s: &mut Scene) -> Result<Plan, String> {
    let (device, digest) = readable_block_device()
        .ok_or("no block device on this host can be opened, even by root")?;
    let needle = format!("sha256 {digest}");
    let evidence = move |o: &Outcome| {
        o.text
            .contains(&needle)
            .then(|| format!("the program read the same first sector the host reads ({needle})"))
    };
    Ok(Plan::new(s.python("block_device.py", [device]), evidence))
}

fn dev_kvm_open(s: &mut Scene) -> Result<Plan, String> {
    if !Path::new("/dev/kvm").exists() {
        return Err("this host has no /dev/kvm".into());
    }
    Ok(Plan::new(
        s.python("dev_kvm.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn mknod_dev_mem(s: &mut Scene) -> Result<Plan, String> {
    let dir = s.dir.join("devices");
    s.make_dir(&dir, 0o777)?;
    let node = dir.join("mem");
    let evidence = move |o: &Outcome| {
        use std::os::unix::fs::FileTypeExt;
        let on_host =
            std::fs::symlink_metadata(&node).is_ok_and(|m| m.file_type().is_char_device());
        if on_host {
            return Some(format!("device node {} exists on the host", node.display()));
        }
        escaped_line(o)
    };
    Ok(Plan::new(
        s.python("mknod_device.py", [dir.display().to_string()]),
        evidence,
    ))
}

fn dev_kmsg_write(s: &mut Scene) -> Result<Plan, String> {
    let needle = format!("airlock attack {}", s.marker);
    let evidence = move |_: &Outcome| {
        kernel_log()
            .contains(&needle)
            .then(|| format!("host kernel log has {needle:?}"))
    };
    Ok(Plan::new(
        s.python("kmsg_write.py", [s.marker.clone()]),
        evidence,
    ))
}

fn tcp_to_host_listener(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = tcp_listener(0)?;
    Ok(Plan::new(
        s.python(
            "tcp_connect.py",
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    ))
}

fn udp_to_host_listener(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = udp_listener(0)?;
    Ok(Plan::new(
        s.python(
            "udp_send.py",
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    ))
}

fn dns_exfiltration(s: &mut Scene) -> Result<Plan, String> {
    let (port, tcp_inbox) = tcp_listener(0)?;
    let (_, udp_inbox) = udp_listener(port)?;
    let marker = s.marker.clone();
    let evidence = move |o: &Outcome| {
        tcp_inbox.evidence(&marker)(o).or_else(|| udp_inbox.evidence(&marker)(o))
    };
    Ok(Plan::new(
        s.python(
            "dns_exfil.py",
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        evidence,
    ))
}

fn raw_socket_forgery(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = udp_listener(0)?;
    Ok(Plan::new(
        s.python(
            "raw_socket.py",
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    ))
}

fn host_unix_path_socket(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("host-service.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| e.to_string())?;
    let inbox = Inbox::serve_unix(listener);
    Ok(Plan::new(
        s.python(
            "unix_connect.py",
            [path.display().to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    ))
}

fn host_unix_abstract_socket(s: &mut Scene) -> Result<Plan, String> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("airlock-attack-{}", s.marker);
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| e.to_string())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&address)
        .map_err(|e| format!("cannot bind @{name}: {e}"))?;
    let inbox = Inbox::serve_unix(listener);
    Ok(Plan::new(
        s.python("unix_connect.py", [format!("@{name}"), s.marker.clone()]),
        inbox.evidence(&s.marker),
    ))
}

fn netlink_host_interfaces(s: &mut Scene) -> Result<Plan, String> {
    let host_only: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "lo")
        .collect();
    if host_only.is_empty() {
        return Err("the host has no network interface besides lo".into());
    }
    let evidence = move |o: &Outcome| {
        let line = o
            .text
            .lines()
            .find(|l| l.starts_with("ESCAPED interfaces:"))?;
        let seen: Vec<&String> = host_only
            .iter()
            .filter(|name| line.split_whitespace().any(|w| w == name.as_str()))
            .collect();
        (!seen.is_empty()).then(|| format!("host interfaces listed: {seen:?}"))
    };
    Ok(Plan::new(
        s.python("netlink_route.py", Vec::<String>::new()),
        evidence,
    ))
}

fn double_fork_setsid_survivor(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("survivor.py", [s.marker.clone()]),
        survivors(&s.marker),
    )
    .expect(|o| status_in(o, &["exited"])))
}

fn supervisor_killed_mid_run(s: &mut Scene) -> Result<Plan, String> {
    let mut plan = Plan::new(
        s.python("survivor.py", [s.marker.clone(), "--wait".into()]),
        survivors(&s.marker),
    );
    plan.lifecycle = Lifecycle::KillWhenReady { whole_group: false };
    Ok(plan)
}

fn supervisor_and_init_killed(s: &mut Scene) -> Result<Plan, String> {
    let mut plan = Plan::new(
        s.python("survivor.py", [s.marker.clone(), "--wait".into()]),
        survivors(&s.marker),
    );
    plan.lifecycle = Lifecycle::KillWhenReady { whole_group: true };
    Ok(plan)
}

fn fork_bomb(s: &mut Scene) -> Result<Plan, String> {
    const LIMIT: usize = 32;
    let started = Instant::now();
    let evidence = move |o: &Outcome| {
        if let Some(seen) = &o.watched {
            return Some(seen.clone());
        }
        let host_can_fork = Command::new("/bin/true")
            .status()
            .is_ok_and(|st| st.success());
        let took = started.elapsed();
        if !host_can_fork {
            return Some("the host could not fork after the bomb".into());
        }
        (o.status.is_none() || took > Duration::from_secs(30))
            .then(|| format!("no result from airlock within {took:?}"))
    };
    let mut plan = Plan::new(s.python("fork_bomb.py", [s.marker.clone()]), evidence);
    // The bomb's processes on the host, counted while it runs: a process limit (cgroup, or
    // RLIMIT_NPROC without one) keeps them at the limit; a few more for the runs' own.
    let marker = s.marker.clone();
    plan.watch = Some(Box::new(move || {
        let alive = processes_with(&marker)
            .iter()
            .filter(|(_, cmdline)| cmdline.starts_with(PYTHON))
            .count();
        (alive > LIMIT + 4)
            .then(|| format!("{alive} bomb processes on the host at once (--pids {LIMIT})"))
    }));
    Ok(plan
        .flags(["--pids", &LIMIT.to_string(), "--wall", "3s"])
        .expect(|o| status_in(o, &["timeout", "signaled", "exited"])))
}

fn memory_bomb(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("memory_bomb.py", ["1024".to_string()]),
        escaped_line,
    );
    Ok(plan.flags(["--mem", "128MiB"]).expect(|o| {
        if o.cgroup {
            status_in(o, &["memory_limit"])
        } else {
            status_in(o, &["memory_limit", "exited", "signaled"])
        }
    }))
}

fn cpu_loop(s: &mut Scene) -> Result<Plan, String> {
    let evidence = |o: &Outcome| {
        (o.status.as_deref() != Some("cpu_limit")).then(|| {
            format!(
                "the loop was not stopped by the CPU limit (status {:?})",
                o.status
            )
        })
    };
    let plan = Plan::new(s.python("cpu_loop.py", Vec::<String>::new()), evidence);
    // Status cpu_limit (not timeout) proves the CPU budget, not the wall clock, ended it; the
    // wall time it takes depends on how busy the host is.
    Ok(plan
        .flags(["--cpu", "2s", "--wall", "30s"])
        .expect(|o| status_in(o, &["cpu_limit"])))
}

fn disk_fill(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(s.python("disk_fill.py", ["48".to_string()]), escaped_line);
    Ok(plan
        .flags(["--disk", "16MiB", "--fsize", "8MiB"])
        .stopped_by("disk_quota")
        .expect(|o| status_in(o, &["exited"])))
}

fn inode_bomb(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("inode_bomb.py", ["3000".to_string()]),
        escaped_line,
    );
    Ok(plan
        .flags(["--files", "300"])
        .stopped_by("inode_quota")
        .expect(|o| status_in(o, &["exited"])))
}

// ---------------------------------------------------------------------------------------------
// Evidence helpers.

type Evidence = Box<dyn Fn(&Outcome) -> Option<String> + Send>;
type Check = Box<dyn Fn(&Outcome) -> Result<(), String> + Send>;
type Numbered<'a> = Vec<(usize, &'a Attack)>;

fn output_has(secret: String) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    move |o: &Outcome| {
        o.text
            .contains(&secret)
            .then(|| format!("the secret {secret} is in the program's output"))
    }
}

fn file_exists(path: PathBuf) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    move |_: &Outcome| {
        path.exists()
            .then(|| format!("{} exists on the host", path.display()))
    }
}

/// For kernel interfaces whose only effect is inside the caller, the program's own report.
fn escaped_line(o: &Outcome) -> Option<String> {
    o.text
        .lines()
        .find(|l| l.starts_with("ESCAPED"))
        .map(str::to_string)
}

fn survivors(marker: &str) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    let marker = marker.to_string();
    move |_: &Outcome| {
        std::thread::sleep(Duration::from_millis(300));
        let alive = processes_with(&marker);
        (!alive.is_empty()).then(|| format!("still running on the host after the run: {alive:?}"))
    }
}

fn status_in(o: &Outcome, allowed: &[&str]) -> Result<(), String> {
    match o.status.as_deref() {
        Some(status) if allowed.contains(&status) => Ok(()),
        other => Err(format!("status {other:?}, expected one of {allowed:?}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The plan of one run and its outcome.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    /// Run to the end and collect the JSON result.
    Normal,
    /// Run with a fresh terminal on stdin and read its input queue afterwards.
    Terminal,
    /// Wait for READY on stdout, then SIGKILL the supervisor (or its whole process group,
    /// which holds the init too).
    KillWhenReady { whole_group: bool },
}

struct Plan {
    argv: Vec<String>,
    flags: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    /// A file the caller opens on descriptor 7 without close-on-exec before starting the run.
    inherit_fd7: Option<PathBuf>,
    lifecycle: Lifecycle,
    /// Polled on the host while the run lasts; the first report is kept in `Outcome::watched`.
    watch: Option<Box<dyn FnMut() -> Option<String> + Send>>,
    evidence: Evidence,
    /// Extra sanity checks of a contained run's result.
    expect: Option<Check>,
    /// The layer that stops this attack. A backend whose result does not claim it is allowed
    /// to let the attack through: the report matches reality. One that claims it must stop it.
    stopped_by: Option<&'static str>,
}

impl Plan {
    fn new(
        argv: Vec<String>,
        evidence: impl Fn(&Outcome) -> Option<String> + Send + 'static,
    ) -> Plan {
        Plan {
            argv,
            flags: Vec::new(),
            env: Vec::new(),
            cwd: None,
            inherit_fd7: None,
            lifecycle: Lifecycle::Normal,
            watch: None,
            evidence: Box::new(evidence),
            expect: None,
            stopped_by: None,
        }
    }

    fn argv(mut self, argv: Vec<String>) -> Plan {
        self.argv = argv;
        self
    }

    fn flags<I: IntoIterator<Item = S>, S: Into<String>>(mut self, flags: I) -> Plan {
        self.flags.extend(flags.into_iter().map(Into::into));
        self
    }

    fn expect(mut self, check: impl Fn(&Outcome) -> Result<(), String> + Send + 'static) -> Plan {
        self.expect = Some(Box::new(check));
        self
    }

    fn stopped_by(mut self, layer: &'static str) -> Plan {
        self.stopped_by = Some(layer);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runner {
    Untrusted,
    Tier0,
    Tier0AsRoot,
    Bare,
    BareAsNobody,
}

impl Runner {
    fn is_airlock(self) -> bool {
        matches!(
            self,
            Runner::Untrusted | Runner::Tier0 | Runner::Tier0AsRoot
        )
    }
}

#[derive(Debug, Default)]
struct Outcome {
    /// The RunResult status, for airlock runs that printed one.
    status: Option<String>,
    /// Whether the run had a cgroup (a "cgroup" layer in the result).
    cgroup: bool,
    /// The layers the result says were in force.
    layers: Vec<String>,
    warnings: Vec<String>,
    /// The program's stdout and stderr.
    text: String,
    /// The CLI's own stderr (warnings).
    cli_stderr: String,
    elapsed: Duration,
    watched: Option<String>,
    pty_input: Option<String>,
    /// The pid of the airlock CLI (it names the run's directory and cgroups).
    cli_pid: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// The suite.

struct Suite {
    id: String,
    dir: PathBuf,
    scripts: PathBuf,
    airlock: PathBuf,
    mode: Mode,
    user: User,
    /// The CLI runs through setpriv as [`UNPRIVILEGED_UID`].
    cli_as_nobody: bool,
    /// The uid the program runs as: victims and owned files use it.
    sandbox_uid: u32,
    /// The backend of the contained runs (`None`: the profile's `auto`, i.e. native).
    backend: Option<&'static str>,
    /// The contained runs pass `--allow-degraded` (the backend has [`KNOWN_GAPS`]).
    accept_degradation: bool,
    /// Extra flags of the contained runs.
    backend_flags: &'static [&'static str],
    cli_pids: Mutex<Vec<u32>>,
}

struct Report {
    name: &'static str,
    class: Class,
    runner: Option<Runner>,
    verdict: Verdict,
    detail: String,
    elapsed: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    Skip,
}

fn run_suite(mode: Mode, user: User) {
    run_suite_on(mode, user, None);
}

/// The whole table with the untrusted profile on one backend (`None`: the profile's choice).
fn run_suite_on(mode: Mode, user: User, backend: Option<&'static str>) {
    run_suite_on_with(mode, user, backend, &[]);
}

/// [`run_suite_on`] with extra flags for the contained runs (e.g. `--container-runtime`).
fn run_suite_on_with(
    mode: Mode,
    user: User,
    backend: Option<&'static str>,
    backend_flags: &'static [&'static str],
) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = nix::unistd::geteuid().is_root();
    if user == User::Root && !root {
        eprintln!("skipped: the {mode:?} suite as root needs root");
        return;
    }
    if !Path::new(PYTHON).exists() {
        eprintln!("skipped: {PYTHON} is missing, the attack programs need it");
        return;
    }
    let cli_as_nobody = user == User::Unprivileged && root;
    if cli_as_nobody && !Path::new("/usr/bin/setpriv").exists() {
        eprintln!(
            "skipped: setpriv (util-linux) is needed to run airlock as uid {UNPRIVILEGED_UID}"
        );
        return;
    }
    let sandbox_uid = match (root, user) {
        (true, User::Root) => NOBODY,
        (true, User::Unprivileged) => UNPRIVILEGED_UID,
        (false, _) => nix::unistd::getuid().as_raw(),
    };
    let mut suite = Suite::new(mode, user, cli_as_nobody, sandbox_uid);
    suite.backend = backend;
    suite.backend_flags = backend_flags;
    if mode != Mode::Escape {
        let gaps = known_gaps(backend, backend_flags, user);
        suite.accept_degradation = !gaps.is_empty();
        if let Err(why) = suite.native_backend_works() {
            let on = backend.unwrap_or("its default backend");
            eprintln!("skipped: the untrusted profile cannot run on {on} on this host: {why}");
            suite.remove();
            return;
        }
        suite.check_refused_by_default(gaps);
    }
    let mounts_before = host_mountinfo();
    let started = Instant::now();
    let mut table = attacks();
    assert!(table.len() >= 35, "the suite must keep at least 35 attacks");
    if mode == Mode::Weakened {
        table.retain(|a| WEAKENINGS.iter().any(|w| w.attack == a.name));
        assert_eq!(
            table.len(),
            WEAKENINGS.len(),
            "every weakening names an attack"
        );
    }
    let (shared, exclusive): (Numbered, Numbered) =
        table.iter().enumerate().partition(|(_, a)| !a.exclusive);
    let mut reports = run_parallel(&suite, &shared, PARALLEL);
    reports.extend(run_parallel(&suite, &exclusive, 1));
    let problems = suite.leftovers(&mounts_before);
    let took = started.elapsed();
    print_reports(&suite, &reports, took);
    suite.remove();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(
        failed.is_empty() && problems.is_empty(),
        "attack suite {mode:?} as {user:?} failed:\n{}\n{}",
        failed.join("\n"),
        problems.join("\n")
    );
}

fn run_parallel(suite: &Suite, attacks: &[(usize, &Attack)], workers: usize) -> Vec<Report> {
    let next = AtomicUsize::new(0);
    let reports = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(index, attack)) = attacks.get(i) else {
                    break;
                };
                let report = run_attack(suite, index, attack);
                reports.lock().unwrap().push((index, report));
            });
        }
    });
    let mut reports = reports.into_inner().unwrap();
    reports.sort_by_key(|(i, _)| *i);
    reports.into_iter().map(|(_, r)| r).collect()
}

fn run_attack(suite: &Suite, index: usize, attack: &Attack) -> Report {
    let started = Instant::now();
    let report = |runner, verdict, detail: String| Report {
        name: attack.name,
        class: attack.class,
        runner,
        verdict,
        detail,
        elapsed: started.elapsed(),
    };
    if suite.user == User::Unprivileged {
        if let Some(reason) = attack.root_only {
            return report(None, Verdict::Skip, reason.to_string());
        }
    }
    let mut scene = match Scene::new(suite, attack.name, index) {
        Ok(scene) => scene,
        Err(e) => return report(None, Verdict::Fail, format!("setup failed: {e}")),
    };
    let weakening = WEAKENINGS
        .iter()
        .find(|w| suite.mode == Mode::Weakened && w.attack == attack.name);
    let runner = match (suite.mode, attack.baseline) {
        (Mode::Contained | Mode::Weakened, _) => Runner::Untrusted,
        (Mode::Escape, Baseline::Tier0 | Baseline::ContainedToo) => Runner::Tier0,
        (Mode::Escape, Baseline::Tier0AsRoot) => Runner::Tier0AsRoot,
        (Mode::Escape, Baseline::Bare) => Runner::Bare,
        (Mode::Escape, Baseline::BareAsNobody) => Runner::BareAsNobody,
    };
    let result = (attack.prepare)(&mut scene).and_then(|mut plan| {
        if let Some(weakening) = weakening {
            let dir = scene.dir.display().to_string();
            plan.flags
                .extend(weakening.flags.iter().map(|f| f.replace("{dir}", &dir)));
        }
        let outcome = suite.execute(&scene, runner, &mut plan)?;
        Ok((plan, outcome))
    });
    let (verdict, mut detail, killed_init) = match result {
        Err(reason) => (Verdict::Skip, format!("cannot set up: {reason}"), None),
        Ok((plan, outcome)) => {
            let must_escape = match weakening {
                Some(weakening) => weakening.escapes,
                None => suite.mode == Mode::Escape && attack.baseline != Baseline::ContainedToo,
            };
            let (verdict, mut detail) = judge(must_escape, &plan, &outcome);
            if let Some(weakening) = weakening {
                detail = format!(
                    "{} -> {detail} ({})",
                    weakening.flags.join(" "),
                    weakening.why
                );
            }
            let killed_init = (plan.lifecycle == Lifecycle::KillWhenReady { whole_group: true })
                .then_some(outcome.cli_pid)
                .flatten();
            (verdict, detail, killed_init)
        }
    };
    scene.cleanup();
    if let Some(pid) = killed_init {
        // With the init dead nobody removes the run's directory and cgroups: that is expected
        // here, so remove them before the suite-wide leftover check.
        let removed = remove_run_leftovers(pid);
        if !removed.is_empty() {
            detail.push_str(&format!(
                " (the killed init left {} behind; the harness removed them)",
                removed.join(", ")
            ));
        }
    }
    if suite.mode == Mode::Escape
        && matches!(
            attack.baseline,
            Baseline::Bare | Baseline::BareAsNobody | Baseline::Tier0AsRoot
        )
    {
        detail.push_str(&format!(
            " | under Tier 0: {}",
            tier0_verdict(suite, index, attack)
        ));
    }
    report(Some(runner), verdict, detail)
}

/// For attacks shown with a weaker baseline: what plain Tier 0 does with them (informational,
/// for the table in docs/attacks.md; Tier 0 is not a security boundary).
fn tier0_verdict(suite: &Suite, index: usize, attack: &Attack) -> String {
    let Ok(mut scene) = Scene::new(suite, &format!("{}-tier0", attack.name), index) else {
        return "not run".into();
    };
    let verdict = match (attack.prepare)(&mut scene) {
        Err(reason) => format!("not run ({reason})"),
        Ok(mut plan) => match suite.execute(&scene, Runner::Tier0, &mut plan) {
            Err(e) => format!("not run ({e})"),
            Ok(outcome) => match (plan.evidence)(&outcome) {
                Some(evidence) => format!("ESCAPED ({evidence})"),
                None => format!("contained ({})", blocked_reason(&outcome.text)),
            },
        },
    };
    scene.cleanup();
    verdict
}

fn judge(must_escape: bool, plan: &Plan, outcome: &Outcome) -> (Verdict, String) {
    let evidence = (plan.evidence)(outcome);
    let summary = format!(
        "[{:?} in {} ms]",
        outcome.status.as_deref().unwrap_or("no result"),
        outcome.elapsed.as_millis()
    );
    if must_escape {
        return match evidence {
            Some(evidence) => (Verdict::Pass, format!("escaped as expected: {evidence} {summary}")),
            None => (Verdict::Fail, format!("the attack did not get through, so its check proves nothing {summary}; output: {}", excerpt(&outcome.text, &outcome.cli_stderr))),
        };
    }
    if let Some(evidence) = evidence {
        if let Some(layer) = plan
            .stopped_by
            .filter(|l| !outcome.layers.iter().any(|have| have == l))
        {
            return (Verdict::Pass, format!("not enforced, and reported so (no {layer} in the result): {evidence} {summary}"));
        }
        return (Verdict::Fail, format!("ESCAPED: {evidence} {summary}"));
    }
    let sane = match (&outcome.status, &plan.expect, plan.lifecycle) {
        (_, _, Lifecycle::KillWhenReady { .. }) => Ok(()),
        (None, _, _) => Err(format!(
            "airlock returned no result; {}",
            excerpt(&outcome.text, &outcome.cli_stderr)
        )),
        (Some(status), _, _) if status == "sandbox_error" => Err(format!(
            "sandbox_error; {}",
            excerpt(&outcome.text, &outcome.cli_stderr)
        )),
        (Some(_), Some(expect), _) => expect(outcome),
        // A contained verdict means something only if the attack ran far enough to try.
        (Some(_), None, _)
            if !outcome
                .text
                .lines()
                .any(|l| l.starts_with("BLOCKED") || l.starts_with("ESCAPED") || l == "READY") =>
        {
            Err(format!(
                "the attack program never reported; {}",
                excerpt(&outcome.text, &outcome.cli_stderr)
            ))
        }
        (Some(_), None, _) => Ok(()),
    };
    match sane {
        Ok(()) => (
            Verdict::Pass,
            format!("contained: {} {summary}", blocked_reason(&outcome.text)),
        ),
        Err(why) => (
            Verdict::Fail,
            format!("no evidence, but the result is not sane: {why} {summary}"),
        ),
    }
}

/// What the program saw: its first refusal, else its first line (an attack may "succeed"
/// inside the sandbox's own view, e.g. write to the sandbox's private /tmp).
fn blocked_reason(text: &str) -> String {
    match text.lines().find(|l| l.starts_with("BLOCKED")) {
        Some(line) => line.trim_start_matches("BLOCKED ").to_string(),
        None => format!(
            "program said {:?}",
            text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
        ),
    }
}

fn excerpt(text: &str, cli_stderr: &str) -> String {
    let mut all = format!("{} | cli: {}", text.trim(), cli_stderr.trim());
    if all.len() > 400 {
        let mut cut = 400;
        while !all.is_char_boundary(cut) {
            cut -= 1;
        }
        all.truncate(cut);
        all.push('…');
    }
    all
}

fn print_reports(suite: &Suite, reports: &[Report], took: Duration) {
    println!(
        "\nattack suite: mode {:?}, CLI as {:?}, {} attacks in {:.1}s",
        suite.mode,
        suite.user,
        reports.len(),
        took.as_secs_f64()
    );
    for r in reports {
        let runner = r
            .runner
            .map(|r| format!("{r:?}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<30} {:?} {:<9} {:<12} {:<4} {:>5}ms  {}",
            r.name,
            r.class,
            format!("{:?}", suite.mode),
            runner,
            format!("{:?}", r.verdict).to_uppercase(),
            r.elapsed.as_millis(),
            r.detail
        );
    }
    let count = |v| reports.iter().filter(|r| r.verdict == v).count();
    println!(
        "passed {}, failed {}, skipped {}",
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Skip)
    );
}

impl Suite {
    fn new(mode: Mode, user: User, cli_as_nobody: bool, sandbox_uid: u32) -> Suite {
        let id = format!("atk{}", &random_hex()[..10]);
        let dir = std::env::temp_dir().join(format!("airlock-attacks-{id}"));
        std::fs::create_dir_all(&dir).expect("create the suite directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the suite directory");
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/attacks")
            .canonicalize()
            .expect("tests/attacks exists");
        let suite = Suite {
            id,
            dir,
            scripts,
            airlock: PathBuf::from(env!("CARGO_BIN_EXE_airlock")),
            mode,
            user,
            cli_as_nobody,
            sandbox_uid,
            backend: None,
            accept_degradation: false,
            backend_flags: &[],
            cli_pids: Mutex::new(Vec::new()),
        };
        std::fs::write(
            suite.tier0_as_root_profile(),
            "extends = \"untrusted\"\nbackend = \"none\"\n\n[user]\ndrop_root = false\n",
        )
        .expect("write the Tier 0 as root profile");
        suite
    }

    fn tier0_as_root_profile(&self) -> PathBuf {
        self.dir.join("tier0-as-root.toml")
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// A backend's gaps refuse a run that does not accept them, naming each gap and the opt-in.
    fn check_refused_by_default(&mut self, gaps: &[&str]) {
        if gaps.is_empty() {
            return;
        }
        self.accept_degradation = false;
        let mut scene = Scene::new(self, "gaps", 998).expect("scene for the refusal check");
        let mut plan = Plan::new(vec!["/bin/true".into()], |_: &Outcome| None);
        let outcome = self
            .execute(&scene, Runner::Untrusted, &mut plan)
            .expect("run the refusal check");
        scene.cleanup();
        self.accept_degradation = true;
        assert_eq!(
            outcome.status, None,
            "a run with unenforceable limits must be refused by default: {}",
            outcome.text
        );
        for gap in gaps {
            assert!(
                outcome.cli_stderr.contains(gap) && outcome.cli_stderr.contains("--allow-degraded"),
                "the refusal must name {gap} and the opt-in: {}",
                outcome.cli_stderr
            );
        }
    }

    fn native_backend_works(&self) -> Result<(), String> {
        let scene = Scene::new(self, "probe", 999).map_err(|e| e.to_string())?;
        let mut plan = Plan::new(vec!["/bin/true".into()], |_: &Outcome| None);
        let outcome = self.execute(&scene, Runner::Untrusted, &mut plan)?;
        match outcome.status.as_deref() {
            Some("exited") => Ok(()),
            _ => Err(excerpt(&outcome.text, &outcome.cli_stderr)),
        }
    }

    /// The command line of one run.
    fn command_line(&self, runner: Runner, plan: &Plan) -> Vec<String> {
        let as_uid = |uid: u32| {
            vec![
                "/usr/bin/setpriv".to_string(),
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
            ]
        };
        let mut line = Vec::new();
        match runner {
            Runner::Bare => {}
            Runner::BareAsNobody => line.extend(as_uid(NOBODY)),
            _ => {
                if self.cli_as_nobody {
                    line.extend(as_uid(UNPRIVILEGED_UID));
                }
                line.push(self.airlock.display().to_string());
                line.push("run".into());
                // A run the harness kills must stream its output, so READY arrives in time.
                if !matches!(plan.lifecycle, Lifecycle::KillWhenReady { .. }) {
                    line.push("--json".into());
                }
                match runner {
                    // The baselines are the weakest airlock: Tier 0 with its run directory on
                    // disk, without the capped tmpfs mounts of an in-memory one.
                    Runner::Tier0 => line
                        .extend(["--dev", "--backend", "none", "--disk-run-dir"].map(String::from)),
                    Runner::Tier0AsRoot => line.extend([
                        "--disk-run-dir".to_string(),
                        "--dev".to_string(),
                        "--profile".into(),
                        self.tier0_as_root_profile().display().to_string(),
                    ]),
                    Runner::Untrusted => {
                        if let Some(backend) = self.backend {
                            line.extend(["--backend".to_string(), backend.to_string()]);
                        }
                        if self.accept_degradation {
                            line.push("--allow-degraded".into());
                        }
                        line.extend(self.backend_flags.iter().map(|f| f.to_string()));
                    }
                    _ => {}
                }
                if !plan.flags.iter().any(|f| f == "--wall") {
                    line.extend(["--wall", "20s"].map(String::from));
                }
                line.extend(plan.flags.iter().cloned());
                line.extend([
                    "--ro".to_string(),
                    self.scripts.display().to_string(),
                    "--".into(),
                ]);
            }
        }
        line.extend(plan.argv.iter().cloned());
        if let Some(secret_file) = &plan.inherit_fd7 {
            let mut wrapped = vec![
                "/bin/bash".to_string(),
                "-c".into(),
                "exec 7<\"$0\"; exec \"$@\"".into(),
            ];
            wrapped.push(secret_file.display().to_string());
            wrapped.extend(line);
            line = wrapped;
        }
        line
    }

    fn execute(&self, scene: &Scene, runner: Runner, plan: &mut Plan) -> Result<Outcome, String> {
        let lifecycle = plan.lifecycle;
        let line = self.command_line(runner, plan);
        let mut command = Command::new(&line[0]);
        command
            .args(&line[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C.UTF-8");
        command.envs(plan.env.iter().cloned());
        command.current_dir(plan.cwd.clone().unwrap_or_else(|| scene.dir.clone()));
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        // Its own process group: a group kill reaches the supervisor and its init, never us.
        command.process_group(0);
        let terminal = match lifecycle {
            Lifecycle::Terminal => Some(Terminal::open()?),
            _ => None,
        };
        if let Some(terminal) = &terminal {
            command.stdin(Stdio::from(terminal.slave()?));
        }
        let started = Instant::now();
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", line[0]))?;
        if runner.is_airlock() {
            self.cli_pids.lock().unwrap().push(child.id());
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let stdout = collect(child.stdout.take().expect("piped stdout"), Some(ready_tx));
        let stderr = collect(child.stderr.take().expect("piped stderr"), None);
        let finished = Arc::new(AtomicBool::new(false));
        let watcher = spawn_watch(plan, &finished);
        match lifecycle {
            Lifecycle::KillWhenReady { whole_group } => {
                let ready = ready_rx.recv_timeout(Duration::from_secs(30)).is_ok();
                let target = if whole_group {
                    -(child.id() as i32)
                } else {
                    child.id() as i32
                };
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(target),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                if !ready {
                    return Err("the program never said READY".into());
                }
                // Give whatever should notice the death (the init, PID 1's parent-death signal)
                // time to act before looking for survivors.
                std::thread::sleep(Duration::from_millis(1000));
            }
            _ => wait_with_deadline(&mut child, Duration::from_secs(90)),
        }
        let elapsed = started.elapsed();
        finished.store(true, Ordering::SeqCst);
        let watched = watcher.and_then(|w| w.join().ok()).flatten();
        let stdout = stdout.finish();
        let stderr = stderr.finish();
        let cli_pid = runner.is_airlock().then(|| child.id());
        let mut outcome = Outcome {
            elapsed,
            watched,
            cli_pid,
            cli_stderr: stderr.clone(),
            ..Outcome::default()
        };
        outcome.pty_input = terminal.map(|t| t.pending_input());
        match serde_json::from_str::<Value>(&stdout) {
            Ok(result) if runner.is_airlock() && result.get("status").is_some() => {
                // A run refused before it started (`--json` prints that too) has no status.
                let started = result["backend"] != "";
                outcome.status = result["status"]
                    .as_str()
                    .filter(|_| started)
                    .map(str::to_string);
                outcome.layers = result["isolation"]
                    .as_array()
                    .map(|l| {
                        l.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                outcome.cgroup = outcome.layers.iter().any(|l| l == "cgroup");
                outcome.warnings = result["warnings"]
                    .as_array()
                    .map(|w| {
                        w.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let field = |name: &str| result[name].as_str().unwrap_or_default().to_string();
                outcome.text = format!("{}\n{}", field("stdout"), field("stderr"));
                if let Some(error) = result["error"].as_str() {
                    outcome.cli_stderr = format!("sandbox error: {error}; {}", outcome.cli_stderr);
                }
            }
            _ => outcome.text = format!("{stdout}\n{stderr}"),
        }
        Ok(outcome)
    }

    /// Everything an airlock run may leave on the host, checked after the whole suite.
    fn leftovers(&self, mounts_before: &[String]) -> Vec<String> {
        let mut problems = Vec::new();
        let strays = processes_with(&self.id);
        for (pid, cmdline) in &strays {
            problems.push(format!("stray process {pid} outlived the suite: {cmdline}"));
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let before: HashSet<&String> = mounts_before.iter().collect();
        for line in host_mountinfo() {
            if !before.contains(&line) && (line.contains(&self.id) || line.contains("airlock")) {
                problems.push(format!("mount left behind: {line}"));
            }
        }
        let pids = self.cli_pids.lock().unwrap().clone();
        let prefixes: Vec<String> = pids.iter().map(|pid| format!("run-{pid}-")).collect();
        let mut places: Vec<PathBuf> = Vec::new();
        for controller in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            places.push(controller.path().join("airlock"));
        }
        places.extend(runtime_dirs());
        for place in places {
            for entry in std::fs::read_dir(&place).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if prefixes.iter().any(|p| name.starts_with(p)) {
                    problems.push(format!("left behind by a run: {}", entry.path().display()));
                }
            }
        }
        problems
    }
}

/// The run directories and cgroups of the runs a CLI with this pid started, removed.
fn remove_run_leftovers(cli_pid: u32) -> Vec<String> {
    let prefix = format!("run-{cli_pid}-");
    let mut places: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| c.path().join("airlock"))
        .collect();
    places.extend(runtime_dirs());
    let mut removed = Vec::new();
    for place in places {
        for entry in std::fs::read_dir(&place).into_iter().flatten().flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let path = entry.path();
            let gone = if path.starts_with("/sys/fs/cgroup") {
                // rmdir of a cgroup fails while the killed processes are still being reaped.
                (0..100).any(|_| {
                    std::fs::remove_dir(&path).is_ok() || {
                        std::thread::sleep(Duration::from_millis(20));
                        false
                    }
                })
            } else {
                std::fs::remove_dir_all(&path).is_ok()
            };
            if gone {
                removed.push(path.display().to_string());
            }
        }
    }
    removed
}

fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/run/airlock"),
        PathBuf::from(format!("/tmp/airlock-{UNPRIVILEGED_UID}")),
    ];
    dirs.push(PathBuf::from(format!(
        "/tmp/airlock-{}",
        nix::unistd::geteuid()
    )));
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(Path::new(&runtime).join("airlock"));
    }
    dirs
}

/// Polls the plan's watch on the host until the run is over; keeps the first report.
fn spawn_watch(
    plan: &mut Plan,
    finished: &Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<Option<String>>> {
    let mut watch = plan.watch.take()?;
    let finished = Arc::clone(finished);
    Some(std::thread::spawn(move || {
        while !finished.load(Ordering::SeqCst) {
            if let Some(report) = watch() {
                return Some(report);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }))
}

fn wait_with_deadline(child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        if Instant::now() >= deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-(child.id() as i32)),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads a pipe to the end in a thread; tells `ready` when a line says READY.
struct Collector {
    buffer: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
}

fn collect(pipe: impl Read + Send + 'static, ready: Option<mpsc::Sender<()>>) -> Collector {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done) = mpsc::channel();
    let sink = Arc::clone(&buffer);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if line.trim_ascii() == b"READY" {
                if let Some(ready) = &ready {
                    let _ = ready.send(());
                }
            }
            sink.lock().unwrap().extend_from_slice(&line);
            line.clear();
        }
        let _ = done_tx.send(());
    });
    Collector { buffer, done }
}

impl Collector {
    /// The text so far once the pipe closes, or after a few seconds if something still holds
    /// it open (then that something is itself evidence the survivor checks find).
    fn finish(self) -> String {
        let _ = self.done.recv_timeout(Duration::from_secs(5));
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }
}

// ---------------------------------------------------------------------------------------------
// Per-attack host state.

struct Scene<'s> {
    suite: &'s Suite,
    index: usize,
    dir: PathBuf,
    /// Unique per attack and suite: given to the program, searched for in processes.
    marker: String,
    cleanups: Vec<Box<dyn FnOnce() + Send>>,
}

impl<'s> Scene<'s> {
    fn new(suite: &'s Suite, name: &str, index: usize) -> Result<Scene<'s>, String> {
        let dir = suite.dir.join(name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let marker = format!("{}-{index}-{}", suite.id, &random_hex()[..8]);
        Ok(Scene {
            suite,
            index,
            dir,
            marker,
            cleanups: Vec::new(),
        })
    }

    fn script(&self, name: &str) -> String {
        self.suite.scripts.join(name).display().to_string()
    }

    /// `python3 -B tests/attacks/NAME ARGS` (-B: never write bytecode into the repository).
    fn python<I: IntoIterator<Item = S>, S: Into<String>>(
        &self,
        name: &str,
        args: I,
    ) -> Vec<String> {
        let mut argv = vec![PYTHON.to_string(), "-B".into(), self.script(name)];
        argv.extend(args.into_iter().map(Into::into));
        argv
    }

    /// A random value the program is never told: finding it anywhere proves a read.
    fn secret(&self) -> String {
        format!("secret-{}", random_hex())
    }

    /// Writes a fresh secret to `path` (removed afterwards) and returns it.
    fn plant(&mut self, path: &Path, mode: u32) -> Result<String, String> {
        let secret = self.secret();
        std::fs::write(path, format!("{secret}\n"))
            .map_err(|e| format!("cannot plant {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| e.to_string())?;
        self.remove_later(path);
        Ok(secret)
    }

    fn make_dir(&mut self, dir: &Path, mode: u32) -> Result<(), String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| e.to_string())?;
        if !dir.starts_with(&self.suite.dir) {
            let dir = dir.to_path_buf();
            self.on_cleanup(move || {
                let _ = std::fs::remove_dir_all(dir);
            });
        }
        Ok(())
    }

    fn chown_to_sandbox_user(&self, path: &Path) -> Result<(), String> {
        let uid = self.suite.sandbox_uid;
        std::os::unix::fs::chown(path, Some(uid), Some(uid))
            .map_err(|e| format!("cannot chown {} to {uid}: {e}", path.display()))
    }

    fn remove_later(&mut self, path: &Path) {
        let path = path.to_path_buf();
        self.on_cleanup(move || {
            let _ = std::fs::remove_file(path);
        });
    }

    fn on_cleanup(&mut self, action: impl FnOnce() + Send + 'static) {
        self.cleanups.push(Box::new(action));
    }

    /// A host process of the sandbox's own uid (another job of the same user), with `argument`
    /// on its command line and `env_secret` in its environment.
    fn victim(&mut self, argument: &str, env_secret: &str) -> Result<Victim, String> {
        let mut command = Command::new(PYTHON);
        command.args([
            "-c",
            "import time\nwhile True: time.sleep(1)",
            &format!("victim-{}", self.marker),
            argument,
        ]);
        command
            .env_clear()
            .env("AIRLOCK_VICTIM_SECRET", env_secret)
            .current_dir("/");
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            command
                .uid(self.suite.sandbox_uid)
                .gid(self.suite.sandbox_uid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start the victim: {e}"))?;
        let victim = Victim {
            pid: child.id(),
            child: Arc::new(Mutex::new(child)),
        };
        let handle = victim.clone();
        self.on_cleanup(move || handle.kill());
        // The victim must be running before the attack looks for it.
        std::thread::sleep(Duration::from_millis(50));
        Ok(victim)
    }

    fn cleanup(&mut self) {
        // Anything the attack started and left running carries the marker.
        for (pid, _) in processes_with(&self.marker) {
            if !std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .contains("victim-")
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        while let Some(action) = self.cleanups.pop() {
            action();
        }
    }
}

#[derive(Clone)]
struct Victim {
    pid: u32,
    child: Arc<Mutex<Child>>,
}

impl Victim {
    fn alive(&self) -> bool {
        self.child
            .lock()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_none())
    }

    fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Bytes received by a host listener.
#[derive(Clone, Default)]
struct Inbox(Arc<Mutex<Vec<u8>>>);

impl Inbox {
    fn push(&self, bytes: &[u8]) {
        self.0.lock().unwrap().extend_from_slice(bytes);
    }

    fn evidence(&self, marker: &str) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
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

    fn serve_unix(listener: std::os::unix::net::UnixListener) -> Inbox {
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
fn tcp_listener(port: u16) -> Result<(u16, Inbox), String> {
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

fn udp_listener(port: u16) -> Result<(u16, Inbox), String> {
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
struct Terminal {
    _master: OwnedFd,
    slave: OwnedFd,
}

impl Terminal {
    fn open() -> Result<Terminal, String> {
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

    fn slave(&self) -> Result<OwnedFd, String> {
        self.slave
            .try_clone()
            .map_err(|e| format!("dup the terminal: {e}"))
    }

    /// What is waiting in the terminal's input queue: what a shell would read next.
    fn pending_input(&self) -> String {
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

// ---------------------------------------------------------------------------------------------
// Host inspection.

/// Processes whose command line contains `needle` (not this test process).
fn processes_with(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid != me && cmdline.contains(needle)).then_some((pid, cmdline.trim().to_string()))
        })
        .collect()
}

fn host_mountinfo() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The host kernel log, read like dmesg does (needs root when dmesg_restrict is set).
fn kernel_log() -> String {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut kmsg) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
    else {
        return String::new();
    };
    let mut log = Vec::new();
    let mut record = [0u8; 8192];
    loop {
        match kmsg.read(&mut record) {
            Ok(0) => break,
            Ok(n) => log.extend_from_slice(&record[..n]),
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&log).into_owned()
}

/// The first block device root can open, and the sha256 of its first sector as python sees it.
fn readable_block_device() -> Option<(String, String)> {
    let mut candidates: Vec<String> = std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .collect();
    candidates.sort();
    candidates.into_iter().find_map(|device| {
        let script = "import hashlib,sys\nprint(hashlib.sha256(open(sys.argv[1],'rb').read(512)).hexdigest())";
        let digest = run_host(&[PYTHON, "-c", script, &device]).ok()?;
        Some((device, digest.trim().to_string()))
    })
}

/// Runs a host helper to completion; its stdout on success.
fn run_host(argv: &[&str]) -> Result<String, String> {
    let output = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn random_hex() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_usize(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let mut second = RandomState::new().build_hasher();
    second.write_u64(hasher.finish());
    format!("{:016x}{:016x}", hasher.finish(), second.finish())
}
