//! The sandbox flags every command that runs a program shares (`run`, `exec`, `call`,
//! `worker`): the profile, what it is changed by (the library's [`Overrides`]) and how the
//! sandbox is set up. One set, so each command offers the same choices; a new kind of flag
//! (e.g. a network allowlist) is added here once.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::{
    self, BackendChoice, ContainerRuntime, GitProtection, LimitsSection, Overrides, Policy,
};
use airlock::{CgroupConfig, SandboxOptions};

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum BackendArg {
    Auto,
    Native,
    Bwrap,
    None,
    Gvisor,
    Container,
}

impl From<BackendArg> for BackendChoice {
    fn from(arg: BackendArg) -> Self {
        match arg {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Native => BackendChoice::Native,
            BackendArg::Bwrap => BackendChoice::Bwrap,
            BackendArg::None => BackendChoice::None,
            BackendArg::Gvisor => BackendChoice::Gvisor,
            BackendArg::Container => BackendChoice::Container,
        }
    }
}

// (Plain comments, not doc comments: a flattened struct's doc would become the
// subcommand's about text once its flags are deferred.)
// Limit overrides on top of a profile.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Limits")]
pub struct LimitFlags {
    /// Wall-clock limit, e.g. 30s or 2m (at most 365d).
    #[arg(long, value_name = "DURATION")]
    pub wall: Option<Seconds>,
    /// CPU-time limit of the whole run.
    #[arg(long, value_name = "DURATION")]
    pub cpu: Option<Seconds>,
    /// Memory limit, e.g. 512MiB.
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<ByteSize>,
    /// Processes and threads alive at once (at least 3: the sandbox needs some itself).
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Open files per process.
    #[arg(long, value_name = "N")]
    pub nofile: Option<u64>,
    /// Largest file the program may write (at least 64KiB).
    #[arg(long, value_name = "SIZE")]
    pub fsize: Option<ByteSize>,
    /// Size of each writable tmpfs (workdir, /tmp).
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<ByteSize>,
    /// Files the program may create in its writable areas.
    #[arg(long, value_name = "N")]
    pub files: Option<u64>,
    /// Bytes of stdout kept (default 1MiB).
    #[arg(long, value_name = "SIZE")]
    pub stdout_cap: Option<ByteSize>,
    /// Bytes of stderr kept (default 1MiB).
    #[arg(long, value_name = "SIZE")]
    pub stderr_cap: Option<ByteSize>,
    /// Grace period between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION")]
    pub grace: Option<Seconds>,
}

impl LimitFlags {
    fn section(&self) -> LimitsSection {
        LimitsSection {
            memory: self.mem,
            cpu_time: self.cpu,
            wall_time: self.wall,
            grace: self.grace,
            processes: self.pids,
            open_files: self.nofile,
            file_size: self.fsize,
            disk: self.disk,
            files: self.files,
            stdout: self.stdout_cap,
            stderr: self.stderr_cap,
            ..LimitsSection::default()
        }
    }
}

// How the sandbox is set up.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Set-up")]
pub struct SetupFlags {
    /// Run even if a layer the profile requires is missing (on this host, or because a flag
    /// such as --network host removes it); the result lists what was in force.
    #[arg(long)]
    pub allow_degraded: bool,
    /// Do not use cgroups.
    #[arg(long)]
    pub no_cgroup: bool,
    /// Put the run directory on the runtime directory's filesystem instead of in memory
    /// (without it, a wrapping tool's tmpfs mounts may lack their inode caps).
    #[arg(long)]
    pub disk_run_dir: bool,
    /// Where run directories are made (default /run/airlock as root, else
    /// $XDG_RUNTIME_DIR/airlock); runs that share one clean up after each other.
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// The cgroup under which runs get their own, in every hierarchy (default airlock).
    #[arg(long, value_name = "NAME")]
    pub cgroup_parent: Option<String>,
}

impl SetupFlags {
    pub fn options(&self) -> SandboxOptions {
        let cgroup = self.cgroup_parent.as_ref().map(|parent| CgroupConfig {
            parent: parent.clone(),
            ..CgroupConfig::default()
        });
        SandboxOptions {
            allow_degraded: self.allow_degraded,
            no_cgroup: self.no_cgroup,
            disk_run_dir: self.disk_run_dir,
            runtime_dir: self.runtime_dir.clone(),
            cgroup,
            ..SandboxOptions::default()
        }
    }
}

