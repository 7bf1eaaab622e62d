//! A warm pool's shared root (`supervisor::shared_root`): the read-only part of its
//! sandboxes' root is built once per plan and `/etc` snapshot, and each sandbox's mount
//! namespace is a copy of it. What one run tries against it — writing into it, changing a
//! mode, remounting, unmounting or mounting over it — must leave no trace on the host, in a
//! run going on meanwhile or in the next run; the root is renewed with its `/etc` snapshot
//! and goes with the pool. A pool's command that finds no sandbox ready runs cold on the same
//! root, and the same holds for it.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::api::{load_profile, Sandbox, SandboxOptions, WarmOptions, WarmPool};

static SERIAL: Mutex<()> = Mutex::new(());

const READY: Duration = Duration::from_secs(30);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn untrusted() -> Sandbox {
    let options = SandboxOptions {
        init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
        ..SandboxOptions::default()
    };
    Sandbox::with_options(load_profile("untrusted").unwrap(), options).unwrap()
}

fn pool_of(sandbox: &Sandbox, options: WarmOptions) -> Option<WarmPool> {
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return None;
    }
    let target = options.target;
    let pool = sandbox.warm(options).unwrap();
    assert!(pool.wait_ready(target, READY), "{:?}", pool.stats());
    Some(pool)
}

/// Where the attack tries to leave a file: the shared root's own directories and binds.
const TRACES: &[&str] = &[
    "/airlock-trace",
    "/etc/airlock-trace",
    "/dev/airlock-trace",
    "/usr/airlock-trace",
    "/proc/airlock-trace",
];

/// Run from inside a prepared sandbox: every way at the shared root the program has (the
/// mount calls through the C library, as a program that got the capability would make
/// them). Prints one JSON object: what each attempt gave, and whether each shared mount
/// reads as read-only.
const ATTACK: &str = r#"
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def name(e):
    return errno.errorcode.get(e, str(e))
def attempt(key, fn):
    try:
        fn()
        out[key] = "ok"
    except OSError as e:
        out[key] = name(e.errno)
def call(key, fn, *args):
    r = getattr(libc, fn)(*args)
    out[key] = "ok" if r == 0 else name(ctypes.get_errno())
for path in TRACES:
    attempt("create " + path, lambda p=path: open(p, "w").write("x"))
for path in ["/", "/dev", "/etc"]:
    attempt("chmod " + path, lambda p=path: os.chmod(p, 0o777))
attempt("mkdir /dev/d", lambda: os.mkdir("/dev/d"))
attempt("symlink /etc/l", lambda: os.symlink("/", "/etc/l"))
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
call("remount / rw", "mount", None, b"/", None, MS_REMOUNT | MS_BIND, None)
call("remount superblock / rw", "mount", None, b"/", None, MS_REMOUNT, None)
call("remount /usr rw", "mount", None, b"/usr", None, MS_REMOUNT | MS_BIND, None)
call("umount /usr", "umount2", b"/usr", MNT_DETACH)
call("umount /proc", "umount2", b"/proc", MNT_DETACH)
call("mount over /etc", "mount", b"tmpfs", b"/etc", b"tmpfs", 0, None)
call("mount over /", "mount", b"tmpfs", b"/", b"tmpfs", 0, None)
# The shared root's user namespace, the parent of the run's (NS_GET_PARENT).
import fcntl
attempt("get the parent namespace", lambda: fcntl.ioctl(os.open("/proc/self/ns/user", os.O_RDONLY), 0xB702))
for path in ["/", "/dev", "/etc", "/usr"]:
    out["read-only " + path] = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
out["read-only superblock /"] = SUPERBLOCK_READ_ONLY()
print(json.dumps(out, sort_keys=True))
"#;

/// Whether the superblock of the mount at `/` is read-only: the super options of
/// `/proc/self/mountinfo` (after the `-`), not the mount's own.
const SUPERBLOCK: &str = r#"
def SUPERBLOCK_READ_ONLY(mountinfo=None):
    for line in mountinfo or open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == "/":
            sep = fields.index("-")
            found = fields[sep + 3].split(",")[0] == "ro"
    return found
"#;

