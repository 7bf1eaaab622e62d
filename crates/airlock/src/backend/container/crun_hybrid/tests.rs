//! How crun is kept off this host's hybrid cgroup layout: by the init, or by the command line.

use std::path::Path;

use super::*;
use crate::policy::{builtin, Policy};
use crate::rundir::MemoryScratch;

const RUN_DIR: &str = "/run/airlock/r1";

fn ctx<'a>(policy: &'a Policy, scratch: Option<&'a MemoryScratch>) -> PlanContext<'a> {
    PlanContext {
        fresh_workdir: true,
        scratch,
        ..PlanContext::for_test(
            policy,
            Path::new("/run/airlock/r1/work"),
            Path::new(RUN_DIR),
        )
    }
}

fn in_memory() -> MemoryScratch {
    MemoryScratch {
        runtime_dir: "/run/airlock".into(),
        mounts: Vec::new(),
        needed: true,
    }
}

fn crun_argv() -> Vec<String> {
    vec!["/usr/bin/crun".into(), "run".into()]
}

fn workaround(scratch: Option<&MemoryScratch>, rootless: bool) -> (HybridWorkaround, Vec<RunFile>) {
    let policy = builtin("untrusted").expect("built-in profile");
    let ctx = ctx(&policy, scratch);
    let mut files = Vec::new();
    let bundle = Bundle::new(&ctx);
    let hybrid = crun_hybrid_workaround(crun_argv(), &bundle, &mut files, &ctx, rootless);
    (hybrid, files)
}

#[test]
fn an_init_with_its_own_mount_namespace_hides_the_controller_list_itself() {
    let scratch = in_memory();
    let (hybrid, files) = workaround(Some(&scratch), false);
    assert_eq!(
        hybrid.wrapper_argv,
        crun_argv(),
        "no unshare, sh or mount before crun"
    );
    assert_eq!(
        hybrid.hidden_files,
        [HiddenFile {
            target: "/sys/fs/cgroup/unified/cgroup.controllers".into(),
            empty: "/run/airlock/r1/oci/empty".into(),
        }]
    );
    assert!(files
        .iter()
        .any(|f| f.path == Path::new("/run/airlock/r1/oci/empty") && f.contents.is_empty()));
}

#[test]
fn without_one_the_command_line_hides_it() {
    if find_binary("unshare").is_none() {
        eprintln!("skipped: no unshare (util-linux) on this host");
        return;
    }
    for (scratch, rootless) in [(None, false), (Some(in_memory()), true)] {
        let (hybrid, _) = workaround(scratch.as_ref(), rootless);
        assert!(hybrid.hidden_files.is_empty());
        assert!(
            hybrid.wrapper_argv[0].ends_with("/unshare"),
            "{:?}",
            hybrid.wrapper_argv
        );
        assert_eq!(
            hybrid.wrapper_argv.iter().any(|a| a == "--map-root-user"),
            rootless
        );
        let script = hybrid.wrapper_argv.last().unwrap();
        assert_eq!(
            script,
            "mount --bind -o ro '/run/airlock/r1/oci/empty' \
             '/sys/fs/cgroup/unified/cgroup.controllers' && exec '/usr/bin/crun' 'run'"
        );
    }
}
