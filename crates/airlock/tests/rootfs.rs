//! End-to-end checks of `airlock::internals::rootfs::enter`, observed from inside the sandbox.
//!
//! Runs without libtest (`harness = false`): the binary must stay single-threaded because it
//! re-executes itself as the rootfs probe (`examples/rootfs_probe.rs`, included below), which
//! unshares a user namespace. Each sandbox run executes `/usr/bin/python3` with `INSIDE_SCRIPT`,
//! which tries allowed and forbidden things and prints the outcomes as JSON.

#[path = "../examples/rootfs_probe.rs"]
#[allow(dead_code)]
mod probe;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};

use airlock::internals::rootfs::{
    default_etc_files, default_system_ro, GeneratedFile, RootfsPlan, TmpfsSpec, Workdir,
};
use serde_json::Value;

const PYTHON: &str = "/usr/bin/python3";
const HOST_DATA: &str = "hello from the host";
const NOBODY: u32 = 65534;
const TMP_BYTES: u64 = 1 << 20;
const TMP_FILES: u64 = 64;

const INSIDE_SCRIPT: &str = r#"
import errno, json, os, shutil, stat, subprocess, sys
base = sys.argv[1]
r = {}

def attempt(action):
    try:
        action()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def write(path, data=b"x"):
    def go():
        with open(path, "wb") as f:
            f.write(data)
    return attempt(go)

def run(path):
    return attempt(lambda: subprocess.run([path], check=True))

r["pid"] = os.getpid()
r["proc_pids"] = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
r["root_write"] = write("/new-file")
r["root_mkdir"] = attempt(lambda: os.mkdir("/new-dir"))
r["top_level"] = sorted(os.listdir("/"))
r["etc"] = sorted(os.listdir("/etc"))
r["passwd"] = open("/etc/passwd").read()
r["hosts"] = open("/etc/hosts").read()
absent = ["/root", "/home", "/sys", "/etc/shadow", "/work", "/var", base + "/secret.txt"]
r["visible"] = [p for p in absent if os.path.lexists(p)]
r["dev"] = sorted(os.listdir("/dev"))
r["dev_null_write"] = write("/dev/null")
r["dev_zero"] = open("/dev/zero", "rb").read(4) == bytes(4)
r["dev_create"] = write("/dev/new-node")
r["shm_write"] = write("/dev/shm/x")
r["tmp_small_write"] = write("/tmp/small")
r["tmp_big_write"] = write("/tmp/big", bytes(2 << 20))
if os.path.exists("/tmp/big"):
    os.remove("/tmp/big")
created, error = 0, None
for i in range(1000):
    result = write("/tmp/f%d" % i, b"")
    if result != "ok":
        error = result
        break
    created += 1
for i in range(created):
    os.remove("/tmp/f%d" % i)
r["tmp_files_created"], r["tmp_files_error"] = created, error
shutil.copy("/usr/bin/true", "/tmp/true")
os.chmod("/tmp/true", 0o755)
r["tmp_exec"] = run("/tmp/true")
r["usr_exec"] = run("/usr/bin/true")
r["cwd"] = os.getcwd()
r["work_write"] = write("created-inside.txt", b"from inside")
r["work_nested_ro_write"] = write("sub/new")
r["ro_read"] = open(base + "/ro/data.txt").read()
r["ro_write"] = write(base + "/ro/data.txt")
r["ro_create"] = write(base + "/ro/new")
r["link_read"] = open(base + "/link/data.txt").read()
r["rw_write"] = write(base + "/rw/out.txt", b"from inside")
r["proc_sys_write"] = write("/proc/sys/kernel/hostname")
null_rdev = os.stat("/dev/null").st_rdev
masked = {}
for name in ["kcore", "keys", "timer_list", "kallsyms", "kpageflags"]:
    path = "/proc/" + name
    if os.path.lexists(path):
        st = os.stat(path)
        masked[name] = stat.S_ISCHR(st.st_mode) and st.st_rdev == null_rdev