/// What a run sees of the shared root: which trace files exist, the modes of its
/// directories, and its mount table (mount point, options, type and source; not the ids,
/// which are the namespace's own).
const PROBE: &str = r#"
import json, os
def probe():
    mounts = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        sep = fields.index("-")
        # The workdir is named after the run.
        point = fields[4].replace(os.getcwd(), "WORKDIR")
        options = fields[sep + 3].replace(os.getcwd(), "WORKDIR")
        mounts.append(" ".join([point, fields[5], fields[sep + 1], options]))
    return {
        "traces": [p for p in TRACES if os.path.lexists(p)],
        "modes": {p: oct(os.stat(p).st_mode) for p in ["/", "/dev", "/etc", "/usr", "/tmp"]},
        "mounts": sorted(mounts),
    }
"#;

fn script(body: &str) -> String {
    format!("TRACES = {TRACES:?}\n{SUPERBLOCK}\n{body}")
}

fn probe_once() -> String {
    script(&format!(
        "{PROBE}\nimport json\nprint(json.dumps(probe(), sort_keys=True))"
    ))
}

/// The result of `command` running the probe once, and what the probe saw.
fn probed(command: airlock::Command) -> (airlock::RunResult, serde_json::Value) {
    let result = command
        .args(["-c".to_string(), probe_once()])
        .run()
        .unwrap();
    assert!(result.success(), "{result:?}");
    let seen = serde_json::from_str(result.stdout.as_deref().unwrap().trim()).unwrap();
    (result, seen)
}

/// Probes, sleeps while the attack runs elsewhere, probes again.
fn probe_around(pause_s: f64) -> String {
    script(&format!(
        "{PROBE}\nimport json, time\nfirst = probe()\ntime.sleep({pause_s})\nprint(json.dumps([first, probe()], sort_keys=True))"
    ))
}

fn host_mounts() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().map(str::to_string).collect()
}

/// A run's attacks on the shared root all fail, writes with `EROFS` (the root and its binds
/// are read-only mounts, not only refused by Landlock), and leave nothing on the host, in a
/// run going on meanwhile or in the next run, whose view is exactly the first run's.
#[test]
fn a_run_cannot_change_the_shared_root_for_the_host_a_concurrent_or_the_next_run() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = pool_of(&sandbox, WarmOptions::new(3)) else {
        return;
    };
    attack_the_shared_root(&pool);
    assert_eq!(pool.stats().served, 3, "{:?}", pool.stats());
}

/// The same attack from a cold fallback on the shared root (the pool's one sandbox taken by
/// the concurrent run and not replaced): it fails alike, and the concurrent (prepared) run
/// and the next run (a fallback too) see the root unchanged.
#[test]
fn a_cold_fallback_cannot_change_the_shared_root_for_the_host_a_concurrent_or_the_next_run() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = pool_of(&sandbox, one_sandbox_never_replaced()) else {
        return;
    };
    attack_the_shared_root(&pool);
    let stats = pool.stats();
    assert_eq!(stats.served, 1, "{stats:?}");
    assert_eq!(stats.cold_fallbacks, 2, "{stats:?}");
    assert_eq!(stats.cold_on_shared_root, 2, "{stats:?}");
}

/// A pool of one sandbox, not replaced once used: its later commands find none ready and run
/// cold (on the shared root, which the pool keeps).
fn one_sandbox_never_replaced() -> WarmOptions {
    let mut options = WarmOptions::new(1);
    options.refill = false;
    options
}

