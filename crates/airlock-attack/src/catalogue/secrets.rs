//! Reading what the host holds: files in well-known places, other processes' environment and
//! command line, links, shared memory, the caller's environment and descriptors.

use std::os::unix::fs::symlink;
use std::path::PathBuf;

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::host::{run_host, HOST_PYTHON};
use crate::plan::{output_has, Plan};
use crate::program::program;
use crate::scene::Scene;

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("read_root_canary", (C, FsRead, Tier0AsRoot),
            "secret of `/root/…` in the output",
            "rootfs built from scratch (no /root), Landlock fs, uid drop",
            read_root_canary)
            .root_only("a canary in /root is unreadable to uid 65534 anyway"),
        attack("read_host_tmp_canary", (C, FsRead, Tier0),
            "secret of a host `/tmp` file",
            "rootfs (private /tmp tmpfs), Landlock fs",
            read_host_tmp_canary),
        attack("read_home_canary", (C, FsRead, Tier0),
            "secret of a `/home/…/.ssh-id_ed25519`",
            "rootfs (no /home), Landlock fs",
            read_home_canary),
        attack("read_etc_canary", (C, FsRead, Tier0),
            "secret of `/etc/airlock-canary-…`",
            "rootfs (minimal /etc from a list), Landlock fs",
            read_etc_canary),
        attack("read_caller_cwd_canary", (C, FsRead, Tier0),
            "secret of `.env` in the caller's cwd",
            "rootfs, Landlock fs",
            read_caller_cwd_canary),
        attack("read_dev_shm_canary", (C, FsRead, Tier0),
            "secret of a host `/dev/shm` file",
            "rootfs (private /dev/shm)",
            read_dev_shm_canary),
        attack("read_via_proc_1_root", (C, FsRead, Bare),
            "secret read via `/proc/1/root/…`",
            "PID namespace (PID 1 is the sandbox's), fresh /proc",
            read_via_proc_1_root),
        attack("read_host_pid_environ", (C, Env, Tier0),
            "secret in a same-uid host process's environ",
            "PID namespace + fresh /proc",
            read_host_pid_environ),
        attack("read_host_pid_cmdline", (C, Env, Tier0),
            "secret in a host process's cmdline",
            "PID namespace + fresh /proc",
            read_host_pid_cmdline),
        attack("read_via_host_pid_root", (C, FsRead, Tier0),
            "secret via `/proc/<host pid>/root/…`",
            "PID namespace + fresh /proc",
            read_via_host_pid_root),
        attack("read_through_planted_symlink", (C, FsRead, Tier0),
            "secret via a host-planted symlink in a `--ro` dir",
            "rootfs (links resolve in the sandbox's view), Landlock fs",
            read_through_planted_symlink),
        attack("read_through_own_symlink", (C, FsRead, Tier0),
            "secret via a symlink the program makes",
            "rootfs, Landlock fs",
            read_through_own_symlink),
        attack("read_through_hardlink", (C, FsRead, Tier0),
            "secret via a hardlink into a writable dir",
            "rootfs (target not visible), Landlock fs",
            read_through_hardlink),
        attack("read_sysv_shm_segment", (C, Ipc, Tier0),
            "secret in a host SysV shm segment",
            "seccomp (SysV IPC not allowed), IPC namespace",
            read_sysv_shm_segment),
        attack("read_parent_env", (C, Env, Bare),
            "secret in the caller's environment",
            "env scrub, PID namespace, non-dumpable supervisor and init",
            read_parent_env),
        attack("read_inherited_fd", (C, Env, Bare),
            "secret behind fd 7 the caller leaked",
            "fd close (Tier 0)",
            read_inherited_fd),
        attack("open_by_handle_shocker", (C, FsRead, Bare),
            "secret opened by file handle through the `--ro` mount",
            "seccomp (file handles refused), capabilities dropped",
            open_by_handle_shocker),
    ]
}

/// A secret in a file at `path`, read with `read_path.py`.
fn read_canary(s: &mut Scene, path: PathBuf) -> Result<Plan, String> {
    let secret = s.plant(&path, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [path.display().to_string()]),
        output_has(secret),
    ))
}

fn read_root_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/root/airlock-canary-{}", s.marker));
    read_canary(s, path)
}

fn read_host_tmp_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    read_canary(s, path)
}

fn read_home_canary(s: &mut Scene) -> Result<Plan, String> {
    let dir = PathBuf::from(format!("/home/airlock-attack-{}", s.marker));
    s.make_dir(&dir, 0o755)?;
    read_canary(s, dir.join(".ssh-id_ed25519"))
}

fn read_etc_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/etc/airlock-canary-{}", s.marker));
    read_canary(s, path)
}

fn read_caller_cwd_canary(s: &mut Scene) -> Result<Plan, String> {
    let cwd = s.dir.join("caller-cwd");
    s.make_dir(&cwd, 0o755)?;
    let path = cwd.join(".env");
    let secret = s.plant(&path, 0o644)?;
    let mut plan = Plan::new(
        s.python("read_path.py", [path.display().to_string(), ".env".into()]),
        output_has(secret),
    );
    plan.cwd = Some(cwd);
    Ok(plan)
}

