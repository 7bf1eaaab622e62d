//! Sandbox flags shared by `worker`, `call` and `exec`: limits, extra paths and set-up options.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::{self, Policy};
use airlock::SandboxOptions;

/// Limit overrides on top of a profile.
#[derive(Args, Debug, Clone, Default)]
pub struct LimitFlags {
    /// Wall-clock limit, e.g. 30s or 2m.
    #[arg(long, value_name = "DURATION")]
    pub wall: Option<Seconds>,
    /// CPU-time limit of the whole run.
    #[arg(long, value_name = "DURATION")]
    pub cpu: Option<Seconds>,
    /// Memory limit, e.g. 512MiB.
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<ByteSize>,
    /// Processes and threads alive at once.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
}

impl LimitFlags {
    pub fn apply(&self, policy: &mut Policy) {
        let limits = &mut policy.limits;
        if let Some(wall) = self.wall {
            limits.wall_time = wall;
        }
        if let Some(cpu) = self.cpu {
            limits.cpu_time = cpu;
        }
        if let Some(mem) = self.mem {
            limits.memory = mem;
        }
        if let Some(pids) = self.pids {
            limits.processes = pids;
        }
    }
}

/// How the sandbox is set up.
#[derive(Args, Debug, Clone, Default)]
pub struct SetupFlags {
    /// Run even if a layer the profile requires is missing on this host.
    #[arg(long)]
    pub allow_degraded: bool,
    /// Do not use cgroups.
    #[arg(long)]
    pub no_cgroup: bool,
    /// Put the run directory on the runtime directory's filesystem instead of in memory
    /// (without it, a wrapping tool's tmpfs mounts may lack their inode caps).
    #[arg(long)]
    pub disk_run_dir: bool,
}

impl SetupFlags {
    pub fn options(&self) -> SandboxOptions {
        SandboxOptions {
            allow_degraded: self.allow_degraded,
            no_cgroup: self.no_cgroup,
            disk_run_dir: self.disk_run_dir,
            ..SandboxOptions::default()
        }
    }
}

/// A profile plus the flags that adjust it, for commands that run a program.
#[derive(Args, Debug, Clone)]
pub struct ProfileFlags {
    /// Built-in profile name (untrusted, trusted) or a profile file.
    #[arg(long, default_value = "untrusted")]
    pub profile: String,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Expose a host path read-only at the same path (repeatable).
    #[arg(long = "ro", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// Set an environment variable for the program (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Allow backend "none" (Tier 0 only) with any profile, not only the built-in trusted one.
    #[arg(long)]
    pub dev: bool,
    /// What starts containers for `--backend container`: auto, runc, crun, podman or docker.
    #[arg(long, value_name = "NAME")]
    pub container_runtime: Option<policy::ContainerRuntime>,
    #[command(flatten)]
    pub network: crate::net_flags::NetworkFlags,
    #[command(flatten)]
    pub setup: SetupFlags,
}

impl ProfileFlags {
    /// The profile with the overrides applied; paths made absolute.
    pub fn policy(&self) -> Result<Policy> {
        let mut policy = policy::load_profile(&self.profile)?;
        self.adjust(&mut policy)?;
        Ok(policy)
    }

    /// Applies the limit flags and `--ro` paths to a policy. Whether the paths exist is the
    /// library's check (its error names the key and the fix).
    pub fn adjust(&self, policy: &mut Policy) -> Result<()> {
        self.limits.apply(policy);
        self.network.apply(policy);
        if let Some(runtime) = self.container_runtime {
            policy.container.runtime = runtime;
        }
        for path in &self.read_only {
            let absolute = std::path::absolute(path)
                .with_context(|| format!("cannot resolve {}", path.display()))?;
            policy.filesystem.read_only.push(absolute);
        }
        Ok(())
    }

    pub fn options(&self) -> SandboxOptions {
        SandboxOptions {
            dev: self.dev,
            ..self.setup.options()
        }
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
