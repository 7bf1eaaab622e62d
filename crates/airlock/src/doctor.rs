//! `airlock doctor`: what this host supports, layer by layer, and what each built-in profile
//! would get here.

use serde::Serialize;

pub use crate::backend::RuntimeReport;
use crate::backend::{all_backends, container_runtimes, select};
use crate::confine::cgroup::{probe as probe_cgroups, CgroupConfig};
use crate::confine::landlock::probe_abi;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::builtin;

/// The whole diagnosis.
#[derive(Serialize, Debug, Clone)]
pub struct DoctorReport {
    pub kernel: String,
    pub running_as_root: bool,
    pub landlock_abi: u32,
    pub seccomp: bool,
    pub cgroup: CgroupReport,
    pub runtime_dir: RuntimeDirReport,
    pub backends: Vec<BackendReport>,
    /// The programs the `container` backend can drive (`[container] runtime`), in the order
    /// `auto` tries them.
    pub container_runtimes: Vec<RuntimeReport>,
    pub profiles: Vec<ProfileReport>,
}

/// cgroup support.
#[derive(Serialize, Debug, Clone)]
pub struct CgroupReport {
    pub version: Option<String>,
    pub controllers: Vec<String>,
    pub problems: Vec<String>,
}

/// Where run directories go, and whether that costs time.
#[derive(Serialize, Debug, Clone)]
pub struct RuntimeDirReport {
    pub path: String,
    /// `tmpfs`, `disk` (anything else), or `unknown` when it cannot be inspected.
    pub filesystem: String,
    pub note: Option<String>,
}

/// One backend on this host.
#[derive(Serialize, Debug, Clone)]
pub struct BackendReport {
    pub name: String,
    pub level: IsolationLevel,
    pub available: bool,
    pub layers: Vec<Layer>,
    pub problems: Vec<String>,
    /// Facts about how the backend runs here, nothing to fix.
    pub notes: Vec<String>,
}

/// What a built-in profile would get here.
#[derive(Serialize, Debug, Clone)]
pub struct ProfileReport {
    pub name: String,
    pub backend: Option<String>,
    pub layers: Vec<Layer>,
    pub missing_required: Vec<Layer>,
    pub runs: bool,
    pub note: Option<String>,
}

/// Probes the host. Reads kernel switches and files; creates nothing that outlives the call.
pub fn diagnose(cgroup: &CgroupConfig) -> DoctorReport {
    let cgroups = probe_cgroups(cgroup);
    let cgroup_ok = cgroups.version.is_some() && !cgroups.controllers.is_empty();
    let backends: Vec<BackendReport> = all_backends()
        .iter()
        .map(|b| {
            let probe = b.probe();
            let mut layers = probe.layers;
            if cgroup_ok {
                layers.push(Layer::Cgroup);
            }
            layers.sort();
            BackendReport {
                name: b.name().into(),
                level: b.level(),
                available: probe.available,
                layers,
                problems: probe.problems,
                notes: probe.notes,
            }
        })
        .collect();
    let profiles = crate::policy::builtin_names()
        .iter()
        .map(|name| profile_report(name, &backends))
        .collect();
    DoctorReport {
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        running_as_root: nix::unistd::geteuid().is_root(),
        landlock_abi: probe_abi(),
        seccomp: std::path::Path::new("/proc/sys/kernel/seccomp/actions_avail").exists(),
        cgroup: CgroupReport {
            version: cgroups.version.map(|v| format!("{v:?}").to_lowercase()),
            controllers: cgroups.controllers,
            problems: cgroups.problems,
        },
        runtime_dir: runtime_dir_report(),
        backends,
        container_runtimes: container_runtimes(),
        profiles,
    }
}

/// A run without an in-memory run directory creates its directory there, and a container or
/// gVisor run writes an OCI bundle of about 80 entries: on a disk filesystem (measured here:
/// ext4 without a journal, where creating an inode next to many recently deleted ones takes
/// about 0.7 ms) that adds about 20 ms to a crun run (40.8 against 19.6 ms), which a tmpfs
/// avoids.
fn runtime_dir_report() -> RuntimeDirReport {
    // The doctor creates nothing: a directory not made yet will land on its parent's filesystem.
    let path = crate::rundir::default_runtime_dir();
    let on_tmpfs = path.ancestors().find(|dir| dir.exists()).map(|dir| {
        nix::sys::statfs::statfs(dir)
            .map(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
    });
    let (filesystem, note) = match on_tmpfs {
        Some(Ok(true)) => ("tmpfs", None),
        Some(Ok(false)) if crate::confine::caps::can_mount() => ("disk", Some(
            "runs keep their directories in memory (a tmpfs in the init's own mount namespace); only --keep and --disk-run-dir runs, and the tool-version cache, use this directory".to_string(),
        )),
        Some(Ok(false)) => ("disk", Some(format!(
            "runs create and remove their directories (and container/gVisor bundles) here; on a disk filesystem that costs time (measured on ext4 without a journal: about 20 ms per container run): mount a tmpfs on it (`mount -t tmpfs -o mode=0711 tmpfs {}`)",
            path.display()
        ))),
        _ => ("unknown", None),
    };
    RuntimeDirReport {
        path: path.display().to_string(),
        filesystem: filesystem.into(),
        note,
    }
}

fn profile_report(name: &str, backends: &[BackendReport]) -> ProfileReport {
    let Some(policy) = builtin(name) else {
        return ProfileReport {
            name: name.into(),
            backend: None,
            layers: vec![],
            missing_required: vec![],
            runs: false,
            note: Some("unknown".into()),
        };
    };
    let chosen = select(&policy).ok().map(|s| s.backend.name().to_string());
    let report = chosen
        .as_ref()
        .and_then(|n| backends.iter().find(|b| &b.name == n));
    let layers = report.map(|b| b.layers.clone()).unwrap_or_default();
    let missing: Vec<Layer> = policy
        .require
        .iter()
        .copied()
        .filter(|l| !layers.contains(l))
        .collect();
    let note = match (&chosen, missing.is_empty()) {
        (None, _) => Some("no backend is available for this profile here".to_string()),
        (Some(_), false) => {
            Some("refuses to run here unless --allow-degraded is given".to_string())
        }
        _ => None,
    };
    ProfileReport {
        name: name.into(),
        runs: chosen.is_some() && missing.is_empty(),
        backend: chosen,
        layers,
        missing_required: missing,
        note,
    }
}
