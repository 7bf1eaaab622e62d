//! Every Linux backend honours a gated network or refuses it with the reason: a program
//! reaches an allowed name through the proxy endpoint (HTTP and CONNECT) and transparently
//! (its own DNS lookup and TLS), an unlisted name gets no address, and the result carries the
//! gate's report and the `egress_gate` layer. Never a silent `host` or `none`.

use airlock_testworld::World;
use serde_json::Value;

use crate::support::{self, status};
use crate::{allow_with_ranges, ca, decisions, stdout_ok};

/// Through the proxy variables, then with them ignored, then an unlisted name.
fn client(world: &World) -> String {
    format!(
        r#"
import os, socket, ssl, time, urllib.request
ctx = ssl.create_default_context(cafile="{ca}")
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
print(opener.open("http://allowed.test/", timeout=10).read().decode().strip())
print(opener.open("https://allowed.test/", timeout=10).read().decode().strip())
raw = socket.create_connection(("allowed.test", 443), timeout=10)
tls = ctx.wrap_socket(raw, server_hostname="allowed.test")
tls.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
print(tls.recv(200).decode().split("\n")[-2])
start = time.time()
try:
    socket.getaddrinfo("other.test", 443)
    print("resolved")
except socket.gaierror:
    print("no-address", time.time() - start < 3)
"#,
        ca = ca(world)
    )
}

const EXPECTED: [&str; 4] = [
    "host=allowed.test",
    "sni=allowed.test",
    "sni=allowed.test",
    "no-address True",
];

fn gated_run(backend: &str, extra: &[&str]) {
    let Some(world) = crate::world() else { return };
    let mut flags = allow_with_ranges(&["allowed.test"]);
    flags.extend(["--backend", backend].map(String::from));
    flags.extend(extra.iter().map(|s| s.to_string()));
    let out = crate::airlock_in(
        &world,
        &flags,
        &[airlock_testworld::PYTHON, "-c", &client(&world)],
    );
    let stderr = support::stderr_text(&out);
    if stderr.contains("backend_unavailable") {
        return support::skip(&format!("{backend} {extra:?}: {stderr}"));
    }
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{backend}: no result ({e}): {stderr}"));
    let out = stdout_ok(&result);
    assert_eq!(out.lines().collect::<Vec<_>>(), EXPECTED, "{result:#}");
    check_report(&result, backend);
}

fn check_report(result: &Value, backend: &str) {
    let layers = result["isolation"].as_array().unwrap();
    for layer in ["net_ns", "egress_gate"] {
        assert!(
            layers.contains(&Value::from(layer)),
            "{backend}: {layer} in {layers:?}"
        );
    }
    let network = &result["network"];
    assert_eq!(network["mode"], "allowlist", "{backend}");
    let allowed = decisions(result, "allow");
    let named: Vec<&str> = allowed
        .iter()
        .filter(|d| d["channel"] != "dns")
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(
        named, ["allowed.test"; 3],
        "{backend}: three allowed streams: {network:#}"
    );
    assert!(allowed
        .iter()
        .filter(|d| d["channel"] != "dns")
        .all(|d| d["bytes_in"].as_u64() > Some(0) && d["bytes_out"].as_u64() > Some(0)));
    assert!(
        network["counters"]["dns_refused"].as_u64() >= Some(1),
        "{network:#}"
    );
}

#[test]
fn native_honours_the_allowlist() {
    gated_run("native", &[]);
}

/// A warm run (`run --warm`: a sandbox prepared ahead, its gate started with it) is gated
/// exactly as a cold one: the allowed name is reached, the unlisted one gets no address, and
/// the report and the `egress_gate` layer are there.
#[test]
fn a_warm_native_run_honours_the_allowlist() {
    gated_run("native", &["--warm"]);
}

