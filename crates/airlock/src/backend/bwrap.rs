//! `bwrap`: the program runs under a distro bubblewrap. For hosts where the native backend
//! cannot create what it needs but bwrap can (a setuid bwrap, or a bwrap an LSM profile lets
//! through). Tier 0, the cgroup and our seccomp filters still come from airlock; bwrap builds
//! the namespaces and the root filesystem. It cannot apply Landlock, so that is never claimed.
//! Its tmpfs mounts have no inode cap and no noexec: when airlock can mount, the writable areas
//! are instead the init's capped tmpfs mounts (its in-memory run directory), bound by bwrap.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::confine::rootfs::{default_etc_files, default_system_ro};
use crate::confine::seccomp::SeccompConfig;
use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::rundir::{self, RunFile};
use crate::spec::{Confinement, WrapSpec, WrapStep};
use trial::trial_run;

/// The hostname inside every bwrap sandbox (the same as the native one).
pub const BWRAP_HOSTNAME: &str = super::native::SANDBOX_HOSTNAME;

/// Descriptors at which the init hands bwrap our seccomp filters (syscall table, then argument
/// checks).
pub const SECCOMP_FDS: [i32; 2] = crate::spec::fds::BWRAP_SECCOMP_FDS;

/// The descriptor bwrap writes its JSON status to, so that a bwrap that fails before the
/// program starts is reported as a setup failure, not as the program exiting 1.
pub const STATUS_FD: i32 = crate::spec::fds::BWRAP_STATUS_FD;
const GIT_FDS_FIRST: i32 = crate::spec::fds::BWRAP_GIT_FDS_FIRST;

/// Where bwrap is looked for before `PATH`.
const BWRAP_CANDIDATES: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];

/// The oldest bwrap with everything we pass (`--add-seccomp-fd`, `--size`).
const MIN_VERSION: (u32, u32, u32) = (0, 5, 0);

/// The layers bwrap builds with the arguments of [`bwrap_args`].
fn bwrap_layers() -> Vec<Layer> {
    let mut layers = Layer::NAMESPACES_BUT_NET.to_vec();
    layers.extend([Layer::Rootfs, Layer::CapsDropped, Layer::Workdir]);
    layers
}

const NOT_INSTALLED: &str =
    "bwrap is not installed: apt-get install bubblewrap (or dnf install bubblewrap)";
const UNENFORCED_NOTE: &str = "bwrap applies no Landlock rules: use the native backend for them";
const UNCAPPED_NOTE: &str = "bwrap puts no inode cap (limits.files) and no noexec on its tmpfs mounts; airlock premounts capped ones for it only when it can mount (CAP_SYS_ADMIN): run as root, or use the native backend";

/// What a working bwrap puts in force, with Tier 0 and our seccomp filters, and the inode
/// cap of the init's premounted tmpfs mounts when it can make them.
fn probe_layers(available: bool) -> Vec<Layer> {
    let mut layers = tier0_layers();
    if available {
        layers.extend(bwrap_layers());
        layers.extend([
            Layer::NetNs,
            Layer::Seccomp,
            Layer::NoNewPrivs,
            Layer::DiskQuota,
            Layer::GitReadOnly,
        ]);
        if crate::confine::caps::can_mount() {
            layers.push(Layer::InodeQuota);
        }
        layers.sort();
        layers.dedup();
    }
    layers
}

/// What bwrap leaves unenforced on this host.
fn notes() -> Vec<String> {
    let mut notes = vec![UNENFORCED_NOTE.to_string()];
    if !crate::confine::caps::can_mount() {
        notes.push(UNCAPPED_NOTE.into());
    }
    notes
}

/// The bubblewrap backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct BwrapBackend;

/// A bwrap binary found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwrapInstall {
    pub path: PathBuf,
    pub version: (u32, u32, u32),
    /// The binary is setuid root: it must not run under no_new_privs.
    pub setuid: bool,
}

/// One system directory of the host as the sandbox shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// Bound read-only at the same path.
    Dir(PathBuf),
    /// Recreated as a symlink (merged-/usr hosts: `/bin -> usr/bin`).
    Symlink { path: PathBuf, target: PathBuf },
}

