//! Gaining privilege and reaching dangerous kernel interfaces and devices.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::host::{host_mountinfo, kernel_log, readable_block_device, run_host};
use crate::plan::{escaped_line, Outcome, Plan};
use crate::scene::Scene;

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("setuid_binary", (D, Privilege, BareAsNobody),
            "a setuid-root `id -u` printed 0",
            "no_new_privs, nosuid binds",
            setuid_binary)
            .root_only("planting a setuid-root binary needs root"),
        attack("plant_setuid_in_workspace", (D, Privilege, Tier0),
            "a setuid or setgid file in the `--workdir` directory on the host",
            "seccomp (setuid/setgid mode bits refused in chmod, open, mknod)",
            plant_setuid_in_workspace),
        attack("capabilities_kept", (D, Privilege, Bare),
            "program reports an effective capability or no_new_privs off",
            "capabilities dropped, uid drop, no_new_privs (Tier 0)",
            capabilities_kept),
        attack("mount_tmpfs", (D, Syscalls, Bare),
            "host mount table / program's report",
            "seccomp (mount refused), capabilities dropped",
            mount_tmpfs),
        attack("nested_userns_then_mount", (D, Syscalls, Tier0),
            "uid 0 in a new user namespace mounted tmpfs",
            "seccomp (unshare refused)",
            |s| self_reported(s, "userns_mount.py", true)),
        attack("nested_userns_clone3", (D, Syscalls, Tier0),
            "child in a new user namespace via clone3",
            "seccomp (clone3 → ENOSYS; clone's namespace flags refused)",
            |s| self_reported(s, "clone3_userns.py", false)),
        attack("keyctl_add_key", (D, Syscalls, Tier0),
            "key added to a kernel keyring",
            "seccomp (keyring calls refused)",
            |s| self_reported(s, "keyctl.py", true)),
        attack("bpf_map_create", (D, Syscalls, Bare),
            "eBPF map created",
            "seccomp",
            |s| self_reported(s, "bpf.py", false)),
        attack("perf_event_open", (D, Syscalls, Tier0),
            "perf event opened",
            "seccomp",
            |s| self_reported(s, "perf_event.py", false)),
        attack("io_uring_setup", (D, Syscalls, Tier0),
            "io_uring instance created",
            "seccomp",
            |s| self_reported(s, "io_uring.py", false)),
        attack("block_device_read", (D, Devices, Bare),
            "same first-sector hash the host reads",
            "minimal /dev, nodev, capabilities",
            block_device_read),
        attack("dev_kvm_open", (D, Devices, Bare),
            "`/dev/kvm` answered KVM_GET_API_VERSION",
            "minimal /dev",
            dev_kvm_open),
        attack("mknod_dev_mem", (D, Devices, Bare),
            "char device 1:1 (`/dev/mem`) created on the host",
            "capabilities (no CAP_MKNOD in the initial user namespace), nodev mounts",
            mknod_dev_mem),
        attack("dev_kmsg_write", (D, Devices, Bare),
            "marker line in the host kernel log",
            "minimal read-only /dev",
            dev_kmsg_write),
    ]
}

/// A kernel interface whose only effect is inside the caller: the program's own report is the
/// evidence. `with_marker`: the program takes the scene's marker as its argument.
fn self_reported(s: &mut Scene, program: &str, with_marker: bool) -> Result<Plan, String> {
    let args = with_marker.then(|| s.marker.clone());
    Ok(Plan::new(s.python(program, args), escaped_line))
}

fn setuid_binary(s: &mut Scene) -> Result<Plan, String> {
    let dir = s.dir.join("setuid");
    s.make_dir(&dir, 0o755)?;
    let binary = dir.join("id");
    std::fs::copy("/usr/bin/id", &binary).map_err(|e| format!("cannot copy /usr/bin/id: {e}"))?;
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o4755))
        .map_err(|e| format!("chmod u+s: {e}"))?;
    let evidence = |o: &Outcome| {
        o.text
            .lines()
            .next()
            .filter(|l| l.trim() == "0")
            .map(|_| "the setuid binary ran with euid 0".to_string())
    };
    let plan = Plan::new(vec![binary.display().to_string(), "-u".into()], evidence);
    let ran = |o: &Outcome| match o.text.lines().next().map(str::trim) {
        Some(uid) if uid.parse::<u32>().is_ok() => Ok(()),
        other => Err(format!("the setuid binary did not run: {other:?}")),
    };
    Ok(plan
        .flags(["--ro".to_string(), dir.display().to_string()])
        .expect(ran))
}

