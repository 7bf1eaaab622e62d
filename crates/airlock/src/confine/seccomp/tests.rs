//! Tests of the syscall policy: probes run under the filters from a fresh thread (refusals,
//! errno, sockets, device nodes), real interpreters and compilers doing work under them, and
//! the lists checked against each other and the range-searched table.

use super::*;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Output};

const OFFLINE: SeccompConfig = SeccompConfig {
    allow_network: false,
    allow_inet: false,
};
const ONLINE: SeccompConfig = SeccompConfig {
    allow_network: true,
    allow_inet: false,
};
/// The egress gate's sandboxes: IP stream and datagram sockets, nothing else.
const GATED: SeccompConfig = SeccompConfig {
    allow_network: false,
    allow_inet: true,
};
const EPERM: &str = "1";
const ENOSYS: &str = "38";
const PYTHON: &str = "/usr/bin/python3";

/// Runs `program` from a fresh thread, under the filters when `cfg` is given. The child
/// inherits the thread's filters through fork+exec, exactly as the sandbox's payload does.
fn run(cfg: Option<SeccompConfig>, program: &str, args: &[&str]) -> Output {
    let program = program.to_owned();
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    std::thread::spawn(move || {
        if let Some(cfg) = cfg {
            crate::confine::caps::set_no_new_privs().unwrap();
            install(&cfg).unwrap();
        }
        Command::new(program).args(args).output().unwrap()
    })
    .join()
    .expect("the filtered thread panicked")
}

fn stdout_of(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn missing(program: &str) -> bool {
    let absent = !Path::new(program).exists();
    if absent {
        eprintln!("skipped: {program} is not installed");
    }
    absent
}

/// Calls raw syscalls through ctypes and prints "label errno" (or "label ok") per call.
/// A successful raw clone returns 0 in the child, which must leave at once.
const PROBE_SCRIPT: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for spec in sys.argv[1:]:
    label, *numbers = spec.split(":")
    number, *args = (int(n, 0) for n in numbers)
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_ulong(a) for a in args))
    if label.startswith("clone") and result == 0:
        os._exit(0)
    if label.startswith("clone") and result > 0:
        os.waitpid(result, 0)
    print(label, ctypes.get_errno() if result == -1 else "ok", flush=True)
"#;

struct Probe {
    label: String,
    number: i64,
    args: Vec<u64>,
}

fn probe(label: &str, number: i64, args: &[u64]) -> Probe {
    let label = label.to_owned();
    let args = args.to_vec();
    Probe {
        label,
        number,
        args,
    }
}

/// Runs the probes under `cfg` (or unfiltered) and maps each label to its outcome.
fn outcomes(cfg: Option<SeccompConfig>, probes: &[Probe]) -> HashMap<String, String> {
    let specs: Vec<String> = probes
        .iter()
        .map(|probe| {
            let numbers = std::iter::once(probe.number.to_string())
                .chain(probe.args.iter().map(u64::to_string));
            std::iter::once(probe.label.clone())
                .chain(numbers)
                .collect::<Vec<_>>()
                .join(":")
        })
        .collect();
    let mut args = vec!["-c", PROBE_SCRIPT];
    args.extend(specs.iter().map(String::as_str));
    let stdout = stdout_of(&run(cfg, PYTHON, &args));
    stdout
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(label, outcome)| (label.to_owned(), outcome.to_owned()))
        .collect()
}

/// Arguments that make each refused call harmless should the filter ever let it through
/// (bad pointers, invalid descriptors or flags); all others are called with zeros.
fn harmless_args(name: &str) -> Vec<u64> {
    match name {
        "SYS_ptrace" => vec![libc::PTRACE_ATTACH as u64, 0],
        "SYS_acct" | "SYS_sethostname" | "SYS_setdomainname" => vec![1, 1],
        "SYS_kexec_load" => vec![0, 0, 0, u64::from(u32::MAX)],
        "SYS_kexec_file_load" | "SYS_finit_module" | "SYS_setns" | "SYS_pidfd_getfd" => {
            vec![u64::MAX; 5]
        }
        _ => vec![0; 6],
    }
}

