//! `airlock conformance --prefix "<sandbox command>"`: grades any sandbox command line (bwrap,
//! firejail, unshare, airlock itself) with the same compact set of attacks. Each attack is a
//! Python program run as `<prefix> python3 -c <program> <args>`; wherever an attack has an
//! effect outside the sandbox (a file, a TCP connection, a dead process, a leaked secret) the
//! verdict comes from that host-side evidence, never from what the program claims. Attacks
//! print `ESCAPED ...` / `BLOCKED ...` lines (the convention of tests/attacks).

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

/// Arguments of `airlock conformance`.
#[derive(Args, Debug)]
pub struct ConformanceArgs {
    /// A sandbox command line the attack program is appended to, as a shell fragment, e.g.
    /// "bwrap --unshare-all --ro-bind / /" or "airlock run --" (repeatable: one row each).
    #[arg(long, required = true, value_name = "COMMAND")]
    pub prefix: Vec<String>,
    /// Row labels, in the order of --prefix (default: the prefix itself).
    #[arg(long, value_name = "NAME")]
    pub name: Vec<String>,
    /// The Python interpreter the attacks run with, as seen inside the sandbox.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: String,
    /// Seconds before one attack is stopped.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Where the fs attacks' secret file and drop directory are made: somewhere sandboxes do
    /// not usually replace with a private tmpfs (as they do /tmp and /var/tmp).
    #[arg(long, default_value = "/var/lib", value_name = "DIR")]
    pub bait_dir: PathBuf,
    /// Print JSON instead of a Markdown table.
    #[arg(long)]
    pub json: bool,
}

/// The attack classes, in table order.
pub const CLASSES: &[&str] = &[
    "fs-read",
    "fs-write",
    "network",
    "signal",
    "env",
    "syscalls",
    "privilege",
    "pids",
];

/// Processes the `pids` attack tries to hold at once.
const PIDS_ATTEMPT: u32 = 256;

/// The environment variable carrying the secret the `env` attack looks for.
const SECRET_VAR: &str = "AIRLOCK_CONFORMANCE_SECRET";

/// How one attack went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Blocked,
    Escaped,
    /// The attack program did not run (the sandbox refused to start, python missing, ...).
    NotRun,
}

impl Verdict {
    fn cell(self) -> &'static str {
        match self {
            Verdict::Blocked => "blocked",
            Verdict::Escaped => "**ESCAPED**",
            Verdict::NotRun => "n/a",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Verdict::Blocked => "blocked",
            Verdict::Escaped => "escaped",
            Verdict::NotRun => "not_run",
        }
    }
}

/// One cell of the table with what it was judged on.
#[derive(Debug, Clone)]
pub struct Judged {
    pub class: &'static str,
    pub verdict: Verdict,
    pub evidence: String,
}

pub fn run(args: ConformanceArgs) -> Result<u8> {
    let mut rows = Vec::new();
    for (index, prefix) in args.prefix.iter().enumerate() {
        let name = args
            .name
            .get(index)
            .cloned()
            .unwrap_or_else(|| prefix.clone());
        let cells = CLASSES
            .iter()
            .map(|class| attack(class, prefix, &args))
            .collect::<Result<Vec<_>>>()?;
        rows.push((name, prefix.clone(), cells));
    }
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(name, prefix, cells)| {
                let cells: Vec<_> = cells.iter().map(|c| json!({"class": c.class, "verdict": c.verdict.name(), "evidence": c.evidence})).collect();
                json!({"name": name, "prefix": prefix, "attacks": cells})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", markdown(&rows));
    }
    let escaped = rows
        .iter()
        .flat_map(|(_, _, cells)| cells)
        .any(|c| c.verdict == Verdict::Escaped);
    Ok(u8::from(escaped))
}