r["proc_masked"] = masked
masked_dirs = {}
for name in ["acpi", "asound", "scsi"]:
    path = "/proc/" + name
    if os.path.isdir(path):
        masked_dirs[name] = {
            "entries": os.listdir(path),
            "mode": oct(stat.S_IMODE(os.stat(path).st_mode)),
            "create": write(path + "/new"),
            "mkdir": attempt(lambda: os.mkdir(path + "/new-dir")),
            "chmod": attempt(lambda: os.chmod(path, 0o777)),
        }
r["proc_masked_dirs"] = masked_dirs
dev = os.stat("/dev")
r["dev_mode"] = oct(stat.S_IMODE(dev.st_mode)) if stat.S_ISDIR(dev.st_mode) else "not a directory"
r["dev_mkdir"] = attempt(lambda: os.mkdir("/dev/new-dir"))
r["dev_chmod"] = attempt(lambda: os.chmod("/dev", 0o777))
r["dev_nodes"] = {
    name: [stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)]
    for name in ["null", "zero", "full", "random", "urandom"]
    for st in [os.stat("/dev/" + name)]
}
r["dev_links"] = {name: os.readlink("/dev/" + name) for name in ["fd", "stdin", "stdout", "stderr"]}
r["dev_shm_mode"] = oct(stat.S_IMODE(os.stat("/dev/shm").st_mode))
print(json.dumps(r))
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("airlock-rootfs-")
        .tempdir()
        .expect("create a temporary directory");
    let base = dir.path().to_path_buf();
    for sub in ["work/sub", "ro", "rw"] {
        fs::create_dir_all(base.join(sub)).unwrap();
    }
    fs::write(base.join("ro/data.txt"), HOST_DATA).unwrap();
    fs::write(base.join("secret.txt"), "host secret").unwrap();
    symlink(base.join("ro"), base.join("link")).unwrap();
    if nix::unistd::geteuid().is_root() {
        // The probe runs as nobody on the host; it must be able to reach these paths.
        for path in [
            "",
            "work",
            "work/sub",
            "ro",
            "ro/data.txt",
            "rw",
            "secret.txt",
        ] {
            chown(base.join(path), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
    }
    Fixture { _dir: dir, base }
}

fn generated(path: &str, contents: &str) -> GeneratedFile {
    GeneratedFile {
        path: path.into(),
        contents: contents.into(),
        mode: 0o644,
    }
}

fn standard_plan(base: &Path) -> RootfsPlan {
    RootfsPlan {
        git_read_only: Vec::new(),
        git_pinned: Vec::new(),
        git_found: Vec::new(),
        protect_git: false,
        system_ro: default_system_ro(),
        etc_files: default_etc_files(),
        generated_files: vec![
            generated("/etc/passwd", "root:x:0:0:sandbox:/:/bin/sh\n"),
            generated("/etc/group", "root:x:0:\n"),
            generated("/etc/hosts", "127.0.0.1 localhost sandbox\n"),
            generated("/etc/hostname", "sandbox\n"),
        ],
        read_only: vec![base.join("ro"), base.join("link"), base.join("work/sub")],
        read_write: vec![base.join("rw")],
        workdir: Workdir::Bind {
            host: base.join("work"),
            writable: true,
        },
        tmp: TmpfsSpec {
            size_bytes: TMP_BYTES,
            max_files: TMP_FILES,
        },
        dev_shm: TmpfsSpec {
            size_bytes: 256 << 10,
            max_files: 16,
        },
        exec_writable: false,
        workspace: true,
        tty: false,
        hostname: "sandbox".into(),
        proc_hidepid: true,
        unreachable: None,
    }
}

/// Runs the inside script in a sandbox built from `plan`; the plan file lives outside `base`'s
/// bound subdirectories, so the sandbox cannot see it.
fn run_inside(fixture: &Fixture, plan: &RootfsPlan) -> Output {
    let plan_path = fixture.base.join("plan.json");
    fs::write(&plan_path, serde_json::to_string(plan).unwrap()).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .env(probe::STAGE_ENV, "outer")
        .arg(&plan_path)
        .args([PYTHON, "-c", INSIDE_SCRIPT])
        .arg(&fixture.base)
        .output()
        .expect("spawn the probe")
}

fn host_mountinfo() -> String {
    fs::read_to_string("/proc/self/mountinfo").unwrap()
}

/// One standard sandbox run, observed from inside and from the host.
struct Observed {
    fixture: Fixture,
    inside: Value,
    mounts_before: String,
    mounts_after: String,
}

enum Setup {
    Ready(Box<Observed>),
    Skip(String),
}

fn observe() -> Setup {
    if !Path::new(PYTHON).exists() {
        return Setup::Skip(format!("{PYTHON} is missing"));
    }
    let fixture = fixture();
    let plan = standard_plan(&fixture.base);
    let mounts_before = host_mountinfo();
    let output = run_inside(&fixture, &plan);
    let mounts_after = host_mountinfo();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(probe::EXIT_NO_NAMESPACES.into()) {
        return Setup::Skip(format!("namespaces unavailable: {stderr}"));
    }
    assert!(output.status.success(), "probe failed: {stderr}");
    let inside = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("bad probe output ({e}): {stderr}"));
    Setup::Ready(Box::new(Observed {
        fixture,
        inside,
        mounts_before,
        mounts_after,
    }))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

fn root_is_read_only(o: &Observed) {
    assert_eq!(o.inside["root_write"], "EROFS");
    assert_eq!(o.inside["root_mkdir"], "EROFS");
}

fn only_planned_entries_exist(o: &Observed) {
    assert_eq!(strings(&o.inside["visible"]), Vec::<String>::new());
    let top: BTreeSet<String> = strings(&o.inside["top_level"]).into_iter().collect();
    for expected in ["usr", "etc", "dev", "proc", "tmp"] {
        assert!(top.contains(expected), "missing /{expected} in {top:?}");
    }
    for forbidden in ["sys", "root", "home", "var", "boot", "opt", "srv", "mnt"] {
        assert!(!top.contains(forbidden), "/{forbidden} is visible: {top:?}");
    }
}

fn etc_holds_only_listed_and_generated_entries(o: &Observed) {
    let mut expected: BTreeSet<String> = default_etc_files()
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    expected.extend(["passwd", "group", "hosts", "hostname"].map(String::from));
    let actual: BTreeSet<String> = strings(&o.inside["etc"]).into_iter().collect();
    assert_eq!(actual, expected);
    assert_eq!(o.inside["passwd"], "root:x:0:0:sandbox:/:/bin/sh\n");
    assert_eq!(o.inside["hosts"], "127.0.0.1 localhost sandbox\n");
}

fn proc_shows_only_sandbox_processes(o: &Observed) {
    assert_eq!(
        o.inside["pid"], 1,
        "the program should be PID 1 of its namespace"
    );
    assert_eq!(o.inside["proc_pids"], serde_json::json!([1]));
}

fn proc_is_hardened(o: &Observed) {
    assert_eq!(o.inside["proc_sys_write"], "EROFS");
    let masked = o.inside["proc_masked"].as_object().unwrap();
    assert!(!masked.is_empty(), "no maskable /proc file on this kernel");
    for (name, is_null) in masked {
        assert_eq!(is_null, &Value::Bool(true), "/proc/{name} is not masked");
    }
}

/// The masked `/proc` directories the host has show nothing, and nothing can be made there
/// (read-only, mode 0555, as the empty read-only tmpfs each was): whatever the host holds
/// there stays hidden.
fn proc_dirs_are_masked(o: &Observed) {
    let masked = o.inside["proc_masked_dirs"].as_object().unwrap();
    let on_host: Vec<&str> = ["acpi", "asound", "scsi"]
        .into_iter()
        .filter(|name| Path::new("/proc").join(name).is_dir())
        .collect();
    let inside: Vec<&str> = masked.keys().map(String::as_str).collect();
    assert_eq!(inside, on_host);
    for (name, seen) in masked {
        assert_eq!(seen["entries"], serde_json::json!([]), "/proc/{name}");
        assert_eq!(seen["mode"], "0o555", "/proc/{name}");
        for action in ["create", "mkdir"] {
            assert_eq!(seen[action], "EROFS", "/proc/{name}: {action}");
        }
        assert_ne!(seen["chmod"], "ok", "/proc/{name}: chmod");
    }
}

/// `/dev` is what it was as a tmpfs of its own: a directory of mode 0755 that nothing can
/// be made in, the host's device nodes, the links to the process's descriptors and a
/// writable `/dev/shm`.
fn dev_is_sealed_with_the_host_nodes(o: &Observed) {
    assert_eq!(o.inside["dev_mode"], "0o755");
    assert_eq!(o.inside["dev_mkdir"], "EROFS");
    assert_ne!(o.inside["dev_chmod"], "ok");
    let nodes = o.inside["dev_nodes"].as_object().unwrap();
    for (name, seen) in nodes {
        let host = fs::metadata(Path::new("/dev").join(name)).unwrap();
        let rdev = std::os::unix::fs::MetadataExt::rdev(&host);
        let expected = serde_json::json!([true, libc::major(rdev), libc::minor(rdev)]);
        assert_eq!(seen, &expected, "/dev/{name}");
    }
    let links = serde_json::json!({
        "fd": "/proc/self/fd",
        "stdin": "/proc/self/fd/0",
        "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2",
    });
    assert_eq!(o.inside["dev_links"], links);
    assert_eq!(o.inside["dev_shm_mode"], "0o1777");
}

fn dev_has_only_listed_nodes(o: &Observed) {
    let expected = [
        "fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero",
    ];
    assert_eq!(strings(&o.inside["dev"]), expected);
    assert_eq!(o.inside["dev_null_write"], "ok");
    assert_eq!(o.inside["dev_zero"], true);
    assert_eq!(o.inside["dev_create"], "EROFS");
    assert_eq!(o.inside["shm_write"], "ok");
}

fn tmp_is_writable_but_capped(o: &Observed) {
    assert_eq!(o.inside["tmp_small_write"], "ok");
    assert_eq!(o.inside["tmp_big_write"], "ENOSPC");
    let created = o.inside["tmp_files_created"].as_u64().unwrap();
    assert!(
        (10..TMP_FILES).contains(&created),
        "created {created} files"
    );
    assert_eq!(o.inside["tmp_files_error"], "ENOSPC");
}

fn writable_mounts_are_noexec(o: &Observed) {
    assert_eq!(o.inside["usr_exec"], "ok");
    assert_eq!(o.inside["tmp_exec"], "EACCES");
}

fn workdir_is_the_writable_cwd(o: &Observed) {
    let work = o.fixture.base.join("work");
    assert_eq!(o.inside["cwd"], work.to_str().unwrap());
    assert_eq!(o.inside["work_write"], "ok");
    let written = fs::read_to_string(work.join("created-inside.txt")).unwrap();
    assert_eq!(written, "from inside");
    assert_eq!(o.inside["work_nested_ro_write"], "EROFS");
}

fn extra_paths_have_their_access(o: &Observed) {
    assert_eq!(o.inside["ro_read"], HOST_DATA);
    assert_eq!(o.inside["ro_write"], "EROFS");
    assert_eq!(o.inside["ro_create"], "EROFS");
    assert_eq!(o.inside["link_read"], HOST_DATA);
    let ro_after = fs::read_to_string(o.fixture.base.join("ro/data.txt")).unwrap();
    assert_eq!(ro_after, HOST_DATA);
    assert_eq!(o.inside["rw_write"], "ok");
    let rw_after = fs::read_to_string(o.fixture.base.join("rw/out.txt")).unwrap();
    assert_eq!(rw_after, "from inside");
}

fn nothing_leaks_into_host_mounts(o: &Observed) {
    let before: BTreeSet<&str> = o.mounts_before.lines().collect();
    let leaked: Vec<&str> = o
        .mounts_after
        .lines()
        .filter(|line| !before.contains(line))
        .filter(|line| {
            let point = line.split(' ').nth(4).unwrap_or("");
            point == "/tmp" || point.starts_with("/tmp/") || point.contains("root")
        })
        .collect();
    assert!(leaked.is_empty(), "host gained mounts: {leaked:#?}");
}

fn exec_writable_allows_exec_in_tmp() {
    let fixture = fixture();
    let mut plan = standard_plan(&fixture.base);
    plan.exec_writable = true;
    let output = run_inside(&fixture, &plan);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "probe failed: {stderr}");
    let inside: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(inside["tmp_exec"], "ok");
}