// A profile plus everything that changes it, for every command that runs a program.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Sandbox")]
pub struct SandboxFlags {
    /// Built-in profile name (untrusted, trusted) or a profile file [default: untrusted].
    #[arg(long)]
    pub profile: Option<String>,
    /// Resource tier: small (256MiB/10s CPU/30s wall/25MiB output) or standard (512MiB/60s/180s/100MiB).
    #[arg(long)]
    pub tier: Option<String>,
    /// Backend override.
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// What starts containers for `--backend container`: auto, runc, crun, podman or docker.
    #[arg(long, value_name = "NAME")]
    pub container_runtime: Option<ContainerRuntime>,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Expose a host path read-only at the same path (repeatable).
    #[arg(long = "ro", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Expose a host path read-write at the same path (repeatable).
    #[arg(long = "rw", value_name = "PATH")]
    pub read_write: Vec<PathBuf>,
    /// Use this existing host directory as the working directory, read-write (kept; as root
    /// its owner is mapped to the program's user, so files created there are the owner's).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Run the program in the current directory, exposed read-only: `airlock run --cwd --
    /// python3 script.py` runs ./script.py (the program writes only to /tmp).
    #[arg(long, conflicts_with = "workdir")]
    pub cwd: bool,
    /// Git repositories in the workdir and --rw paths: read-only (default: the program cannot
    /// plant hooks or config that git would run on the host, nor commit) or off (it can).
    #[arg(long, value_name = "read-only|off")]
    pub protect_git: Option<GitProtection>,
    /// Set an environment variable for the program (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Allow backend "none" (Tier 0 only) with any profile, not only the built-in trusted one.
    #[arg(long)]
    pub dev: bool,
    #[command(flatten)]
    pub network: crate::net_flags::NetworkFlags,
    #[command(flatten)]
    pub setup: SetupFlags,
}

impl SandboxFlags {
    /// The changes the flags ask for, as the library takes them.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            tier: self.tier.clone(),
            backend: self.backend.map(Into::into),
            container_runtime: self.container_runtime,
            network: self.network.network.map(Into::into),
            allow_net: self.network.allow_net.clone(),
            deny_net: self.network.deny_net.clone(),
            unix_sockets: self.network.unix_sockets.clone(),
            resolver: self.network.resolver.clone(),
            limits: self.limits.section(),
            read_only: self.read_only.clone(),
            read_write: self.read_write.clone(),
            workdir: match self.cwd {
                true => Some(PathBuf::from(".")),
                false => self.workdir.clone(),
            },
            workdir_read_only: self.cwd,
            protect_git: self.protect_git,
        }
    }

    /// The profile given with `--profile`, or `default`.
    pub fn profile_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.profile.as_deref().unwrap_or(default)
    }

    /// The profile (`--profile`, else `default`) with the flags applied.
    pub fn policy(&self, default: &str) -> Result<Policy> {
        let mut policy = policy::load_profile(self.profile_or(default))?;
        if let Err(invalid) = self.overrides().apply(&mut policy) {
            let flag = flag_of(invalid.key);
            return Err(anyhow::Error::new(airlock::Error::from(invalid)).context(flag));
        }
        Ok(policy)
    }

    pub fn options(&self) -> SandboxOptions {
        SandboxOptions {
            dev: self.dev,
            ..self.setup.options()
        }
    }
}

/// The flag that sets a policy key, for naming it in an error.
fn flag_of(key: &str) -> &'static str {
    match key {
        "tier" => "--tier",
        "limits.memory" => "--mem",
        "limits.cpu_time" => "--cpu",
        "limits.wall_time" => "--wall",
        "limits.grace" => "--grace",
        "limits.processes" => "--pids",
        "limits.open_files" => "--nofile",
        "limits.file_size" => "--fsize",
        "limits.disk" => "--disk",
        "limits.files" => "--files",
        "limits.stdout" => "--stdout-cap",
        "limits.stderr" => "--stderr-cap",
        "filesystem paths" => "--ro, --rw or --workdir",
        _ => "the command-line flags",
    }
}

pub fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// Warnings go to stderr in every mode: a weaker run must never be silent.
pub fn print_warnings(warnings: &[String]) {
    for warning in warnings {
        eprintln!("airlock: warning: {warning}");
    }
}
