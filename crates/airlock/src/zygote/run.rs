//! One run on a zygote, the host's side: the run's cgroup and pipes, the descriptors handed
//! to the template, the request, the output, the child's report, then the result and the
//! cleanup.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::host::{Zygote, ZygoteRun};
use crate::confine::cgroup::{CgroupVersion, RunCgroup};
use crate::error::Error;
use crate::init::zygote::{decide_status, ChildLine};
use crate::init::ExitReport;
use crate::init::SetupMessage;
use crate::result::{RunResult, RunStatus};
use crate::supervisor::output::{drain, Drained, OutputSink, StreamKind};

/// What the child reported on its report socket.
#[derive(Default)]
struct Report {
    layers: Vec<crate::Layer>,
    warnings: Vec<String>,
    error: Option<crate::SetupError>,
    exit: Option<ExitReport>,
    timed_out: bool,
}

pub(super) fn run(zygote: &Zygote, run: &ZygoteRun) -> Result<RunResult, Error> {
    let started = Instant::now();
    let (cgroup, cgroup_warning) = create_cgroup(zygote);
    let outcome = run_in(zygote, run, cgroup.as_ref(), started).map(|mut result| {
        result.warnings.extend(cgroup_warning);
        result
    });
    if let Some(cgroup) = cgroup {
        zygote.tear_down(cgroup);
    }
    outcome
}

fn run_in(
    zygote: &Zygote,
    run: &ZygoteRun,
    cgroup: Option<&RunCgroup>,
    started: Instant,
) -> Result<RunResult, Error> {
    let tasks = cgroup.map(join_files).transpose()?.unwrap_or_default();
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (report, child_report) =
        UnixStream::pair().map_err(|e| Error::io("cannot create the report socket", e))?;
    let mut fds = vec![
        stdin_read.as_raw_fd(),
        stdout_write.as_raw_fd(),
        stderr_write.as_raw_fd(),
        child_report.as_raw_fd(),
    ];
    fds.extend(tasks.iter().map(|f| f.as_raw_fd()));
    zygote.fork_run(&fds)?;
    drop((stdin_read, stdout_write, stderr_write, child_report, tasks));
    send_request(&report, &zygote.request(run))?;
    let stdin = feed(stdin_write, run.stdin.clone());
    let (stdout_cap, stderr_cap) = zygote.output_caps();
    let stdout = collect(stdout_read, StreamKind::Stdout, stdout_cap);
    let stderr = collect(stderr_read, StreamKind::Stderr, stderr_cap);
    let wall = zygote.plan.spec.limits.wall_time;
    let report = read_report(report, started + wall, cgroup);
    let _ = stdin.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(assemble(zygote, report, cgroup, started, stdout, stderr))
}

/// The run's cgroup, or (as for a cold run) none and a warning when it cannot be created:
/// the limits fall back to rlimits, and a required `cgroup` layer refuses the run unless
/// degradation was accepted.
fn create_cgroup(zygote: &Zygote) -> (Option<RunCgroup>, Option<String>) {
    let Some(request) = &zygote.plan.spec.cgroup else {
        return (None, None);
    };
    let run_id = crate::rundir::new_run_id();
    match RunCgroup::create(&request.config, &run_id, &request.limits) {
        Ok(cgroup) => (Some(cgroup), None),
        Err(e) => (
            None,
            Some(format!(
                "no cgroup for this run ({e}); limits fall back to rlimits"
            )),
        ),
    }
}

/// The files the child writes "0" to, opened here (by the host's user) for the child.
fn join_files(cgroup: &RunCgroup) -> Result<Vec<OwnedFd>, Error> {
    cgroup
        .join_paths()
        .into_iter()
        .map(|procs| match cgroup.version() {
            CgroupVersion::V1 => procs.with_file_name("tasks"),
            CgroupVersion::V2 => procs,
        })
        .map(|path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map(OwnedFd::from)
                .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))
        })
        .collect()
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("cannot create a pipe", e.into()))
}

fn send_request(mut report: &UnixStream, request: &super::wire::RunRequest) -> Result<(), Error> {
    let body = serde_json::to_vec(request)
        .map_err(|e| Error::io("cannot encode the request", std::io::Error::other(e)))?;
    let mut framed = (body.len() as u64).to_le_bytes().to_vec();
    framed.extend(body);
    report
        .write_all(&framed)
        .map_err(|e| Error::io("cannot send the run's request", e))
}

