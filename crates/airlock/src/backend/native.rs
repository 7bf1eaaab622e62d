//! `native`: airlock's own Linux sandbox. Probing reads kernel switches only (no namespace is
//! created); the init re-checks everything when it applies the layers.

use std::path::{Path, PathBuf};

use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::confine::landlock::{probe_abi, LandlockRules};
use crate::confine::rootfs::{
    default_etc_files, default_system_ro, GeneratedFile, RootfsPlan, TmpfsSpec, Workdir,
};
use crate::confine::seccomp::SeccompConfig;
use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::{GitProtection, Policy};
use crate::spec::{Confinement, NativeSpec};

/// The hostname inside every native sandbox.
pub const SANDBOX_HOSTNAME: &str = "airlock";

/// The native Linux backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeBackend;

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn level(&self) -> IsolationLevel {
        IsolationLevel::Kernel
    }

    fn mounts_own_scratch(&self) -> bool {
        true
    }

    fn probe(&self) -> Probe {
        let mut problems = Vec::new();
        let userns = user_namespaces_usable(&mut problems);
        let seccomp = Path::new("/proc/sys/kernel/seccomp/actions_avail").exists();
        if !seccomp {
            problems.push(
                "seccomp filters are not available in this kernel (CONFIG_SECCOMP_FILTER)".into(),
            );
        }
        let mut layers = tier0_layers();
        if userns {
            layers.extend(Layer::NAMESPACES_BUT_NET);
            layers.extend([
                Layer::NetNs,
                Layer::Rootfs,
                Layer::DiskQuota,
                Layer::InodeQuota,
                Layer::CapsDropped,
                Layer::GitReadOnly,
            ]);
        }
        if seccomp {
            layers.push(Layer::Seccomp);
        }
        layers.extend(landlock_layers(probe_abi(), &mut problems));
        Probe {
            available: userns,
            layers,
            problems,
            notes: Vec::new(),
        }
    }

    /// A gated network: the init's child configures the new network namespace right after
    /// creating it (it holds CAP_NET_ADMIN there until PID 1 drops every capability) and
    /// hands the gate its sockets; seccomp allows IP stream and datagram sockets only, and
    /// Landlock lets TCP connect only to the gate's ports.
    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        let policy = ctx.policy;
        let rootfs = rootfs_plan(ctx);
        let mut landlock = landlock_rules(policy, &rootfs, ctx.workdir);
        if let Some(egress) = ctx.egress {
            landlock.connect_tcp_ports = super::gate_ports(egress);
        }
        Ok(Confinement::Native(NativeSpec {
            new_net: !policy.has_network(),
            hostname: SANDBOX_HOSTNAME.into(),
            rootfs,
            landlock,
            seccomp: SeccompConfig {
                allow_network: policy.has_network(),
                allow_inet: ctx.egress.is_some(),
            },
        }))
    }
}

pub(crate) fn user_namespaces_usable(problems: &mut Vec<String>) -> bool {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    };
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        problems.push(
            "user namespaces are disabled: set the sysctl user.max_user_namespaces above 0".into(),
        );
        return false;
    }
    let root = nix::unistd::geteuid().is_root();
    if !root && read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        problems.push("unprivileged user namespaces are disabled: set the sysctl kernel.unprivileged_userns_clone=1".into());
        return false;
    }
    if !root
        && read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1")
    {
        problems.push("AppArmor restricts unprivileged user namespaces: set kernel.apparmor_restrict_unprivileged_userns=0 or add an AppArmor profile for airlock".into());
        return false;
    }
    true
}

fn landlock_layers(abi: u32, problems: &mut Vec<String>) -> Vec<Layer> {
    let mut layers = Vec::new();
    match abi {
        0 => problems
            .push("Landlock is not enabled: boot with lsm=...,landlock (kernel >= 5.13)".into()),
        _ => layers.push(Layer::LandlockFs),
    }
    if abi >= 4 {
        layers.push(Layer::LandlockNet);
    } else if abi > 0 {
        problems.push(format!(
            "Landlock ABI {abi} cannot restrict TCP (needs ABI 4, kernel >= 6.7)"
        ));
    }
    if abi >= 6 {
        layers.push(Layer::LandlockScope);
    }
    layers
}

