//! `airlock run --dry-run` end to end through the real binary: the plan printed as JSON, the
//! same decisions as a real run (backend, refusals, exit codes), and nothing left on the host:
//! no run directory, no cgroup, no runtime directory when there was none.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const SETPRIV: &str = "/usr/bin/setpriv";
/// The uid a dry run is tried as when the tests run as root (the attack suite's unprivileged
/// uid, which nothing else on the host uses).
const UNPRIVILEGED_UID: u32 = 64123;

fn airlock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
}

fn dry_run(command: &mut Command, flags: &[&str], argv: &[&str]) -> (Output, Option<Value>) {
    let output = command
        .args(["run", "--dry-run"])
        .args(flags)
        .arg("--")
        .args(argv)
        .output()
        .expect("airlock runs");
    let plan = serde_json::from_slice(&output.stdout).ok();
    (output, plan)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn path_of(plan: &Value, key: &str) -> PathBuf {
    PathBuf::from(
        plan[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in {plan}")),
    )
}

/// Every cgroup directory named after this run, in any hierarchy.
fn cgroups_named(run_id: &str) -> Vec<PathBuf> {
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten();
    hierarchies
        .flatten()
        .flat_map(|h| [h.path().join("airlock").join(run_id), h.path().join(run_id)])
        .chain([Path::new("/sys/fs/cgroup/airlock").join(run_id)])
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn a_dry_run_prints_the_plan_and_creates_nothing() {
    let (output, plan) = dry_run(&mut airlock(), &[], &["/bin/true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let plan = plan.expect("the plan is JSON on stdout");
    assert!(
        plan["backend"].as_str().is_some_and(|b| !b.is_empty()),
        "{plan}"
    );
    assert!(plan["backend_reason"].as_str().is_some(), "{plan}");
    assert_eq!(plan["argv"], serde_json::json!(["/bin/true"]));
    assert!(
        plan["layers"].as_array().is_some_and(|l| !l.is_empty()),
        "{plan}"
    );
    assert!(plan["limits"]["memory"].is_string(), "{plan}");
    assert!(plan["mounts"].is_array(), "{plan}");
    assert_eq!(plan["workdir_kind"], "fresh");
    // Variable names only: values may be secrets.
    let env = plan["env"].as_array().expect("env names");
    assert!(env
        .iter()
        .all(|name| name.as_str().is_some_and(|n| !n.contains('='))));
    let run_dir = path_of(&plan, "run_dir");
    assert!(
        !run_dir.exists(),
        "the dry run created {}",
        run_dir.display()
    );
    let run_id = run_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(cgroups_named(&run_id), Vec::<PathBuf>::new());
}

#[test]
fn a_dry_run_makes_no_runtime_directory() {
    let home = tempfile::tempdir().unwrap();
    let mut command = match nix::unistd::geteuid().is_root() {
        true if !Path::new(SETPRIV).exists() => {
            eprintln!("skipped: setpriv (util-linux) is needed to plan as uid {UNPRIVILEGED_UID}");
            return;
        }
        true => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
            let id = UNPRIVILEGED_UID.to_string();
            let mut command = Command::new(SETPRIV);
            command
                .args(["--reuid", &id, "--regid", &id, "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_airlock"))
                .current_dir("/");
            command
        }
        false => airlock(),
    };
    command.env("XDG_RUNTIME_DIR", home.path());
    let (output, plan) = dry_run(&mut command, &[], &["/bin/true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let run_dir = path_of(&plan.expect("a plan"), "run_dir");
    assert_eq!(
        run_dir.parent(),
        Some(home.path().join("airlock").as_path())
    );
    let left: Vec<_> = std::fs::read_dir(home.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "the dry run left {left:?}");
}

#[test]
fn backend_none_is_planned_for_the_trusted_profile_and_refused_otherwise() {
    let (output, plan) = dry_run(&mut airlock(), &["--profile", "trusted"], &["/bin/true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let plan = plan.expect("a plan");
    assert_eq!(plan["backend"], "none");
    assert_eq!(plan["verdict"], "runs");
    assert_eq!(plan["mounts"], serde_json::json!([]));
    assert!(
        plan["warnings"].to_string().contains("Tier 0 only"),
        "{plan}"
    );
    let (output, plan) = dry_run(&mut airlock(), &["--backend", "none"], &["/bin/true"]);
    assert_eq!(output.status.code(), Some(125));
    assert!(plan.is_none(), "a refused command has no plan");
    assert!(stderr(&output).contains("--dev"), "{}", stderr(&output));
}

/// bwrap cannot cap inodes without the init's in-memory run directory: a real run is refused
/// (see tests/bwrap.rs), and so is its plan, which says why.
#[test]
fn a_refused_plan_is_printed_and_exits_like_the_refused_run() {
    if !Path::new("/usr/bin/bwrap").exists() {
        eprintln!("skipped: bwrap is not installed (apt-get install bubblewrap)");
        return;
    }
    let flags = ["--backend", "bwrap", "--disk-run-dir"];
    let (output, plan) = dry_run(&mut airlock(), &flags, &["/bin/true"]);
    assert_eq!(output.status.code(), Some(125), "{}", stderr(&output));
    let plan = plan.expect("the refused plan is printed");
    assert_eq!(plan["verdict"], "refused");
    assert!(
        plan["missing"].to_string().contains("inode_quota"),
        "{plan}"
    );
    assert!(plan["missing_reason"].is_string(), "{plan}");
    let said = stderr(&output);
    assert!(
        said.contains("backend bwrap cannot enforce inode_quota")
            && said.contains("--allow-degraded"),
        "{said}"
    );
    let mut accepted = flags.to_vec();
    accepted.push("--allow-degraded");
    let (output, plan) = dry_run(&mut airlock(), &accepted, &["/bin/true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let plan = plan.expect("a plan");
    assert_eq!(plan["verdict"], "runs_degraded");
    assert!(plan["warnings"].to_string().contains("degraded"), "{plan}");
}
