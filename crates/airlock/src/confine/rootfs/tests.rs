use super::*;

fn sample_plan(work: &Path) -> RootfsPlan {
    RootfsPlan {
        git_read_only: Vec::new(),
        git_pinned: Vec::new(),
        git_found: Vec::new(),
        protect_git: false,
        system_ro: vec!["/usr".into(), "/bin".into()],
        etc_files: vec!["/etc/ld.so.cache".into(), "/etc/hosts".into()],
        generated_files: vec![GeneratedFile {
            path: "/etc/hosts".into(),
            contents: "127.0.0.1 localhost sandbox\n".into(),
            mode: 0o644,
        }],
        read_only: vec![work.join("data/ro")],
        read_write: vec![work.join("data")],
        workdir: Workdir::Bind {
            host: work.to_path_buf(),
            writable: true,
        },
        tmp: TmpfsSpec {
            size_bytes: 1 << 20,
            max_files: 100,
        },
        dev_shm: TmpfsSpec {
            size_bytes: 1 << 16,
            max_files: 10,
        },
        exec_writable: false,
        workspace: true,
        tty: true,
        hostname: "sandbox".into(),
        proc_hidepid: false,
        unreachable: None,
    }
}

const EXPECTED_OPS: &str = "\
make-private /
mount-new-root
mkdir /etc
mkdir /proc mode=555
mkdir /dev
mkdir /tmp
write /etc/hosts mode=644
mirror-ro /usr
mirror-ro /bin
mirror-ro /etc/ld.so.cache
bind /dev/null rw,nosuid,dev,noexec
bind /dev/zero rw,nosuid,dev,noexec
bind /dev/full rw,nosuid,dev,noexec
bind /dev/random rw,nosuid,dev,noexec
bind /dev/urandom rw,nosuid,dev,noexec
bind /dev/tty rw,nosuid,dev,noexec
symlink /dev/fd -> /proc/self/fd
symlink /dev/stdin -> /proc/self/fd/0
symlink /dev/stdout -> /proc/self/fd/1
symlink /dev/stderr -> /proc/self/fd/2
tmpfs /dev/shm size=65536,nr_inodes=10,mode=1777,noexec
proc hidepid=false
protect /proc/sys ReadOnly
protect /proc/sysrq-trigger ReadOnly
protect /proc/irq ReadOnly
protect /proc/bus ReadOnly
protect /proc/fs ReadOnly
protect /proc/kcore MaskFile
protect /proc/keys MaskFile
protect /proc/key-users MaskFile
protect /proc/kallsyms MaskFile
protect /proc/timer_list MaskFile
protect /proc/timer_stats MaskFile
protect /proc/sched_debug MaskFile
protect /proc/latency_stats MaskFile
protect /proc/kpagecount MaskFile
protect /proc/kpageflags MaskFile
protect /proc/kpagecgroup MaskFile
protect /proc/config.gz MaskFile
protect /proc/acpi MaskDir
protect /proc/asound MaskDir
protect /proc/scsi MaskDir
tmpfs /tmp size=1048576,nr_inodes=100,mode=1777,noexec
bind /w rw,nosuid,nodev,exec
bind /w/data rw,nosuid,nodev,exec
bind /w/data/ro ro,nosuid,nodev,exec
pivot-new-root
remount-ro /
chdir /w
";

fn render(ops: &[MountOp]) -> String {
    ops.iter().map(|op| format!("{op}\n")).collect()
}

#[test]
fn operations_for_sample_plan_match_snapshot() {
    let ops = plan_operations(&sample_plan(Path::new("/w")));
    assert_eq!(render(&ops), EXPECTED_OPS);
}

#[test]
fn git_directories_are_bound_read_only_on_top_of_the_workspace() {
    let mut plan = sample_plan(Path::new("/w"));
    plan.git_pinned = vec!["/w/vendor".into()];
    plan.git_read_only = vec!["/w/.git".into(), "/w/vendor/lib/.git".into()];
    let rendered = render(&plan_operations(&plan));
    let line = |text: &str| {
        rendered
            .find(text)
            .unwrap_or_else(|| panic!("{text:?} not in\n{rendered}"))
    };
    let workspace = line("bind /w rw,nosuid,nodev,exec\n");
    let pinned = line("bind /w/vendor rw,nosuid,nodev,exec\n");
    let git = line("bind /w/.git ro,nosuid,nodev,exec\n");
    let nested = line("bind /w/vendor/lib/.git ro,nosuid,nodev,exec\n");
    assert!(
        workspace < pinned && workspace < git && pinned < nested,
        "{rendered}"
    );
}