/// A workdir that outlives the run, given to the sandbox user (gVisor refuses a root-owned
/// one; `tests/workspace.rs` plants into a root-owned, id-mapped one on the other backends):
/// a setuid file of any owner planted there is a credential handed to whoever runs it.
fn plant_setuid_in_workspace(s: &mut Scene) -> Result<Plan, String> {
    let workspace = s.dir.join("workspace");
    s.make_dir(&workspace, 0o777)?;
    s.chown_to_sandbox_user(&workspace)?;
    let program = s.python("setuid_plant.py", [workspace.display().to_string()]);
    let host_dir = workspace.clone();
    let evidence = move |_: &Outcome| {
        let entries = std::fs::read_dir(&host_dir).ok()?;
        entries.flatten().find_map(|entry| {
            let meta = entry.path().symlink_metadata().ok()?;
            let setid = meta.is_file() && meta.permissions().mode() & 0o6000 != 0;
            setid.then(|| {
                let owner = std::os::unix::fs::MetadataExt::uid(&meta);
                let mode = meta.permissions().mode();
                format!(
                    "{} is mode {mode:o}, owner uid {owner}",
                    entry.path().display()
                )
            })
        })
    };
    Ok(Plan::new(program, evidence)
        .flags(["--workdir".to_string(), workspace.display().to_string()]))
}

fn capabilities_kept(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("capabilities.py", Vec::<String>::new()),
        escaped_line,
    ))
}

fn mount_tmpfs(s: &mut Scene) -> Result<Plan, String> {
    let target = s.dir.join("mountpoint");
    s.make_dir(&target, 0o777)?;
    let host_target = target.display().to_string();
    let unmount = host_target.clone();
    s.on_cleanup(move || {
        let _ = run_host(&["umount", "-l", &unmount]);
    });
    let program = s.python("mount_tmpfs.py", [host_target.clone(), s.marker.clone()]);
    let evidence = move |o: &Outcome| {
        let host_sees = host_mountinfo()
            .iter()
            .any(|l| l.split(' ').nth(4) == Some(host_target.as_str()));
        if host_sees {
            return Some(format!("host mount table has {host_target}"));
        }
        escaped_line(o)
    };
    Ok(Plan::new(program, evidence))
}

fn block_device_read(s: &mut Scene) -> Result<Plan, String> {
    let (device, digest) = readable_block_device()
        .ok_or("no block device on this host can be opened, even by root")?;
    let needle = format!("sha256 {digest}");
    let evidence = move |o: &Outcome| {
        o.text
            .contains(&needle)
            .then(|| format!("the program read the same first sector the host reads ({needle})"))
    };
    Ok(Plan::new(s.python("block_device.py", [device]), evidence))
}

fn dev_kvm_open(s: &mut Scene) -> Result<Plan, String> {
    if !Path::new("/dev/kvm").exists() {
        return Err("this host has no /dev/kvm".into());
    }
    self_reported(s, "dev_kvm.py", false)
}

fn mknod_dev_mem(s: &mut Scene) -> Result<Plan, String> {
    let dir = s.dir.join("devices");
    s.make_dir(&dir, 0o777)?;
    let node = dir.join("mem");
    let evidence = move |o: &Outcome| {
        use std::os::unix::fs::FileTypeExt;
        let on_host =
            std::fs::symlink_metadata(&node).is_ok_and(|m| m.file_type().is_char_device());
        if on_host {
            return Some(format!("device node {} exists on the host", node.display()));
        }
        escaped_line(o)
    };
    Ok(Plan::new(
        s.python("mknod_device.py", [dir.display().to_string()]),
        evidence,
    ))
}

fn dev_kmsg_write(s: &mut Scene) -> Result<Plan, String> {
    let needle = format!("airlock attack {}", s.marker);
    let evidence = move |_: &Outcome| {
        kernel_log()
            .contains(&needle)
            .then(|| format!("host kernel log has {needle:?}"))
    };
    Ok(Plan::new(
        s.python("kmsg_write.py", [s.marker.clone()]),
        evidence,
    ))
}