/// A gated warm pool's command that finds no sandbox ready runs cold on the pool's shared root
/// (`WarmStats::cold_on_shared_root`) with an egress gate of its own: it is gated exactly as
/// the prepared run before it (allowed name reached three ways, unlisted name no address, the
/// gate's report) and its isolation record is the prepared run's.
#[test]
fn a_gated_pools_cold_fallback_is_gated_like_its_prepared_run() {
    use support::api::{Overrides, WarmOptions};
    let Some(world) = crate::world() else { return };
    // The CA outside `/tmp` (where the target directory of a clone in `/tmp` is too): a host
    // path bound under a mount each run makes afresh would give the pool no shared root
    // (`rootfs::plan_shared_root`).
    let ca_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    support::set_mode(ca_dir.path(), 0o755);
    let ca = support::write_file(
        ca_dir.path(),
        "cert.pem",
        std::fs::read(ca(&world)).unwrap(),
    );
    let client = client(&world).replace(&world.ca(), &ca.display().to_string());
    let (results, stats) = airlock_testworld::in_netns(&world.gate_ns, move || {
        let mut policy = support::api::load_profile("untrusted").unwrap();
        let overrides = Overrides {
            allow_net: ["allowed.test"]
                .iter()
                .chain(crate::TEST_RANGES.iter())
                .map(|rule| rule.to_string())
                .collect(),
            resolver: Some(airlock_testworld::RESOLVER.into()),
            read_only: vec![ca],
            ..Overrides::default()
        };
        overrides.apply(&mut policy).unwrap();
        let sandbox = support::api::Sandbox::with_options(policy, support::sandbox_options());
        let mut options = WarmOptions::new(1);
        options.refill = false;
        let pool = sandbox.unwrap().warm(options).unwrap();
        assert!(
            pool.wait_ready(1, std::time::Duration::from_secs(30)),
            "{:?}",
            pool.stats()
        );
        let run = || {
            let result = pool
                .command(airlock_testworld::PYTHON)
                .args(["-c", &client])
                .run()
                .unwrap();
            serde_json::to_value(result).unwrap()
        };
        let results = [run(), run()];
        let stats = pool.stats();
        pool.shutdown();
        (results, stats)
    });
    let served = (
        stats.served,
        stats.cold_fallbacks,
        stats.cold_on_shared_root,
    );
    assert_eq!(served, (1, 1, 1), "{stats:?}");
    drop(ca_dir);
    for result in &results {
        let out = stdout_ok(result);
        assert_eq!(out.lines().collect::<Vec<_>>(), EXPECTED, "{result:#}");
        check_report(result, "native");
    }
    assert_eq!(results[0]["isolation"], results[1]["isolation"]);
}

#[test]
fn bwrap_honours_the_allowlist() {
    gated_run("bwrap", &[]);
}

#[test]
fn runc_honours_the_allowlist() {
    gated_run("container", &["--container-runtime", "runc"]);
}

#[test]
fn crun_honours_the_allowlist() {
    gated_run("container", &["--container-runtime", "crun"]);
}

#[test]
fn podman_honours_the_allowlist() {
    gated_run("container", &["--container-runtime", "podman"]);
}

/// gVisor reaches the gate's namespace through hostinet, where runsc makes no user namespace
/// for the sentry: `user_ns` is missing, so the untrusted profile refuses the run with that
/// reason unless the degradation is accepted.
#[test]
fn gvisor_honours_the_allowlist_without_a_user_namespace() {
    let Some(world) = crate::world() else { return };
    let flags = {
        let mut flags = allow_with_ranges(&["allowed.test"]);
        flags.extend(["--backend", "gvisor"].map(String::from));
        flags
    };
    let refused = crate::refusal(&world, &flags);
    if refused.contains("backend_unavailable") {
        return support::skip(&format!("gvisor: {refused}"));
    }
    assert!(
        refused.contains("[degraded]") && refused.contains("user_ns"),
        "{refused}"
    );
    drop(world);
    gated_run("gvisor", &["--allow-degraded"]);
}