#[test]
fn later_filter_errno_wins_for_equal_actions() {
    let refuse_getcwd = |errno: i32| {
        let rules = BTreeMap::from([(libc::SYS_getcwd, Vec::new())]);
        let errno = SeccompAction::Errno(errno as u32);
        let filter = SeccompFilter::new(rules, SeccompAction::Allow, errno, TARGET_ARCH);
        BpfProgram::try_from(filter.unwrap()).unwrap()
    };
    let first = refuse_getcwd(libc::EXDEV);
    let second = refuse_getcwd(libc::ELOOP);
    let seen = std::thread::spawn(move || {
        crate::confine::caps::set_no_new_privs().unwrap();
        seccompiler::apply_filter(&first).unwrap();
        seccompiler::apply_filter(&second).unwrap();
        nix::unistd::getcwd()
    })
    .join()
    .unwrap();
    assert_eq!(seen, Err(nix::errno::Errno::ELOOP));
    assert!(
        nix::unistd::getcwd().is_ok(),
        "the test thread must be unfiltered"
    );
}

#[test]
fn every_refused_syscall_gets_eperm() {
    if missing(PYTHON) {
        return;
    }
    let probes: Vec<Probe> = every(REFUSED)
        .map(|&(name, number)| probe(name, number, &harmless_args(name)))
        .collect();
    let seen = outcomes(Some(OFFLINE), &probes);
    for probe in &probes {
        assert_eq!(
            seen.get(&probe.label).map(String::as_str),
            Some(EPERM),
            "{}",
            probe.label
        );
    }
}

#[test]
fn unknown_and_unlisted_syscalls_get_enosys() {
    if missing(PYTHON) {
        return;
    }
    let mut probes = vec![
        probe("made_up_1000", 1000, &[]),
        probe("clone3", libc::SYS_clone3, &[0, 0]),
        probe("kcmp", libc::SYS_kcmp, &[0, 0, 0, 0, 0]),
    ];
    if cfg!(target_arch = "x86_64") {
        // The x32 ABI shares the x86_64 arch token; its numbers carry bit 30.
        probes.push(probe("x32_getpid", 0x4000_0000 | libc::SYS_getpid, &[]));
    }
    let seen = outcomes(Some(OFFLINE), &probes);
    for probe in &probes {
        assert_eq!(
            seen.get(&probe.label).map(String::as_str),
            Some(ENOSYS),
            "{}",
            probe.label
        );
    }
    let free = outcomes(None, &probes);
    assert_ne!(free["clone3"], ENOSYS, "the kernel itself must know clone3");
    assert_ne!(free["kcmp"], ENOSYS, "the kernel itself must know kcmp");
}

#[test]
fn namespace_clone_is_refused_but_fork_style_clone_works() {
    if missing(PYTHON) {
        return;
    }
    let sigchld = libc::SIGCHLD as u64;
    let newuser = libc::CLONE_NEWUSER as u64 | sigchld;
    let probes = [
        probe("clone_newuser", libc::SYS_clone, &[newuser, 0, 0, 0, 0]),
        probe(
            "clone_newnet",
            libc::SYS_clone,
            &[libc::CLONE_NEWNET as u64 | sigchld],
        ),
        probe(
            "clone_upper_bits",
            libc::SYS_clone,
            &[(1 << 32) | newuser, 0, 0, 0, 0],
        ),
        probe("clone_fork", libc::SYS_clone, &[sigchld, 0, 0, 0, 0]),
    ];
    let seen = outcomes(Some(OFFLINE), &probes);
    assert_eq!(seen["clone_newuser"], EPERM);
    assert_eq!(seen["clone_newnet"], EPERM);
    assert_eq!(seen["clone_upper_bits"], EPERM);
    assert_eq!(seen["clone_fork"], "ok");
    let free = outcomes(None, &probes[..1]);
    assert_eq!(
        free["clone_newuser"], "ok",
        "unfiltered, the kernel must allow it"
    );
}

