//! Every command README.md shows runs as written: each line of its `sh` blocks is run with
//! bash, `airlock` on the PATH being the binary under test, in a directory holding the files the
//! commands name (script.py, job.py, job/build.py, a Makefile, my.toml, input.csv, opts.json,
//! worker.py, tools/mytools.py). A command succeeds unless its comment says which exit code it
//! has (`exit 1: ...`). The set-up commands are CI's own: the sample after its `cargo build`
//! runs here with the built binary; `bash .ci/test` is what runs this test.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(path).unwrap()
}

/// The commands of every ```sh block, in order: one a line, or several lines while a single
/// quote is open (a program given as a multi-line string).
fn shell_lines(markdown: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut inside = false;
    let mut open_quote = false;
    for line in markdown.lines() {
        match (inside, line.trim_start()) {
            (false, "```sh") => inside = true,
            (true, "```") => inside = false,
            (true, text) if open_quote => {
                let last = lines.last_mut().expect("a command is open");
                last.push('\n');
                last.push_str(line);
                open_quote ^= text.matches('\'').count() % 2 == 1;
            }
            (true, text) if !text.is_empty() => {
                lines.push(text.to_string());
                open_quote = text.matches('\'').count() % 2 == 1;
            }
            _ => {}
        }
    }
    lines
}

/// The command without its trailing `# comment`, and the exit code the comment promises.
fn command_and_expected_code(line: &str) -> (String, i32) {
    let (command, comment) = match line.find("  #") {
        Some(at) => (&line[..at], &line[at..]),
        None => (line, ""),
    };
    let expected = comment
        .split("exit ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0);
    (command.trim().to_string(), expected)
}

/// The files the README's commands name, readable by the sandbox user.
fn fixture() -> tempfile::TempDir {
    let dir = shared_tempdir();
    let files: &[(&str, &str)] = &[
        ("script.py", "print('script ran')\n"),
        ("job.py", "print('job ran')\n"),
        ("job/build.py", "import os\nprint('built with', os.environ['KEY'])\n"),
        ("Makefile", "test:\n\t@echo tests pass\n"),
        ("my.toml", "extends = \"untrusted\"\n[limits]\nwall_time = \"2m\"\n"),
        ("input.csv", "a,b\n1,2\n"),
        ("opts.json", "{\"n\": 1}\n"),
        (
            "worker.py",
            "import json, shutil\nshutil.copy('in/data', 'out/data.csv')\nprint(json.dumps({'done': True}))\n",
        ),
        (
            "tools/mytools.py",
            "def summarise(text):\n    return {'words': len(text.split())}\n",
        ),
    ];
    for (name, content) in files {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
            set_mode(parent, 0o755);
        }
        write_file(
            path.parent().unwrap(),
            path.file_name().unwrap().to_str().unwrap(),
            content,
        );
    }
    dir
}

fn path_with_airlock() -> String {
    let bin_dir: PathBuf = airlock_bin().parent().unwrap().to_path_buf();
    format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn run_line(command: &str, dir: &Path) -> std::process::Output {
    Command::new("bash")
        .args(["-c", command])
        .current_dir(dir)
        .env("PATH", path_with_airlock())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn every_readme_command_runs_as_written() {
    let text = readme();
    let lines = shell_lines(&text);
    assert!(lines.len() > 10, "no sh blocks found in README.md");
    let dir = fixture();
    let mut ran = 0;
    for line in &lines {
        let (command, expected) = command_and_expected_code(line);
        let command = match setup_command(&command) {
            Setup::Run(command) => command,
            Setup::IsCi => continue,
        };
        let first_word = command.split_whitespace().next().unwrap_or_default();
        // Grading another sandbox plants its bait under /var/lib, which is root's.
        if command.starts_with("airlock conformance") && !is_root() {
            eprintln!("skipped as a normal user (its bait directory is under /var/lib): {command}");
            continue;
        }
        let needs_make = first_word == "make" || command.contains("-- make");
        if needs_make && Command::new("make").arg("--version").output().is_err() {
            eprintln!("skipped (make is not installed; .ci/run installs it): {command}");
            continue;
        }
        let output = run_line(&command, dir.path());
        assert_eq!(
            output.status.code(),
            Some(expected),
            "README command failed: {command}\nstdout: {}\nstderr: {}",
            stdout_text(&output),
            stderr_text(&output)
        );
        ran += 1;
    }
    assert!(ran >= 15, "only {ran} README commands ran");
}

enum Setup {
    Run(String),
    IsCi,
}

/// The set-up commands: the sample runs its second half with the binary under test (its
/// `cargo build --release` is CI's build); the test command is CI itself.
fn setup_command(command: &str) -> Setup {
    if command == "bash .ci/test" {
        return Setup::IsCi;
    }
    match command.strip_prefix("cargo build --release && ") {
        Some(rest) => Setup::Run(rest.replace(
            "./target/release/airlock",
            &airlock_bin().display().to_string(),
        )),
        None => Setup::Run(command.to_string()),
    }
}

#[test]
fn the_first_example_runs_a_script_from_the_current_directory() {
    let text = readme();
    assert!(
        text.contains("(`airlock run --cwd -- python3 script.py`)"),
        "the headline example changed: update this test and its fixture"
    );
    let dir = fixture();
    let output = run_line("airlock run --cwd -- python3 script.py", dir.path());
    assert_eq!(
        stdout_text(&output),
        "script ran\n",
        "{}",
        stderr_text(&output)
    );
}