#[test]
fn generated_file_content_reaches_its_operation() {
    let ops = plan_operations(&sample_plan(Path::new("/w")));
    let written = ops.iter().find_map(|op| match op {
        MountOp::WriteFile { contents, .. } => Some(contents.as_str()),
        _ => None,
    });
    assert_eq!(written, Some("127.0.0.1 localhost sandbox\n"));
}

#[test]
fn exec_writable_lifts_noexec_from_writable_mounts_only() {
    let mut plan = sample_plan(Path::new("/w"));
    plan.exec_writable = true;
    plan.tty = false;
    plan.workdir = Workdir::Tmpfs {
        path: "/scratch".into(),
        size_bytes: 4096,
        max_files: 8,
    };
    let rendered = render(&plan_operations(&plan));
    assert!(rendered.contains("tmpfs /tmp size=1048576,nr_inodes=100,mode=1777,exec\n"));
    assert!(rendered.contains("tmpfs /scratch size=4096,nr_inodes=8,mode=755,exec\n"));
    assert!(rendered.contains("bind /w/data rw,nosuid,nodev,exec\n"));
    // `/dev` is a directory of the root (sealed read-only and noexec with it), not a mount.
    assert!(!rendered.contains("tmpfs /dev "));
    assert!(!rendered.contains("/dev/tty"));
    assert!(rendered.ends_with("chdir /scratch\n"));
}

#[test]
fn hidepid_is_passed_to_proc() {
    let mut plan = sample_plan(Path::new("/w"));
    plan.proc_hidepid = true;
    let ops = plan_operations(&plan);
    assert!(ops.contains(&MountOp::MountProc { hidepid: true }));
}

#[test]
fn plan_round_trips_through_json() {
    let plan = sample_plan(Path::new("/w"));
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<RootfsPlan>(&json).unwrap(), plan);
}

#[test]
fn defaults_cover_merged_usr_and_linker_config() {
    let system = default_system_ro();
    for path in ["/usr", "/bin", "/lib", "/lib64"] {
        assert!(system.contains(&PathBuf::from(path)), "{path}");
    }
    let etc = default_etc_files();
    assert!(etc.contains(&PathBuf::from("/etc/ld.so.cache")));
    assert!(!etc
        .iter()
        .any(|p| p.ends_with("shadow") || p.ends_with("passwd")));
}

#[test]
fn only_python3_entries_of_etc_are_added_in_order() {
    let etc = tempfile::tempdir().unwrap();
    for name in ["python3.11", "hosts", "python3", "apython3", "python2.7"] {
        std::fs::write(etc.path().join(name), "").unwrap();
    }
    std::fs::create_dir(etc.path().join("python3.12")).unwrap();
    let names: Vec<PathBuf> = ["python3", "python3.11", "python3.12"]
        .iter()
        .map(|name| etc.path().join(name))
        .collect();
    assert_eq!(source::python_etc_entries(etc.path()), names);
    assert!(source::python_etc_entries(&etc.path().join("missing")).is_empty());
}

fn existing_plan() -> (tempfile::TempDir, RootfsPlan) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/ro")).unwrap();
    let plan = sample_plan(dir.path());
    (dir, plan)
}

fn validate_message(plan: &RootfsPlan) -> String {
    validate(plan).unwrap_err().to_string()
}

#[test]
fn validate_accepts_existing_paths() {
    let (_dir, plan) = existing_plan();
    validate(&plan).unwrap();
}

#[test]
fn validate_names_a_missing_read_only_path_and_the_fix() {
    let (dir, mut plan) = existing_plan();
    let missing = dir.path().join("nope");
    plan.read_only.push(missing.clone());
    let message = validate_message(&plan);
    assert_eq!(
        message,
        format!(
            "read-only path {} does not exist on the host; create it or remove it from the policy",
            missing.display()
        )
    );
}

#[test]
fn validate_names_a_missing_workdir() {
    let (dir, mut plan) = existing_plan();
    plan.workdir = Workdir::Bind {
        host: dir.path().join("gone"),
        writable: true,
    };
    assert!(validate_message(&plan).starts_with("workdir path "));
}

