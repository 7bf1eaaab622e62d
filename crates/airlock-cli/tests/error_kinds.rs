//! Typed errors through the real binary: a sandbox error carries its kind in the result
//! (`error_kind`, beside the `error` message), and every refusal's error line names its kind,
//! so a caller branches on a kind instead of parsing text.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use serde_json::Value;

fn airlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(args)
        .output()
        .expect("airlock runs")
}

fn result_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_missing_program_is_program_not_found() {
    for profile in ["trusted", "untrusted"] {
        let output = airlock(&[
            "run",
            "--json",
            "--profile",
            profile,
            "--",
            "no-such-program-xyz",
        ]);
        let result = result_of(&output);
        assert_eq!(result["status"], "sandbox_error", "{profile}: {result}");
        assert_eq!(
            result["error_kind"], "program_not_found",
            "{profile}: {result}"
        );
        assert!(
            result["error"]
                .as_str()
                .is_some_and(|e| e.contains("no-such-program-xyz")),
            "{result}"
        );
    }
}

#[test]
fn a_file_that_may_not_be_executed_is_permission_denied_exec() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = airlock(&[
        "run",
        "--json",
        "--profile",
        "trusted",
        "--",
        script.to_str().unwrap(),
    ]);
    let result = result_of(&output);
    assert_eq!(result["status"], "sandbox_error", "{result}");
    assert_eq!(result["error_kind"], "permission_denied_exec", "{result}");
}

#[test]
fn a_run_that_starts_has_no_error_kind() {
    let output = airlock(&["run", "--json", "--profile", "trusted", "--", "/bin/true"]);
    let result = result_of(&output);
    assert_eq!(result["status"], "exited", "{result}");
    assert!(result.get("error_kind").is_none(), "{result}");
}

#[test]
fn every_refusal_names_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent");
    let cases: [(&[&str], &str); 4] = [
        (&["--backend", "none"], "[unisolated_refused]"),
        (&["--profile", "no-such-profile"], "[profile_not_found]"),
        (&["--ro", missing.to_str().unwrap()], "[bad_path]"),
        (&["--workdir", missing.to_str().unwrap()], "[bad_path]"),
    ];
    for (flags, kind) in cases {
        let mut args = vec!["run"];
        args.extend(flags);
        args.extend(["--", "/bin/true"]);
        let output = airlock(&args);
        assert_eq!(output.status.code(), Some(125), "{flags:?}");
        let said = stderr(&output);
        assert!(
            said.contains(&format!("airlock: error {kind}: ")),
            "{flags:?}: {said}"
        );
    }
    let output = airlock(&["exec", "--allow", "sh", "python", "print(1)"]);
    assert!(
        stderr(&output).contains("[interpreter_not_allowed]"),
        "{}",
        stderr(&output)
    );
}
