//! `airlock exec`: code given as a string runs with a registered interpreter; unknown and
//! disallowed interpreters are refused with an error naming them and the allowed ones.
#![cfg(target_os = "linux")]

mod support;

use std::path::Path;

use support::*;

/// The sandboxed profile when available, else Tier 0, so the registry logic is always tested.
fn profile() -> &'static str {
    if sandbox_available() {
        "untrusted"
    } else {
        skip("untrusted profile unavailable here: exec tests use the trusted profile");
        "trusted"
    }
}

#[test]
fn python_code_runs_with_its_arguments() {
    let out = airlock(&[
        "exec",
        "--profile",
        profile(),
        "python",
        "import sys; print(6 * 7, sys.argv[1:])",
        "a",
        "-b",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
    assert_eq!(stdout_text(&out), "42 ['a', '-b']\n");
}

#[test]
fn the_program_exit_code_is_returned() {
    let out = airlock(&[
        "exec",
        "--profile",
        profile(),
        "sh",
        "echo $0; exit 7",
        "zero",
    ]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stdout_text(&out), "zero\n");
}

#[test]
fn other_builtin_interpreters_run_where_installed() {
    for (name, code, expected) in [
        ("node", "console.log(2 + 2)", "4\n"),
        ("perl", "print 2 + 2", "4"),
        ("bash", "echo $((2 + 2))", "4\n"),
    ] {
        let program = api::InterpreterRegistry::builtin()
            .get(name)
            .unwrap()
            .1
            .argv[0]
            .clone();
        if !Path::new(&program).exists() {
            skip(&format!("{name}: {program} is not installed"));
            continue;
        }
        let out = airlock(&["exec", "--profile", profile(), name, code]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr_text(&out));
        assert_eq!(stdout_text(&out), expected, "{name}");
    }
}

#[test]
fn a_disallowed_interpreter_is_refused_and_named() {
    let out = airlock(&[
        "exec",
        "--profile",
        profile(),
        "--allow",
        "python,sh",
        "bash",
        "echo ran",
    ]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = stderr_text(&out);
    assert!(
        stderr.contains("\"bash\" is not in allowed_programs")
            && stderr.contains("allowed: python3, sh"),
        "{stderr}"
    );
    assert!(
        stdout_text(&out).is_empty(),
        "the refused code must not run"
    );

    let allowed = airlock(&["exec", "--profile", profile(), "bash", "echo ran"]);
    assert_eq!(
        stdout_text(&allowed),
        "ran\n",
        "the same code runs when bash is allowed"
    );
}

#[test]
fn an_unknown_interpreter_is_refused_with_the_known_list() {
    let out = airlock(&["exec", "cobol", "DISPLAY 'HI'"]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = stderr_text(&out);
    assert!(
        stderr.contains("unknown interpreter \"cobol\"") && stderr.contains("python3"),
        "{stderr}"
    );
}

#[test]
fn a_registry_file_adds_interpreters_and_restricts_the_rest() {
    let dir = shared_tempdir();
    let registry = write_file(
        dir.path(),
        "interpreters.toml",
        r#"
allowed_programs = ["pystdin"]

[interpreters.pystdin]
argv = ["/usr/bin/python3", "-"]
aliases = ["ps"]
"#,
    );
    let registry = registry.to_str().unwrap();
    let out = airlock(&[
        "exec",
        "--profile",
        profile(),
        "--interpreters",
        registry,
        "ps",
        "print('via stdin')",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
    assert_eq!(stdout_text(&out), "via stdin\n");

    let refused = airlock(&[
        "exec",
        "--profile",
        profile(),
        "--interpreters",
        registry,
        "python",
        "print(1)",
    ]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(
        stderr_text(&refused).contains("allowed: pystdin"),
        "{}",
        stderr_text(&refused)
    );

    let broken = write_file(dir.path(), "broken.toml", "[interpreters.x]\nargv = []\n");
    let out = airlock(&[
        "exec",
        "--interpreters",
        broken.to_str().unwrap(),
        "python",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_text(&out).contains("argv is empty"),
        "{}",
        stderr_text(&out)
    );
}

#[test]
fn exec_code_cannot_reach_host_files_in_the_sandbox() {
    if !sandbox_available() {
        return skip("the untrusted profile cannot run on this host");
    }
    let dir = shared_tempdir();
    let canary = write_file(dir.path(), "canary.txt", "original");
    set_mode(&canary, 0o666);
    let code = format!(
        "open({:?}, 'w').write('clobbered')",
        canary.display().to_string()
    );
    let out = airlock(&["exec", "python", &code]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr_text(&out).contains("No such file or directory"),
        "{}",
        stderr_text(&out)
    );
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "original");

    // The same code under Tier 0 (the host filesystem is visible) does reach it.
    let out = airlock(&["exec", "--profile", "trusted", "python", &code]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "clobbered");
}

#[test]
fn json_mode_prints_the_run_result() {
    let out = airlock(&[
        "exec",
        "--profile",
        profile(),
        "--json",
        "python",
        "print('hi')",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result: serde_json::Value = serde_json::from_str(&stdout_text(&out)).unwrap();
    assert_eq!(result["status"], "exited");
    assert_eq!(result["stdout"], "hi\n");
}
