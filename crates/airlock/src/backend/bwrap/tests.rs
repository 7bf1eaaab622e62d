use std::path::{Path, PathBuf};

use super::*;
use crate::policy::{builtin, NetworkMode, Policy};
use crate::spec::WrapStep;

const RUN_DIR: &str = "/run/airlock/r1";
const WORKDIR: &str = "/run/airlock/r1/work";

fn install() -> BwrapInstall {
    BwrapInstall {
        path: "/usr/bin/bwrap".into(),
        version: (0, 8, 0),
        setuid: false,
    }
}

fn layout() -> HostLayout {
    HostLayout {
        system: vec![
            SystemEntry::Dir("/usr".into()),
            SystemEntry::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
        ],
        etc: vec!["/etc/ld.so.cache".into()],
        identity: vec![(
            "/run/airlock/r1/bwrap-etc/passwd".into(),
            "/etc/passwd".into(),
        )],
    }
}

fn ctx<'a>(policy: &'a Policy, fresh: bool, keep: bool) -> PlanContext<'a> {
    PlanContext {
        fresh_workdir: fresh,
        keep,
        ..PlanContext::for_test(policy, Path::new(WORKDIR), Path::new(RUN_DIR))
    }
}

fn untrusted() -> Policy {
    builtin("untrusted").expect("built-in profile")
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

#[test]
fn untrusted_argv_is_exact() {
    let policy = untrusted();
    let disk = policy.limits.disk.0;
    let expected = words(&format!(
        "/usr/bin/bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session \
         --cap-drop ALL --hostname airlock \
         --ro-bind /usr /usr --symlink usr/bin /bin \
         --ro-bind-try /etc/ld.so.cache /etc/ld.so.cache \
         --ro-bind /run/airlock/r1/bwrap-etc/passwd /etc/passwd \
         --proc /proc --dev /dev --size {disk} --tmpfs /tmp --size {shm} --tmpfs /dev/shm \
         --size {disk} --tmpfs {WORKDIR} --chdir {WORKDIR} \
         --add-seccomp-fd 10 --add-seccomp-fd 11 --json-status-fd 12 --",
        shm = disk.min(64 << 20),
    ));
    assert_eq!(
        bwrap_args(&ctx(&policy, true, false), &install(), &layout()),
        expected
    );
}

#[test]
fn network_is_shared_only_for_host_mode() {
    let mut policy = untrusted();
    let args = bwrap_args(&ctx(&policy, true, false), &install(), &layout());
    assert!(!args.contains(&"--share-net".to_string()));
    policy.network.mode = NetworkMode::Host;
    let args = bwrap_args(&ctx(&policy, true, false), &install(), &layout());
    assert_eq!(
        args[1..4],
        words("--unshare-all --unshare-user --share-net")[..]
    );
}

#[test]
fn kept_or_callers_workdir_is_bound_not_tmpfs() {
    let policy = untrusted();
    for (fresh, keep) in [(true, true), (false, false)] {
        let args = bwrap_args(&ctx(&policy, fresh, keep), &install(), &layout()).join(" ");
        assert!(
            args.contains(&format!("--bind {WORKDIR} {WORKDIR} --chdir {WORKDIR}")),
            "{args}"
        );
        assert!(!args.contains(&format!("--tmpfs {WORKDIR}")), "{args}");
    }
}

#[test]
fn extra_paths_are_bound_with_their_access() {
    let mut policy = untrusted();
    policy.filesystem.read_only.push("/opt/data".into());
    policy.filesystem.read_write.push("/srv/out".into());
    let args = bwrap_args(&ctx(&policy, true, false), &install(), &layout()).join(" ");
    assert!(
        args.contains("--ro-bind /opt/data /opt/data --bind /srv/out /srv/out"),
        "{args}"
    );
}

#[test]
fn old_bwrap_gets_no_disable_userns_and_a_tty_keeps_its_session() {
    let policy = untrusted();
    let old = BwrapInstall {
        version: (0, 6, 2),
        ..install()
    };
    let mut context = ctx(&policy, true, false);
    context.tty = true;
    let args = bwrap_args(&context, &old, &layout());
    assert!(!args.contains(&"--disable-userns".to_string()));
    assert!(!args.contains(&"--new-session".to_string()));
}

#[test]
fn versions_parse() {
    assert_eq!(parse_version("bubblewrap 0.8.0\n"), Some((0, 8, 0)));
    assert_eq!(parse_version("bubblewrap 0.11.0-rc1"), Some((0, 11, 0)));
    assert_eq!(parse_version("bubblewrap 1"), Some((1, 0, 0)));
    assert_eq!(parse_version("garbage"), None);
}

#[test]
fn merged_usr_aliases_become_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("usr")).unwrap();
    std::os::unix::fs::symlink("usr", dir.path().join("alias")).unwrap();
    let paths: Vec<PathBuf> = ["usr", "alias", "missing"]
        .iter()
        .map(|p| dir.path().join(p))
        .collect();
    assert_eq!(
        resolve_system_entries(&paths),
        vec![
            SystemEntry::Dir(dir.path().join("usr")),
            SystemEntry::Symlink {
                path: dir.path().join("alias"),
                target: "usr".into()
            }
        ]
    );
}