/// Tier 0 has no network namespace: a gated run is refused, never run with the host's
/// network, and so are host Unix sockets (Tier 0 sees them all).
#[test]
fn tier0_refuses_a_gated_network_and_unix_sockets() {
    for flags in [
        &["--allow-net", "allowed.test"][..],
        &["--network", "report"],
        &["--unix-socket", "/run/x.sock"],
    ] {
        let mut args = vec!["run", "--json", "--dev", "--backend", "none"];
        args.extend_from_slice(flags);
        args.extend(["--", "/bin/true"]);
        let out = support::airlock(&args);
        let result: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let stderr = support::stderr_text(&out);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {stderr}");
        assert!(
            stderr.contains("network_unsupported") || stderr.contains("bad_path"),
            "{flags:?}: {stderr} {result}"
        );
        if flags[0] != "--unix-socket" {
            assert!(stderr.contains("no network namespace"), "{stderr}");
        }
    }
}

/// The plan shows the gate before anything runs: mode, rules, the captured ports, the DNS
/// stub and the proxy endpoint, the proxy variables and the `egress_gate` layer it requires.
#[test]
fn a_dry_run_shows_the_gate() {
    let out = support::airlock(&[
        "run",
        "--dry-run",
        "--allow-net",
        "api.example.com",
        "--allow-net",
        "tcp://ssh.example.com:22",
        "--deny-net",
        "uploads.example.com",
        "--",
        "/bin/true",
    ]);
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan");
    assert_eq!(plan["network"], "allowlist");
    let egress = &plan["egress"];
    assert_eq!(
        egress["allow"],
        serde_json::json!(["api.example.com", "tcp://ssh.example.com:22"])
    );
    assert_eq!(egress["deny"], serde_json::json!(["uploads.example.com"]));
    assert_eq!(egress["capture_ports"], serde_json::json!([22, 80, 443]));
    assert_eq!(egress["dns"], "127.0.0.1:53");
    assert_eq!(egress["proxy"], "127.0.0.1:3128");
    assert_eq!(egress["limits"]["connections"], 256);
    for name in [
        "HTTPS_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "PIP_PROXY",
        "NPM_CONFIG_HTTPS_PROXY",
    ] {
        assert!(
            plan["env"].as_array().unwrap().contains(&Value::from(name)),
            "{name} in {}",
            plan["env"]
        );
    }
    for key in ["required", "layers"] {
        assert!(
            plan[key]
                .as_array()
                .unwrap()
                .contains(&Value::from("egress_gate")),
            "{key}: {plan:#}"
        );
    }
    let bad = support::airlock(&[
        "run",
        "--dry-run",
        "--allow-net",
        "exa mple.com",
        "--",
        "/bin/true",
    ]);
    let stderr = support::stderr_text(&bad);
    assert_eq!(bad.status.code(), Some(125));
    assert!(
        stderr.contains("network.allow") && stderr.contains("exa mple.com"),
        "{stderr}"
    );
    let unused = support::airlock(&[
        "run",
        "--dry-run",
        "--network",
        "none",
        "--allow-net",
        "a.example",
        "--",
        "/bin/true",
    ]);
    assert!(
        support::stderr_text(&unused).contains("only with network.mode"),
        "{}",
        support::stderr_text(&unused)
    );
}

/// As a normal user the native backend still honours the allowlist: the child owns its user
/// and network namespaces, so it configures the gate's namespace without any privilege.
#[test]
fn native_honours_the_allowlist_without_root() {
    let Some(world) = crate::world() else { return };
    if !std::path::Path::new("/usr/bin/setpriv").exists() {
        return support::skip("setpriv (util-linux) is not installed");
    }
    let uid = support::UNPRIVILEGED_UID.to_string();
    let mut command = world.in_gate("/usr/bin/setpriv");
    command
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--"])
        .arg(support::airlock_bin())
        .args([
            "run",
            "--json",
            "--no-cgroup",
            "--resolver",
            airlock_testworld::RESOLVER,
        ])
        .args(["--ro", &world.ca()])
        .args(allow_with_ranges(&["allowed.test"]))
        .args(["--", airlock_testworld::PYTHON, "-c", &client(&world)]);
    let out = command.output().unwrap();
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", support::stderr_text(&out)));
    if status(&result) == "sandbox_error" && result["error_kind"] == "user_namespaces_refused" {
        return support::skip("unprivileged user namespaces are refused here");
    }
    let text = stdout_ok(&result);
    assert_eq!(text.lines().collect::<Vec<_>>(), EXPECTED, "{result:#}");
    check_report(&result, "native (unprivileged)");
}