fn socket_probes() -> Vec<Probe> {
    let stream = libc::SOCK_STREAM as u64;
    let (inet, inet6, unix) = (libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_UNIX);
    vec![
        probe("socket_inet", libc::SYS_socket, &[inet, stream, 0]),
        probe("socket_inet6", libc::SYS_socket, &[inet6, stream, 0]),
        probe(
            "socket_netlink",
            libc::SYS_socket,
            &[libc::AF_NETLINK as u64, 3, 0],
        ),
        probe("socket_unix", libc::SYS_socket, &[unix as u64, stream, 0]),
        probe(
            "socket_inet_dgram",
            libc::SYS_socket,
            &[inet, libc::SOCK_DGRAM as u64 | libc::SOCK_CLOEXEC as u64, 0],
        ),
        probe(
            "socket_inet_raw",
            libc::SYS_socket,
            &[inet, libc::SOCK_RAW as u64, libc::IPPROTO_ICMP as u64],
        ),
        probe(
            "socket_inet6_raw",
            libc::SYS_socket,
            &[
                inet6,
                libc::SOCK_RAW as u64 | libc::SOCK_NONBLOCK as u64,
                58,
            ],
        ),
        probe(
            "socket_packet",
            libc::SYS_socket,
            &[libc::AF_PACKET as u64, libc::SOCK_RAW as u64, 0],
        ),
        probe(
            "socket_inet_seqpacket",
            libc::SYS_socket,
            &[inet, libc::SOCK_SEQPACKET as u64, 132],
        ),
        probe(
            "socketpair_inet",
            libc::SYS_socketpair,
            &[inet, stream, 0, 0],
        ),
    ]
}

/// NULL paths: a call the filter lets through fails with EFAULT, never creating anything.
fn mknod_probes() -> Vec<Probe> {
    let at_fdcwd = libc::AT_FDCWD as u64;
    let mode = |kind: libc::mode_t| u64::from(kind | 0o600);
    let mem = libc::makedev(1, 1);
    vec![
        probe(
            "mknodat_chr",
            libc::SYS_mknodat,
            &[at_fdcwd, 0, mode(libc::S_IFCHR), mem],
        ),
        probe(
            "mknodat_blk",
            libc::SYS_mknodat,
            &[at_fdcwd, 0, mode(libc::S_IFBLK), mem],
        ),
        probe("mknod_chr", libc::SYS_mknod, &[0, mode(libc::S_IFCHR), mem]),
        probe(
            "mknodat_fifo",
            libc::SYS_mknodat,
            &[at_fdcwd, 0, mode(libc::S_IFIFO), 0],
        ),
    ]
}

#[test]
fn device_nodes_are_refused_and_fifos_are_not() {
    if missing(PYTHON) {
        return;
    }
    const EFAULT: &str = "14";
    let seen = outcomes(Some(OFFLINE), &mknod_probes());
    for label in ["mknodat_chr", "mknodat_blk", "mknod_chr"] {
        assert_eq!(seen[label], EPERM, "{label}");
    }
    assert_eq!(seen["mknodat_fifo"], EFAULT, "FIFOs reach the kernel");
    let free = outcomes(None, &mknod_probes());
    assert_eq!(
        free["mknodat_chr"], EFAULT,
        "unfiltered, the kernel decides"
    );
}

/// NULL paths again (EFAULT once through the filter), except `fchmod` on an fd that is not
/// open (EBADF): the mode decides, never the file.
fn setid_mode_probes() -> Vec<Probe> {
    let at_fdcwd = libc::AT_FDCWD as u64;
    let (suid, sgid) = (u64::from(libc::S_ISUID), u64::from(libc::S_ISGID));
    let creat = (libc::O_CREAT | libc::O_WRONLY) as u64;
    let regular = u64::from(libc::S_IFREG);
    let mut probes = vec![
        probe("fchmodat_plain", libc::SYS_fchmodat, &[at_fdcwd, 0, 0o755]),
        probe(
            "fchmodat_suid",
            libc::SYS_fchmodat,
            &[at_fdcwd, 0, suid | 0o755],
        ),
        probe(
            "fchmodat_sgid",
            libc::SYS_fchmodat,
            &[at_fdcwd, 0, sgid | 0o755],
        ),
        probe(
            "fchmodat_suid_upper",
            libc::SYS_fchmodat,
            &[at_fdcwd, 0, (1 << 32) | suid],
        ),
        probe(
            "fchmodat2_suid",
            sysno::SYS_fchmodat2,
            &[at_fdcwd, 0, suid | 0o755, 0],
        ),
        probe("fchmod_suid", libc::SYS_fchmod, &[999, suid | 0o755]),
        probe(
            "openat_plain",
            libc::SYS_openat,
            &[at_fdcwd, 0, creat, 0o644],
        ),
        probe(
            "openat_suid",
            libc::SYS_openat,
            &[at_fdcwd, 0, creat, suid | 0o755],
        ),
        probe(
            "mknodat_suid",
            libc::SYS_mknodat,
            &[at_fdcwd, 0, regular | suid, 0],
        ),
        probe("openat2", libc::SYS_openat2, &[at_fdcwd, 0, 0, 0]),
    ];
    #[cfg(target_arch = "x86_64")]
    probes.extend([
        probe("open_suid", libc::SYS_open, &[0, creat, suid | 0o755]),
        probe("creat_sgid", libc::SYS_creat, &[0, sgid | 0o755]),
        probe("chmod_suid", libc::SYS_chmod, &[0, suid | 0o4755]),
        probe("mknod_sgid", libc::SYS_mknod, &[0, regular | sgid, 0]),
    ]);
    probes
}