/// The host paths the sandbox sees, resolved once on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    pub system: Vec<SystemEntry>,
    /// `/etc` entries bound read-only when they exist.
    pub etc: Vec<PathBuf>,
    /// Generated files (host path inside the run directory, path inside the sandbox).
    pub identity: Vec<(PathBuf, PathBuf)>,
}

impl Backend for BwrapBackend {
    fn name(&self) -> &'static str {
        "bwrap"
    }

    fn level(&self) -> IsolationLevel {
        IsolationLevel::Kernel
    }

    fn probe(&self) -> Probe {
        let status = cached_status();
        let available = status.install.is_some() && status.problems.is_empty();
        let mut problems = status.problems.clone();
        problems.extend(notes());
        Probe {
            available,
            layers: probe_layers(available),
            problems,
            notes: Vec::new(),
        }
    }

    fn quick_probe(&self) -> Probe {
        let installed = find_bwrap().is_some();
        let mut problems = Vec::new();
        if !installed {
            problems.push(NOT_INSTALLED.into());
        }
        problems.extend(notes());
        Probe {
            available: installed,
            layers: probe_layers(installed),
            problems,
            notes: Vec::new(),
        }
    }

    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        let install =
            &inspect_install(ctx.tool_cache).map_err(|reason| Error::BackendUnavailable {
                backend: "bwrap".into(),
                reason,
            })?;
        let identity = identity_files(ctx);
        let layout = HostLayout {
            system: resolve_system_entries(&default_system_ro()),
            etc: default_etc_files(),
            identity: identity
                .iter()
                .map(|(file, inside)| (file.path.clone(), inside.clone()))
                .collect(),
        };
        let mut layers = bwrap_layers();
        if !ctx.policy.has_network() {
            layers.push(Layer::NetNs);
        }
        if ctx.egress.is_some() {
            layers.push(Layer::EgressGate);
        }
        if ctx.sandbox_owns_workdir() {
            layers.push(Layer::DiskQuota);
            if ctx.scratch.is_some() {
                layers.push(Layer::InodeQuota);
            }
        }
        layers.push(Layer::Seccomp);
        layers.extend(super::git_layer(ctx));
        if install.setuid {
            // bwrap itself sets no_new_privs before it execs the program.
            layers.push(Layer::NoNewPrivs);
        }
        let mut steps: Vec<WrapStep> = identity
            .into_iter()
            .map(|(file, _)| WrapStep::WriteFile(file))
            .collect();
        // bwrap runs without root (the init dropped it), so the gate's namespace belongs to
        // a user namespace of the sandbox user's own; bwrap nests its own inside.
        if ctx.egress.is_some() {
            steps.push(WrapStep::EgressNamespace {
                own_user_namespace: true,
            });
        }
        // A setuid bwrap must not run under no_new_privs (it sets it itself, see above), nor
        // in a user namespace of ours.
        if !install.setuid {
            steps.extend([WrapStep::ProcessCapInOwnUserNamespace, WrapStep::NoNewPrivs]);
        }
        steps.push(WrapStep::SeccompFds {
            config: SeccompConfig {
                allow_network: ctx.policy.has_network(),
                allow_inet: ctx.egress.is_some(),
            },
            fds: SECCOMP_FDS.to_vec(),
        });
        steps.push(WrapStep::StatusFd(STATUS_FD));
        // bwrap makes no cgroup and its processes cannot reach ours (see the step).
        steps.push(WrapStep::MembersStayInRunCgroup);
        if !ctx.git_found.is_empty() {
            steps.push(WrapStep::FoundFds {
                found: ctx.git_found.to_vec(),
                first: GIT_FDS_FIRST,
            });
        }
        Ok(Confinement::Wrapped(WrapSpec {
            wrapper_argv: bwrap_args(ctx, install, &layout),
            layers,
            steps,
            ..WrapSpec::default()
        }))
    }
}