fn feed(pipe: OwnedFd, bytes: Vec<u8>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = std::fs::File::from(pipe).write_all(&bytes);
    })
}

fn collect(pipe: OwnedFd, kind: StreamKind, cap: u64) -> JoinHandle<Drained> {
    std::thread::spawn(move || {
        drain(
            std::fs::File::from(pipe),
            kind,
            &OutputSink::Capture,
            cap,
            || {},
        )
    })
}

/// Reads the child's lines until its exit report or EOF; at the wall-clock deadline every
/// process of the run is killed, with a cgroup or without one.
fn read_report(socket: UnixStream, deadline: Instant, cgroup: Option<&RunCgroup>) -> Report {
    let mut report = Report::default();
    let mut lines = BufReader::new(&socket);
    let mut line = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = if report.timed_out {
            Duration::from_secs(5)
        } else {
            left.max(Duration::from_millis(1))
        };
        let _ = socket.set_read_timeout(Some(wait));
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => return report,
            Ok(_) => {
                if apply_line(&mut report, &line) {
                    return report;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if report.timed_out {
                    return report;
                }
                report.timed_out = true;
                // PID 1 ends (and with it the namespace) when its report socket closes; the
                // cgroup's kill also takes what a run without a new PID namespace would leave.
                let _ = socket.shutdown(std::net::Shutdown::Both);
                if let Some(cgroup) = cgroup {
                    let _ = cgroup.kill_all();
                }
            }
            Err(_) => return report,
        }
    }
}

/// Records one line; true at the exit report.
fn apply_line(report: &mut Report, line: &str) -> bool {
    match serde_json::from_str::<ChildLine>(line.trim_end()) {
        Ok(ChildLine::Setup(SetupMessage::Layers(layers))) => report.layers = layers,
        Ok(ChildLine::Setup(SetupMessage::Warning(warning))) => report.warnings.push(warning),
        Ok(ChildLine::Setup(SetupMessage::Error(error))) => report.error = Some(error),
        Ok(ChildLine::Setup(SetupMessage::Ready)) | Err(_) => {}
        Ok(ChildLine::Exit { exit }) => {
            report.exit = Some(exit);
            return true;
        }
    }
    false
}

fn assemble(
    zygote: &Zygote,
    report: Report,
    cgroup: Option<&RunCgroup>,
    started: Instant,
    stdout: Drained,
    stderr: Drained,
) -> RunResult {
    let wall_ms = started.elapsed().as_millis() as u64;
    let mut result = RunResult::blank(zygote.plan.backend.clone(), wall_ms);
    result.isolation = report.layers;
    result.warnings = zygote.plan.warnings.clone();
    result.warnings.extend(report.warnings);
    result.warnings.extend(zygote.plan.planted_git_warnings());
    result.details = zygote.plan.details.clone();
    result
        .details
        .push("forked from an interpreter zygote".into());
    result.workdir = Some(zygote.plan.spec.workdir.clone());
    result.set_stdout(&stdout.kept);
    result.set_stderr(&stderr.kept);
    (result.stdout_truncated, result.stdout_bytes) = (stdout.truncated, stdout.total);
    (result.stderr_truncated, result.stderr_bytes) = (stderr.truncated, stderr.total);
    if let Some(error) = report.error {
        result.error = Some(error.message.clone());
        result.error_kind = Some(error.kind.into());
        return result;
    }
    let usage = cgroup.map(|c| c.usage()).unwrap_or_default();
    let Some(exit) = report.exit.or(report.timed_out.then(ExitReport::default)) else {
        result.error = Some("the zygote's child ended without a report".into());
        result.error_kind = Some(crate::SetupErrorKind::InitFailed.into());
        return result;
    };
    result.status = decide_status(
        report.timed_out,
        exit,
        &usage,
        zygote.plan.spec.limits.cpu_time,
    );
    result.exit_code = exit.exit_code;
    result.signal = exit.signal;
    let children = exit.children_usage.unwrap_or_default();
    result.cpu_user_ms = children.user_ms;
    result.cpu_sys_ms = children.sys_ms;
    result.peak_memory_bytes = usage.peak_memory_bytes.or(Some(children.max_rss_bytes));
    if usage.pids_limit_hits > 0 {
        result.warnings.push(format!(
            "the process limit ({}) was reached {} times",
            zygote.plan.spec.limits.processes, usage.pids_limit_hits
        ));
    }
    if result.status == RunStatus::SandboxError {
        result.error = Some("the run ended without a status".into());
    }
    result
}
