//! The caller's view of a prepared run: the layers a plan puts in force and the [`Plan`] that
//! `Command::plan` returns, derived from the init's spec so the two cannot disagree.

use std::path::{Path, PathBuf};

use super::judge::Judged;
use super::prepare::Workdir;
use crate::backend::{tier0_layers, Probe, Selected};
use crate::confine::rootfs::{default_system_ro, RootfsPlan, Workdir as RootfsWorkdir};
use crate::layer::Layer;
use crate::net::EgressPlan;
use crate::plan::{Plan, PlannedMount, WorkdirKind};
use crate::policy::Policy;
use crate::rundir::MemoryScratch;
use crate::spec::{Confinement, InitSpec};

/// The layers a plan puts in force if the host behaves as probed. A wrapping tool's plan names
/// its own; the native sandbox and Tier 0 give what the backend offers here, less what this
/// run's choices leave out.
pub(super) fn planned_layers(
    confinement: &Confinement,
    probe: &Probe,
    scratch: Option<&MemoryScratch>,
    workdir: &Workdir,
    gated: bool,
) -> Vec<Layer> {
    let mut layers = match confinement {
        Confinement::Wrapped(wrap) => {
            let mut layers = tier0_layers();
            layers.extend(wrap.layers.iter().copied());
            layers
        }
        Confinement::Native(native) => {
            let mut layers = probe.layers.clone();
            let capped_workdir = matches!(native.rootfs.workdir, RootfsWorkdir::Tmpfs { .. });
            layers.retain(|l| match l {
                Layer::NetNs => native.new_net,
                Layer::LandlockNet => native.landlock.deny_tcp,
                Layer::DiskQuota | Layer::InodeQuota => capped_workdir,
                Layer::GitReadOnly => native.rootfs.protect_git,
                _ => true,
            });
            if gated {
                layers.push(Layer::EgressGate);
            }
            layers
        }
        Confinement::Tier0 => {
            let mut layers = probe.layers.clone();
            if scratch.is_some_and(|s| s.mount_at(&workdir.path).is_some()) {
                layers.extend([Layer::DiskQuota, Layer::InodeQuota]);
            }
            layers
        }
    };
    layers.sort();
    layers.dedup();
    layers
}

/// The network part of a prepared run, as the plan shows it.
pub(super) struct PlannedNetwork<'a> {
    pub egress: Option<&'a EgressPlan>,
    /// The host Unix sockets, expanded.
    pub unix_sockets: Vec<PathBuf>,
}

/// The plan as the caller reads it.
pub(super) fn plan(
    selected: &Selected,
    spec: &InitSpec,
    judged: &Judged,
    workdir_kind: &WorkdirKind,
    policy: &Policy,
    network: PlannedNetwork,
) -> Plan {
    let backend = selected.backend.as_ref();
    let (warnings, details, wrapper_argv) = match &spec.confinement {
        Confinement::Wrapped(wrap) => {
            let mut warnings = judged.warnings.clone();
            warnings.extend(wrap.notes.iter().cloned());
            (
                warnings,
                wrap.details.clone(),
                Some(wrap.wrapper_argv.clone()),
            )
        }
        Confinement::Tier0 => {
            let mut warnings = judged.warnings.clone();
            warnings.push(crate::spec::TIER0_WARNING.into());
            (warnings, Vec::new(), None)
        }
        Confinement::Native(_) => (judged.warnings.clone(), Vec::new(), None),
    };
    let mut mounts = mounts(spec, policy, &judged.layers);
    if !matches!(spec.confinement, Confinement::Tier0) {
        mounts.extend(network.unix_sockets.iter().map(|p| bind(p, false)));
    }
    Plan {
        backend: backend.name().into(),
        backend_reason: selected.reason.clone(),
        isolation_level: backend.level(),
        argv: spec.argv.clone(),
        layers: judged.layers.clone(),
        required: judged.require.clone(),
        missing: judged.missing.clone(),
        missing_reason: judged.reason.clone(),
        verdict: judged.verdict,
        network: policy.network.mode,
        egress: network.egress.map(crate::net::planned),
        unix_sockets: network.unix_sockets,
        workdir: spec.workdir.clone(),
        workdir_kind: *workdir_kind,
        run_dir: spec.run_dir.clone(),
        run_dir_in_memory: spec.scratch.is_some(),
        mounts,
        limits: policy.limits.clone(),
        cgroup: spec
            .cgroup
            .as_ref()
            .map(|c| format!("{}/{}", c.config.parent.trim_matches('/'), c.run_id)),
        env: spec.env.iter().map(|(name, _)| name.clone()).collect(),
        warnings,
        details,
        wrapper_argv,
    }
}

