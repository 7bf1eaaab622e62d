use super::*;
use crate::backend::oci::{HostIds, OciMounts, OciResources, OciRlimit};

fn oci() -> OciInput {
    OciInput {
        argv: vec!["/usr/bin/python3".into(), "-c".into(), "print(1)".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/run/airlock/r1/work".into(),
        uid: 65534,
        gid: 65534,
        hostname: "airlock".into(),
        rootfs: "/run/airlock/r1/oci/rootfs".into(),
        mounts: OciMounts {
            system_ro: vec!["/usr".into(), "/bin".into()],
            files_ro: vec![("/etc/ld.so.cache".into(), "/etc/ld.so.cache".into())],
            read_only: vec!["/usr/share/x".into()],
            read_write: vec!["/srv/out".into()],
            workdir: "/run/airlock/r1/work".into(),
            git_read_only: Vec::new(),
            git_pinned: Vec::new(),
            git_sources: Vec::new(),
            workdir_tmpfs: false,
            workdir_read_only: false,
            tmp_bytes: 1 << 20,
            tmp_files: 100,
            shm_bytes: 1 << 20,
            exec_writable: false,
            workspace: true,
            scratch_binds: None,
        },
        host_network: false,
        gated: false,
        resolv_conf: None,
        resources: OciResources {
            memory_bytes: Some(64 << 20),
            pids: Some(32),
            cpus: Some(0.5),
        },
        rlimits: vec![OciRlimit {
            kind: "RLIMIT_NOFILE",
            soft: 256,
            hard: 256,
        }],
        cgroups_path: None,
        seccomp: None,
        user_namespace: Some(HostIds {
            uid: 100_000,
            gid: 100_000,
        }),
    }
}

fn podman(cgroups: EngineCgroups) -> EngineInput {
    EngineInput {
        engine: Engine::Podman,
        binary: "/usr/bin/podman".into(),
        name: "airlock-r1".into(),
        oci: oci(),
        identity_files: vec![(
            "/run/airlock/r1/oci/rootfs/etc/hosts".into(),
            "/etc/hosts".into(),
        )],
        seccomp_profile: Some("/run/airlock/r1/oci/seccomp.json".into()),
        cgroups,
        storage: Some(PodmanStorage {
            root: "/run/airlock/r1/oci/podman/root".into(),
            runroot: "/run/airlock/r1/oci/podman/run".into(),
            tmpdir: "/run/airlock/r1/oci/podman/tmp".into(),
        }),
        oci_runtime: Some("/usr/bin/crun".into()),
        nproc: 1000,
        pid_file: Some("/run/airlock/r1/oci/pid".into()),
        self_destruct_after: None,
    }
}

fn docker() -> EngineInput {
    EngineInput {
        engine: Engine::Docker,
        binary: "/usr/bin/docker".into(),
        storage: None,
        oci_runtime: None,
        cgroups: EngineCgroups::Own { parent: None },
        pid_file: None,
        self_destruct_after: Some(183),
        ..podman(EngineCgroups::Inherit)
    }
}

fn golden(name: &str, argv: &[String]) {
    crate::golden::assert_golden("engine", name, &(argv.join("\n") + "\n"));
}

/// `flag value` appears as adjacent arguments.
fn has(argv: &[String], flag: &str, value: &str) -> bool {
    argv.windows(2).any(|w| w[0] == flag && w[1] == value)
}

#[test]
fn podman_argv_matches_golden() {
    golden("podman.txt", &engine_argv(&podman(EngineCgroups::Inherit)));
}

#[test]
fn podman_with_its_own_cgroup_matches_golden() {
    let input = podman(EngineCgroups::Own {
        parent: Some("/airlock/r1".into()),
    });
    golden("podman-own-cgroup.txt", &engine_argv(&input));
}

#[test]
fn docker_argv_matches_golden() {
    golden("docker.txt", &engine_argv(&docker()));
}

#[test]
fn both_engines_lock_the_container_down() {
    for input in [podman(EngineCgroups::Inherit), docker()] {
        let argv = engine_argv(&input);
        assert!(has(&argv, "--network", "none"), "{argv:?}");
        assert!(has(&argv, "--cap-drop", "all"));
        assert!(has(&argv, "--security-opt", "no-new-privileges"));
        assert!(has(
            &argv,
            "--security-opt",
            "seccomp=/run/airlock/r1/oci/seccomp.json"
        ));
        assert!(argv.contains(&"--read-only".to_string()));
        assert!(has(&argv, "--user", "65534:65534"));
        assert!(has(&argv, "--hostname", "airlock"));
        assert!(has(&argv, "--ulimit", "nofile=256:256"));
        assert!(has(&argv, "--ulimit", "nproc=1000:1000"));
        assert!(has(&argv, "--env", "PATH=/usr/bin:/bin"));
        assert!(has(&argv, "--workdir", "/run/airlock/r1/work"));
        let tmp = "/tmp:rw,nosuid,nodev,noexec,mode=1777,size=1048576";
        let inodes = match input.engine {
            Engine::Podman => String::new(),
            Engine::Docker => ",nr_inodes=100".into(),
        };
        assert!(has(&argv, "--tmpfs", &format!("{tmp}{inodes}")), "{argv:?}");
        assert!(
            has(
                &argv,
                "--volume",
                "/run/airlock/r1/oci/rootfs/etc/hosts:/etc/hosts:ro"
            ) || has(
                &argv,
                "--volume",
                "/run/airlock/r1/oci/rootfs/etc/hosts:/etc/hosts:ro,nosuid,nodev"
            )
        );
        assert!(
            !argv.iter().any(|a| a.starts_with("/etc:")),
            "no /etc bind: {argv:?}"
        );
        assert!(argv.ends_with(&["/usr/bin/python3".into(), "-c".into(), "print(1)".into()]));
    }
}

#[test]
fn host_network_drops_the_network_flag() {
    let mut input = podman(EngineCgroups::Inherit);
    input.oci.host_network = true;
    assert!(!engine_argv(&input).contains(&"--network".to_string()));
}

#[test]
fn an_inherited_cgroup_takes_no_resource_flags() {
    let argv = engine_argv(&podman(EngineCgroups::Inherit));
    assert!(argv.contains(&"--cgroups=disabled".to_string()));
    for flag in ["--memory", "--pids-limit", "--cpus", "--cgroup-parent"] {
        assert!(!argv.contains(&flag.to_string()), "{flag} in {argv:?}");
    }
}

#[test]
fn an_own_cgroup_carries_the_limits_under_the_runs_cgroup() {
    let argv = engine_argv(&podman(EngineCgroups::Own {
        parent: Some("/airlock/r1".into()),
    }));
    assert!(has(&argv, "--cgroup-parent", "/airlock/r1"));
    assert!(has(&argv, "--memory", &(64u64 << 20).to_string()));
    assert!(has(&argv, "--memory-swap", &(64u64 << 20).to_string()));
    assert!(has(&argv, "--pids-limit", "32"));
    assert!(has(&argv, "--cpus", "0.5"));
}

#[test]
fn writable_binds_are_noexec_on_podman_unless_asked() {
    let mut input = podman(EngineCgroups::Inherit);
    assert!(has(
        &engine_argv(&input),
        "--volume",
        "/srv/out:/srv/out:rw,nosuid,nodev,noexec"
    ));
    input.oci.mounts.exec_writable = true;
    assert!(has(
        &engine_argv(&input),
        "--volume",
        "/srv/out:/srv/out:rw,nosuid,nodev,exec"
    ));
}

#[test]
fn podman_maps_only_root_and_the_program_id() {
    let argv = engine_argv(&podman(EngineCgroups::Inherit));
    assert!(has(&argv, "--uidmap", "0:100000:1"));
    assert!(has(&argv, "--uidmap", "65534:65534:1"));
    assert!(has(&argv, "--gidmap", "65534:65534:1"));
    assert!(!engine_argv(&docker()).contains(&"--uidmap".to_string()));
}

#[test]
fn podman_keeps_its_state_in_the_run_directory_and_uses_the_skeleton_root() {
    let argv = engine_argv(&podman(EngineCgroups::Inherit));
    assert!(has(&argv, "--root", "/run/airlock/r1/oci/podman/root"));
    assert!(has(&argv, "--runroot", "/run/airlock/r1/oci/podman/run"));
    assert!(has(&argv, "--tmpdir", "/run/airlock/r1/oci/podman/tmp"));
    assert!(has(&argv, "--rootfs", "/run/airlock/r1/oci/rootfs"));
    assert!(has(&argv, "--runtime", "/usr/bin/crun"));
}

#[test]
fn docker_starts_from_the_empty_image_and_destructs_on_its_own() {
    let argv = engine_argv(&docker());
    assert!(has(&argv, "--pull", "never"));
    let image = argv.iter().position(|a| a == DOCKER_EMPTY_IMAGE).unwrap();
    assert_eq!(
        argv[image + 1..image + 5],
        ["/usr/bin/timeout", "--signal", "KILL", "183s"]
    );
    assert!(!argv.contains(&"--rootfs".to_string()));
    assert!(!argv.iter().any(|a| a == "--root" || a == "--runtime"));
}

#[test]
fn docker_script_imports_the_empty_image_once_then_runs() {
    let script = docker_script(Path::new("/usr/bin/docker"), &engine_argv(&docker()));
    assert!(script.starts_with("'/usr/bin/docker' image inspect airlock/empty:1"));
    assert!(script
        .contains("tar -cf - --files-from /dev/null | '/usr/bin/docker' import - airlock/empty:1"));
    assert!(script.contains("; exec '/usr/bin/docker' 'run' '--rm'"));
}

#[test]
fn docker_seccomp_profile_has_the_engine_format() {
    let profile = crate::backend::oci::docker_seccomp_profile(&crate::backend::oci::OciSeccomp {
        allow_network: false,
        allow_inet: false,
        allow_clone3: false,
    });
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    assert!(profile["architectures"].is_array());
    let rules = profile["syscalls"].as_array().unwrap();
    assert!(rules
        .iter()
        .all(|r| r["names"].is_array() && r["action"].is_string()));
}

/// With the init's capped tmpfs mounts, podman binds them as `/tmp` and `/dev/shm` instead of
/// its own tmpfs, which podman 4 cannot cap in inodes.
#[test]
fn podman_binds_the_inits_capped_mounts_when_there_are_some() {
    let mut input = podman(EngineCgroups::Inherit);
    input.oci.mounts.scratch_binds = Some(crate::backend::oci::ScratchBinds {
        tmp: "/run/airlock/r1/tmp".into(),
        shm: "/run/airlock/r1/shm".into(),
    });
    let argv = engine_argv(&input);
    assert!(
        !argv.iter().any(|a| a == "--tmpfs" || a == "--shm-size"),
        "{argv:?}"
    );
    for volume in [
        "/run/airlock/r1/tmp:/tmp:rw,nosuid,nodev,noexec",
        "/run/airlock/r1/shm:/dev/shm:rw,nosuid,nodev,noexec",
    ] {
        assert!(has(&argv, "--volume", volume), "{volume}: {argv:?}");
    }
}
