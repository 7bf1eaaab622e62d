//! Runs one attack's plan under a sandbox command line and collects what it left: output,
//! the airlock result if there is one, what the host-side watch saw, the terminal's input.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bait::Terminal;
use crate::catalogue::Attack;
use crate::host::kill;
use crate::plan::{Lifecycle, Outcome, Plan};

/// How the harness starts one run.
pub struct Launch<'a> {
    /// The whole command line: the sandbox's, then the plan's program.
    pub line: Vec<String>,
    /// The working directory unless the plan names one (the scene's directory).
    pub cwd: PathBuf,
    /// Its stdout is `airlock run --json`'s result, to unpack into the outcome.
    pub airlock_result: bool,
    /// Start from an empty environment (PATH and LANG only) instead of the harness's own.
    pub clear_env: bool,
    /// A run still going after this long is killed with its process group.
    pub deadline: Duration,
    /// What [`Lifecycle::KillWhenReady`] without `whole_group` kills.
    pub supervisor: Supervisor,
    /// Every launched pid is recorded here (airlock names its runs' leftovers after it).
    pub pids: Option<&'a Mutex<Vec<u32>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Supervisor {
    /// The launched process is the sandbox's supervisor (the airlock CLI).
    Launched,
    /// The launched process is a shell around the sandbox command: its children are.
    ChildrenOfLaunched,
}

/// Runs `plan` as `launch` says; `Err` when it could not be run as planned.
pub fn execute(plan: &mut Plan, launch: Launch) -> Result<Outcome, String> {
    let (mut command, terminal) = command_for(plan, &launch)?;
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
    if let Some(pids) = launch.pids {
        pids.lock().unwrap().push(child.id());
    }
    let ready = Arc::new(AtomicBool::new(false));
    let stdout = collect(child.stdout.take().expect("piped stdout"), Some(&ready));
    let stderr = collect(child.stderr.take().expect("piped stderr"), None);
    let finished = Arc::new(AtomicBool::new(false));
    let watcher = spawn_watch(plan, &finished);
    let waited = wait(&mut child, plan.lifecycle, &launch, &ready);
    let mut outcome = Outcome {
        elapsed: started.elapsed(),
        cli_pid: Some(child.id()),
        ..Outcome::default()
    };
    finished.store(true, Ordering::SeqCst);
    waited?;
    outcome.watched = watcher.and_then(|w| w.join().ok()).flatten();
    outcome.pty_input = terminal.map(|t| t.pending_input());
    let (stdout, stderr) = (stdout.finish(), stderr.finish());
    outcome.cli_stderr = stderr.clone();
    if !(launch.airlock_result && read_airlock_result(&stdout, &mut outcome)) {
        outcome.text = format!("{stdout}\n{stderr}");
    }
    Ok(outcome)
}

/// The command of one run (in its own process group: a group kill reaches the supervisor and
/// its init, never the harness), and the terminal on its stdin if the plan wants one.
fn command_for(plan: &Plan, launch: &Launch) -> Result<(Command, Option<Terminal>), String> {
    let line = with_inherited_fd7(plan, launch.line.clone());
    let mut command = Command::new(&line[0]);
    command.args(&line[1..]);
    if launch.clear_env {
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C.UTF-8");
    }
    command
        .envs(plan.env.iter().cloned())
        .current_dir(plan.cwd.as_ref().unwrap_or(&launch.cwd))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .process_group(0);
    let terminal = match plan.lifecycle {
        Lifecycle::Terminal => Some(Terminal::open()?),
        _ => None,
    };
    if let Some(terminal) = &terminal {
        command.stdin(Stdio::from(terminal.slave()?));
    }
    Ok((command, terminal))
}

/// Waits for the run to end, or to say READY and then kills its supervisor.
fn wait(
    child: &mut Child,
    lifecycle: Lifecycle,
    launch: &Launch,
    ready: &AtomicBool,
) -> Result<(), String> {
    let Lifecycle::KillWhenReady { whole_group } = lifecycle else {
        wait_with_deadline(child, launch.deadline);
        return Ok(());
    };
    let ready = wait_for(Duration::from_secs(30), || ready.load(Ordering::SeqCst));
    kill_supervisor(child, whole_group, launch.supervisor);
    if !ready {
        return Err("the program never said READY".into());
    }
    // Give whatever should notice the death (the init, PID 1's parent-death signal) time to
    // act before looking for survivors.
    std::thread::sleep(Duration::from_millis(1000));
    Ok(())
}

