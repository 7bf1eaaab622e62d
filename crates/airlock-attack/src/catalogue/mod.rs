//! The catalogue: every attack with its threat class, what it is judged on, what stops it and
//! how to set it up ([`Attack::prepare`] builds the host scene and the [`Plan`]). Each
//! submodule holds one family of attacks: its table and its plans.

mod git;
mod integrity;
mod kernel;
mod network;
mod resources;
mod secrets;

use crate::plan::Plan;
use crate::scene::Scene;

/// Threat classes, in the order users meet them (docs/threat-model.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threat {
    /// Mistakes: runaway memory, loops, fork, disk, inode and output floods, leftovers.
    A,
    /// Exfiltration: any network path, DNS included, and host services over sockets.
    B,
    /// Local side effects: secrets in files, the environment, inherited descriptors, other
    /// processes; writes outside the workdir.
    C,
    /// Host escape: setuid, mounts, namespaces, ptrace, bpf, keyrings, devices, kernel knobs.
    D,
}

/// What an attack goes after: the columns of `airlock conformance`, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    FsRead,
    FsWrite,
    Network,
    Signal,
    Env,
    Syscalls,
    Privilege,
    Pids,
    Devices,
    Ipc,
    Lifetime,
    Resources,
}

impl Group {
    pub const ALL: [Group; 12] = [
        Group::FsRead,
        Group::FsWrite,
        Group::Network,
        Group::Signal,
        Group::Env,
        Group::Syscalls,
        Group::Privilege,
        Group::Pids,
        Group::Devices,
        Group::Ipc,
        Group::Lifetime,
        Group::Resources,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::FsRead => "fs-read",
            Group::FsWrite => "fs-write",
            Group::Network => "network",
            Group::Signal => "signal",
            Group::Env => "env",
            Group::Syscalls => "syscalls",
            Group::Privilege => "privilege",
            Group::Pids => "pids",
            Group::Devices => "devices",
            Group::Ipc => "ipc",
            Group::Lifetime => "lifetime",
            Group::Resources => "resources",
        }
    }
}

/// What proves, in airlock's escape suite, that the attack works at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// `airlock run --dev --backend none`.
    Tier0,
    /// Tier 0 without the uid drop (a profile with `drop_root = false`): root inside Tier 0.
    Tier0AsRoot,
    /// Tier 0 already stops it (uid drop, no_new_privs, fd closing, tree kill): a bare process.
    Bare,
    /// A bare process as uid 65534 without no_new_privs (for setuid binaries).
    BareAsNobody,
    /// A resource attack Tier 0 already contains: assert containment in both modes.
    ContainedToo,
}

/// Sets the scene up on the host and returns the plan; `Err` says why it cannot be set up.
pub type Prepare = fn(&mut Scene) -> Result<Plan, String>;

pub struct Attack {
    pub name: &'static str,
    pub threat: Threat,
    pub group: Group,
    pub baseline: Baseline,
    /// What is checked on the host (docs/attacks.md, column "evidence checked on the host").
    pub evidence: &'static str,
    /// The layers that stop it under the `untrusted` profile (docs/attacks.md, last column).
    pub layers: &'static str,
    /// Resource-hungry: runs alone after the parallel batch.
    pub exclusive: bool,
    /// Why the attack cannot be set up without root, if it cannot.
    pub root_only: Option<&'static str>,
    pub prepare: Prepare,
}

/// An attack with the common defaults (not exclusive, needs no root).
const fn attack(
    name: &'static str,
    (threat, group, baseline): (Threat, Group, Baseline),
    evidence: &'static str,
    layers: &'static str,
    prepare: Prepare,
) -> Attack {
    Attack {
        name,
        threat,
        group,
        baseline,
        evidence,
        layers,
        exclusive: false,
        root_only: None,
        prepare,
    }
}

impl Attack {
    const fn exclusive(mut self) -> Attack {
        self.exclusive = true;
        self
    }

    const fn root_only(mut self, reason: &'static str) -> Attack {
        self.root_only = Some(reason);
        self
    }
}

/// Every attack, in table order.
pub fn catalogue() -> Vec<Attack> {
    let mut all = Vec::new();
    all.extend(secrets::attacks());
    all.extend(integrity::attacks());
    all.extend(kernel::attacks());
    all.extend(git::attacks());
    all.extend(network::attacks());
    all.extend(resources::attacks());
    all
}
