//! A host path bound into the sandbox brings the mounts beneath it along (a recursive bind),
//! and every one of them gets the bind's restrictions, whatever the host mounted them with:
//! read-only under `--ro`, never setuid or device nodes under `--ro` or `--rw`. The native
//! root adds the flags to the whole bound tree at once (`mount_setattr(AT_RECURSIVE)`); a
//! submount the host left writable, setuid and with devices must not stay so inside.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use support::*;

/// Reports, for `sub` (a host submount of the bound path), the options the sandbox sees on
/// it and whether a file can be written there.
const PROBE: &str = r#"
import json, os, sys
sub = sys.argv[1]
options = [line.split()[5].split(",") for line in open("/proc/self/mountinfo")
           if line.split()[4] == sub]
try:
    with open(os.path.join(sub, "written-inside"), "w") as f:
        f.write("x")
    write = "ok"
except OSError as e:
    write = os.strerror(e.errno)
print(json.dumps({"options": options, "write": write}))
"#;

/// A tmpfs mounted on the host under a temporary directory, with none of nosuid, nodev and
/// noexec and writable by the sandbox user; unmounted when dropped.
struct HostSubmount {
    dir: tempfile::TempDir,
}

impl HostSubmount {
    fn new() -> HostSubmount {
        let dir = tempfile::Builder::new()
            .prefix("airlock-submount-")
            .tempdir_in("/var/tmp")
            .unwrap();
        set_mode(dir.path(), 0o755);
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                "size=1m,mode=0777,suid,dev,exec",
                "tmpfs",
            ])
            .arg(&sub)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs on {}", sub.display());
        HostSubmount { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn sub(&self) -> PathBuf {
        self.dir.path().join("sub")
    }
}

impl Drop for HostSubmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.sub()).status();
    }
}

fn probe(access: &str, mount: &HostSubmount) -> Value {
    let root = mount.root().to_str().unwrap();
    let sub = mount.sub();
    let sub = sub.to_str().unwrap();
    let result = run_json(
        &[access, root, "--wall", "20s"],
        &["/usr/bin/python3", "-c", PROBE, sub],
    );
    assert_eq!(result["exit_code"], 0, "{result}");
    let report = result["stdout"].as_str().unwrap_or_default();
    serde_json::from_str(report).unwrap_or_else(|e| panic!("{e}: {result}"))
}

fn options(report: &Value) -> Vec<String> {
    let mounts = report["options"].as_array().cloned().unwrap_or_default();
    assert_eq!(mounts.len(), 1, "the submount is seen once: {report}");
    serde_json::from_value(mounts[0].clone()).unwrap()
}

fn assert_has(options: &[String], wanted: &[&str], report: &Value) {
    for flag in wanted {
        assert!(
            options.iter().any(|o| o == flag),
            "{flag} missing: {report}"
        );
    }
}

#[test]
fn a_host_submount_of_a_read_only_path_is_read_only_nosuid_nodev_inside() {
    if !is_root() || !sandbox_available() {
        return skip("needs root (to mount on the host) and the native sandbox");
    }
    let mount = HostSubmount::new();
    let report = probe("--ro", &mount);
    assert_has(&options(&report), &["ro", "nosuid", "nodev"], &report);
    assert_eq!(report["write"], "Read-only file system", "{report}");
    assert!(!mount.sub().join("written-inside").exists());
}

#[test]
fn a_host_submount_of_a_writable_path_stays_writable_but_nosuid_nodev() {
    if !is_root() || !sandbox_available() {
        return skip("needs root (to mount on the host) and the native sandbox");
    }
    let mount = HostSubmount::new();
    let report = probe("--rw", &mount);
    let seen = options(&report);
    assert_has(&seen, &["rw", "nosuid", "nodev"], &report);
    assert_eq!(report["write"], "ok", "{report}");
    assert!(mount.sub().join("written-inside").exists());
}
