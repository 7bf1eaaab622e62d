//! The trial run that tells whether bwrap can build its namespaces on this host, and the
//! switch to flip when it cannot.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::BwrapInstall;

/// Runs bwrap the way a run will (as the unprivileged sandbox user when we are root), so
/// "available" means a run can really start.
pub(super) fn trial_run(install: &BwrapInstall) -> Result<(), String> {
    let mut command = Command::new(&install.path);
    command.args([
        "--unshare-all",
        "--unshare-user",
        "--ro-bind",
        "/",
        "/",
        "--",
        "/bin/true",
    ]);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear();
    if nix::unistd::geteuid().is_root() {
        let nobody = crate::policy::builtin("untrusted")
            .map(|p| (p.user.uid, p.user.gid))
            .unwrap_or((65534, 65534));
        command.uid(nobody.0).gid(nobody.1);
    }
    let output = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", install.path.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(format!(
        "{} cannot create its namespaces here ({stderr}): {}",
        install.path.display(),
        userns_fix()
    ))
}

/// The exact switch that keeps unprivileged user namespaces from working on this host.
fn userns_fix() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    };
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return "AppArmor restricts unprivileged user namespaces: set kernel.apparmor_restrict_unprivileged_userns=0 or install the distro's bwrap AppArmor profile (apparmor-profiles: /etc/apparmor.d/bwrap-userns-restrict)".into();
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return "unprivileged user namespaces are disabled: set the sysctl kernel.unprivileged_userns_clone=1 (or make bwrap setuid: chmod u+s /usr/bin/bwrap)".into();
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return "user namespaces are disabled: set the sysctl user.max_user_namespaces above 0"
            .into();
    }
    "check `dmesg` for an LSM denial; a setuid bwrap (chmod u+s) works without unprivileged user namespaces".into()
}