/// A setuid or setgid bit never reaches the kernel (a file planted in a workspace that
/// outlives the run would be the workspace owner's setuid program); plain modes do.
#[test]
fn setuid_and_setgid_modes_are_refused() {
    if missing(PYTHON) {
        return;
    }
    const EFAULT: &str = "14";
    const EBADF: &str = "9";
    let seen = outcomes(Some(OFFLINE), &setid_mode_probes());
    for (label, outcome) in &seen {
        let expected = match label.as_str() {
            "fchmodat_plain" | "openat_plain" => EFAULT,
            "openat2" => ENOSYS,
            _ => EPERM,
        };
        assert_eq!(outcome, expected, "{label}");
    }
    let free = outcomes(None, &setid_mode_probes());
    assert_eq!(
        free["fchmodat_suid"], EFAULT,
        "unfiltered, the kernel decides"
    );
    assert_eq!(free["fchmod_suid"], EBADF, "unfiltered, the kernel decides");
}

#[test]
fn network_off_allows_only_unix_sockets() {
    if missing(PYTHON) {
        return;
    }
    let seen = outcomes(Some(OFFLINE), &socket_probes());
    assert_eq!(seen["socket_inet"], EPERM);
    assert_eq!(seen["socket_inet6"], EPERM);
    assert_eq!(seen["socket_netlink"], EPERM);
    assert_eq!(seen["socketpair_inet"], EPERM);
    assert_eq!(seen["socket_unix"], "ok");
}

/// The egress gate's sandboxes: TCP and UDP sockets pass (the network namespace decides what
/// they reach), raw, packet and netlink sockets and other IP types never reach the kernel. The
/// probes run as root here, where the kernel itself would make a raw socket.
#[test]
fn the_gated_network_allows_ip_stream_and_datagram_sockets_only() {
    if missing(PYTHON) {
        return;
    }
    let seen = outcomes(Some(GATED), &socket_probes());
    for allowed in [
        "socket_inet",
        "socket_inet6",
        "socket_unix",
        "socket_inet_dgram",
    ] {
        assert_eq!(seen[allowed], "ok", "{allowed}");
    }
    for refused in [
        "socket_netlink",
        "socket_inet_raw",
        "socket_inet6_raw",
        "socket_packet",
        "socket_inet_seqpacket",
        "socketpair_inet",
    ] {
        assert_eq!(seen[refused], EPERM, "{refused}");
    }
    if nix::unistd::geteuid().is_root() {
        let free = outcomes(None, &socket_probes());
        assert_eq!(free["socket_inet_raw"], "ok", "unfiltered, root makes one");
    }
}

#[test]
fn network_on_allows_inet_sockets() {
    if missing(PYTHON) {
        return;
    }
    let seen = outcomes(Some(ONLINE), &socket_probes());
    assert_eq!(seen["socket_inet"], "ok");
    assert_eq!(seen["socket_inet6"], "ok");
    assert_eq!(seen["socket_unix"], "ok");
    assert_ne!(
        seen["socketpair_inet"], EPERM,
        "the kernel, not the filter, decides"
    );
}

