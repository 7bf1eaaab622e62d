use std::path::Path;

use super::*;
use crate::policy::builtin;

fn policy_with_workdir(dir: &Path) -> (Policy, Workdir) {
    let mut policy = builtin("untrusted").unwrap();
    policy.filesystem.workdir = Some(dir.to_path_buf());
    let workdir = Workdir {
        path: dir.to_path_buf(),
        fresh: false,
        owned: false,
    };
    (policy, workdir)
}

#[test]
fn finds_the_root_repository_and_nested_ones_but_not_inside_git() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for path in [
        ".git/hooks",
        ".git/modules/x/hooks",
        "a/b/.git/hooks",
        "c/d",
    ] {
        fs::create_dir_all(root.join(path)).unwrap();
    }
    let (policy, workdir) = policy_with_workdir(root);
    let found = protected_paths(&policy, &workdir).unwrap();
    assert_eq!(
        found.read_only,
        vec![root.join(".git"), root.join("a/b/.git")]
    );
    assert_eq!(found.pinned, vec![root.join("a"), root.join("a/b")]);
}

#[test]
fn a_gitdir_file_protects_itself_and_its_writable_target_and_common_dir() {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir_all(root.join("main/.git/worktrees/wt")).unwrap();
    fs::write(root.join("main/.git/worktrees/wt/commondir"), "../..\n").unwrap();
    fs::create_dir_all(root.join("wt")).unwrap();
    fs::write(root.join("wt/.git"), "gitdir: ../main/.git/worktrees/wt\n").unwrap();
    let (mut policy, workdir) = policy_with_workdir(&root.join("wt"));
    policy.filesystem.read_write.push(root.join("main"));
    let found = protected_paths(&policy, &workdir).unwrap();
    for expected in ["wt/.git", "main/.git", "main/.git/worktrees/wt"] {
        assert!(
            found.read_only.contains(&root.join(expected)),
            "{expected}: {found:?}"
        );
    }
    // Nothing inside a read-only git directory is bound writable again.
    assert!(found.pinned.is_empty(), "{found:?}");
}

#[test]
fn a_git_symlink_or_a_tree_past_the_bound_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.path().join(".git")).unwrap();
    let (policy, workdir) = policy_with_workdir(dir.path());
    let err = protected_paths(&policy, &workdir).unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");

    let deep = tempfile::tempdir().unwrap();
    let mut path = deep.path().to_path_buf();
    for _ in 0..=MAX_DEPTH {
        path.push("d");
    }
    fs::create_dir_all(&path).unwrap();
    let (policy, workdir) = policy_with_workdir(deep.path());
    let err = protected_paths(&policy, &workdir).unwrap_err();
    assert!(err.to_string().contains("directories deep"), "{err}");
    assert!(err.to_string().contains("--protect-git off"), "{err}");
}

#[test]
fn off_or_a_read_only_workdir_walks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join(".git")).unwrap();
    let (mut policy, workdir) = policy_with_workdir(dir.path());
    policy.filesystem.protect_git = GitProtection::Off;
    assert_eq!(
        protected_paths(&policy, &workdir).unwrap(),
        GitMounts::default()
    );
    policy.filesystem.protect_git = GitProtection::ReadOnly;
    policy.filesystem.workdir_read_only = true;
    assert_eq!(
        protected_paths(&policy, &workdir).unwrap(),
        GitMounts::default()
    );
}

#[test]
fn a_bare_repository_is_protected_and_never_pins_above_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for path in ["objects", "refs/heads"] {
        fs::create_dir_all(root.join(path)).unwrap();
    }
    fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let (policy, workdir) = policy_with_workdir(root);
    let found = protected_paths(&policy, &workdir).unwrap();
    assert_eq!(found.read_only, vec![root.to_path_buf()]);
    assert!(found.pinned.is_empty(), "{found:?}");
}

#[test]
fn moving_aside_never_follows_a_directory_swapped_for_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let (root, outside) = (dir.path().join("ws"), dir.path().join("host-repo"));
    fs::create_dir_all(root.join("sub/.git")).unwrap();
    fs::create_dir_all(outside.join(".git")).unwrap();
    let (policy, workdir) = policy_with_workdir(&root);
    let watch = PlantWatch {
        roots: writable_roots(&policy, &workdir),
        known: Vec::new(),
        suffix: "airlock-planted-test".into(),
    };
    // Found, then swapped by a program still running in the same workspace.
    fs::rename(root.join("sub"), root.join("sub2")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();
    let warning = watch.move_aside(&root.join("sub/.git"));
    assert!(warning.contains("could not be moved aside"), "{warning}");
    assert!(outside.join(".git").is_dir(), "the host's .git was moved");
    // Without the swap the planted one is moved.
    fs::remove_file(root.join("sub")).unwrap();
    fs::rename(root.join("sub2"), root.join("sub")).unwrap();
    let warning = watch.move_aside(&root.join("sub/.git"));
    assert!(warning.contains("moved"), "{warning}");
    assert!(!root.join("sub/.git").exists());
}