/// The complete bwrap command line up to (and including) the `--` before the program.
pub fn bwrap_args(ctx: &PlanContext, install: &BwrapInstall, layout: &HostLayout) -> Vec<String> {
    let policy = ctx.policy;
    let mut args = Args(vec![install.path.display().to_string()]);
    args.flag("--unshare-all");
    args.flag("--unshare-user");
    // A gated run keeps the namespace the init prepared for the gate.
    if policy.has_network() || ctx.egress.is_some() {
        args.flag("--share-net");
    }
    if install.version >= (0, 8, 0) {
        args.flag("--disable-userns");
    }
    args.flag("--die-with-parent");
    if !ctx.tty {
        // Without a terminal of its own the program cannot push input into ours (TIOCSTI).
        args.flag("--new-session");
    }
    args.flags(["--cap-drop", "ALL"]);
    args.flags(["--hostname", BWRAP_HOSTNAME]);
    for entry in &layout.system {
        match entry {
            SystemEntry::Dir(path) => args.paths("--ro-bind", path, path),
            SystemEntry::Symlink { path, target } => args.paths("--symlink", target, path),
        }
    }
    for path in &layout.etc {
        args.paths("--ro-bind-try", path, path);
    }
    for (host, inside) in &layout.identity {
        args.paths("--ro-bind", host, inside);
    }
    args.flags(["--proc", "/proc", "--dev", "/dev"]);
    let disk = policy.limits.disk.0;
    args.writable_area(ctx, &rundir::tmp_dir(ctx.run_dir), Path::new("/tmp"), disk);
    let (shm, _) = policy.limits.shm_caps();
    args.writable_area(
        ctx,
        &rundir::shm_dir(ctx.run_dir),
        Path::new("/dev/shm"),
        shm,
    );
    for path in policy.filesystem.read_only.iter().chain(ctx.unix_sockets) {
        args.paths("--ro-bind", path, path);
    }
    for path in &policy.filesystem.read_write {
        args.paths("--bind", path, path);
    }
    if ctx.sandbox_owns_workdir() {
        args.writable_area(ctx, ctx.workdir, ctx.workdir, disk);
    } else if policy.filesystem.workdir_read_only {
        args.paths("--ro-bind", ctx.workdir, ctx.workdir);
    } else {
        args.paths("--bind", ctx.workdir, ctx.workdir);
    }
    // After every writable bind, so each lands on top of the path holding it; from the
    // descriptor of what the walk found (see `WrapStep::FoundFds`), never by path.
    for path in ctx.git_pinned {
        args.git_bind(ctx, "--bind", path);
    }
    for path in ctx.git_read_only {
        args.git_bind(ctx, "--ro-bind", path);
    }
    args.path("--chdir", ctx.workdir);
    for fd in SECCOMP_FDS {
        args.flags(["--add-seccomp-fd", &fd.to_string()]);
    }
    args.flags(["--json-status-fd", &STATUS_FD.to_string()]);
    args.flag("--");
    args.0
}

struct Args(Vec<String>);

impl Args {
    /// A writable tmpfs at `inside`: the in-memory run directory's capped mount at `scratch`
    /// when the run has one (it caps inodes and sets noexec, which bwrap cannot), else bwrap's
    /// own tmpfs, capped in size only.
    fn writable_area(&mut self, ctx: &PlanContext, scratch: &Path, inside: &Path, size: u64) {
        match ctx.scratch.and_then(|s| s.mount_at(scratch)) {
            Some(mount) => self.paths("--bind", &mount.path, inside),
            None => {
                self.flags(["--size", &size.to_string()]);
                self.path("--tmpfs", inside);
            }
        }
    }

    /// `{bind}-fd N path` when the walk found `path` (its descriptor's number), else by path.
    fn git_bind(&mut self, ctx: &PlanContext, bind: &str, path: &Path) {
        match ctx.git_found.iter().position(|f| f.path == path) {
            Some(index) => {
                let fd = GIT_FDS_FIRST + index as i32;
                self.flags([&format!("{bind}-fd"), &fd.to_string()]);
                self.0.push(path.display().to_string());
            }
            None => self.paths(bind, path, path),
        }
    }

    fn flag(&mut self, flag: &str) {
        self.0.push(flag.to_string());
    }

    fn flags<const N: usize>(&mut self, flags: [&str; N]) {
        self.0.extend(flags.iter().map(|f| f.to_string()));
    }

    // `to_string_lossy`, not `display().to_string()`: the same text without the formatting
    // machinery, for the ~40 paths of every plan.
    fn path(&mut self, flag: &str, path: &Path) {
        self.0
            .extend([flag.to_string(), path.to_string_lossy().into_owned()]);
    }

    fn paths(&mut self, flag: &str, first: &Path, second: &Path) {
        self.0.extend([
            flag.to_string(),
            first.to_string_lossy().into_owned(),
            second.to_string_lossy().into_owned(),
        ]);
    }
}

