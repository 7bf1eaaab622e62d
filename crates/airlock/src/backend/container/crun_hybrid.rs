//! crun 1.8 refuses a hybrid cgroup layout whose v2 mount offers any controller: crun runs
//! with that controller list hidden, by the init in its own mount namespace or by the command
//! line (see [`crun_hybrid_workaround`]).

use std::path::Path;

use super::bundle::Bundle;
use super::{find_binary, CGROUP_ROOT};
use crate::backend::PlanContext;
use crate::rundir::RunFile;
use crate::spec::HiddenFile;

/// How crun can run on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CrunHost {
    /// As it is.
    Plain,
    /// crun 1.8 refuses a hybrid cgroup layout whose v2 mount offers any controller: it runs
    /// behind [`crun_hybrid_workaround`].
    Workaround,
    /// Not at all, for this reason (with the fix).
    Unusable(String),
}

pub(crate) fn crun_host() -> CrunHost {
    let controllers = Path::new(CGROUP_ROOT).join("unified/cgroup.controllers");
    let hybrid = std::fs::read_to_string(controllers)
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    match (hybrid, find_binary("unshare")) {
        (false, _) => CrunHost::Plain,
        (true, Some(_)) => CrunHost::Workaround,
        (true, None) => CrunHost::Unusable("crun 1.8 refuses this host's hybrid cgroups (a cgroup v2 mount that offers controllers), and hiding them needs `unshare`: install util-linux, or use --container-runtime runc".into()),
    }
}

/// The tool's argv and what hides the v2 controller list from crun.
pub(super) struct HybridWorkaround {
    pub wrapper_argv: Vec<String>,
    pub hidden_files: Vec<HiddenFile>,
    pub details: Vec<String>,
}

impl HybridWorkaround {
    pub fn none(wrapper_argv: Vec<String>) -> HybridWorkaround {
        HybridWorkaround {
            wrapper_argv,
            hidden_files: Vec::new(),
            details: Vec::new(),
        }
    }
}

/// Hides the controller list so crun uses v1 like runc. With an in-memory run directory the
/// init covers it in its own mount namespace (one bind mount); otherwise the argv does, with
/// `unshare`, `sh` and `mount` (about 2.3 ms of three more execs per run).
pub(super) fn crun_hybrid_workaround(
    wrapper_argv: Vec<String>,
    bundle: &Bundle,
    files: &mut Vec<RunFile>,
    ctx: &PlanContext,
    rootless: bool,
) -> HybridWorkaround {
    let empty = bundle.dir.join("empty");
    files.push(RunFile {
        path: empty.clone(),
        contents: Vec::new(),
        mode: 0o444,
    });
    let hidden = vec![HiddenFile {
        target: Path::new(CGROUP_ROOT).join("unified/cgroup.controllers"),
        empty,
    }];
    if ctx.scratch.is_some() && !rootless {
        return HybridWorkaround {
            wrapper_argv,
            hidden_files: hidden,
            details: vec!["container: crun runs with the v2 controller list hidden in the init's own mount namespace (hybrid cgroups)".into()],
        };
    }
    let Some(wrapper_argv) = hide_files_with_unshare(wrapper_argv.clone(), &hidden, rootless)
    else {
        return HybridWorkaround::none(wrapper_argv);
    };
    let note = match rootless {
        false => "container: crun runs with the v2 controller list hidden in a private mount namespace (hybrid cgroups)",
        true => "container: crun runs with the v2 controller list hidden in a private mount namespace, inside a user namespace that maps the caller to root (hybrid cgroups, no root)",
    };
    HybridWorkaround {
        wrapper_argv,
        hidden_files: Vec::new(),
        details: vec![note.into()],
    }
}

/// `wrapper_argv` started by `unshare` in a private mount namespace where a shell first covers
/// each hidden file: for a tool started outside airlock's init. Root can mount there directly;
/// `rootless` first enters a user namespace that maps the caller to root. `None` without
/// `unshare`.
pub fn hide_files_with_unshare(
    wrapper_argv: Vec<String>,
    hidden: &[HiddenFile],
    rootless: bool,
) -> Option<Vec<String>> {
    let unshare = find_binary("unshare")?;
    let covers: Vec<String> = hidden
        .iter()
        .map(|file| {
            format!(
                "mount --bind -o ro {} {} && ",
                shell_quote(&file.empty.display().to_string()),
                shell_quote(&file.target.display().to_string())
            )
        })
        .collect();
    let quoted: Vec<String> = wrapper_argv.iter().map(|a| shell_quote(a)).collect();
    let script = format!("{}exec {}", covers.concat(), quoted.join(" "));
    let mut argv = vec![unshare.display().to_string()];
    if rootless {
        argv.extend(["--user".to_string(), "--map-root-user".into()]);
    }
    argv.extend(
        ["-m", "--propagation", "private", "/bin/sh", "-c"]
            .map(String::from)
            .into_iter()
            .chain([script]),
    );
    Some(argv)
}

pub(super) fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests;
