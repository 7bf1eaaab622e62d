//! Which program starts the container: `[container] runtime` (or `--container-runtime`)
//! resolved against what is installed in the system directories.

use std::path::PathBuf;

use serde::Serialize;

use super::find_binary;
use crate::policy::ContainerRuntime;

/// A concrete runtime: an OCI runtime driven with a bundle, or a container engine's CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    Runc,
    Crun,
    Podman,
    Docker,
}

impl RuntimeKind {
    /// The order `auto` tries them in: the direct OCI runtimes start fastest.
    pub const AUTO_ORDER: [RuntimeKind; 4] = [
        RuntimeKind::Runc,
        RuntimeKind::Crun,
        RuntimeKind::Podman,
        RuntimeKind::Docker,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Runc => "runc",
            RuntimeKind::Crun => "crun",
            RuntimeKind::Podman => "podman",
            RuntimeKind::Docker => "docker",
        }
    }

    fn install_hint(self) -> &'static str {
        match self {
            RuntimeKind::Runc => "`apt-get install runc` or `dnf install runc`",
            RuntimeKind::Crun => "`apt-get install crun` or `dnf install crun`",
            RuntimeKind::Podman => "`apt-get install podman` or `dnf install podman`",
            RuntimeKind::Docker => "`apt-get install docker.io` or `dnf install moby-engine`",
        }
    }

    fn of(choice: ContainerRuntime) -> Option<RuntimeKind> {
        match choice {
            ContainerRuntime::Auto => None,
            ContainerRuntime::Runc => Some(RuntimeKind::Runc),
            ContainerRuntime::Crun => Some(RuntimeKind::Crun),
            ContainerRuntime::Podman => Some(RuntimeKind::Podman),
            ContainerRuntime::Docker => Some(RuntimeKind::Docker),
        }
    }
}

/// A runtime found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRuntime {
    pub kind: RuntimeKind,
    pub binary: PathBuf,
}

/// One runtime's state on this host, for `airlock doctor`.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct RuntimeReport {
    pub name: String,
    /// The binary, when installed.
    pub path: Option<PathBuf>,
    /// Whether `--container-runtime NAME` can run here.
    pub usable: bool,
    /// Why not, with the fix.
    pub problem: Option<String>,
}

/// Resolves the policy's choice; the error names the missing runtime and how to install it.
pub fn resolve(choice: ContainerRuntime) -> Result<FoundRuntime, String> {
    if let Some(kind) = RuntimeKind::of(choice) {
        return check(kind);
    }
    let mut problems = Vec::new();
    for kind in RuntimeKind::AUTO_ORDER {
        match check(kind) {
            Ok(found) => return Ok(found),
            Err(problem) => problems.push(problem),
        }
    }
    Err(format!(
        "no container runtime can run here: {}",
        problems.join("; ")
    ))
}

/// Every runtime and whether it can run here.
pub fn report_all() -> Vec<RuntimeReport> {
    RuntimeKind::AUTO_ORDER
        .iter()
        .map(|kind| {
            let checked = check(*kind);
            RuntimeReport {
                name: kind.name().into(),
                path: find_binary(kind.name()),
                usable: checked.is_ok(),
                problem: checked.err(),
            }
        })
        .collect()
}

fn check(kind: RuntimeKind) -> Result<FoundRuntime, String> {
    let Some(binary) = find_binary(kind.name()) else {
        return Err(format!(
            "container runtime {} is not installed in the system directories: install it with {}",
            kind.name(),
            kind.install_hint()
        ));
    };
    if super::rootless::is_rootless() {
        if let Some(problem) = super::rootless::runtime_problem(kind) {
            return Err(format!("{} without root: {problem}", kind.name()));
        }
    }
    let problem = match kind {
        RuntimeKind::Docker => docker_engine_problem(),
        RuntimeKind::Crun => match super::crun_hybrid::crun_host() {
            super::crun_hybrid::CrunHost::Unusable(reason) => Some(reason),
            _ => None,
        },
        _ => None,
    };
    match problem {
        Some(problem) => Err(problem),
        None => Ok(FoundRuntime { kind, binary }),
    }
}

/// The Docker client alone cannot run anything: its engine must answer on its socket.
fn docker_engine_problem() -> Option<String> {
    let socket = docker_socket();
    match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "docker engine not reachable at {} ({e}): start dockerd (`systemctl start docker`)",
            socket.display()
        )),
    }
}

/// `DOCKER_HOST` when it names a unix socket, else the default socket.
fn docker_socket() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_runtime_that_is_missing_is_named_with_its_fix() {
        let missing = RuntimeKind::AUTO_ORDER
            .into_iter()
            .find(|k| find_binary(k.name()).is_none());
        let Some(kind) = missing else {
            eprintln!("skipped: every runtime is installed here");
            return;
        };
        let choice: ContainerRuntime = kind.name().parse().unwrap();
        let error = resolve(choice).unwrap_err();
        assert!(error.contains(kind.name()), "{error}");
        assert!(
            error.contains("apt-get install") && error.contains("dnf install"),
            "{error}"
        );
    }

    #[test]
    fn auto_takes_the_first_usable_runtime_in_order() {
        let reports = report_all();
        let first_usable = reports.iter().find(|r| r.usable).map(|r| r.name.clone());
        let resolved = resolve(ContainerRuntime::Auto)
            .ok()
            .map(|f| f.kind.name().into());
        assert_eq!(resolved, first_usable);
        assert_eq!(
            reports.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["runc", "crun", "podman", "docker"]
        );
    }

    #[test]
    fn docker_without_an_engine_says_to_start_dockerd() {
        if docker_engine_problem().is_none() {
            eprintln!("skipped: a docker engine answers here");
            return;
        }
        let problem = docker_engine_problem().unwrap();
        assert!(problem.contains("start dockerd"), "{problem}");
    }
}
