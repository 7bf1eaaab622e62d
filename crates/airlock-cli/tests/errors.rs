//! Every profile and flag error names the key (or flag), the bad value and the fix, and
//! airlock exits 125 without running anything.

mod support;

use support::*;

fn write_profile(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Runs airlock and returns (exit code, stderr).
fn fails(args: &[&str]) -> (i32, String) {
    let out = airlock(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_mentions(args: &[&str], needles: &[&str]) {
    let (code, stderr) = fails(args);
    assert_eq!(code, 125, "{args:?} should fail with 125: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: error lacks {needle:?}:\n{stderr}"
        );
    }
}

#[test]
fn unknown_profile_keys_are_errors_with_line_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(
        &dir,
        "typo.toml",
        "extends = \"untrusted\"\n[limits]\nmemroy = \"1GiB\"\n",
    );
    assert_mentions(
        &["profile", "check", &file],
        &["line 3", "memroy", "expected one of", "memory"],
    );
    let file = write_profile(&dir, "top.toml", "sandbox = true\n");
    assert_mentions(&["profile", "check", &file], &["line 1", "sandbox"]);
}

#[test]
fn bad_sizes_and_durations_name_the_value_and_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(&dir, "size.toml", "[limits]\nmemory = \"12XB\"\n");
    assert_mentions(&["profile", "check", &file], &["line 2", "12XB", "512MiB"]);
    let file = write_profile(&dir, "dur.toml", "[limits]\nwall_time = \"soon\"\n");
    assert_mentions(&["profile", "check", &file], &["line 2", "soon", "90s"]);
    let file = write_profile(&dir, "neg.toml", "[limits]\ndisk = -5\n");
    assert_mentions(&["profile", "check", &file], &["-5", "negative"]);
}

#[test]
fn out_of_range_values_name_the_key_and_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[limits]\nprocesses = 0\n",
            "limits.processes",
            "at least 3",
        ),
        (
            "[limits]\nmemory = \"1MiB\"\n",
            "limits.memory",
            "at least 16MiB",
        ),
        (
            "[limits]\nwall_time = \"0s\"\n",
            "limits.wall_time",
            "above zero",
        ),
        ("[limits]\ncpus = -1.0\n", "limits.cpus", ">= 0"),
        (
            "[filesystem]\nread_only = [\"relative/path\"]\n",
            "filesystem paths",
            "absolute",
        ),
        ("[env]\npass = [\"A=B\"]\n", "env", "without '='"),
    ];
    for (i, (text, key, allowed)) in cases.iter().enumerate() {
        let file = write_profile(&dir, &format!("range{i}.toml"), text);
        assert_mentions(&["profile", "check", &file], &[key, allowed]);
    }
}

#[test]
fn bad_enum_values_list_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(&dir, "backend.toml", "backend = \"qemu\"\n");
    assert_mentions(
        &["profile", "check", &file],
        &["qemu", "auto", "native", "none"],
    );
    let file = write_profile(&dir, "net.toml", "[network]\nmode = \"internet\"\n");
    assert_mentions(&["profile", "check", &file], &["internet", "none", "host"]);
}

#[test]
fn profile_references_that_do_not_resolve_say_how_to_fix_them() {
    assert_mentions(
        &["run", "--profile", "nosuch", "--", "/bin/true"],
        &["nosuch", "untrusted", "trusted", ".toml"],
    );
    assert_mentions(
        &["profile", "check", "/nonexistent/p.toml"],
        &["/nonexistent/p.toml", "No such file"],
    );
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(&dir, "loop.toml", "extends = \"./loop.toml\"\n");
    assert_mentions(&["profile", "check", &file], &["loop", "extend each other"]);
}

#[test]
fn user_profiles_extend_builtins_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(
        &dir,
        "mine.toml",
        "extends = \"trusted\"\n[limits]\nwall_time = \"7s\"\nmemory = \"300MiB\"\n",
    );
    let out = airlock(&["profile", "show", &file]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("wall_time = \"7s\"")
            && shown.contains("memory = \"300MiB\"")
            && shown.contains("backend = \"none\""),
        "{shown}"
    );
    let result = run_json(
        &["--profile", &file, "--dev", "--wall", "3s"],
        &["/bin/true"],
    );
    assert_eq!(result["status"], "exited");
}

#[test]
fn profile_show_prints_a_profile_that_checks() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["untrusted", "trusted"] {
        let out = airlock(&["profile", "show", name]);
        assert!(out.status.success());
        let file = write_profile(
            &dir,
            &format!("{name}.toml"),
            &String::from_utf8_lossy(&out.stdout),
        );
        let (code, stderr) = fails(&["profile", "check", &file]);
        assert_eq!(code, 0, "{name}: {stderr}");
    }
}

