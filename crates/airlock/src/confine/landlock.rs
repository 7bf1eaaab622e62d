//! Landlock: unprivileged, kernel-enforced access control on file paths, TCP ports and IPC
//! scopes, applied to the calling thread (and everything it later forks or executes).
//!
//! Best effort by design: on a kernel with an older Landlock ABI the crate drops the rights the
//! kernel does not know, and [`LandlockReport`] says per layer what was really enforced, so the
//! caller can log it or refuse to run.

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, LandlockStatus, NetPort, PathBeneath, PathFd,
    RestrictSelf, RestrictionStatus, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr,
    RulesetStatus, Scope, ABI,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The newest ABI whose rights this module asks for and is tested against. Newer kernels keep
/// honouring it; raising it is a deliberate change (new rights may deny what used to work).
const TARGET_ABI: ABI = ABI::V6;

/// What the sandboxed program may touch. Everything not granted here is denied.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct LandlockRules {
    /// Trees that may be read, listed and executed (e.g. `/usr`).
    pub read_exec: Vec<PathBuf>,
    /// Trees with full access (e.g. the work directory and `/tmp`).
    pub read_write: Vec<PathBuf>,
    /// Trees with full access, executing included whatever `exec_writable` says: the caller's
    /// own directories, given to the program to work in.
    #[serde(default)]
    pub workspace: Vec<PathBuf>,
    /// Trees whose directories may only be listed (e.g. the sandbox's own `/`, which holds
    /// only what the sandbox put there): no file in them may be read by this rule.
    #[serde(default)]
    pub list_only: Vec<PathBuf>,
    /// Whether files under `read_write` may also be executed. Off means code the sandbox
    /// writes can still be interpreted (`python3 x.py`) but not executed directly.
    pub exec_writable: bool,
    /// Refuse every TCP `bind` and `connect` (ABI 4+), except connecting to
    /// `connect_tcp_ports`.
    pub deny_tcp: bool,
    /// With `deny_tcp`: the ports a TCP `connect` may still reach (the egress gate's listeners
    /// in the sandbox: its captured ports, DNS and the proxy endpoint).
    #[serde(default)]
    pub connect_tcp_ports: Vec<u16>,
    /// Refuse connecting to abstract unix sockets and signalling processes created outside
    /// the sandbox (ABI 6+).
    pub scope_ipc: bool,
}

/// How much of one requested layer the running kernel enforces.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    Full,
    /// Some of the rights could not be handled (older ABI): those stay allowed.
    Partial,
    /// Nothing is enforced for this layer, either because it was not requested or because the
    /// kernel cannot.
    None,
}

/// What [`restrict_self`] actually achieved.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LandlockReport {
    /// The best Landlock ABI the kernel offers, 0 when Landlock is unavailable.
    pub abi: u32,
    pub filesystem: Enforcement,
    pub network: Enforcement,
    pub scope: Enforcement,
    /// Rule paths that did not exist and so granted nothing.
    pub skipped_paths: Vec<PathBuf>,
}

/// Why the Landlock restriction could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LandlockError {
    #[error("failed to build the landlock ruleset: {0}")]
    Ruleset(#[source] landlock::RulesetError),
    #[error("failed to inspect landlock rule path {path}: {source}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to open landlock rule path {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: landlock::PathFdError,
    },
    #[error("failed to add landlock rule for {path}: {source}")]
    AddRule {
        path: PathBuf,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("failed to allow TCP connections to port {port} with landlock: {source}")]
    AddPortRule {
        port: u16,
        #[source]
        source: landlock::RulesetError,
    },
    #[error("failed to restrict the calling thread with landlock: {0}")]
    RestrictSelf(#[source] landlock::RulesetError),
}

/// The best Landlock ABI version the running kernel offers (0 if none), without restricting
/// anything.
pub fn probe_abi() -> u32 {
    // With no flags and no_new_privs off, `apply` only probes the kernel and makes no change.
    match RestrictSelf::default().no_new_privs(false).apply() {
        Ok(status) => abi_number(&status.landlock),
        Err(_) => 0,
    }
}