fn markdown(rows: &[(String, String, Vec<Judged>)]) -> String {
    let mut out = format!(
        "| sandbox | {} |\n|---|{}\n",
        CLASSES.join(" | "),
        "---|".repeat(CLASSES.len())
    );
    for (name, _, cells) in rows {
        let cells: Vec<&str> = cells.iter().map(|c| c.verdict.cell()).collect();
        out.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    out.push_str("\nevidence:\n");
    for (name, _, cells) in rows {
        for cell in cells {
            out.push_str(&format!("- {name} / {}: {}\n", cell.class, cell.evidence));
        }
    }
    out
}

/// Runs one attack class under `prefix` and judges it.
fn attack(class: &'static str, prefix: &str, args: &ConformanceArgs) -> Result<Judged> {
    let timeout = Duration::from_secs(args.timeout);
    let judged = match class {
        "fs-read" => {
            let bait = Bait::create(&args.bait_dir)?;
            let out = run_probe(
                prefix,
                args,
                READ_FILE,
                &[bait.secret_file().display().to_string()],
                &[],
                timeout,
            )?;
            host_judged(
                class,
                &out,
                out.stdout.contains(&bait.token),
                "the secret file's contents reached stdout",
            )
        }
        "fs-write" => {
            let bait = Bait::create(&args.bait_dir)?;
            let target = bait.drop_dir().join("escaped");
            let out = run_probe(
                prefix,
                args,
                WRITE_FILE,
                &[target.display().to_string()],
                &[],
                timeout,
            )?;
            host_judged(
                class,
                &out,
                target.exists(),
                "a file appeared in the host directory",
            )
        }
        "network" => {
            let listener =
                TcpListener::bind("127.0.0.1:0").context("cannot open the host listener")?;
            listener.set_nonblocking(true)?;
            let port = listener.local_addr()?.port().to_string();
            let out = run_probe(prefix, args, TCP_CONNECT, &[port], &[], timeout)?;
            host_judged(
                class,
                &out,
                listener.accept().is_ok(),
                "the host listener on 127.0.0.1 accepted a connection",
            )
        }
        "signal" => {
            let mut victim = spawn_victim()?;
            let out = run_probe(
                prefix,
                args,
                KILL_PID,
                &[victim.id().to_string()],
                &[],
                timeout,
            )?;
            let died = matches!(victim.try_wait(), Ok(Some(_)));
            let _ = victim.kill();
            let _ = victim.wait();
            host_judged(
                class,
                &out,
                died,
                "a host process outside the sandbox was killed",
            )
        }
        "env" => {
            let token = new_token();
            let out = run_probe(
                prefix,
                args,
                READ_ENV,
                &[SECRET_VAR.to_string()],
                &[(SECRET_VAR, token.as_str())],
                timeout,
            )?;
            host_judged(
                class,
                &out,
                out.stdout.contains(&token),
                "a secret from the caller's environment reached stdout",
            )
        }
        "syscalls" => probe_judged(
            class,
            &run_probe(prefix, args, SYSCALLS, &[], &[], timeout)?,
        ),
        "privilege" => probe_judged(
            class,
            &run_probe(prefix, args, PRIVILEGE, &[], &[], timeout)?,
        ),
        "pids" => probe_judged(
            class,
            &run_probe(
                prefix,
                args,
                PIDS,
                &[PIDS_ATTEMPT.to_string()],
                &[],
                timeout,
            )?,
        ),
        _ => unreachable!("unknown attack class {class}"),
    };
    Ok(judged)
}

/// What an attack program left.
struct ProbeOutput {
    stdout: String,
    stderr: String,
    ran: bool,
}

/// Judges by host-side evidence; the program's claim only decides whether it ran at all.
fn host_judged(class: &'static str, out: &ProbeOutput, escaped: bool, what: &str) -> Judged {
    let claimed = out
        .stdout
        .lines()
        .find(|l| l.starts_with("ESCAPED") || l.starts_with("BLOCKED"))
        .unwrap_or("")
        .to_string();
    let (verdict, evidence) = match (escaped, out.ran) {
        (true, _) => (Verdict::Escaped, format!("host evidence: {what}")),
        (false, true) => (
            Verdict::Blocked,
            format!("no host evidence; the attack said: {claimed}"),
        ),
        (false, false) => (Verdict::NotRun, not_run(out)),
    };
    Judged {
        class,
        verdict,
        evidence,
    }
}

/// Judges an attack whose only effect is inside the caller, by its own report.
fn probe_judged(class: &'static str, out: &ProbeOutput) -> Judged {
    let escapes: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ESCAPED "))
        .collect();
    let blocked: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("BLOCKED "))
        .collect();
    let (verdict, evidence) = if !escapes.is_empty() {
        (
            Verdict::Escaped,
            format!("the attack reported: {}", escapes.join("; ")),
        )
    } else if out.ran {
        (
            Verdict::Blocked,
            format!("the attack reported: {}", blocked.join("; ")),
        )
    } else {
        (Verdict::NotRun, not_run(out))
    };
    Judged {
        class,
        verdict,
        evidence,
    }
}