/// A run probing the root while the next command of `pool` attacks it, then a probe by the
/// command after (see the two tests above).
fn attack_the_shared_root(pool: &WarmPool) {
    let stats = pool.stats();
    assert_eq!(stats.shared_roots, 1, "{stats:?}");
    assert_eq!(stats.shared_root_error, None, "{stats:?}");
    let host_before = host_mounts();
    let concurrent = pool
        .command(support::PYTHON)
        .args(["-c".to_string(), probe_around(2.0)])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let attack = pool
        .command(support::PYTHON)
        .args(["-c".to_string(), script(ATTACK)])
        .run()
        .unwrap();
    assert!(attack.success(), "{attack:?}");
    let outcome: serde_json::Value =
        serde_json::from_str(attack.stdout.as_deref().unwrap().trim()).unwrap();
    for (attempt, result) in outcome.as_object().unwrap() {
        match attempt.split_once(' ') {
            Some(("read-only", _)) => assert_eq!(result, true, "{attempt}: {outcome}"),
            // A file in the root or a bind: refused by the mount, before Landlock is asked.
            Some(("create", path)) if path != "/proc/airlock-trace" => {
                assert_eq!(result, "EROFS", "{attempt}: {outcome}")
            }
            _ => assert_ne!(result, "ok", "{attempt}: {outcome}"),
        }
    }
    let concurrent = concurrent.wait().unwrap();
    assert!(concurrent.success(), "{concurrent:?}");
    let [during_first, during_last]: [serde_json::Value; 2] =
        serde_json::from_str(concurrent.stdout.as_deref().unwrap().trim()).unwrap();
    assert_eq!(during_first, during_last, "the concurrent run saw a change");
    let next = pool
        .command(support::PYTHON)
        .args(["-c".to_string(), probe_once()])
        .run()
        .unwrap();
    assert!(next.success(), "{next:?}");
    let next: serde_json::Value =
        serde_json::from_str(next.stdout.as_deref().unwrap().trim()).unwrap();
    assert_eq!(next, during_first, "the next run saw a change");
    assert_eq!(next["traces"], serde_json::json!([]), "{next}");
    assert_eq!(pool.stats().shared_roots, 1, "{:?}", pool.stats());
    assert_eq!(host_mounts(), host_before, "the host's mount table changed");
    for trace in TRACES {
        assert!(!std::path::Path::new(trace).exists(), "{trace} on the host");
    }
}

/// A run on a shared root sees the cold run's mount table (mount points, their flags and
/// types) but for three mounts the shared root adds (docs/warm.md): its own empty `/proc`
/// (under the run's), the workdir's tmpfs at the runtime directory (read-only; the cold
/// root's directory there is read-only too) and the run's `/etc/passwd` (its home is the
/// run's workdir) bound over the shared root's.
#[test]
fn a_run_on_a_shared_root_sees_the_cold_runs_mounts() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = pool_of(&sandbox, WarmOptions::new(1)) else {
        return;
    };
    let probe = |command| probed(command).1;
    let warm = probe(pool.command(support::PYTHON));
    assert_eq!(pool.stats().served, 1, "{:?}", pool.stats());
    let cold = probe(sandbox.command(support::PYTHON));
    assert_cold_mounts_and_the_shared_roots(&warm, &cold);
}

/// `seen` (a probe of a run on a shared root) has `cold`'s modes and mount table, but for
/// the three mounts the shared root adds.
fn assert_cold_mounts_and_the_shared_roots(seen: &serde_json::Value, cold: &serde_json::Value) {
    assert_eq!(seen["modes"], cold["modes"]);
    // Mount point, flags and type; not the superblock's options (sizes, the run's ids).
    let mounts = |seen: &serde_json::Value| -> Vec<String> {
        let mut mounts: Vec<String> = seen["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let fields: Vec<&str> = m.as_str().unwrap().split(' ').collect();
                fields[..3].join(" ")
            })
            .collect();
        mounts.sort();
        mounts
    };
    let mut warm_mounts = mounts(seen);
    let workdir_base = "/run/airlock ro,nosuid,nodev,noexec,relatime tmpfs";
    let added = [
        "/proc rw,nosuid,nodev,noexec,relatime proc",
        workdir_base,
        "/etc/passwd ro,nosuid,nodev,noexec,relatime tmpfs",
    ];
    for mount in added {
        let at = warm_mounts.iter().position(|m| m == mount);
        assert!(at.is_some(), "{mount} not in {warm_mounts:#?}");
        warm_mounts.remove(at.unwrap());
    }
    assert_eq!(warm_mounts, mounts(cold));
}

