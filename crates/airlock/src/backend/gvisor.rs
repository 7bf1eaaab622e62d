//! `gvisor`: the program's syscalls are served by gVisor's user-space kernel (`runsc`), from
//! the same OCI bundle as the `container` backend.
//!
//! Platform: KVM only when the CPU has real virtualization (not PVM, where runsc hangs);
//! systrap when this runsc has it; ptrace otherwise. Under ptrace (and systrap) every guest
//! address space needs a host stub process, so a cgroup pids limit kills the whole sandbox:
//! the run's cgroup gets no pids limit and `limits.processes` is enforced inside the sandbox as
//! RLIMIT_NPROC instead (the sentry refuses the fork with EAGAIN). Memory and CPU stay on the
//! run's cgroup, which runsc joins through `linux.cgroupsPath`.

use std::path::Path;
use std::sync::OnceLock;

use super::container::{
    bind_scratch_mounts, bundle_steps, container_id, find_binary, gate_for_rootful_tool, rlimits,
    rootless, runtime_cgroup_dirs, Bundle,
};
use super::oci::{OciRlimit, OciSeccomp};
use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::spec::{Confinement, StartEvidence, WrapSpec, WrapStep};

/// The first runsc release date (YYYYMMDD) with the systrap platform.
const SYSTRAP_SINCE: u32 = 20230601;

/// The gVisor backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct GvisorBackend;

/// The platform runsc uses here, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformChoice {
    pub platform: &'static str,
    pub reason: String,
}

impl Backend for GvisorBackend {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn level(&self) -> IsolationLevel {
        IsolationLevel::UserKernel
    }

    fn probe(&self) -> Probe {
        probe_runsc(true)
    }

    /// runsc's file server creates files as root and hands them over afterwards: root is no
    /// id of an idmapped mount that maps only the owner, so every create fails (EOVERFLOW).
    fn works_in_mapped_paths(&self, _policy: &crate::policy::Policy) -> Result<(), String> {
        Err("gVisor's file server creates files as root, which an idmapped mount of the directory cannot write as its owner".into())
    }

    fn quick_probe(&self) -> Probe {
        probe_runsc(false)
    }

    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        let mut problems = Vec::new();
        let Some(runsc) = find_runsc(&mut problems) else {
            return Err(Error::BackendUnavailable {
                backend: "gvisor".into(),
                reason: problems.join("; "),
            });
        };
        let rootless = rootless::is_rootless();
        let gate = gate_for_rootful_tool(ctx, "gvisor", "runsc", rootless)?;
        if !ctx.unix_sockets.is_empty() {
            return Err(crate::backend::network_unsupported(
                "gvisor",
                ctx.policy,
                "gVisor's sentry reaches host Unix sockets only through its gofer, which airlock does not set up: use the native, bwrap or container backend for unix_sockets",
            ));
        }
        let platform = choose_platform(&runsc, ctx.tool_cache);
        let bundle = Bundle::new(ctx);
        let mut input = bundle.oci_input(ctx);
        let capped = bind_scratch_mounts(ctx, &mut input.mounts);
        input.rlimits = rlimits(ctx.policy);
        input.rlimits.push(OciRlimit {
            kind: "RLIMIT_NPROC",
            soft: ctx.policy.limits.processes,
            hard: ctx.policy.limits.processes,
        });
        if rootless {
            rootless::drop_cgroup(&mut input, ctx.policy);
        }
        input.seccomp = Some(OciSeccomp {
            allow_network: ctx.policy.has_network(),
            allow_inet: ctx.egress.is_some(),
            allow_clone3: true,
        });
        let mut files = bundle.skeleton_files(&input);
        files.push(bundle.config_file(&input));
        let wrapper_argv = runsc_argv(&runsc, ctx, &bundle, &platform, rootless);
        let details = vec![format!(
            "gvisor: runsc platform {} ({})",
            platform.platform, platform.reason
        )];
        let mut notes = vec![PIDS_NOTE.into()];
        if !capped && ctx.sandbox_owns_workdir() {
            notes.push(INODES_NOTE.into());
        }
        if rootless {
            notes.push(ROOTLESS_NOTE.into());
        }
        if ctx.egress.is_some() {
            notes.push(GATED_NOTE.into());
        }
        let mut steps = bundle_steps(files, ctx.git_found);
        steps.extend(gate);
        steps.extend([WrapStep::NoCgroupPidsLimit, WrapStep::PresizeFdTable]);
        steps.push(WrapStep::CheckStarted(StartEvidence {
            tool: "runsc".into(),
            pid_file: bundle.dir.join("pid"),
            // runsc writes its pid file when the sandbox exists, before it loads the
            // program: a failure to start it is logged as the `run` command's error.
            failure_log: Some((bundle.dir.join("runsc.log"), RUNSC_FAILED.into())),
        }));
        // Without root no cgroup is made, by airlock or by runsc.
        if !rootless {
            steps.extend(
                runtime_cgroup_dirs(ctx)
                    .into_iter()
                    .map(WrapStep::RemoveDir),
            );
        }
        let mut layers = gvisor_layers(
            network_of(ctx),
            ctx.sandbox_owns_workdir().then_some(capped),
        );
        layers.extend(super::git_layer(ctx));
        Ok(Confinement::Wrapped(WrapSpec {
            wrapper_argv,
            argv_in_files: true,
            layers,
            notes,
            details,
            steps,
        }))
    }
}