fn tty_plan_binds_dev_tty() {
    if !Path::new("/dev/tty").exists() {
        eprintln!("skipping tty_plan_binds_dev_tty: the host has no /dev/tty");
        return;
    }
    let fixture = fixture();
    let mut plan = standard_plan(&fixture.base);
    plan.tty = true;
    let output = run_inside(&fixture, &plan);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "probe failed: {stderr}");
    let inside: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(strings(&inside["dev"]).contains(&"tty".to_string()));
}

fn missing_read_only_path_is_refused_before_setup() {
    let fixture = fixture();
    let mut plan = standard_plan(&fixture.base);
    let missing = fixture.base.join("does-not-exist");
    plan.read_only.push(missing.clone());
    let output = run_inside(&fixture, &plan);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    let expected = format!(
        "read-only path {} does not exist on the host",
        missing.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

type ObservedCheck = fn(&Observed);

const OBSERVED_CHECKS: &[(&str, ObservedCheck)] = &[
    ("root_is_read_only", root_is_read_only),
    ("only_planned_entries_exist", only_planned_entries_exist),
    (
        "etc_holds_only_listed_and_generated_entries",
        etc_holds_only_listed_and_generated_entries,
    ),
    (
        "proc_shows_only_sandbox_processes",
        proc_shows_only_sandbox_processes,
    ),
    ("proc_is_hardened", proc_is_hardened),
    ("proc_dirs_are_masked", proc_dirs_are_masked),
    ("dev_has_only_listed_nodes", dev_has_only_listed_nodes),
    (
        "dev_is_sealed_with_the_host_nodes",
        dev_is_sealed_with_the_host_nodes,
    ),
    ("tmp_is_writable_but_capped", tmp_is_writable_but_capped),
    ("writable_mounts_are_noexec", writable_mounts_are_noexec),
    ("workdir_is_the_writable_cwd", workdir_is_the_writable_cwd),
    (
        "extra_paths_have_their_access",
        extra_paths_have_their_access,
    ),
    (
        "nothing_leaks_into_host_mounts",
        nothing_leaks_into_host_mounts,
    ),
];

const STANDALONE_CHECKS: &[(&str, fn())] = &[
    (
        "exec_writable_allows_exec_in_tmp",
        exec_writable_allows_exec_in_tmp,
    ),
    ("tty_plan_binds_dev_tty", tty_plan_binds_dev_tty),
    (
        "missing_read_only_path_is_refused_before_setup",
        missing_read_only_path_is_refused_before_setup,
    ),
];

fn passed(name: &str, check: impl FnOnce()) -> bool {
    let ok = panic::catch_unwind(AssertUnwindSafe(check)).is_ok();
    println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
    ok
}

fn main() -> ExitCode {
    if let Ok(stage) = std::env::var(probe::STAGE_ENV) {
        return probe::run_stage(&stage);
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let selected = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f));
    let observed: Vec<_> = OBSERVED_CHECKS
        .iter()
        .filter(|(n, _)| selected(n))
        .collect();
    let standalone: Vec<_> = STANDALONE_CHECKS
        .iter()
        .filter(|(n, _)| selected(n))
        .collect();
    let total = observed.len() + standalone.len();
    let setup = match observed.is_empty() && standalone.is_empty() {
        true => None,
        false => Some(observe()),
    };
    if let Some(Setup::Skip(reason)) = &setup {
        eprintln!("skipping {total} rootfs tests: {reason}");
        return ExitCode::SUCCESS;
    }
    let mut failures = 0;
    if let Some(Setup::Ready(o)) = &setup {
        for (name, check) in observed {
            failures += usize::from(!passed(name, || check(o)));
        }
    }
    for (name, check) in standalone {
        failures += usize::from(!passed(name, check));
    }
    println!(
        "\ntest result: {}. {} passed; {failures} failed",
        if failures == 0 { "ok" } else { "FAILED" },
        total - failures
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
