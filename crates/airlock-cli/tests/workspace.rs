//! A workspace that works: a directory the caller gives (`--workdir`, `--rw`) is fully usable by
//! the program without changing its ownership on the host. As root, its owner is shown to the
//! program as the program's own user through an idmapped mount, so `git commit`, `./script.sh`
//! and a virtualenv work, and what the program creates belongs on the host to the directory's
//! owner; as a normal user the program is that user. Programs in the caller's directories run
//! (fresh scratch stays noexec); writes outside them stay refused. A backend that cannot do
//! this refuses with a typed error naming the fix, and so does a filesystem without idmapped
//! mounts. `--cwd` runs a script from the current directory, read-only. Committing needs
//! `--protect-git off`: by default the repository's `.git` is read-only (tests/git_guard.rs).

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use support::*;

/// The normal user these tests work as: not `UNPRIVILEGED_UID`, whose processes other test
/// binaries count (without cgroups RLIMIT_NPROC counts every process of the uid on the host).
const WORKSPACE_UID: u32 = 64124;

/// A git repository with a script in it, owned by `uid:gid` on the host (another owner than
/// the caller needs root), in a directory the sandbox user can reach. Under /var/tmp: the sandbox's own /tmp would hide where its parent
/// is on the host.
fn repository(uid: u32, gid: u32) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("airlock-workspace-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let git = |args: &[&str]| {
        let status = Command::new("git")
            .args(["-c", "user.email=t@example.org", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(dir.path().join("notes.txt"), "first\n").unwrap();
    std::fs::write(dir.path().join("script.sh"), "#!/bin/sh\necho script-ran\n").unwrap();
    set_mode(&dir.path().join("script.sh"), 0o755);
    git(&["add", "."]);
    git(&["commit", "-qm", "init"]);
    chown_tree(dir.path(), uid, gid);
    set_mode(dir.path(), 0o755);
    dir
}

/// What the program does in the workspace: commit, run the repository's script, create a
/// file, and (with `venv`) make a virtualenv with Debian's python and run its python.
fn work(venv: bool) -> String {
    let mut script = String::from(
        "set -e; echo second >> notes.txt; \
         git -c user.email=s@example.org -c user.name=s commit -qam change; echo committed; \
         ./script.sh; echo made > created.txt",
    );
    if venv {
        script.push_str(&format!(
            "; {PYTHON} -m venv v && v/bin/python -c 'print(\"venv-ran\")'"
        ));
    }
    script
}

fn check_workspace(what: &str, repo: &Path, result: &Value, venv: bool, owner: (u32, u32)) {
    assert_eq!(result["exit_code"], 0, "{what}: {result}");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    for expected in ["committed", "script-ran"] {
        assert!(stdout.contains(expected), "{what}: {result}");
    }
    if venv {
        assert!(stdout.contains("venv-ran"), "{what}: {result}");
    }
    let created = std::fs::metadata(repo.join("created.txt")).unwrap();
    assert_eq!(
        (created.uid(), created.gid()),
        owner,
        "{what}: owner on the host"
    );
    let log = Command::new("git")
        .args(["-c", "safe.directory=*", "log", "--format=%s"])
        .current_dir(repo)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&log.stdout),
        "change\ninit\n",
        "{what}"
    );
}