#[test]
#[allow(clippy::unnecessary_cast)] // the request type is u64 in glibc but i32 in musl
fn personality_changes_and_terminal_injection_are_refused() {
    if missing(PYTHON) {
        return;
    }
    let personality = libc::SYS_personality;
    let (tiocsti, tioclinux) = (libc::TIOCSTI as u64, libc::TIOCLINUX as u64);
    let probes = [
        probe("personality_query", personality, &[PERSONALITY_QUERY]),
        probe("personality_linux", personality, &[PER_LINUX]),
        probe(
            "personality_no_aslr",
            personality,
            &[libc::ADDR_NO_RANDOMIZE as u64],
        ),
        probe("ioctl_tiocsti", libc::SYS_ioctl, &[0, tiocsti, 0]),
        probe(
            "ioctl_tiocsti_upper",
            libc::SYS_ioctl,
            &[0, (1 << 32) | tiocsti, 0],
        ),
        probe("ioctl_tioclinux", libc::SYS_ioctl, &[0, tioclinux, 0]),
        probe(
            "ioctl_fionread",
            libc::SYS_ioctl,
            &[0, libc::FIONREAD as u64, 0],
        ),
    ];
    let seen = outcomes(Some(OFFLINE), &probes);
    assert_eq!(seen["personality_query"], "ok");
    assert_eq!(seen["personality_linux"], "ok");
    assert_eq!(seen["personality_no_aslr"], EPERM);
    assert_eq!(seen["ioctl_tiocsti"], EPERM);
    assert_eq!(seen["ioctl_tiocsti_upper"], EPERM);
    assert_eq!(seen["ioctl_tioclinux"], EPERM);
    assert_ne!(
        seen["ioctl_fionread"], EPERM,
        "other ioctls reach the kernel"
    );
    assert_ne!(
        seen["ioctl_fionread"], ENOSYS,
        "other ioctls reach the kernel"
    );
}

const PYTHON_WORK: &str = r#"
import asyncio, concurrent.futures, hashlib, json, multiprocessing, os, socket, subprocess
import tempfile, threading
def square(x):
    return x * x
with multiprocessing.Pool(2) as pool:
    squares = pool.map(square, range(4))
with concurrent.futures.ProcessPoolExecutor(2) as executor:
    cubes = list(executor.map(pow, [2, 3], [3, 3]))
child = subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip()
box = []
worker = threading.Thread(target=box.append, args=(1,))
worker.start()
worker.join()
with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "f")
    with open(path, "w") as f:
        f.write("data")
    with open(path) as f:
        data = f.read()
left, right = socket.socketpair()
left.send(b"x")
echoed = right.recv(1).decode()
asyncio.run(asyncio.sleep(0))
digest = hashlib.sha256(b"").hexdigest()[:8]
print(json.dumps([squares, cubes, child, box, data, echoed, digest]))
"#;

#[test]
fn python_does_real_work_under_the_filter() {
    if missing(PYTHON) {
        return;
    }
    let stdout = stdout_of(&run(Some(OFFLINE), PYTHON, &["-c", PYTHON_WORK]));
    let expected = r#"[[0, 1, 4, 9], [8, 27], "child", [1], "data", "x", "e3b0c442"]"#;
    assert_eq!(stdout.trim(), expected);
}

#[test]
fn bash_pipelines_work_under_the_filter() {
    if missing("/bin/bash") {
        return;
    }
    let script = r#"set -euo pipefail
seq 1 100 | sort -rn | head -3 | tr '\n' ' '; echo
dir=$(mktemp -d); echo hi > "$dir/f"; cp "$dir/f" "$dir/g"; cat "$dir/g"; rm -r "$dir"
(sleep 0.01 &); wait
echo $(( 6 * 7 )) | awk '{ print $1 + 0 }'
grep -E '^Seccomp(_filters)?:' /proc/self/status | tr -s '\t' ' '"#;
    let stdout = stdout_of(&run(Some(OFFLINE), "/bin/bash", &["-c", script]));
    let inherited = "Seccomp: 2\nSeccomp_filters: 2\n";
    assert_eq!(stdout, format!("100 99 98 \nhi\n42\n{inherited}"));
}

#[test]
fn perl_works_under_the_filter() {
    if missing("/usr/bin/perl") {
        return;
    }
    let script = r#"pipe(my $r, my $w) or die;
my $pid = fork() // die;
if ($pid == 0) { close $r; print $w "from child\n"; exit 0 }
close $w; my $line = <$r>; waitpid($pid, 0); print $line;
print join(",", sort { $a <=> $b } (3, 1, 2)), "\n";
print `echo backtick`;"#;
    let stdout = stdout_of(&run(Some(OFFLINE), "/usr/bin/perl", &["-e", script]));
    assert_eq!(stdout, "from child\n1,2,3\nbacktick\n");
}

