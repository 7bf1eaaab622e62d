//! Runs a program inside the root filesystem built by `airlock::internals::rootfs::enter`, set up
//! the way the native backend's init sets it up.
//!
//! Usage: `rootfs_probe <plan.json> <program> [args...]`
//!
//! Stage "outer" (this process): when root, drop to uid/gid 65534 so the user namespace is
//! unprivileged on the host; unshare user, mount and pid namespaces; map inner uid/gid 0 to the
//! outer ones (a process may map its own ids); spawn itself again as stage "sandbox-init". After
//! `unshare(CLONE_NEWPID)` only children enter the new pid namespace, so the respawned process is
//! its PID 1. Being uid 0 in its namespace, it keeps all capabilities there across the `execve`.
//! Stage "sandbox-init": `enter(plan)`, report to stderr, then `exec` the program.
//!
//! The integration test `tests/rootfs.rs` includes this file as a module and re-executes its own
//! (single-threaded) binary, so no separate build of this example is needed.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use airlock::internals::rootfs::{enter, validate, RootfsPlan};
use nix::sched::{unshare, CloneFlags};
use nix::sys::prctl::set_dumpable;
use nix::unistd::{getegid, geteuid, setgroups, setresgid, setresuid, Gid, Uid};

/// Selects the stage; absent means "outer".
pub const STAGE_ENV: &str = "AIRLOCK_ROOTFS_PROBE_STAGE";
const PLAN_ENV: &str = "AIRLOCK_ROOTFS_PROBE_PLAN";
/// The outer stage exits with this when the kernel refuses the namespaces (callers may skip).
pub const EXIT_NO_NAMESPACES: u8 = 77;
const EXIT_SETUP_FAILED: u8 = 125;
const EXIT_EXEC_FAILED: u8 = 127;
const NOBODY: u32 = 65534;

fn main() -> ExitCode {
    let stage = std::env::var(STAGE_ENV).unwrap_or_else(|_| "outer".into());
    run_stage(&stage)
}

/// Runs one stage with this process's arguments.
pub fn run_stage(stage: &str) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let result = match stage {
        "sandbox-init" => sandbox_init(&args),
        _ => outer(&args),
    };
    result.unwrap_or_else(|(code, message)| {
        eprintln!("rootfs_probe: {message}");
        ExitCode::from(code)
    })
}

type StageResult = Result<ExitCode, (u8, String)>;

fn setup_failed(message: impl std::fmt::Display) -> (u8, String) {
    (EXIT_SETUP_FAILED, message.to_string())
}

fn outer(args: &[OsString]) -> StageResult {
    let [plan_path, _program, ..] = args else {
        return Err((
            2,
            "usage: rootfs_probe <plan.json> <program> [args...]".into(),
        ));
    };
    let plan_json = std::fs::read_to_string(plan_path)
        .map_err(|e| setup_failed(format!("failed to read {plan_path:?}: {e}")))?;
    let plan: RootfsPlan = serde_json::from_str(&plan_json)
        .map_err(|e| setup_failed(format!("invalid plan {plan_path:?}: {e}")))?;
    validate(&plan).map_err(setup_failed)?;
    if geteuid().is_root() {
        drop_to_nobody().map_err(setup_failed)?;
    }
    enter_namespaces().map_err(|message| (EXIT_NO_NAMESPACES, message))?;
    let exe = std::env::current_exe().map_err(setup_failed)?;
    let status = Command::new(exe)
        .args(args)
        .env(STAGE_ENV, "sandbox-init")
        .env(PLAN_ENV, plan_json)
        .status()
        .map_err(|e| setup_failed(format!("failed to spawn the sandbox init: {e}")))?;
    let code = status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(EXIT_SETUP_FAILED.into());
    Ok(ExitCode::from(
        u8::try_from(code).unwrap_or(EXIT_SETUP_FAILED),
    ))
}

fn drop_to_nobody() -> Result<(), String> {
    let (uid, gid) = (Uid::from_raw(NOBODY), Gid::from_raw(NOBODY));
    setgroups(&[]).map_err(|e| format!("failed to clear supplementary groups: {e}"))?;
    setresgid(gid, gid, gid).map_err(|e| format!("failed to switch to gid {gid}: {e}"))?;
    setresuid(uid, uid, uid).map_err(|e| format!("failed to switch to uid {uid}: {e}"))?;
    // Changing uid cleared "dumpable", which makes /proc/self/{uid_map,...} root-owned.
    set_dumpable(true).map_err(|e| format!("failed to mark the process dumpable: {e}"))
}

fn enter_namespaces() -> Result<(), String> {
    let (uid, gid) = (geteuid(), getegid());
    let flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID;
    unshare(flags).map_err(|e| format!("failed to unshare user, mount and pid namespaces: {e}"))?;
    // setgroups must be denied before an unprivileged process may write its gid_map.
    for (file, contents) in [
        ("setgroups", "deny".to_string()),
        ("uid_map", format!("0 {uid} 1")),
        ("gid_map", format!("0 {gid} 1")),
    ] {
        let path = PathBuf::from("/proc/self").join(file);
        std::fs::write(&path, contents)
            .map_err(|e| format!("failed to write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn sandbox_init(args: &[OsString]) -> StageResult {
    let [_plan_path, program, program_args @ ..] = args else {
        return Err((2, "sandbox init started without a program".into()));
    };
    let plan_json = std::env::var(PLAN_ENV).map_err(setup_failed)?;
    let plan: RootfsPlan = serde_json::from_str(&plan_json).map_err(setup_failed)?;
    let report = enter(&plan).map_err(setup_failed)?;
    eprintln!(
        "rootfs_probe: skipped {:?}, unprotected {:?}",
        report.skipped, report.unprotected
    );
    let error = Command::new(program)
        .args(program_args)
        .env_remove(STAGE_ENV)
        .env_remove(PLAN_ENV)
        .exec();
    Err((
        EXIT_EXEC_FAILED,
        format!("failed to execute {program:?}: {error}"),
    ))
}