/// What runsc's `run` command logs when it fails (`util.Fatalf("running container: ...")`).
const RUNSC_FAILED: &str = "running container: ";

/// `runsc ... run` for the bundle. Without root, `--rootless` makes runsc re-execute itself
/// in a user namespace that maps the caller to root, where it can build the sandbox; the
/// sandbox's own user namespace then maps only the sentry's user to the caller. No cgroup
/// can be made for the caller here: `--ignore-cgroups`.
fn runsc_argv(
    runsc: &Path,
    ctx: &PlanContext,
    bundle: &Bundle,
    platform: &PlatformChoice,
    rootless: bool,
) -> Vec<String> {
    let dir = |name: &str| bundle.dir.join(name).display().to_string();
    // A gated run: the sentry uses the network of the namespace the init prepared and
    // started runsc in (hostinet), whose only way out is the gate.
    let network = if ctx.policy.has_network() || ctx.egress.is_some() {
        "--network=host"
    } else {
        "--network=none"
    };
    let mut argv = vec![runsc.display().to_string(), "--root".into(), dir("state")];
    if rootless {
        argv.extend(["--rootless".to_string(), "--ignore-cgroups".into()]);
    }
    argv.extend([
        format!("--platform={}", platform.platform),
        network.into(),
        "--oci-seccomp".into(),
        "--log".into(),
        dir("runsc.log"),
        "run".into(),
        "--pid-file".into(),
        dir("pid"),
        "--bundle".into(),
        bundle.dir.display().to_string(),
        container_id(ctx.run_id),
    ]);
    argv
}

/// Whether runsc is installed and usable by this user; `platform` also names the platform it
/// would use, which costs a `runsc --version` (about 20 ms).
fn probe_runsc(platform: bool) -> Probe {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let runsc = find_runsc(&mut problems);
    let rootless = rootless::is_rootless();
    let userns = match rootless {
        true => rootless::user_namespaces_problem(),
        false => None,
    };
    problems.extend(userns.iter().map(|p| format!("gvisor without root: {p}")));
    if let Some(runsc) = runsc.as_deref().filter(|_| platform) {
        let choice = choose_platform(runsc, None);
        notes.push(format!(
            "runsc platform {} ({})",
            choice.platform, choice.reason
        ));
    }
    let capped = crate::confine::caps::can_mount();
    if runsc.is_some() {
        if !capped {
            problems.push(INODES_NOTE.into());
        }
        problems.push(PIDS_NOTE.into());
        if rootless {
            problems.push(ROOTLESS_NOTE.into());
        }
    }
    Probe {
        available: runsc.is_some() && userns.is_none(),
        layers: {
            let mut layers = gvisor_layers(SentryNetwork::None, Some(capped));
            layers.push(Layer::GitReadOnly);
            layers
        },
        problems,
        notes,
    }
}

const GATED_NOTE: &str = "gvisor (network allowlist or report): the sentry reaches the egress gate's namespace through hostinet (--network=host), and runsc then gives it no user namespace of its own: no user_ns (the program still runs under gVisor's kernel, as nobody)";
const ROOTLESS_NOTE: &str = "gvisor (rootless): airlock is not root, so runsc runs with --rootless: no uid_drop (the sentry and its helpers run as your uid on the host) and no cgroup (none is delegated to a non-root user here): memory is capped per process inside the sentry (RLIMIT_AS: an allocation past it fails inside the program), processes by RLIMIT_NPROC, and the result has no cgroup accounting; run airlock as root for both";
const INODES_NOTE: &str = "gvisor: runsc's tmpfs ignores nr_inodes, so limits.files is not enforced (file counts are bounded only by the memory limit) unless airlock can mount (CAP_SYS_ADMIN) and premounts capped tmpfs mounts for runsc to bind: run as root, or use the native or container backend for it";
const PIDS_NOTE: &str = "gvisor: limits.processes is enforced inside the sandbox as RLIMIT_NPROC, not by the host cgroup (runsc's stub processes would count against a cgroup pids limit and kill the whole sandbox)";

/// The network the sentry's host side (hostinet or none) sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SentryNetwork {
    /// `--network=none`.
    None,
    /// `--network=host` in the host's namespace.
    Host,
    /// `--network=host` in the egress gate's namespace, prepared by the init.
    Gated,
}

fn network_of(ctx: &PlanContext) -> SentryNetwork {
    match (ctx.policy.has_network(), ctx.egress.is_some()) {
        (true, _) => SentryNetwork::Host,
        (false, true) => SentryNetwork::Gated,
        (false, false) => SentryNetwork::None,
    }
}