/// What the program sees of the filesystem. The native sandbox's root is planned exactly; a
/// wrapping tool builds the same view, with the caps its layers promise.
fn mounts(spec: &InitSpec, policy: &Policy, layers: &[Layer]) -> Vec<PlannedMount> {
    match &spec.confinement {
        Confinement::Tier0 => Vec::new(),
        Confinement::Native(native) => native_mounts(&native.rootfs),
        Confinement::Wrapped(_) => wrapped_mounts(spec, policy, layers),
    }
}

fn native_mounts(rootfs: &RootfsPlan) -> Vec<PlannedMount> {
    let mut mounts = host_mounts(&rootfs.system_ro, &rootfs.read_only, &rootfs.read_write);
    mounts.push(match &rootfs.workdir {
        RootfsWorkdir::Bind { host, writable } => bind(host, *writable),
        RootfsWorkdir::Tmpfs {
            path,
            size_bytes,
            max_files,
        } => tmpfs(path, *size_bytes, Some(*max_files)),
    });
    mounts.push(tmpfs(
        Path::new("/tmp"),
        rootfs.tmp.size_bytes,
        Some(rootfs.tmp.max_files),
    ));
    mounts.push(tmpfs(
        Path::new("/dev/shm"),
        rootfs.dev_shm.size_bytes,
        Some(rootfs.dev_shm.max_files),
    ));
    mounts
}

fn wrapped_mounts(spec: &InitSpec, policy: &Policy, layers: &[Layer]) -> Vec<PlannedMount> {
    let fs = &policy.filesystem;
    let mut mounts = host_mounts(&default_system_ro(), &fs.read_only, &fs.read_write);
    let limits = &policy.limits;
    let files = layers.contains(&Layer::InodeQuota).then_some(limits.files);
    let capped_workdir = !spec.workdir_is_callers && layers.contains(&Layer::DiskQuota);
    mounts.push(match capped_workdir {
        true => tmpfs(&spec.workdir, limits.disk.0, files),
        false => bind(&spec.workdir, !policy.filesystem.workdir_read_only),
    });
    mounts.push(tmpfs(Path::new("/tmp"), limits.disk.0, files));
    let (shm_bytes, shm_files) = limits.shm_caps();
    mounts.push(tmpfs(
        Path::new("/dev/shm"),
        shm_bytes,
        files.map(|_| shm_files),
    ));
    mounts
}

/// Host system directories (read-only; a merged-/usr alias such as `/bin -> usr/bin` is
/// recreated as the same symlink, not mounted), then the policy's extra paths.
fn host_mounts(
    system: &[PathBuf],
    read_only: &[PathBuf],
    read_write: &[PathBuf],
) -> Vec<PlannedMount> {
    let existing = system
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()));
    existing
        .chain(read_only)
        .map(|p| bind(p, false))
        .chain(read_write.iter().map(|p| bind(p, true)))
        .collect()
}

fn bind(path: &Path, writable: bool) -> PlannedMount {
    PlannedMount {
        target: path.to_path_buf(),
        source: Some(path.to_path_buf()),
        writable,
        size_bytes: None,
        max_files: None,
    }
}

fn tmpfs(path: &Path, size_bytes: u64, max_files: Option<u64>) -> PlannedMount {
    PlannedMount {
        target: path.to_path_buf(),
        source: None,
        writable: true,
        size_bytes: Some(size_bytes),
        max_files,
    }
}