#[test]
fn node_works_under_the_filter() {
    if missing("/usr/bin/node") {
        return;
    }
    let script = r#"const cp = require("child_process"), fs = require("fs");
const os = require("os"), path = require("path"), wt = require("worker_threads");
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "airlock-"));
fs.writeFileSync(path.join(dir, "f"), "hi");
const text = fs.readFileSync(path.join(dir, "f"), "utf8");
fs.rmSync(dir, { recursive: true });
const child = cp.execFileSync("/bin/echo", ["child"]).toString().trim();
const code = "require('worker_threads').parentPort.postMessage(6 * 7)";
const worker = new wt.Worker(code, { eval: true });
worker.on("message", (answer) => { console.log(text, child, answer); worker.terminate(); });"#;
    let stdout = stdout_of(&run(Some(OFFLINE), "/usr/bin/node", &["-e", script]));
    assert_eq!(stdout, "hi child 42\n");
}

#[test]
fn gcc_compiles_and_runs_a_threaded_program_under_the_filter() {
    if missing("/usr/bin/gcc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = r#"#include <pthread.h>
#include <stdio.h>
static void *work(void *arg) { return arg; }
int main(void) { pthread_t t; void *r; pthread_create(&t, 0, work, "thread"); pthread_join(t, &r);
printf("hi from %s\n", (char *)r); return 0; }"#;
    std::fs::write(dir.path().join("x.c"), source).unwrap();
    let script = format!(
        "cd {} && gcc -O1 -pthread x.c -o x && ./x",
        dir.path().display()
    );
    let stdout = stdout_of(&run(Some(OFFLINE), "/bin/sh", &["-c", &script]));
    assert_eq!(stdout, "hi from thread\n");
}

/// The init's order (landlock, no_new_privs, drop capabilities, seccomp last) must leave a
/// working interpreter: seccomp is installed without any capability left.
#[test]
fn full_confinement_sequence_still_runs_python() {
    use crate::confine::{caps, landlock};
    if missing(PYTHON) {
        return;
    }
    if landlock::probe_abi() == 0 {
        eprintln!("skipped: landlock is unavailable");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let rules = landlock::LandlockRules {
        read_exec: ["/usr", "/bin", "/lib", "/lib64", "/etc"]
            .map(Into::into)
            .to_vec(),
        read_write: vec![work.path().to_path_buf(), "/dev/null".into()],
        deny_tcp: true,
        scope_ipc: true,
        ..Default::default()
    };
    let script = format!(
        "import subprocess, threading; open('{}/f', 'w').write('x'); \
         t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); \
         print(subprocess.run(['/bin/cat', '{}/f'], capture_output=True, text=True).stdout)",
        work.path().display(),
        work.path().display()
    );
    let output = std::thread::spawn(move || {
        landlock::restrict_self(&rules).unwrap();
        caps::set_no_new_privs().unwrap();
        caps::drop_all_capabilities().unwrap();
        install(&OFFLINE).unwrap();
        Command::new(PYTHON).args(["-c", &script]).output().unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(stdout_of(&output), "thread\nx\n");
}

fn names(groups: &'static [&'static [Syscall]]) -> Vec<&'static str> {
    every(groups).map(|&(name, _)| name).collect()
}

#[test]
fn lists_have_no_duplicates_and_never_overlap() {
    let allowed = names(ALLOWED);
    let refused = names(REFUSED);
    let unique_allowed: HashSet<_> = allowed.iter().collect();
    let unique_refused: HashSet<_> = refused.iter().collect();
    assert_eq!(
        unique_allowed.len(),
        allowed.len(),
        "duplicate in the allowlist"
    );
    assert_eq!(
        unique_refused.len(),
        refused.len(),
        "duplicate in the refusals"
    );
    let overlap: Vec<_> = unique_allowed.intersection(&unique_refused).collect();
    assert!(overlap.is_empty(), "both allowed and refused: {overlap:?}");
    assert!(!unique_allowed.contains(&"SYS_clone3"));
}

#[test]
fn programs_never_kill_on_a_foreign_architecture() {
    for cfg in [OFFLINE, ONLINE] {
        let filters = build_filters(&cfg).unwrap();
        assert_eq!(filters.len(), 2);
        let enosys = u32::from(SeccompAction::Errno(libc::ENOSYS as u32));
        assert_eq!(filters[0][2].k, enosys);
        assert_eq!(filters[1][2].k, u32::from(SeccompAction::Allow));
        for program in &filters {
            let kills = program.iter().filter(|insn| insn.code == 0x06);
            let kills = kills.filter(|insn| insn.k == libc::SECCOMP_RET_KILL_PROCESS);
            assert_eq!(kills.count(), 0);
        }
    }
}

/// The table filter answers for every number the way the lists say, and checks the same
/// architecture token as seccompiler's program.
#[test]
fn the_syscall_table_follows_the_lists() {
    let program = syscall_table().compile();
    let arguments = &build_filters(&OFFLINE).unwrap()[1];
    assert_eq!(program[1].k, arguments[1].k, "the same architecture check");
    let allow = u32::from(SeccompAction::Allow);
    let eperm = u32::from(SeccompAction::Errno(libc::EPERM as u32));
    let enosys = u32::from(SeccompAction::Errno(libc::ENOSYS as u32));
    let listed = |groups| -> HashSet<u32> { every(groups).map(|&(_, nr)| nr as u32).collect() };
    let (allowed, refused) = (listed(ALLOWED), listed(REFUSED));
    for nr in (0..1024).chain([0x4000_0000 | 39, u32::MAX]) {
        let want = if allowed.contains(&nr) {
            allow
        } else if refused.contains(&nr) {
            eperm
        } else {
            enosys
        };
        assert_eq!(
            table::tests::evaluate(&program, nr, AUDIT_ARCH),
            want,
            "{nr}"
        );
    }
    let i386 = 0x4000_0003;
    assert_eq!(table::tests::evaluate(&program, 20, i386), enosys);
    assert!(
        program.len() < 300,
        "{} instructions: the table should be a search, not a chain",
        program.len()
    );
}

#[test]
fn config_round_trips_through_json() {
    let json = serde_json::to_string(&ONLINE).unwrap();
    assert_eq!(json, r#"{"allow_network":true}"#);
    assert_eq!(
        serde_json::from_str::<SeccompConfig>(&json).unwrap(),
        ONLINE
    );
}

/// The filters compiled ahead ([`prebuilt`]) are the lists' filters, byte for byte, and
/// [`build_filters`] and [`filter_images`] hand out the same programs. After a change to the
/// lists, `AIRLOCK_WRITE_PREBUILT_SECCOMP=1 cargo test -p airlock --lib prebuilt_filters`
/// rewrites the files (then build and run it again, without the variable).
#[test]
fn prebuilt_filters_are_the_compiled_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/confine/seccomp/prebuilt")
        .join(std::env::consts::ARCH);
    let write = std::env::var_os("AIRLOCK_WRITE_PREBUILT_SECCOMP").is_some();
    // `allow_inet` with the network open changes nothing: it shares ONLINE's file.
    let open_and_inet = SeccompConfig {
        allow_inet: true,
        ..ONLINE
    };
    for cfg in [OFFLINE, ONLINE, GATED, open_and_inet] {
        let compiled = compile_filters(&cfg).unwrap();
        let files = [prebuilt::TABLE, prebuilt::arguments_file(&cfg)];
        for (file, program) in files.into_iter().zip(&compiled) {
            let path = dir.join(file);
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, filter_bytes(program)).unwrap();
            } else if cfg!(target_arch = "x86_64") {
                assert!(
                    std::fs::read(&path).unwrap() == filter_bytes(program),
                    "{} is not the compiled filter: regenerate it (see this test's comment)",
                    path.display()
                );
            }
        }
        if write {
            continue;
        }
        assert_eq!(build_filters(&cfg).unwrap(), compiled, "{cfg:?}");
        let images: Vec<Vec<u8>> = compiled.iter().map(|p| filter_bytes(p)).collect();
        let handed: Vec<Vec<u8>> = filter_images(&cfg)
            .unwrap()
            .iter()
            .map(|image| image.to_vec())
            .collect();
        assert_eq!(handed, images, "{cfg:?}");
    }
}