/// Host directories as bind (real directories) or symlink (merged-/usr aliases); absent ones
/// are left out.
pub fn resolve_system_entries(paths: &[PathBuf]) -> Vec<SystemEntry> {
    paths
        .iter()
        .filter_map(|path| {
            let meta = std::fs::symlink_metadata(path).ok()?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(path).ok()?;
                return Some(SystemEntry::Symlink {
                    path: path.clone(),
                    target,
                });
            }
            meta.is_dir().then(|| SystemEntry::Dir(path.clone()))
        })
        .collect()
}

/// passwd, group, hosts and hostname naming only the sandbox user and host, written by the
/// init into the run directory and bound over the sandbox's `/etc`.
fn identity_files(ctx: &PlanContext) -> Vec<(RunFile, PathBuf)> {
    let (uid, gid) = super::native::sandbox_ids(ctx.policy);
    let home = ctx.workdir.display();
    let mut files = vec![
        (
            "passwd",
            format!("sandbox:x:{uid}:{gid}:airlock sandbox:{home}:/bin/sh\n"),
        ),
        ("group", format!("sandbox:x:{gid}:\n")),
        (
            "hosts",
            format!("127.0.0.1 localhost {BWRAP_HOSTNAME}\n::1 localhost\n"),
        ),
        ("hostname", format!("{BWRAP_HOSTNAME}\n")),
    ];
    if ctx.egress.is_some() {
        files.push(("resolv.conf", super::GATED_RESOLV_CONF.into()));
    } else if ctx.policy.has_network() {
        if let Ok(resolv) = std::fs::read_to_string("/etc/resolv.conf") {
            files.push(("resolv.conf", resolv));
        }
    }
    let dir = ctx.run_dir.join("bwrap-etc");
    files
        .into_iter()
        .map(|(name, contents)| {
            let file = RunFile {
                path: dir.join(name),
                contents: contents.into_bytes(),
                mode: 0o644,
            };
            (file, Path::new("/etc").join(name))
        })
        .collect()
}

/// What probing found, computed once per process.
#[derive(Debug, Clone)]
struct BwrapStatus {
    install: Option<BwrapInstall>,
    problems: Vec<String>,
}

fn cached_status() -> &'static BwrapStatus {
    static STATUS: OnceLock<BwrapStatus> = OnceLock::new();
    STATUS.get_or_init(probe_host)
}

fn probe_host() -> BwrapStatus {
    match inspect_install(None) {
        Ok(install) => {
            let problems = trial_run(&install).err().into_iter().collect();
            BwrapStatus {
                install: Some(install),
                problems,
            }
        }
        Err(problem) => BwrapStatus {
            install: None,
            problems: vec![problem],
        },
    }
}

/// The installed bwrap, its version (remembered in `cache_dir`) and whether it is setuid.
fn inspect_install(cache_dir: Option<&Path>) -> Result<BwrapInstall, String> {
    let path = find_bwrap().ok_or_else(|| NOT_INSTALLED.to_string())?;
    let version = super::wrapper_version::version_line(&path, cache_dir)
        .and_then(|line| parse_version(&line))
        .ok_or_else(|| {
            format!(
                "cannot read the version of {}: reinstall bubblewrap",
                path.display()
            )
        })?;
    if version < MIN_VERSION {
        let (a, b, c) = version;
        return Err(format!("bwrap {a}.{b}.{c} is too old (needs 0.5.0 for --add-seccomp-fd and --size): upgrade bubblewrap"));
    }
    let setuid = std::fs::metadata(&path)
        .map(|m| m.permissions().mode() & 0o4000 != 0)
        .unwrap_or(false);
    Ok(BwrapInstall {
        path,
        version,
        setuid,
    })
}

fn find_bwrap() -> Option<PathBuf> {
    let path_dirs = std::env::var("PATH").unwrap_or_default();
    BWRAP_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .chain(
            path_dirs
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| Path::new(d).join("bwrap")),
        )
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Parses `bubblewrap 0.8.0` into `(0, 8, 0)`.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut parts = word.split('.').map(|p| {
        p.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    });
    Some((
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
        parts.next().flatten().unwrap_or(0),
    ))
}

mod trial;

#[cfg(test)]
mod tests;