/// What the sentry gives: its own kernel behind the OCI namespaces, with the bundle as root.
/// `owned_workdir` is `Some(capped)` when the run owns its workdir: its own tmpfs honours
/// `size` but not `nr_inodes`, so the inode cap holds only on the init's capped mounts.
fn gvisor_layers(network: SentryNetwork, owned_workdir: Option<bool>) -> Vec<Layer> {
    let mut layers = tier0_layers();
    layers.extend([
        Layer::MountNs,
        Layer::PidNs,
        Layer::IpcNs,
        Layer::UtsNs,
        Layer::Rootfs,
        Layer::CapsDropped,
        Layer::Seccomp,
    ]);
    match network {
        // Without host networking runsc starts the sandbox in a new user namespace that maps
        // only nobody (65534) to nobody (rootless: to the caller); the sentry runs as that uid.
        SentryNetwork::None => layers.extend([Layer::NetNs, Layer::UserNs]),
        // With hostinet it makes none; the namespace is the gate's, made by the init.
        SentryNetwork::Gated => layers.extend([Layer::NetNs, Layer::EgressGate]),
        SentryNetwork::Host => {}
    }
    match owned_workdir {
        Some(true) => layers.extend([Layer::DiskQuota, Layer::InodeQuota]),
        Some(false) => layers.push(Layer::DiskQuota),
        None => {}
    }
    layers
}

fn find_runsc(problems: &mut Vec<String>) -> Option<std::path::PathBuf> {
    let found = find_binary("runsc");
    if found.is_none() {
        problems.push("runsc (gVisor) is not installed: `apt-get install runsc` (Debian) or see gvisor.dev/docs/user_guide/install".into());
    }
    found
}

/// Picks the platform once per process.
pub fn choose_platform(runsc: &Path, cache_dir: Option<&Path>) -> PlatformChoice {
    static CHOICE: OnceLock<PlatformChoice> = OnceLock::new();
    CHOICE
        .get_or_init(|| decide_platform(&kvm_facts(), runsc_release_date(runsc, cache_dir)))
        .clone()
}

/// Facts about /dev/kvm that decide whether gVisor's KVM platform can work.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvmFacts {
    pub device: bool,
    pub hardware_virtualization: bool,
    pub pvm: bool,
}

fn kvm_facts() -> KvmFacts {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("");
    KvmFacts {
        device: Path::new("/dev/kvm").exists(),
        hardware_virtualization: flags.split_whitespace().any(|f| f == "vmx" || f == "svm"),
        pvm: Path::new("/sys/module/kvm_pvm").exists(),
    }
}

/// The release date in `runsc --version` ("runsc version 0.0~20221219.0" or "release-20231009.0").
fn runsc_release_date(runsc: &Path, cache_dir: Option<&Path>) -> Option<u32> {
    parse_release_date(&super::wrapper_version::version_line(runsc, cache_dir)?)
}

fn parse_release_date(version: &str) -> Option<u32> {
    let line = version.lines().next()?;
    line.split(|c: char| !c.is_ascii_digit())
        .find(|t| t.len() == 8)
        .and_then(|t| t.parse().ok())
}

/// The platform rule, separated from the host for tests.
pub fn decide_platform(kvm: &KvmFacts, release: Option<u32>) -> PlatformChoice {
    if kvm.device && kvm.hardware_virtualization && !kvm.pvm {
        return PlatformChoice {
            platform: "kvm",
            reason: "/dev/kvm with hardware virtualization".into(),
        };
    }
    let why_not_kvm = match (kvm.device, kvm.pvm) {
        (false, _) => "no /dev/kvm",
        (true, true) => "/dev/kvm is PVM (kvm_pvm), where runsc's KVM platform hangs",
        (true, false) => "the CPU has no vmx/svm",
    };
    if release.is_some_and(|date| date >= SYSTRAP_SINCE) {
        return PlatformChoice {
            platform: "systrap",
            reason: format!("{why_not_kvm}; systrap is faster than ptrace"),
        };
    }
    let release = release
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    PlatformChoice {
        platform: "ptrace",
        reason: format!("{why_not_kvm}; this runsc ({release}) predates systrap"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_dates_parse_from_both_version_styles() {
        assert_eq!(
            parse_release_date("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n"),
            Some(20221219)
        );
        assert_eq!(
            parse_release_date("runsc version release-20231009.0\n"),
            Some(20231009)
        );
        assert_eq!(parse_release_date("runsc version dev\n"), None);
    }

    #[test]
    fn pvm_kvm_is_never_chosen() {
        let pvm = KvmFacts {
            device: true,
            hardware_virtualization: false,
            pvm: true,
        };
        let choice = decide_platform(&pvm, Some(20221219));
        assert_eq!(choice.platform, "ptrace");
        assert!(choice.reason.contains("PVM"), "{}", choice.reason);
        assert_eq!(decide_platform(&pvm, Some(20240101)).platform, "systrap");
        let real = KvmFacts {
            device: true,
            hardware_virtualization: true,
            pvm: false,
        };
        assert_eq!(decide_platform(&real, Some(20221219)).platform, "kvm");
        assert_eq!(
            decide_platform(&KvmFacts::default(), None).platform,
            "ptrace"
        );
    }
}
