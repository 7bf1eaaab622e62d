//! Package managers through an allowlist naming only their host: pip from a local package
//! index, npm from a local registry, git clone over HTTPS from a local server, each with the
//! test CA (PIP_CERT, npm_config_cafile, GIT_SSL_CAINFO) and its proxy variables pointing
//! at the gate's endpoint.

use std::path::Path;

use crate::{decisions, flags, stdout_ok};

/// `--allow-net HOST` and its one test address (non-public addresses must be listed).
fn only(world: &airlock_testworld::World, host: &str, address: &str, ca_env: &str) -> Vec<String> {
    flags(&[
        "--allow-net",
        host,
        "--allow-net",
        &format!("{address}:443"),
        "--env",
        &format!("{ca_env}={}", world.ca()),
    ])
}

fn check_only(result: &serde_json::Value, host: &str) {
    let names: Vec<&str> = decisions(result, "allow")
        .into_iter()
        .filter(|d| d["channel"] != "dns")
        .map(|d| d["name"].as_str().unwrap_or("?"))
        .collect();
    assert!(!names.is_empty(), "{:#}", result["network"]);
    assert!(names.iter().all(|n| *n == host), "{names:?}");
}

fn installed(tool: &str) -> bool {
    let found = Path::new(tool).exists();
    if !found {
        crate::support::skip(&format!("{tool} is not installed (see .ci/run)"));
    }
    found
}

#[test]
fn pip_installs_from_a_local_index_through_the_gate() {
    let Some(world) = crate::world() else { return };
    if !installed("/usr/lib/python3/dist-packages/pip") {
        return;
    }
    world.serve_packages();
    let mut rules = only(&world, "pypi.test", "203.0.113.30", "PIP_CERT");
    rules.extend(flags(&[
        "--env",
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "--mem",
        "1GiB",
    ]));
    let script = "python3 -m pip install -q --no-deps --target site --index-url https://pypi.test/simple/ demo-pkg \
                  && python3 -c 'import sys; sys.path.insert(0, \"site\"); import demo_pkg; print(demo_pkg.VALUE)'";
    let result = crate::run(&world, &rules, &["/bin/sh", "-c", script]);
    assert_eq!(
        stdout_ok(&result).trim(),
        "demo-pkg from the test index",
        "{result:#}"
    );
    check_only(&result, "pypi.test");
}

#[test]
fn npm_installs_from_a_local_registry_through_the_gate() {
    let Some(world) = crate::world() else { return };
    if !installed("/usr/bin/npm") {
        return;
    }
    world.serve_packages();
    let mut rules = only(
        &world,
        "registry.test",
        "203.0.113.31",
        "NODE_EXTRA_CA_CERTS",
    );
    rules.extend(flags(&[
        "--mem",
        "1GiB",
        "--env",
        &format!("npm_config_cafile={}", world.ca()),
    ]));
    let script = "npm install --registry https://registry.test/ --no-audit --no-fund --no-update-notifier --fetch-retries=0 --loglevel=error demo-pkg >&2 \
                  && node -e 'console.log(require(\"demo-pkg\"))'";
    let result = crate::run(&world, &rules, &["/bin/sh", "-c", script]);
    assert_eq!(
        stdout_ok(&result).trim(),
        "demo-pkg from the test registry",
        "{result:#}"
    );
    check_only(&result, "registry.test");
}

#[test]
fn git_clones_over_https_from_a_local_server_through_the_gate() {
    let Some(world) = crate::world() else { return };
    if !installed("/usr/bin/git") {
        return;
    }
    world.serve_packages();
    let rules = only(&world, "gitsrv.test", "203.0.113.32", "GIT_SSL_CAINFO");
    let script = "/usr/bin/git clone -q https://gitsrv.test/demo.git && cat demo/README";
    let result = crate::run(&world, &rules, &["/bin/sh", "-c", script]);
    assert_eq!(
        stdout_ok(&result).trim(),
        "demo repository of the test git server",
        "{result:#}"
    );
    check_only(&result, "gitsrv.test");
}