#[test]
fn bad_flags_name_the_flag_and_the_format() {
    assert_mentions(
        &["run", "--mem", "12XB", "--", "/bin/true"],
        &["--mem", "12XB", "512MiB"],
    );
    assert_mentions(
        &["run", "--wall", "forever", "--", "/bin/true"],
        &["--wall", "forever", "90s"],
    );
    assert_mentions(
        &["run", "--env", "NOEQUALS", "--", "/bin/true"],
        &["--env", "KEY=VALUE", "NOEQUALS"],
    );
    assert_mentions(
        &["run", "--tier", "huge", "--", "/bin/true"],
        &["--tier", "huge", "small", "standard"],
    );
    assert_mentions(
        &["run", "--wall", "0s", "--", "/bin/true"],
        &["limits.wall_time", "above zero"],
    );
    assert_mentions(
        &["run", "--backend", "qemu", "--", "/bin/true"],
        &["--backend", "qemu", "native"],
    );
}

#[test]
fn backend_none_needs_an_explicit_opt_in() {
    assert_mentions(
        &["run", "--backend", "none", "--", "/bin/true"],
        &["none", "--dev", "trusted"],
    );
    let out = airlock(&["run", "--profile", "trusted", "--", "/bin/true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Tier 0 only"),
        "every Tier-0 run warns"
    );
}

#[test]
fn missing_paths_are_named_with_the_fix() {
    assert_mentions(
        &["run", "--ro", "/nonexistent/data", "--", "/bin/true"],
        &["/nonexistent/data", "does not exist"],
    );
    assert_mentions(
        &["run", "--workdir", "/nonexistent/job", "--", "/bin/true"],
        &["/nonexistent/job", "create it"],
    );
}

#[test]
fn a_missing_program_is_a_sandbox_error_naming_it() {
    let result = run_json(TIER0, &["no-such-program-xyz"]);
    assert_eq!(result["status"], "sandbox_error");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("no-such-program-xyz") && error.contains("PATH"),
        "{error}"
    );
}

#[test]
fn a_missing_required_layer_refuses_the_run_unless_degradation_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(
        &dir,
        "needs-cgroup.toml",
        "extends = \"trusted\"\nrequire = [\"cgroup\", \"rlimits\"]\n",
    );
    assert_mentions(
        &[
            "run",
            "--profile",
            &file,
            "--dev",
            "--no-cgroup",
            "--",
            "/bin/true",
        ],
        &["cgroup", "--allow-degraded"],
    );
    let out = airlock(&[
        "run",
        "--json",
        "--profile",
        &file,
        "--dev",
        "--no-cgroup",
        "--allow-degraded",
        "--",
        "/bin/true",
    ]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "exited");
    let layers = result["isolation"].as_array().unwrap();
    assert!(
        !layers.iter().any(|l| l == "cgroup"),
        "a layer that was not applied is listed: {result}"
    );
    let warnings = result["warnings"].to_string();
    assert!(
        warnings.contains("degraded") && warnings.contains("cgroup"),
        "{warnings}"
    );
}

#[test]
fn the_host_network_is_an_explicit_choice_that_drops_the_network_namespace() {
    if !sandbox_available() {
        eprintln!("skipping: the native backend cannot run here");
        return;
    }
    let code = "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM); print('inet')\nexcept OSError as e: print('refused', e.errno)";
    let default = run_json(&[], &[PYTHON, "-c", code]);
    assert_eq!(default["stdout"], "refused 1\n", "{default}");
    // The profile requires net_ns: a flag that removes it is refused unless accepted.
    let refused = run_json(&["--network", "host"], &[PYTHON, "-c", code]);
    assert_eq!(refused["error_kind"], "degraded", "{refused}");
    assert!(
        refused["error"].to_string().contains("net_ns")
            && refused["error"].to_string().contains("--network host"),
        "{refused}"
    );
    let host = run_json(
        &["--network", "host", "--allow-degraded"],
        &[PYTHON, "-c", code],
    );
    assert_eq!(host["stdout"], "inet\n", "{host}");
    assert!(host["warnings"].to_string().contains("net_ns"), "{host}");
    let layers = host["isolation"].to_string();
    assert!(
        !layers.contains("net_ns") && layers.contains("seccomp"),
        "{layers}"
    );
}

#[test]
fn programs_outside_the_profiles_allowed_programs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_profile(
        &dir,
        "only-python.toml",
        "extends = \"trusted\"\nallowed_programs = [\"python3\"]\n",
    );
    assert_mentions(
        &[
            "run",
            "--dev",
            "--profile",
            &file,
            "--",
            "/bin/sh",
            "-c",
            "true",
        ],
        &["/bin/sh", "allowed_programs", "python3"],
    );
    let result = run_json(
        &["--dev", "--profile", &file],
        &[PYTHON, "-c", "print('ok')"],
    );
    assert_eq!(result["stdout"], "ok\n", "{result}");
    assert_mentions(
        &["exec", "--dev", "--profile", &file, "bash", "echo hi"],
        &["allowed_programs", "python3"],
    );
    let out = airlock(&[
        "exec",
        "--dev",
        "--profile",
        &file,
        "python",
        "print(6 * 7)",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "42\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