/// A pool's command that finds no sandbox ready runs cold on the pool's shared root: its
/// PID 1 adds only the run's own mounts, so it sees exactly what a prepared run sees (the
/// cold run's mount table but for the shared root's three mounts), its isolation record is a
/// cold run's, and nothing of it or of the root outlives the pool.
#[test]
fn a_cold_fallback_runs_on_the_shared_root_with_a_cold_runs_isolation() {
    let _serial = serial();
    let sandbox = untrusted();
    let namespaces_before = namespace_fds();
    let Some(pool) = pool_of(&sandbox, one_sandbox_never_replaced()) else {
        return;
    };
    let run = probed;
    let (_, warm) = run(pool.command(support::PYTHON));
    let (fallback, seen) = run(pool.command(support::PYTHON));
    assert_eq!(
        seen, warm,
        "the fallback's view differs from a prepared run's"
    );
    let stats = pool.stats();
    assert_eq!(
        (
            stats.served,
            stats.cold_fallbacks,
            stats.cold_on_shared_root
        ),
        (1, 1, 1),
        "{stats:?}"
    );
    let warm_detail = airlock::warm::WARM_DETAIL;
    assert!(
        !fallback.details.iter().any(|d| d == warm_detail),
        "{fallback:?}"
    );
    let (cold_result, cold) = run(sandbox.command(support::PYTHON));
    assert_cold_mounts_and_the_shared_roots(&seen, &cold);
    assert_eq!(fallback.isolation, cold_result.isolation);
    assert_eq!(fallback.warnings, cold_result.warnings);
    assert_eq!(fallback.backend, cold_result.backend);
    pool.shutdown();
    assert_eq!(namespace_fds(), namespaces_before);
    assert_eq!(leftovers(), Vec::<std::path::PathBuf>::new());
}

/// What this process's runs left: run directories, and cgroups in any hierarchy.
fn leftovers() -> Vec<std::path::PathBuf> {
    let prefix = format!("run-{}-", std::process::id());
    let mut places = vec![std::path::PathBuf::from("/run/airlock")];
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        places.push(hierarchy.path().join("airlock"));
    }
    let mut left = Vec::new();
    for place in places {
        for entry in std::fs::read_dir(place).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                left.push(entry.path());
            }
        }
    }
    left
}

/// The descriptors this process holds on user or mount namespaces (a pool's shared root).
fn namespace_fds() -> usize {
    shared_root_namespaces().len()
}

/// `/proc/<this process>/fd/N` of each descriptor on a user or mount namespace, with its
/// target.
fn shared_root_namespaces() -> Vec<(String, String)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.path()).ok()?;
            let fd = entry.file_name().to_string_lossy().into_owned();
            let path = format!("/proc/{}/fd/{fd}", std::process::id());
            Some((path, target.to_string_lossy().into_owned()))
        })
        .filter(|(_, target)| target.starts_with("user:[") || target.starts_with("mnt:["))
        .collect()
}

/// Run on the host with the shared root's user and mount namespaces (`argv[1]`, `argv[2]`):
/// enters them, where it holds every capability (their owner is this process's user), and
/// clears the read-only flag of the root's mount (not locked there: the builder made it),
/// as a mount whose flag came to be lost, then tries to write through it.
const FROM_THE_BUILDERS_NAMESPACE: &str = r#"
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_size_t]
def name(e):
    return errno.errorcode.get(e, str(e))
# The root's own /proc is empty: the host's, opened first, shows this process.
host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
# Both opened first: once in the namespace, the host's /proc/<pid>/fd is not this process's.
namespaces = [(os.open(sys.argv[1], os.O_RDONLY), 0x10000000), (os.open(sys.argv[2], os.O_RDONLY), 0x00020000)]
for fd, kind in namespaces:
    if libc.setns(fd, kind) != 0:
        raise OSError(ctypes.get_errno(), "setns")
os.chdir("/")
# The ids the namespace maps (its owner's), as the files the root holds are owned: a write
# as an unmapped id would be refused for that alone (EOVERFLOW). The capabilities stay.
def inside_id(name):
    return int(os.fdopen(os.open("self/" + name, os.O_RDONLY, dir_fd=host_proc)).read().split()[0])
gid, uid = inside_id("gid_map"), inside_id("uid_map")
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
def mountinfo():
    return os.fdopen(os.open("self/mountinfo", os.O_RDONLY, dir_fd=host_proc)).readlines()
