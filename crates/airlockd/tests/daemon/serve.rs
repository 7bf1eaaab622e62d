//! `airlock serve` runs the daemon with the same arguments.

use std::process::Command;

use crate::common::{airlock_bin, Options, TestDaemon};

#[test]
fn airlock_serve_delegates_to_airlockd() {
    let daemon = TestDaemon::start(Options::default());
    let checked = Command::new(airlock_bin())
        .args(["serve", "--check-config", "--config"])
        .arg(&daemon.config)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(String::from_utf8_lossy(&checked.stdout).contains("the configuration is valid"));
    let broken = daemon.dir.path().join("broken.toml");
    std::fs::write(&broken, "[[tenants]]\nname = \"x\"\n").unwrap();
    let refused = Command::new(airlock_bin())
        .args(["serve", "--check-config", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("tenants[0] (x).keys"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let key = Command::new(airlock_bin())
        .args(["serve", "new-key"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&key.stdout).contains("hash = \"sha256:"));
}