#[test]
fn plan_claims_no_landlock_and_hands_over_the_seccomp_filters() {
    let backend = BwrapBackend;
    if !backend.probe().available {
        eprintln!(
            "skipped: bwrap is not usable here: {:?}",
            backend.probe().problems
        );
        return;
    }
    let policy = untrusted();
    let Confinement::Wrapped(wrap) = backend.plan(&ctx(&policy, true, false)).unwrap() else {
        panic!("bwrap must wrap")
    };
    assert_eq!(wrap.seccomp_fds().map(|(_, fds)| fds), Some(&[10, 11][..]));
    assert_eq!(
        wrap.seccomp_fds().map(|(config, _)| config),
        Some(&SeccompConfig {
            allow_network: false,
            allow_inet: false,
        })
    );
    assert!(!wrap.has(&WrapStep::KeepRoot));
    assert!(wrap.has(&WrapStep::MembersStayInRunCgroup));
    assert!(wrap.layers.contains(&Layer::NetNs) && wrap.layers.contains(&Layer::Seccomp));
    for absent in [Layer::LandlockFs, Layer::LandlockNet, Layer::LandlockScope] {
        for probe in [backend.probe(), backend.quick_probe()] {
            assert!(
                !wrap.layers.contains(&absent) && !probe.layers.contains(&absent),
                "{absent:?} is claimed"
            );
        }
    }
    // Without the init's capped mounts (no scratch), bwrap's tmpfs has no inode cap; the
    // probe claims one only where airlock can make those mounts.
    assert!(!wrap.layers.contains(&Layer::InodeQuota));
    let can_mount = crate::confine::caps::can_mount();
    for probe in [backend.probe(), backend.quick_probe()] {
        assert_eq!(probe.layers.contains(&Layer::InodeQuota), can_mount);
    }
    // Every tmpfs has --size; the sandbox's own workdir is one of them.
    assert!(wrap.layers.contains(&Layer::DiskQuota));
    let Confinement::Wrapped(kept) = backend.plan(&ctx(&policy, true, true)).unwrap() else {
        panic!("bwrap must wrap")
    };
    assert!(
        !kept.layers.contains(&Layer::DiskQuota),
        "a kept workdir is a bind without a size cap"
    );
    assert!(wrap.files().all(|f| f.path.starts_with(RUN_DIR)));
    assert!(wrap.files().any(|f| f.path.ends_with("passwd")));
    assert_eq!(wrap.wrapper_argv.last().map(String::as_str), Some("--"));
}

#[test]
fn host_network_plan_claims_no_network_namespace() {
    if !BwrapBackend.probe().available {
        eprintln!("skipped: bwrap is not usable here");
        return;
    }
    let mut policy = untrusted();
    policy.network.mode = NetworkMode::Host;
    let Confinement::Wrapped(wrap) = BwrapBackend.plan(&ctx(&policy, true, false)).unwrap() else {
        panic!("bwrap must wrap")
    };
    assert!(!wrap.layers.contains(&Layer::NetNs));
    assert_eq!(
        wrap.seccomp_fds().map(|(config, _)| config),
        Some(&SeccompConfig {
            allow_network: true,
            allow_inet: false,
        })
    );
}

/// With an in-memory run directory, the writable areas are the init's capped tmpfs mounts,
/// bound by bwrap (whose own tmpfs has no inode cap), and the plan claims the inode cap.
#[test]
fn capped_scratch_mounts_are_bound_instead_of_bwraps_tmpfs() {
    let policy = untrusted();
    let mount = |path: String| crate::confine::rootfs::ScratchMount {
        path: path.into(),
        size_bytes: 1,
        max_files: 1,
        mode: 0o700,
        exec: false,
        owner: None,
    };
    let scratch = crate::rundir::MemoryScratch {
        runtime_dir: "/run/airlock".into(),
        mounts: vec![
            mount(WORKDIR.to_string()),
            mount(format!("{RUN_DIR}/tmp")),
            mount(format!("{RUN_DIR}/shm")),
        ],
        needed: true,
    };
    let mut context = ctx(&policy, true, false);
    context.scratch = Some(&scratch);
    let args = bwrap_args(&context, &install(), &layout()).join(" ");
    for expected in [
        format!("--bind {RUN_DIR}/tmp /tmp"),
        format!("--bind {RUN_DIR}/shm /dev/shm"),
        format!("--bind {WORKDIR} {WORKDIR} --chdir {WORKDIR}"),
    ] {
        assert!(args.contains(&expected), "{expected}: {args}");
    }
    assert!(!args.contains("--tmpfs"), "{args}");
}