out = {"read-only superblock /": SUPERBLOCK_READ_ONLY(mountinfo())}
MOUNT_ATTR_RDONLY, SYS_mount_setattr, AT_FDCWD = 1, 442, -100
def setattr_root(set_, clear):
    attr = (ctypes.c_uint64 * 4)(set_, clear, 0, 0)
    r = libc.syscall(SYS_mount_setattr, AT_FDCWD, b"/", 0, ctypes.addressof(attr), 32)
    return "ok" if r == 0 else name(ctypes.get_errno())
out["clear the mount's read-only flag"] = setattr_root(0, MOUNT_ATTR_RDONLY)
try:
    open("/airlock-trace", "w").write("x")
    out["create /airlock-trace"] = "ok"
    os.unlink("/airlock-trace")
except OSError as e:
    out["create /airlock-trace"] = name(e.errno)
out["restore the mount's read-only flag"] = setattr_root(MOUNT_ATTR_RDONLY, 0)
print(json.dumps(out, sort_keys=True))
"#;

/// The shared root's tmpfs superblock is read-only, not only its mounts: a run reads `ro`
/// in its super options, and in the builder's own namespaces (entered from the host by the
/// namespaces' owner, who can clear the mount's unlocked read-only flag) a write through the
/// root's mount is still refused with `EROFS`. The next run sees no trace.
#[test]
fn the_shared_roots_superblock_is_read_only() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = pool_of(&sandbox, WarmOptions::new(1)) else {
        return;
    };
    let namespaces = shared_root_namespaces();
    let find = |kind: &str| {
        let found = namespaces
            .iter()
            .find(|(_, target)| target.starts_with(kind));
        found.unwrap().0.clone()
    };
    let (user, mnt) = (find("user:["), find("mnt:["));
    let attack = std::process::Command::new(support::PYTHON)
        .args(["-c", &script(FROM_THE_BUILDERS_NAMESPACE), &user, &mnt])
        .output()
        .unwrap();
    assert!(attack.status.success(), "{attack:?}");
    let outcome: serde_json::Value = serde_json::from_slice(&attack.stdout).unwrap();
    let expected = serde_json::json!({
        "read-only superblock /": true,
        "clear the mount's read-only flag": "ok",
        "create /airlock-trace": "EROFS",
        "restore the mount's read-only flag": "ok",
    });
    assert_eq!(outcome, expected);
    let run = pool
        .command(support::PYTHON)
        .args(["-c".to_string(), script(ATTACK)])
        .run()
        .unwrap();
    assert!(run.success(), "{run:?}");
    let seen: serde_json::Value =
        serde_json::from_str(run.stdout.as_deref().unwrap().trim()).unwrap();
    assert_eq!(seen["read-only superblock /"], true, "{seen}");
    assert_ne!(seen["remount superblock / rw"], "ok", "{seen}");
    assert_eq!(seen["create /airlock-trace"], "EROFS", "{seen}");
}

/// The shared root is built again with its `/etc` snapshot (half the idle expiry), its
/// sandboxes expire counting from its build, and nothing of it outlives the pool: no
/// descriptor, no builder process, no run's cgroup or directory.
#[test]
fn the_shared_root_is_renewed_with_the_etc_snapshot_and_goes_with_the_pool() {
    let _serial = serial();
    let sandbox = untrusted();
    let before = namespace_fds();
    let mut options = WarmOptions::new(2);
    options.idle_expiry = Some(Duration::from_millis(800));
    let Some(pool) = pool_of(&sandbox, options) else {
        return;
    };
    assert_eq!(namespace_fds(), before + 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while (pool.stats().shared_roots < 3 || pool.stats().expired < 2) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = pool.stats();
    assert!(stats.shared_roots >= 3 && stats.expired >= 2, "{stats:?}");
    assert!(pool.command("/bin/true").run().unwrap().success());
    assert!(namespace_fds() <= before + 2);
    pool.shutdown();
    assert_eq!(namespace_fds(), before);
    let builders: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| cmdline.ends_with(b"__init\0shared-root\0"))
        .map(|cmdline| String::from_utf8_lossy(&cmdline).into_owned())
        .collect();
    assert_eq!(builders, Vec::<String>::new());
    assert_eq!(leftovers(), Vec::<std::path::PathBuf>::new());
}