/// Report mode (learning, trusted code): traffic to names outside the allowlist flows (as
/// `would_deny`), non-public addresses stay refused, and the result suggests allow rules.
#[test]
fn report_mode_records_what_the_allowlist_would_refuse() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import urllib.request, urllib.error
for name in ["allowed.test", "other.test", "meta.test"]:
    try:
        print(urllib.request.urlopen("http://%s/" % name, timeout=10).read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("X-Airlock-Egress"))
"#;
    let flags = crate::flags(&[
        "--network",
        "report",
        "--allow-net",
        "allowed.test",
        "--allow-net",
        "192.0.2.0/24:80",
    ]);
    let result = crate::python(&world, &flags, code);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        [
            "host=allowed.test",
            "host=other.test",
            "403 non_public_address"
        ],
        "{result:#}"
    );
    let network = &result["network"];
    assert_eq!(network["mode"], "report");
    assert!(
        network["suggested_allow"]
            .as_array()
            .unwrap()
            .contains(&"other.test".into()),
        "{network:#}"
    );
    assert!(!decisions(&result, "would_deny").is_empty(), "{network:#}");
    let warnings = result["warnings"].to_string();
    assert!(warnings.contains("learning mode"), "{warnings}");
}

/// A library caller streaming a run gets each decision of the gate as it happens
/// (`RunEvent::Network`), and the event channel closes with the run.
#[test]
fn a_streaming_caller_gets_the_gates_decisions_as_events() {
    use support::api::{Decision, GateEvent, NetworkMode, RunEvent, Sandbox};
    let Some(world) = crate::world() else { return };
    let events = airlock_testworld::in_netns(&world.gate_ns, move || {
        let mut policy = support::api::load_profile("untrusted").unwrap();
        policy.network.mode = NetworkMode::Allowlist;
        policy.network.allow = ["allowed.test", "192.0.2.0/24:80"]
            .map(String::from)
            .to_vec();
        policy.network.resolver = Some(airlock_testworld::RESOLVER.into());
        let sandbox = Sandbox::with_options(policy, support::sandbox_options()).unwrap();
        let code = "import urllib.request; urllib.request.urlopen('http://allowed.test/', timeout=10).read()";
        let mut handle = sandbox
            .command(airlock_testworld::PYTHON)
            .args(["-c", code])
            .stream_output()
            .spawn()
            .unwrap();
        let events: Vec<RunEvent> = handle.events().unwrap().iter().collect();
        let result = handle.wait().unwrap();
        assert!(result.success(), "{result:?}");
        assert!(result.network.is_some());
        events
    });
    let decided: Vec<&GateEvent> = events
        .iter()
        .filter_map(|event| match event {
            RunEvent::Network(decision) => Some(decision),
            _ => None,
        })
        .collect();
    assert!(
        decided.iter().any(|e| matches!(e, GateEvent::Decided(r)
            if r.name.as_deref() == Some("allowed.test") && r.decision == Decision::Allow)),
        "{decided:#?}"
    );
}

/// README's network example, run as written (with the `airlock` under test first on PATH):
/// the unlisted name is refused at once and the decision is in the log. No packet leaves the
/// sandbox's namespace.
#[test]
fn the_readme_network_example_works_as_written() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .unwrap();
    let section = &readme[readme.find("### Network").expect("a Network section")..];
    let start = section.find("```sh\n").expect("a shell block") + "```sh\n".len();
    let script = &section[start..start + section[start..].find("```").unwrap()];
    let dir = support::shared_tempdir();
    let bin_dir = support::airlock_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", script])
        .env("PATH", path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = support::stdout_text(&out);
    assert!(
        out.status.success(),
        "{stdout}{}",
        support::stderr_text(&out)
    );
    assert!(stdout.contains("refused at once"), "{stdout}");
    let record = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a log line");
    let record: Value = serde_json::from_str(record).unwrap();
    assert_eq!(
        (record["name"].as_str(), record["reason"].as_str()),
        (Some("exfil.attacker.example"), Some("not_allowed"))
    );
}