fn not_run(out: &ProbeOutput) -> String {
    let stderr: String = out.stderr.trim().chars().take(300).collect();
    format!(
        "the attack did not run: {}",
        if stderr.is_empty() {
            "no output"
        } else {
            &stderr
        }
    )
}

/// Runs `<prefix> <python> -c <program> <args...>` through `/bin/sh`, in its own process group.
fn run_probe(
    prefix: &str,
    args: &ConformanceArgs,
    program: &str,
    probe_args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<ProbeOutput> {
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(format!("{prefix} \"$@\""))
        .arg("airlock-conformance")
        .arg(&args.python)
        .arg("-c")
        .arg(program)
        .args(probe_args);
    command
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = command
        .spawn()
        .with_context(|| format!("cannot start /bin/sh for prefix {prefix:?}"))?;
    let (stdout, stderr) = wait_with_timeout(child, timeout)?;
    let ran = stdout
        .lines()
        .any(|l| l.starts_with("ESCAPED") || l.starts_with("BLOCKED"));
    Ok(ProbeOutput {
        stdout,
        stderr,
        ran,
    })
}

fn wait_with_timeout(mut child: Child, timeout: Duration) -> Result<(String, String)> {
    let readers = [
        child.stdout.take().map(read_in_thread),
        child.stderr.take().map(read_in_thread),
    ];
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > timeout {
            // The whole group: sandboxes fork, and sh is only the first process.
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let [out, err] = readers.map(|r| r.map(|h| h.join().unwrap_or_default()).unwrap_or_default());
    Ok((out, err))
}

fn read_in_thread(mut stream: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A host process the `signal` attack tries to kill. When we are root it runs as `nobody`
/// so that only a boundary (not file permissions or uids) can save it from a root attacker,
/// while an unprivileged sandbox user of the same uid could still reach it.
fn spawn_victim() -> Result<Child> {
    let mut command = Command::new("/bin/sleep");
    command
        .arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if running_as_root() {
        command.uid(65534).gid(65534);
    }
    command.spawn().context("cannot start the victim process")
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// A host directory the attacks target: a world-readable secret and a world-writable drop
/// directory, so only the sandbox (not permissions) can stop them. Removed on drop.
struct Bait {
    dir: PathBuf,
    token: String,
}

impl Bait {
    fn create(parent: &Path) -> Result<Bait> {
        // The secret must not be derivable from the path, which error messages echo.
        static BAITS: AtomicU32 = AtomicU32::new(0);
        let token = new_token();
        let name = format!(
            "airlock-conformance-{}-{}",
            std::process::id(),
            BAITS.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let bait = Bait { dir, token };
        set_mode(&bait.dir, 0o755)?;
        std::fs::write(bait.secret_file(), format!("{}\n", bait.token))
            .context("cannot write the secret file")?;
        set_mode(&bait.secret_file(), 0o644)?;
        std::fs::create_dir(bait.drop_dir()).context("cannot create the drop directory")?;
        set_mode(&bait.drop_dir(), 0o777)?;
        Ok(bait)
    }

    fn secret_file(&self) -> PathBuf {
        self.dir.join("secret")
    }

    fn drop_dir(&self) -> PathBuf {
        self.dir.join("drop")
    }
}

impl Drop for Bait {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

fn new_token() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("secret{:x}{:x}", std::process::id(), nanos)
}

const READ_FILE: &str = r#"
import sys
try:
    print(open(sys.argv[1]).read(), end="")
    print("ESCAPED read", sys.argv[1])
except OSError as e:
    print("BLOCKED", e)
"#;

const WRITE_FILE: &str = r#"
import sys
try:
    with open(sys.argv[1], "w") as f:
        f.write("written from inside the sandbox\n")
    print("ESCAPED wrote", sys.argv[1])
except OSError as e:
    print("BLOCKED", e)
"#;

const TCP_CONNECT: &str = r#"
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    print("ESCAPED connected to the host listener")
except OSError as e:
    print("BLOCKED", e)
"#;

const KILL_PID: &str = r#"
import os, signal, sys
try:
    os.kill(int(sys.argv[1]), signal.SIGKILL)
    print("ESCAPED killed pid", sys.argv[1])
except OSError as e:
    print("BLOCKED", e)
"#;

const READ_ENV: &str = r#"
import os, sys
value = os.environ.get(sys.argv[1])
if value:
    print(value)
    print("ESCAPED the caller's secret variable is visible")
else:
    print("BLOCKED the caller's environment did not leak")
"#;

const SYSCALLS: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()
reached = []
pid = os.fork()
if pid == 0:
    os._exit(0 if call(272, 0x10000000)[0] == 0 else 1)
if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0:
    reached.append("unshare(CLONE_NEWUSER) created a user namespace")
result, errno = call(250, 0, -3, 0)
if result >= 0 or errno not in (1, 38):
    reached.append("keyctl reached the session keyring")
if call(425, 1, 0)[1] == 14:
    reached.append("io_uring_setup reached the kernel")
if call(298, 0, 0, -1, -1, 0)[1] == 14:
    reached.append("perf_event_open reached the kernel")
if call(321, 0, 0, 0)[1] in (14, 22):
    reached.append("bpf reached the kernel")
for what in reached:
    print("ESCAPED", what)
if not reached:
    print("BLOCKED unshare(user), keyctl, io_uring, perf_event_open and bpf all refused")
"#;

const PRIVILEGE: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
no_new_privs = libc.prctl(39, 0, 0, 0, 0)
try:
    fields = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
    caps = int(fields["CapEff"].strip(), 16)
except (OSError, KeyError, ValueError):
    caps = None
if caps:
    print("ESCAPED effective capabilities", hex(caps))
if no_new_privs != 1:
    print("ESCAPED no_new_privs is off: setuid programs still raise privileges")
if caps == 0 and no_new_privs == 1:
    print("BLOCKED no capabilities and no_new_privs set")
elif caps is None and no_new_privs == 1:
    print("BLOCKED no_new_privs set (capabilities unreadable)")
"#;

const PIDS: &str = r#"
import os, sys, time
wanted = int(sys.argv[1])
children = []
for _ in range(wanted):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
if len(children) >= wanted:
    print("ESCAPED", wanted, "processes alive at once")
else:
    print("BLOCKED process creation stopped at", len(children))
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn output(stdout: &str) -> ProbeOutput {
        let ran = stdout
            .lines()
            .any(|l| l.starts_with("ESCAPED") || l.starts_with("BLOCKED"));
        ProbeOutput {
            stdout: stdout.into(),
            stderr: "bwrap: boom".into(),
            ran,
        }
    }

    #[test]
    fn host_evidence_overrides_the_attacks_claim() {
        assert_eq!(
            host_judged("fs-write", &output("BLOCKED no\n"), true, "file").verdict,
            Verdict::Escaped
        );
        assert_eq!(
            host_judged("fs-write", &output("ESCAPED wrote\n"), false, "file").verdict,
            Verdict::Blocked
        );
        let not_run = host_judged("fs-write", &output(""), false, "file");
        assert_eq!(not_run.verdict, Verdict::NotRun);
        assert!(not_run.evidence.contains("bwrap: boom"));
    }

    #[test]
    fn any_escape_line_fails_a_self_reported_class() {
        assert_eq!(
            probe_judged("syscalls", &output("ESCAPED keyctl\nBLOCKED x\n")).verdict,
            Verdict::Escaped
        );
        assert_eq!(
            probe_judged("syscalls", &output("BLOCKED all\n")).verdict,
            Verdict::Blocked
        );
        assert_eq!(
            probe_judged("syscalls", &output("Traceback\n")).verdict,
            Verdict::NotRun
        );
    }

    #[test]
    fn the_table_has_a_column_per_class() {
        let cells = CLASSES
            .iter()
            .map(|c| Judged {
                class: c,
                verdict: Verdict::Blocked,
                evidence: String::new(),
            })
            .collect();
        let table = markdown(&[("bare".into(), "env".into(), cells)]);
        let header = table.lines().next().unwrap();
        assert_eq!(header.matches('|').count(), CLASSES.len() + 2);
        assert!(table
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("| bare | blocked |"));
    }
}