/// `bash -c 'exec 7<FILE; exec "$@"' FILE LINE...`: the caller leaks a descriptor.
fn with_inherited_fd7(plan: &Plan, line: Vec<String>) -> Vec<String> {
    let Some(secret_file) = &plan.inherit_fd7 else {
        return line;
    };
    let mut wrapped = vec![
        "/bin/bash".to_string(),
        "-c".into(),
        "exec 7<\"$0\"; exec \"$@\"".into(),
        secret_file.display().to_string(),
    ];
    wrapped.extend(line);
    wrapped
}

fn kill_supervisor(child: &mut Child, whole_group: bool, supervisor: Supervisor) {
    let pid = child.id() as i32;
    match (whole_group, supervisor) {
        (true, _) => kill(-pid),
        (false, Supervisor::Launched) => kill(pid),
        (false, Supervisor::ChildrenOfLaunched) => {
            for child_pid in children_of(pid) {
                kill(child_pid);
            }
            kill(pid);
        }
    }
    let _ = child.wait();
}

fn children_of(parent: i32) -> Vec<i32> {
    let parent_of = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| parent_of(pid) == Some(parent))
        .collect()
}

/// Unpacks `airlock run --json`'s result; false when stdout is not one.
fn read_airlock_result(stdout: &str, outcome: &mut Outcome) -> bool {
    let Ok(result) = serde_json::from_str::<Value>(stdout) else {
        return false;
    };
    if result.get("status").is_none() {
        return false;
    }
    let strings = |name: &str| -> Vec<String> {
        result[name]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    // A run refused before it started (`--json` prints that too) has no status.
    let started = result["backend"] != "";
    outcome.status = result["status"]
        .as_str()
        .filter(|_| started)
        .map(str::to_string);
    outcome.layers = strings("isolation");
    outcome.cgroup = outcome.layers.iter().any(|l| l == "cgroup");
    outcome.warnings = strings("warnings");
    outcome.details = strings("details");
    let field = |name: &str| result[name].as_str().unwrap_or_default().to_string();
    outcome.text = format!("{}\n{}", field("stdout"), field("stderr"));
    if let Some(error) = result["error"].as_str() {
        outcome.cli_stderr = format!("sandbox error: {error}; {}", outcome.cli_stderr);
    }
    true
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
    if !wait_for(limit, || matches!(child.try_wait(), Ok(Some(_)))) {
        kill(-(child.id() as i32));
        let _ = child.wait();
    }
}

/// Polls `done` every few milliseconds for up to `limit`; whether it came true.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads a pipe to the end in a thread; sets `ready` when a line says READY.
struct Collector {
    buffer: Arc<Mutex<Vec<u8>>>,
    reader: JoinHandle<()>,
}

fn collect(pipe: impl Read + Send + 'static, ready: Option<&Arc<AtomicBool>>) -> Collector {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&buffer);
    let ready = ready.cloned();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if line.trim_ascii() == b"READY" {
                if let Some(ready) = &ready {
                    ready.store(true, Ordering::SeqCst);
                }
            }
            sink.lock().unwrap().extend_from_slice(&line);
            line.clear();
        }
    });
    Collector { buffer, reader }
}

impl Collector {
    /// The text so far once the pipe closes, or after a few seconds if something still holds
    /// it open (then that something is itself evidence the survivor checks find).
    fn finish(self) -> String {
        wait_for(Duration::from_secs(5), || self.reader.is_finished());
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }
}

/// Runs `run` over `attacks` (with each one's index), `parallel` at a time, then the
/// exclusive ones alone; the results come back in the order of `attacks`.
pub fn run_all<T: Send>(
    attacks: &[Attack],
    parallel: usize,
    run: impl Fn(usize, &Attack) -> T + Sync,
) -> Vec<T> {
    let slots: Vec<Mutex<Option<T>>> = attacks.iter().map(|_| Mutex::new(None)).collect();
    for (exclusive, workers) in [(false, parallel), (true, 1)] {
        let batch: Vec<usize> = (0..attacks.len())
            .filter(|&i| attacks[i].exclusive == exclusive)
            .collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    while let Some(&i) = batch.get(next.fetch_add(1, Ordering::SeqCst)) {
                        *slots[i].lock().unwrap() = Some(run(i, &attacks[i]));
                    }
                });
            }
        });
    }
    slots
        .into_iter()
        .map(|slot| slot.into_inner().unwrap().expect("every attack ran"))
        .collect()
}