fn read_dev_shm_canary(s: &mut Scene) -> Result<Plan, String> {
    let path = PathBuf::from(format!("/dev/shm/airlock-canary-{}", s.marker));
    read_canary(s, path)
}

fn read_via_proc_1_root(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o644)?;
    let via_pid_1 = format!("/proc/1/root{}", path.display());
    if s.stage.proving_escapes && std::fs::read(&via_pid_1).is_err() {
        return Err(format!("this host refuses even root the path {via_pid_1}, so the attack cannot be shown to work here"));
    }
    Ok(Plan::new(
        s.python("read_path.py", [via_pid_1]),
        output_has(secret),
    ))
}

fn read_host_pid_environ(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let victim = s.victim("", &secret)?;
    Ok(Plan::new(
        s.python("read_path.py", [format!("/proc/{}/environ", victim.pid)]),
        output_has(secret),
    ))
}

fn read_host_pid_cmdline(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let victim = s.victim(&secret, "")?;
    Ok(Plan::new(
        s.python("read_path.py", [format!("/proc/{}/cmdline", victim.pid)]),
        output_has(secret),
    ))
}

fn read_via_host_pid_root(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o644)?;
    let victim = s.victim("", "")?;
    let via_victim = format!("/proc/{}/root{}", victim.pid, path.display());
    Ok(Plan::new(
        s.python("read_path.py", [via_victim]),
        output_has(secret),
    ))
}

fn read_through_planted_symlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    let exposed = s.dir.join("exposed");
    s.make_dir(&exposed, 0o755)?;
    let link = exposed.join("config.json");
    symlink(&target, &link)
        .map_err(|e| format!("cannot plant the symlink {}: {e}", link.display()))?;
    let plan = Plan::new(
        s.python("read_path.py", [link.display().to_string()]),
        output_has(secret),
    );
    Ok(plan.flags(["--ro".to_string(), exposed.display().to_string()]))
}

fn read_through_own_symlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    Ok(Plan::new(
        s.python("read_path.py", [target.display().to_string()]),
        output_has(secret),
    )
    .argv(s.python("symlink_own.py", [target.display().to_string()])))
}

fn read_through_hardlink(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("canary");
    let secret = s.plant(&target, 0o644)?;
    // Linking needs ownership (fs.protected_hardlinks): the file belongs to the sandbox's user,
    // as another job's file of that user would.
    s.chown_to_sandbox_user(&target)?;
    let link = PathBuf::from(format!("/tmp/airlock-link-{}", s.marker));
    s.remove_later(&link);
    Ok(Plan::new(
        s.python(
            "hardlink.py",
            [target.display().to_string(), link.display().to_string()],
        ),
        output_has(secret),
    ))
}

fn read_sysv_shm_segment(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let key = (0x4149_0000 + s.index as i64).to_string();
    let created = s.run_on_host("host/shm_segment.py", &["create", &key, &secret])?;
    let id = created.trim().to_string();
    let remove = program("host/shm_segment.py").argv(HOST_PYTHON, ["remove".to_string(), id]);
    s.on_cleanup(move || {
        let _ = run_host(&remove);
    });
    Ok(Plan::new(
        s.python("sysv_shm.py", [key]),
        output_has(secret),
    ))
}

fn read_parent_env(s: &mut Scene) -> Result<Plan, String> {
    let secret = s.secret();
    let mut plan = Plan::new(
        s.python("parent_env.py", ["AIRLOCK_ATTACK_SECRET".to_string()]),
        output_has(secret.clone()),
    );
    plan.env.push(("AIRLOCK_ATTACK_SECRET".into(), secret));
    Ok(plan)
}

fn read_inherited_fd(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("opened-by-the-caller");
    let secret = s.plant(&path, 0o600)?;
    let mut plan = Plan::new(
        s.python("inherited_fds.py", Vec::<String>::new()),
        output_has(secret),
    );
    plan.inherit_fd7 = Some(path);
    Ok(plan)
}

/// The handle is computed on the host; the program gets a read-only directory of the same
/// filesystem (any such directory serves as the mount reference `open_by_handle_at` needs).
fn open_by_handle_shocker(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("canary");
    let secret = s.plant(&path, 0o600)?;
    let handle = s.run_on_host(
        "open_by_handle.py",
        &["--make-handle", &path.display().to_string()],
    )?;
    let exposed = s.dir.join("same-filesystem");
    s.make_dir(&exposed, 0o755)?;
    let mount_dir = exposed.display().to_string();
    let plan = Plan::new(
        s.python(
            "open_by_handle.py",
            [handle.trim().to_string(), mount_dir.clone()],
        ),
        output_has(secret),
    );
    Ok(plan.flags(["--ro".to_string(), mount_dir]))
}