fn rootfs_plan(ctx: &PlanContext) -> RootfsPlan {
    let limits = &ctx.policy.limits;
    let tmpfs = TmpfsSpec {
        size_bytes: limits.disk.0,
        max_files: limits.files,
    };
    let workdir = if ctx.sandbox_owns_workdir() {
        Workdir::Tmpfs {
            path: ctx.workdir.to_path_buf(),
            size_bytes: limits.disk.0,
            max_files: limits.files,
        }
    } else {
        Workdir::Bind {
            host: ctx.workdir.to_path_buf(),
            writable: !ctx.policy.filesystem.workdir_read_only,
        }
    };
    let mut read_only = ctx.policy.filesystem.read_only.clone();
    read_only.extend(ctx.unix_sockets.iter().cloned());
    RootfsPlan {
        system_ro: default_system_ro(),
        etc_files: default_etc_files(),
        generated_files: identity_files(ctx),
        read_only,
        read_write: ctx.policy.filesystem.read_write.clone(),
        git_read_only: ctx.git_read_only.to_vec(),
        git_pinned: ctx.git_pinned.to_vec(),
        git_found: ctx.git_found.to_vec(),
        protect_git: ctx.policy.filesystem.protect_git == GitProtection::ReadOnly,
        workdir,
        tmp: tmpfs,
        dev_shm: {
            let (size_bytes, max_files) = limits.shm_caps();
            TmpfsSpec {
                size_bytes,
                max_files,
            }
        },
        exec_writable: ctx.policy.filesystem.exec_writable,
        workspace: ctx.policy.filesystem.workspace,
        tty: ctx.tty,
        hostname: SANDBOX_HOSTNAME.into(),
        proc_hidepid: true,
        unreachable: None,
    }
}

/// passwd, group, hosts and hostname that name only the sandbox user and host.
fn identity_files(ctx: &PlanContext) -> Vec<GeneratedFile> {
    let (uid, gid) = sandbox_ids(ctx.policy);
    let home = ctx.workdir.display();
    let mut files = vec![
        file(
            "/etc/passwd",
            format!("sandbox:x:{uid}:{gid}:airlock sandbox:{home}:/bin/sh\n"),
        ),
        file("/etc/group", format!("sandbox:x:{gid}:\n")),
        file(
            "/etc/hosts",
            format!("127.0.0.1 localhost {SANDBOX_HOSTNAME}\n::1 localhost\n"),
        ),
        file("/etc/hostname", format!("{SANDBOX_HOSTNAME}\n")),
    ];
    if ctx.egress.is_some() {
        files.push(file("/etc/resolv.conf", super::GATED_RESOLV_CONF.into()));
    } else if ctx.policy.has_network() {
        if let Ok(resolv) = std::fs::read_to_string("/etc/resolv.conf") {
            files.push(file("/etc/resolv.conf", resolv));
        }
    }
    files
}

fn file(path: &str, contents: String) -> GeneratedFile {
    GeneratedFile {
        path: PathBuf::from(path),
        contents,
        mode: 0o644,
    }
}

/// The uid and gid the program has inside: the unprivileged host ids it runs as.
pub(crate) fn sandbox_ids(policy: &Policy) -> (u32, u32) {
    if nix::unistd::geteuid().is_root() && policy.user.drop_root {
        (policy.user.uid, policy.user.gid)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }
}

/// The same rules as the mounts, enforced a second, independent way.
/// The caller's own paths (its workdir, `--rw` paths) are a workspace whose programs may run;
/// the sandbox's fresh scratch areas follow `exec_writable`.
fn landlock_rules(policy: &Policy, rootfs: &RootfsPlan, workdir: &Path) -> LandlockRules {
    let mut read_exec: Vec<PathBuf> = rootfs.system_ro.clone();
    read_exec.extend(["/etc", "/proc", "/dev"].map(PathBuf::from));
    read_exec.extend(policy.filesystem.read_only.iter().cloned());
    let mut read_write: Vec<PathBuf> = vec!["/tmp".into(), "/dev/shm".into()];
    read_write.extend(["/dev/null", "/dev/zero", "/dev/full"].map(PathBuf::from));
    let mut workspace: Vec<PathBuf> = policy.filesystem.read_write.clone();
    match &rootfs.workdir {
        Workdir::Tmpfs { .. } => read_write.push(workdir.to_path_buf()),
        Workdir::Bind { writable: true, .. } => workspace.push(workdir.to_path_buf()),
        Workdir::Bind {
            writable: false, ..
        } => read_exec.push(workdir.to_path_buf()),
    }
    if !policy.filesystem.workspace {
        read_write.append(&mut workspace);
    }
    LandlockRules {
        read_exec,
        read_write,
        workspace,
        // The root is built from scratch: listing it (and the directories airlock made on the
        // way to a mount) shows only what the sandbox holds, as under bwrap or a container.
        list_only: vec!["/".into()],
        deny_tcp: !policy.has_network(),
        connect_tcp_ports: Vec::new(),
        scope_ipc: true,
        exec_writable: policy.filesystem.exec_writable,
    }
}
