//! `resolver = "system"` (the default) through the real binary: the gate in the CLI's process
//! resolves an allowed name with getaddrinfo and the program reaches it. The `airlock` binary
//! is a static PIE (build.rs), so getaddrinfo is static glibc's: `files` and `dns` are built
//! in, any other nsswitch source is loaded with a static `dlopen`, and a source that fails
//! to load must only be skipped, never stop the lookup or the process.
//!
//! The CLI runs in the world's gate namespace and a mount namespace of its own (`unshare
//! --mount`, private propagation) where /etc/resolv.conf names the world's DNS server and
//! /etc/nsswitch.conf is the test's: the host's files are never touched.

use airlock_testworld::{World, PYTHON, RESOLVER};

use crate::support;
use crate::{allow_with_ranges, stdout_ok};

const FETCH: &str =
    "import urllib.request; print(urllib.request.urlopen('http://allowed.test/', timeout=10).read().decode().strip())";

/// Runs the fetch with the gate resolving through the system resolver, as configured by a
/// `hosts:` line of /etc/nsswitch.conf.
fn fetch_with_hosts_sources(world: &World, hosts: &str) -> String {
    let etc = world.dir.path();
    std::fs::write(etc.join("resolv.conf"), format!("nameserver {RESOLVER}\n")).unwrap();
    std::fs::write(etc.join("nsswitch.conf"), format!("hosts: {hosts}\n")).unwrap();
    let script = format!(
        "mount --bind {0}/resolv.conf /etc/resolv.conf && \
         mount --bind {0}/nsswitch.conf /etc/nsswitch.conf && exec \"$0\" \"$@\"",
        etc.display()
    );
    let out = world
        .in_gate("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(support::airlock_bin())
        .args(["run", "--json"])
        .args(allow_with_ranges(&["allowed.test"]))
        .args(["--", PYTHON, "-c", FETCH])
        .output()
        .expect("airlock runs");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "hosts: {hosts}: no result ({e}): {}",
            support::stderr_text(&out)
        )
    });
    assert!(
        world.seen.asked("allowed.test"),
        "hosts: {hosts}: DNS not asked"
    );
    stdout_ok(&result)
}

#[test]
fn the_system_resolver_reaches_an_allowed_name() {
    let Some(world) = crate::world() else { return };
    let out = fetch_with_hosts_sources(&world, "files dns");
    assert_eq!(out.trim(), "host=allowed.test");
}

/// `systemd` is installed on Debian (a `passwd`/`group` source: it answers no host name, so it
/// is loaded and found wanting); the others are missing here and fail to load. Either way the
/// lookup goes on to `dns`.
#[test]
fn nsswitch_sources_outside_libc_are_skipped_not_fatal() {
    let Some(world) = crate::world() else { return };
    let hosts = "files systemd mymachines resolve [!UNAVAIL=return] mdns4_minimal dns";
    let out = fetch_with_hosts_sources(&world, hosts);
    assert_eq!(out.trim(), "host=allowed.test");
}