#[test]
fn validate_rejects_relative_and_dotdot_paths() {
    let (dir, mut plan) = existing_plan();
    plan.read_write.push("data".into());
    assert_eq!(
        validate_message(&plan),
        "invalid read-write path data: it must be absolute"
    );
    plan.read_write.pop();
    let sneaky = dir.path().join("data/../data");
    plan.read_write.push(sneaky.clone());
    assert_eq!(
        validate_message(&plan),
        format!(
            "invalid read-write path {}: it must not contain `..`",
            sneaky.display()
        )
    );
}

#[test]
fn validate_rejects_root_and_reserved_destinations() {
    for path in ["/", "/proc/1", "/sys/fs/cgroup", "/dev/dri"] {
        let (_dir, mut plan) = existing_plan();
        plan.read_only.push(path.into());
        let message = validate_message(&plan);
        assert!(
            message.starts_with(&format!("invalid read-only path {path}: ")),
            "{message}"
        );
    }
}

#[test]
fn validate_rejects_unbounded_tmpfs() {
    let (_dir, mut plan) = existing_plan();
    plan.tmp.max_files = 0;
    assert_eq!(
        validate_message(&plan),
        "tmpfs for /tmp needs a non-zero size and file count (zero would mean unlimited)"
    );
}

#[test]
fn validate_rejects_generated_file_hidden_by_a_mount() {
    let (_dir, mut plan) = existing_plan();
    plan.generated_files.push(GeneratedFile {
        path: "/tmp/motd".into(),
        contents: String::new(),
        mode: 0o644,
    });
    assert_eq!(
        validate_message(&plan),
        "generated file /tmp/motd lies under the mount at /tmp and would be hidden; \
         move it or drop that mount"
    );
}