/// Restricts the calling thread, and everything it forks or executes afterwards, to `rules`.
///
/// Also sets `no_new_privs` on the calling thread, which Landlock needs unless the caller has
/// `CAP_SYS_ADMIN` in its user namespace. Paths that do not exist are skipped and reported.
pub fn restrict_self(rules: &LandlockRules) -> Result<LandlockReport, LandlockError> {
    let mut ruleset = handled_ruleset(rules)?;
    let mut skipped_paths = Vec::new();
    let grants = rules
        .read_exec
        .iter()
        .map(|path| (path, AccessFs::from_read(TARGET_ABI)))
        .chain(
            rules
                .read_write
                .iter()
                .map(|path| (path, writable_access(rules))),
        )
        .chain(
            rules
                .workspace
                .iter()
                .map(|path| (path, AccessFs::from_all(TARGET_ABI))),
        )
        .chain(
            rules
                .list_only
                .iter()
                .map(|path| (path, BitFlags::from(AccessFs::ReadDir))),
        );
    for (path, access) in grants {
        match grant(ruleset, path, access)? {
            (next, true) => ruleset = next,
            (next, false) => {
                ruleset = next;
                skipped_paths.push(path.clone());
            }
        }
    }
    if rules.deny_tcp {
        for &port in &rules.connect_tcp_ports {
            ruleset = ruleset
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|source| LandlockError::AddPortRule { port, source })?;
        }
    }
    let status = ruleset
        .restrict_self()
        .map_err(LandlockError::RestrictSelf)?;
    Ok(report(rules, &status, skipped_paths))
}

fn handled_ruleset(rules: &LandlockRules) -> Result<RulesetCreated, LandlockError> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(LandlockError::Ruleset)?;
    if rules.deny_tcp {
        // Handling both rights without adding any port rule denies every TCP bind/connect.
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(LandlockError::Ruleset)?;
    }
    if rules.scope_ipc {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(LandlockError::Ruleset)?;
    }
    ruleset.create().map_err(LandlockError::Ruleset)
}

fn writable_access(rules: &LandlockRules) -> BitFlags<AccessFs> {
    let all = AccessFs::from_all(TARGET_ABI);
    if rules.exec_writable {
        all
    } else {
        all & !AccessFs::Execute
    }
}

/// Adds one path rule; returns `false` alongside the ruleset when the path does not exist.
fn grant(
    ruleset: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<(RulesetCreated, bool), LandlockError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((ruleset, false)),
        Err(source) => {
            let path = path.to_path_buf();
            return Err(LandlockError::Inspect { path, source });
        }
    };
    // Directory-only rights on a file rule would make the kernel reject the rule.
    let access = if metadata.is_dir() {
        access
    } else {
        access & AccessFs::from_file(TARGET_ABI)
    };
    let fd = PathFd::new(path).map_err(|source| LandlockError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let ruleset = ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|source| LandlockError::AddRule {
            path: path.to_path_buf(),
            source,
        })?;
    Ok((ruleset, true))
}

fn report(
    rules: &LandlockRules,
    status: &RestrictionStatus,
    skipped_paths: Vec<PathBuf>,
) -> LandlockReport {
    let abi = abi_number(&status.landlock);
    let enforced = status.ruleset != RulesetStatus::NotEnforced;
    // Network and scope rights each arrived whole in one ABI, so they are all or nothing.
    let layer = |requested: bool, minimum_abi: u32| {
        if enforced && requested && abi >= minimum_abi {
            Enforcement::Full
        } else {
            Enforcement::None
        }
    };
    LandlockReport {
        abi,
        filesystem: filesystem_enforcement(enforced, abi),
        network: layer(rules.deny_tcp, 4),
        scope: layer(rules.scope_ipc, 6),
        skipped_paths,
    }
}

/// ABI 5 is the first to know every filesystem right of [`TARGET_ABI`] (`Refer` came in 2,
/// `Truncate` in 3, `IoctlDev` in 5); older ABIs leave those operations unrestricted.
fn filesystem_enforcement(enforced: bool, abi: u32) -> Enforcement {
    match abi {
        _ if !enforced => Enforcement::None,
        0 => Enforcement::None,
        1..=4 => Enforcement::Partial,
        _ => Enforcement::Full,
    }
}

