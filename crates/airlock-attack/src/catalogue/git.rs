//! Code run on the host through git: a program given a writable workspace plants what git
//! there runs (hooks, config, a replaced `.git`, a replaced submodule, a new repository), and
//! the host's own `git status` and `git commit` in the workspace are the evidence.

use std::path::{Path, PathBuf};

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::host::run_host;
use crate::plan::{Outcome, Plan};
use crate::scene::Scene;

const LAYERS: &str = "git_read_only (each .git read-only, nested ones pinned; planted ones moved aside after the run)";
const EVIDENCE: &str = "the host's `git status` / `git commit` in the workspace ran the planted command (a marker file appeared)";

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("git_hook_in_workspace", (D, Privilege, Tier0), EVIDENCE, LAYERS,
            |s| git_plant(s, "hook", Repository::Plain)),
        attack("git_fsmonitor_in_workspace", (D, Privilege, Tier0), EVIDENCE, LAYERS,
            |s| git_plant(s, "fsmonitor", Repository::Plain)),
        attack("git_dir_replaced_in_workspace", (D, Privilege, Tier0), EVIDENCE, LAYERS,
            |s| git_plant(s, "replace", Repository::Plain)),
        attack("git_submodule_replaced_in_workspace", (D, Privilege, Tier0), EVIDENCE, LAYERS,
            |s| git_plant(s, "nested", Repository::WithSubmodule)),
        attack("git_repository_planted_in_workspace", (D, Privilege, Tier0), EVIDENCE, LAYERS,
            |s| git_plant(s, "plant", Repository::None)),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Repository {
    None,
    Plain,
    /// With a submodule at `vendor/lib` (a gitlink in the index: `git status` runs git there).
    WithSubmodule,
}

/// A workspace given to the sandbox user (gVisor refuses a root-owned one), holding
/// `repository`; the marker lies outside it, where only git on the host could write it.
fn git_plant(s: &mut Scene, mode: &str, repository: Repository) -> Result<Plan, String> {
    let workspace = s.dir.join("workspace");
    s.make_dir(&workspace, 0o777)?;
    make_repository(&workspace, repository)?;
    s.chown_tree_to_sandbox_user(&workspace)?;
    let marker = s.dir.join("git-marker");
    let program = s.python(
        "git_plant.py",
        [
            workspace.display().to_string(),
            marker.display().to_string(),
            mode.to_string(),
        ],
    );
    let host_workspace = workspace.clone();
    let evidence = move |_: &Outcome| host_git_ran(&host_workspace, &marker);
    Ok(Plan::new(program, evidence)
        .flags(["--workdir".to_string(), workspace.display().to_string()])
        .expect(tried_or_moved_aside))
}

/// A contained run means something if the program tried and was refused, or (a repository
/// planted where none was, which no mount can refuse) the run says it moved it aside.
fn tried_or_moved_aside(outcome: &Outcome) -> Result<(), String> {
    let moved = outcome
        .warnings
        .iter()
        .chain([&outcome.cli_stderr])
        .any(|w| w.contains("protect_git: the program created"));
    match outcome.reported() || moved {
        true => Ok(()),
        false => Err(format!(
            "the program neither reported nor had its repository moved aside: {}",
            outcome.text
        )),
    }
}

fn make_repository(dir: &Path, repository: Repository) -> Result<(), String> {
    let mut repos: Vec<PathBuf> = Vec::new();
    if repository == Repository::WithSubmodule {
        std::fs::create_dir_all(dir.join("vendor/lib"))
            .map_err(|e| format!("cannot create the submodule: {e}"))?;
        repos.push(dir.join("vendor/lib"));
    }
    if repository != Repository::None {
        repos.push(dir.to_path_buf());
    }
    for repo in repos {
        std::fs::write(repo.join("file.txt"), "content\n")
            .map_err(|e| format!("cannot write into {}: {e}", repo.display()))?;
        git(&repo, &["init", "-q"])?;
        git(&repo, &["add", "."])?;
        git(&repo, &["commit", "-qm", "init"])?;
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let dir = dir.display().to_string();
    let mut argv = vec!["git", "-C", &dir, "-c", "safe.directory=*"];
    argv.extend(["-c", "user.email=a@example.org", "-c", "user.name=a"]);
    argv.extend(args);
    run_host(&argv)
}

/// What the user does next in the workspace, on the host: `git status`, then a commit.
fn host_git_ran(workspace: &Path, marker: &Path) -> Option<String> {
    let _ = git(workspace, &["status"]);
    let _ = git(workspace, &["commit", "-q", "--allow-empty", "-m", "host"]);
    marker.exists().then(|| {
        format!(
            "git on the host ran the planted command: {} exists",
            marker.display()
        )
    })
}