/// The backends this host runs, by their flags.
fn backends() -> Vec<(&'static str, &'static [&'static str], bool)> {
    let all: [(&str, &[&str], bool); 6] = [
        ("native", &[], true),
        ("tier0", &["--dev", "--backend", "none"], false),
        ("bwrap", &["--backend", "bwrap", "--allow-degraded"], true),
        (
            "runc",
            &["--backend", "container", "--container-runtime", "runc"],
            true,
        ),
        (
            "crun",
            &["--backend", "container", "--container-runtime", "crun"],
            false,
        ),
        (
            "podman",
            &["--backend", "container", "--container-runtime", "podman"],
            false,
        ),
    ];
    all.into_iter()
        .filter(|(name, flags, _)| {
            let usable = status(&run_json(flags, &["/bin/true"])) == "exited";
            if !usable {
                eprintln!("skipped: backend {name} cannot run here");
            }
            usable
        })
        .collect()
}

#[test]
fn as_root_a_root_owned_repository_is_a_workspace_on_every_backend() {
    if !is_root() {
        return skip("the owner mapping is for runs as root");
    }
    for (name, flags, venv) in backends() {
        let repo = repository(0, 0);
        let workdir = repo.path().to_str().unwrap();
        let mut args = flags.to_vec();
        args.extend(["--workdir", workdir, "--protect-git", "off"]);
        let result = run_json(&args, &["/bin/sh", "-c", &work(venv)]);
        check_workspace(name, repo.path(), &result, venv, (0, 0));
        if name != "tier0" {
            assert!(
                result["details"].to_string().contains("idmapped mount"),
                "{name}: {result}"
            );
        }
        let planted = plant_setuid(&args, repo.path());
        // Tier 0 has no seccomp: the check can fail, and does there.
        assert_eq!(
            planted,
            name == "tier0",
            "{name}: setuid bit on a root-owned file"
        );
    }
}

/// What the program makes in a root-owned workspace is root's on the host: it must never be
/// a setuid or setgid program (seccomp refuses the mode bits). Whether one got through.
fn plant_setuid(flags: &[&str], repo: &Path) -> bool {
    let plant = "cp /bin/true planted; chmod 6755 planted; touch made; chmod g+s made; exit 0";
    let result = run_json(flags, &["/bin/sh", "-c", plant]);
    assert_eq!(result["exit_code"], 0, "{result}");
    ["planted", "made"].iter().any(|name| {
        let meta = std::fs::metadata(repo.join(name)).unwrap();
        assert_eq!(meta.uid(), 0, "{name} is root's on the host");
        meta.mode() & 0o6000 != 0
    })
}

#[test]
fn as_root_a_users_repository_keeps_what_the_program_creates_as_that_users() {
    if !is_root() {
        return skip("the owner mapping is for runs as root");
    }
    let repo = repository(WORKSPACE_UID, WORKSPACE_UID);
    let workdir = repo.path().to_str().unwrap();
    let flags = ["--workdir", workdir, "--protect-git", "off"];
    let result = run_json(&flags, &["/bin/sh", "-c", &work(false)]);
    let owner = (WORKSPACE_UID, WORKSPACE_UID);
    check_workspace("native", repo.path(), &result, false, owner);
}

/// `--rw` paths are the caller's too: mapped and executable like the workdir.
#[test]
fn a_read_write_path_is_usable_and_its_programs_run() {
    let owner = match is_root() {
        true => (0, 0),
        false => (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        ),
    };
    let repo = repository(owner.0, owner.1);
    let path = repo.path().to_str().unwrap();
    let script = format!("cd {path} && {}", work(false));
    let flags = ["--rw", path, "--protect-git", "off"];
    let result = run_json(&flags, &["/bin/sh", "-c", &script]);
    check_workspace("--rw", repo.path(), &result, false, owner);
}

#[test]
fn as_a_normal_user_the_same_works() {
    let setpriv = Path::new("/usr/bin/setpriv");
    if !is_root() || !setpriv.exists() {
        return skip("runs the CLI as a normal user through setpriv, from root");
    }
    let repo = repository(WORKSPACE_UID, WORKSPACE_UID);
    let id = WORKSPACE_UID.to_string();
    let output = Command::new(setpriv)
        .args(["--reuid", &id, "--regid", &id, "--clear-groups"])
        .arg(airlock_bin())
        .args(["run", "--json", "--protect-git", "off", "--workdir"])
        .arg(repo.path())
        .args(["--", "/bin/sh", "-c", &work(true)])
        .env("XDG_RUNTIME_DIR", repo.path().join(".runtime"))
        .env("HOME", repo.path())
        .current_dir("/")
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", stderr_text(&output)));
    let owner = (WORKSPACE_UID, WORKSPACE_UID);
    check_workspace("normal user", repo.path(), &result, true, owner);
}

/// The workspace is the caller's directory, not more: its parent and the rest of the host
/// stay out of reach, and the fresh scratch (`/tmp`) still refuses to execute what is written.
#[test]
fn writes_outside_the_workspace_stay_refused_and_scratch_stays_noexec() {
    if !native_available() {
        return skip("the native backend cannot run here");
    }
    let me = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let repo = repository(me.0, me.1);
    let parent = repo.path().parent().unwrap().to_path_buf();
    let escape = parent.join(unique("airlock-escape-"));
    let script = format!(
        "touch {} 2>/dev/null && echo escaped; cp ./script.sh /tmp/s.sh; /tmp/s.sh 2>/dev/null && echo scratch-exec; true",
        escape.display()
    );
    let workdir = repo.path().to_str().unwrap();
    let result = run_json(&["--workdir", workdir], &["/bin/sh", "-c", &script]);
    assert_eq!(result["exit_code"], 0, "{result}");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    assert!(!stdout.contains("escaped") && !escape.exists(), "{result}");
    assert!(!stdout.contains("scratch-exec"), "{result}");
}

#[test]
fn a_backend_that_cannot_map_the_owner_refuses_with_the_fix() {
    if !is_root() {
        return skip("the owner mapping is for runs as root");
    }
    let gvisor = run_json(&["--backend", "gvisor", "--allow-degraded"], &["/bin/true"]);
    if status(&gvisor) != "exited" {
        return skip("gVisor cannot run here");
    }
    let repo = repository(0, 0);
    let workdir = repo.path().to_str().unwrap();
    let flags = [
        "--backend",
        "gvisor",
        "--allow-degraded",
        "--workdir",
        workdir,
    ];
    let result = run_json(&flags, &["/bin/true"]);
    assert_eq!(result["error_kind"], "workdir_unusable", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("chown -R 65534:65534") && error.contains(workdir),
        "{error}"
    );
}

/// A filesystem without idmapped mounts (ramfs) refuses the run with the fix, instead of
/// running with a workdir the program cannot write.
#[test]
fn a_filesystem_without_idmapped_mounts_is_refused_with_the_fix() {
    if !is_root() {
        return skip("the owner mapping is for runs as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let mount_point = dir.path().to_str().unwrap();
    // In a mount namespace of the test's own: the ramfs never reaches the host's.
    let script = format!(
        "mount -t ramfs none {mount_point} && exec {} run --json --workdir {mount_point} -- /bin/true",
        airlock_bin().display()
    );
    let output = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", stderr_text(&output)));
    assert_eq!(output.status.code(), Some(125), "{result}");
    assert_eq!(result["error_kind"], "workdir_not_mappable", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("without idmapped mounts") && error.contains("chown -R"),
        "{error}"
    );
}

#[test]
fn cwd_runs_a_script_from_the_current_directory_read_only() {
    if !native_available() {
        return skip("the native backend cannot run here");
    }
    let dir = shared_tempdir();
    write_file(
        dir.path(),
        "script.py",
        "print('from the script')\nopen('out.txt', 'w')\n",
    );
    let output = airlock_command()
        .args(["run", "--json", "--cwd", "--", PYTHON, "script.py"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let stdout = result["stdout"].as_str().unwrap_or_default();
    assert_eq!(stdout, "from the script\n", "{result}");
    let stderr = result["stderr"].as_str().unwrap_or_default();
    assert!(stderr.contains("Read-only file system"), "{result}");
    assert!(
        !dir.path().join("out.txt").exists(),
        "wrote into the caller's directory"
    );
}