fn abi_number(status: &LandlockStatus) -> u32 {
    match status {
        LandlockStatus::Available {
            effective_abi,
            kernel_abi,
        } => kernel_abi
            .and_then(|raw| u32::try_from(raw).ok())
            .unwrap_or(*effective_abi as u32),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::net::{TcpListener, TcpStream};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

    /// The operations the restricted thread must be refused, and an unrestricted one allowed.
    struct Targets {
        inside: tempfile::TempDir,
        outside: tempfile::TempDir,
        tcp: TcpListener,
        abstract_name: String,
        _abstract_listener: UnixListener,
    }

    #[derive(Debug)]
    struct Outcome {
        read_outside: Result<(), ErrorKind>,
        write_outside: Result<(), ErrorKind>,
        write_inside: Result<(), ErrorKind>,
        read_usr: Result<(), ErrorKind>,
        tcp_connect: Result<(), ErrorKind>,
        abstract_connect: Result<(), ErrorKind>,
    }

    fn targets() -> Targets {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let abstract_name = format!("airlock-landlock-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        Targets {
            inside: tempfile::tempdir().unwrap(),
            outside,
            tcp: TcpListener::bind("127.0.0.1:0").unwrap(),
            abstract_name,
            _abstract_listener: UnixListener::bind_addr(&addr).unwrap(),
        }
    }

    fn kind<T>(result: std::io::Result<T>) -> Result<(), ErrorKind> {
        result.map(drop).map_err(|error| error.kind())
    }

    fn attempt_all(targets: &Targets) -> Outcome {
        let abstract_addr = SocketAddr::from_abstract_name(targets.abstract_name.as_bytes());
        Outcome {
            read_outside: kind(std::fs::read(targets.outside.path().join("secret"))),
            write_outside: kind(std::fs::write(targets.outside.path().join("new"), b"x")),
            write_inside: kind(std::fs::write(targets.inside.path().join("new"), b"x")),
            read_usr: kind(std::fs::read_dir("/usr/bin")),
            tcp_connect: kind(TcpStream::connect(targets.tcp.local_addr().unwrap())),
            abstract_connect: kind(UnixStream::connect_addr(&abstract_addr.unwrap())),
        }
    }

    fn rules_for(targets: &Targets) -> LandlockRules {
        LandlockRules {
            read_exec: vec!["/usr".into()],
            read_write: vec![targets.inside.path().to_path_buf()],
            exec_writable: false,
            deny_tcp: true,
            connect_tcp_ports: Vec::new(),
            scope_ipc: true,
            ..Default::default()
        }
    }

    fn skip_below(abi: u32) -> bool {
        let offered = probe_abi();
        if offered < abi {
            eprintln!("skipped: needs landlock ABI {abi}, kernel offers {offered}");
        }
        offered < abi
    }

    #[test]
    fn restricted_thread_is_refused_what_a_free_thread_may_do() {
        if skip_below(6) {
            return;
        }
        let targets = std::sync::Arc::new(targets());
        let shared = targets.clone();
        let (report, confined) = std::thread::spawn(move || {
            let report = restrict_self(&rules_for(&shared)).unwrap();
            (report, attempt_all(&shared))
        })
        .join()
        .unwrap();
        assert_eq!(report.filesystem, Enforcement::Full);
        assert_eq!(report.network, Enforcement::Full);
        assert_eq!(report.scope, Enforcement::Full);
        assert!(report.abi >= 6);

        assert_eq!(confined.read_outside, Err(ErrorKind::PermissionDenied));
        assert_eq!(confined.write_outside, Err(ErrorKind::PermissionDenied));
        assert_eq!(confined.write_inside, Ok(()));
        assert_eq!(confined.read_usr, Ok(()));
        assert_eq!(confined.tcp_connect, Err(ErrorKind::PermissionDenied));
        assert_eq!(confined.abstract_connect, Err(ErrorKind::PermissionDenied));

        let shared = targets.clone();
        let free = std::thread::spawn(move || attempt_all(&shared))
            .join()
            .unwrap();
        assert_eq!(free.read_outside, Ok(()), "{free:?}");
        assert_eq!(free.write_outside, Ok(()));
        assert_eq!(free.tcp_connect, Ok(()));
        assert_eq!(free.abstract_connect, Ok(()));
    }

    /// The egress gate's sandboxes: TCP connect reaches the listed ports only, bind nothing.
    #[test]
    fn tcp_connect_reaches_only_the_listed_ports() {
        if skip_below(4) {
            return;
        }
        let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = |l: &TcpListener| l.local_addr().unwrap().port();
        let rules = LandlockRules {
            deny_tcp: true,
            connect_tcp_ports: vec![port(&allowed)],
            ..LandlockRules::default()
        };
        let (allowed_at, other_at) = (allowed.local_addr().unwrap(), other.local_addr().unwrap());
        let (report, to_allowed, to_other, bound) = std::thread::spawn(move || {
            let report = restrict_self(&rules).unwrap();
            (
                report,
                kind(TcpStream::connect(allowed_at)),
                kind(TcpStream::connect(other_at)),
                kind(TcpListener::bind("127.0.0.1:0")),
            )
        })
        .join()
        .unwrap();
        assert_eq!(report.network, Enforcement::Full);
        assert_eq!(to_allowed, Ok(()));
        assert_eq!(to_other, Err(ErrorKind::PermissionDenied));
        assert_eq!(bound, Err(ErrorKind::PermissionDenied));
    }

    /// Runs a copy of `true` placed in a writable directory from a restricted thread.
    fn exec_from_writable(exec_writable: bool) -> Result<(), ErrorKind> {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("true");
        std::fs::copy("/usr/bin/true", &program).unwrap();
        let rules = LandlockRules {
            read_exec: vec!["/usr".into(), "/lib".into(), "/lib64".into()],
            read_write: vec![dir.path().to_path_buf()],
            exec_writable,
            ..LandlockRules::default()
        };
        std::thread::spawn(move || {
            restrict_self(&rules).unwrap();
            kind(std::process::Command::new(&program).status())
        })
        .join()
        .unwrap()
    }

    #[test]
    fn writable_paths_are_not_executable_unless_allowed() {
        if skip_below(1) {
            return;
        }
        assert_eq!(exec_from_writable(false), Err(ErrorKind::PermissionDenied));
        assert_eq!(exec_from_writable(true), Ok(()));
    }

    #[test]
    fn missing_paths_are_skipped_and_reported() {
        if skip_below(1) {
            return;
        }
        let missing = PathBuf::from("/nonexistent/airlock/landlock");
        let rules = LandlockRules {
            read_exec: vec!["/usr".into(), missing.clone()],
            ..LandlockRules::default()
        };
        let report = std::thread::spawn(move || restrict_self(&rules).unwrap())
            .join()
            .unwrap();
        assert_eq!(report.skipped_paths, vec![missing]);
        assert_eq!(report.network, Enforcement::None, "deny_tcp was not asked");
        assert_eq!(report.scope, Enforcement::None, "scope_ipc was not asked");
    }

    #[test]
    fn layers_follow_the_kernel_abi() {
        assert_eq!(filesystem_enforcement(true, 0), Enforcement::None);
        assert_eq!(filesystem_enforcement(true, 3), Enforcement::Partial);
        assert_eq!(filesystem_enforcement(true, 5), Enforcement::Full);
        assert_eq!(filesystem_enforcement(false, 7), Enforcement::None);
    }

    #[test]
    fn report_serializes_enforcement_in_snake_case() {
        let report = LandlockReport {
            abi: 7,
            filesystem: Enforcement::Full,
            network: Enforcement::Partial,
            scope: Enforcement::None,
            skipped_paths: vec![],
        };
        let json = serde_json::to_string(&report).unwrap();
        assert!(json.contains(r#""filesystem":"full""#), "{json}");
        assert!(json.contains(r#""network":"partial""#), "{json}");
        assert!(json.contains(r#""scope":"none""#), "{json}");
        assert_eq!(
            serde_json::from_str::<LandlockReport>(&json).unwrap(),
            report
        );
    }
}