#[test]
fn enter_refuses_to_run_outside_a_fresh_pid_namespace() {
    let (_dir, plan) = existing_plan();
    match enter(&plan) {
        Err(RootfsError::NotSandboxInit { pid }) => assert_ne!(pid, 1),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A prepared root holds everything runs share and nothing writable a run could leave behind:
/// the per-run mounts (/proc, /tmp, /dev/shm, a tmpfs workdir) are a run's own, and the
/// shared root is sealed read-only. Together the two halves make the cold plan's mounts.
#[test]
fn a_prepared_root_leaves_every_writable_mount_to_the_run() {
    let mut plan = sample_plan(Path::new("/w"));
    plan.workdir = Workdir::Tmpfs {
        path: "/work".into(),
        size_bytes: 1 << 20,
        max_files: 10,
    };
    plan.read_write.clear();
    plan.read_only = vec!["/srv/data".into()];
    let shared = plan_prepared_root(&plan);
    let per_run = plan_prepared_run(&plan);
    assert!(!shared
        .iter()
        .any(|op| matches!(op, MountOp::Tmpfs { path, .. } if path != Path::new("/dev"))));
    assert!(!shared
        .iter()
        .any(|op| matches!(op, MountOp::MountProc { .. })));
    assert_eq!(
        shared.last(),
        Some(&MountOp::RemountReadOnly { path: "/".into() })
    );
    let fresh: Vec<String> = per_run
        .iter()
        .filter_map(|op| match op {
            MountOp::Tmpfs { path, .. } => Some(path.display().to_string()),
            MountOp::MountProc { .. } => Some("/proc".into()),
            _ => None,
        })
        .collect();
    assert_eq!(fresh, ["/dev/shm", "/proc", "/tmp", "/work"]);
    assert!(!per_run
        .iter()
        .any(|op| matches!(op, MountOp::MirrorReadOnly { .. } | MountOp::Bind { .. })));
    let cold = plan_operations(&plan);
    let mounts = |ops: &[MountOp]| {
        ops.iter()
            .filter(|op| {
                matches!(
                    op,
                    MountOp::MirrorReadOnly { .. }
                        | MountOp::Bind { .. }
                        | MountOp::Tmpfs { .. }
                        | MountOp::ProtectProc { .. }
                        | MountOp::MountProc { .. }
                        | MountOp::Symlink { .. }
                        | MountOp::WriteFile { .. }
                )
            })
            .count()
    };
    assert_eq!(mounts(&shared) + mounts(&per_run), mounts(&cold));
}

/// A caller's bind under a mount each run makes afresh (the workdir in /tmp, say) is made by
/// each run, on top of that mount, as the cold plan orders it.
#[test]
fn a_bind_under_a_per_run_mount_is_made_by_each_run() {
    let mut plan = sample_plan(Path::new("/tmp/w"));
    plan.read_only = vec!["/srv/ro".into()];
    let binds = |ops: &[MountOp]| -> Vec<String> {
        ops.iter()
            .filter_map(|op| match op {
                MountOp::Bind { path, .. } if !path.starts_with("/dev") => {
                    Some(path.display().to_string())
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(binds(&plan_prepared_root(&plan)), ["/srv/ro"]);
    assert_eq!(binds(&plan_prepared_run(&plan)), ["/tmp/w", "/tmp/w/data"]);
    let per_run = plan_prepared_run(&plan);
    let tmp = per_run
        .iter()
        .position(|op| matches!(op, MountOp::Tmpfs { path, .. } if path == Path::new("/tmp")));
    let work = per_run
        .iter()
        .position(|op| matches!(op, MountOp::Bind { path, .. } if path == Path::new("/tmp/w")));
    assert!(tmp < work, "{per_run:?}");
}

/// The runtime directory is reached by a bind of it, of a directory holding it (also through
/// a symlink to one) or of anything in it; the default plan reaches none of airlock's.
#[test]
fn a_plan_reaches_a_directory_through_its_binds_only() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::canonicalize(dir.path()).unwrap();
    let runtime = real.join("run/airlock");
    std::fs::create_dir_all(&runtime).unwrap();
    std::os::unix::fs::symlink(real.join("run"), real.join("link")).unwrap();
    let plan = sample_plan(Path::new("/w"));
    assert!(!plan.reaches(&runtime));
    assert!(!plan.reaches(Path::new("/run/airlock")));
    for path in [real.join("run"), real.join("link"), runtime.join("run-1")] {
        let mut reaching = sample_plan(Path::new("/w"));
        reaching.read_only.push(path.clone());
        assert!(reaching.reaches(&runtime), "{}", path.display());
    }
    let mut workdir = sample_plan(Path::new("/w"));
    workdir.workdir = Workdir::Bind {
        host: real.join("link/airlock"),
        writable: true,
    };
    assert!(workdir.reaches(&runtime));
    let mut beside = sample_plan(Path::new("/w"));
    beside.read_write.push(real.join("run/other"));
    assert!(!beside.reaches(&runtime));
}

/// The `python3*` entries of `/etc` are listed again only when the directory changed: an
/// entry made after a listing was kept shows in the next one.
#[test]
fn python_etc_entries_follow_the_directory() {
    let etc = tempfile::tempdir().unwrap();
    std::fs::create_dir(etc.path().join("python3.11")).unwrap();
    std::fs::write(etc.path().join("passwd"), "").unwrap();
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let age = |when| {
        std::fs::File::open(etc.path())
            .unwrap()
            .set_modified(when)
            .unwrap()
    };
    age(an_hour_ago);
    let listed = |names: &[&str]| names.iter().map(|n| etc.path().join(n)).collect::<Vec<_>>();
    assert_eq!(
        source::python_etc_entries(etc.path()),
        listed(&["python3.11"])
    );
    assert_eq!(
        source::python_etc_entries(etc.path()),
        listed(&["python3.11"])
    );
    std::fs::write(etc.path().join("python3.12"), "").unwrap();
    let both = listed(&["python3.11", "python3.12"]);
    assert_eq!(source::python_etc_entries(etc.path()), both);
    // Kept once settled: an entry made behind a time set back to the same value is not
    // seen (only `utimensat` can do that; every change through the directory moves it).
    let settled = an_hour_ago + std::time::Duration::from_secs(60);
    age(settled);
    assert_eq!(source::python_etc_entries(etc.path()), both);
    std::fs::write(etc.path().join("python3.13"), "").unwrap();
    age(settled);
    assert_eq!(source::python_etc_entries(etc.path()), both);
    age(std::time::SystemTime::now());
    let all = listed(&["python3.11", "python3.12", "python3.13"]);
    assert_eq!(source::python_etc_entries(etc.path()), all);
}
