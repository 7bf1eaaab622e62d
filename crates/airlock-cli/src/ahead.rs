//! The init of a cold run, forked first thing (`InitSpawner::fork_ahead`): while this process
//! is still small (the fork copies few page tables, and few pages it shares are written by
//! either side later), and so that the init's own start runs beside the parsing, profile and
//! plan, on the other CPU. Only for the commands that run a sandbox cold; every other one
//! (`doctor`, `profiles`, `--help`, a dry run, a warm pool's or a zygote's run) forks nothing.

use std::ffi::OsString;
use std::sync::{Arc, OnceLock};

use airlock::InitSpawner;

static AHEAD: OnceLock<Arc<InitSpawner>> = OnceLock::new();

/// Forks the init ahead when `args` (the command line after the program's name) run a
/// sandbox cold and no other init program is named (`AIRLOCK_INIT`). Call it before anything
/// starts a thread.
pub fn fork_for(args: &[OsString]) {
    if !runs_cold(args) || std::env::var_os("AIRLOCK_INIT").is_some() {
        return;
    }
    // Nothing forked (threads, or no fork possible): the run forks its init as before.
    if let Ok(Some(spawner)) = InitSpawner::fork_ahead() {
        let _ = AHEAD.set(Arc::new(spawner));
    }
}

/// The init forked ahead, for a cold run's `Command::init_spawner`.
pub fn spawner() -> Option<Arc<InitSpawner>> {
    AHEAD.get().cloned()
}

/// Ends an init forked ahead that no run took, and reaps it (a no-op once a run took it,
/// which reaps it as its init). Called before this process exits, and by the paths that
/// run no cold sandbox after all.
pub fn release() {
    if let Some(spawner) = AHEAD.get() {
        spawner.close();
    }
}

/// Whether `args` look like a cold run: `run` or `exec` without a flag that runs none (a
/// misjudged case only costs a fork, or misses the saving).
fn runs_cold(args: &[OsString]) -> bool {
    let Some(command) = args.first().and_then(|a| a.to_str()) else {
        return false;
    };
    if !matches!(command, "run" | "exec") {
        return false;
    }
    let no_cold_run = ["-h", "--help", "--dry-run", "--warm", "--zygote"];
    !args[1..]
        .iter()
        .take_while(|a| *a != "--")
        .any(|a| a.to_str().is_some_and(|a| no_cold_run.contains(&a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cold(line: &str) -> bool {
        let args: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        runs_cold(&args)
    }

    #[test]
    fn only_cold_runs_fork_ahead() {
        assert!(cold("run -- /bin/true"));
        assert!(cold("run --backend bwrap -- /bin/true --help"));
        assert!(cold("exec python print(1)"));
        for line in [
            "",
            "doctor",
            "profiles",
            "--help",
            "run --help",
            "run --dry-run -- /bin/true",
            "run --warm -- /bin/true",
            "run --zygote -- python3 -c 1",
            "exec --zygote python 1",
            "warm -- /bin/true",
        ] {
            assert!(!cold(line), "{line:?}");
        }
    }
}
