//! Workers end to end (`airlock worker` and `airlock::worker::run::run_worker`): a real Python
//! worker using python/airlock_worker.py, and workers that plant tricks. Every trick test checks
//! that the host canary is untouched.
#![cfg(target_os = "linux")]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::{json, Value};

use support::api::{
    load_profile, run_worker, CancelToken, InputFile, RunStatus, WorkerEvent, WorkerJob,
    WorkerUpdate,
};
use support::*;

const CANARY: &str = "host secret: must never change or leave the host";

/// A host directory with a worker script (next to the helper), inputs and a canary.
struct Host {
    root: tempfile::TempDir,
    canary: PathBuf,
    canary_mtime: SystemTime,
}

impl Host {
    fn new(worker_script: &str) -> Self {
        let root = shared_tempdir();
        let helper = fs::read(repo_python_dir().join("airlock_worker.py")).unwrap();
        write_file(root.path(), "airlock_worker.py", helper);
        write_file(root.path(), "worker.py", worker_script);
        let canary = write_file(root.path(), "canary.txt", CANARY);
        let canary_mtime = fs::metadata(&canary).unwrap().modified().unwrap();
        Self {
            root,
            canary,
            canary_mtime,
        }
    }

    fn path(&self) -> &Path {
        self.root.path()
    }

    fn dest(&self) -> PathBuf {
        self.path().join("dest")
    }

    fn worker_cmd(&self) -> Vec<String> {
        let script = self.path().join("worker.py");
        vec!["/usr/bin/python3".into(), script.display().to_string()]
    }

    /// Runs `airlock worker` with the worker dir exposed read-only, plus `extra` flags.
    fn run_cli(&self, extra: &[&str]) -> std::process::Output {
        let root = self.path().to_str().unwrap();
        let dest = self.dest();
        let mut args = vec!["worker", "--ro", root, "--out", dest.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push("--");
        let command = self.worker_cmd();
        args.extend(command.iter().map(String::as_str));
        airlock(&args)
    }

    fn assert_canary_untouched(&self) {
        assert_eq!(fs::read_to_string(&self.canary).unwrap(), CANARY);
        let mtime = fs::metadata(&self.canary).unwrap().modified().unwrap();
        assert_eq!(mtime, self.canary_mtime, "canary was modified");
    }
}

fn ndjson(output: &std::process::Output) -> Vec<Value> {
    stdout_text(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

fn events_of<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|line| line["event"] == kind).collect()
}

const UPPERCASE_WORKER: &str = r#"
import errno, json, os, sys
import airlock_worker as aw

def attempt(label, action):
    try:
        action()
        aw.log(label + ": allowed")
    except OSError as e:
        aw.log(label + ": " + errno.errorcode.get(e.errno, str(e.errno)))

opts = aw.options()
names = sorted(aw.inputs())
aw.log("inputs " + ",".join(names))
for i, (name, path) in enumerate(sorted(aw.inputs().items())):
    aw.progress(i / len(names), "processing " + name)
    with open(path, "rb") as src, open(aw.output_path(name + ".out"), "wb") as dst:
        dst.write(src.read().upper())
with open(aw.output_path("options.echo"), "w") as dst:
    json.dump(opts, dst)
first = aw.inputs()[names[0]]
attempt("write in/", lambda: open(first, "w").write("clobbered"))
attempt("create in job dir", lambda: open(os.path.join(aw.job_dir(), "planted"), "w"))
print("diagnostics on stderr", file=sys.stderr)
aw.progress(1, "finished")
aw.done()
"#;

#[test]
fn worker_cli_streams_events_and_ingests_out() {
    if !sandbox_available() {
        return skip("the untrusted profile cannot run on this host");
    }
    let host = Host::new(UPPERCASE_WORKER);
    let alpha = write_file(host.path(), "alpha.txt", "hello");
    let beta = write_file(host.path(), "beta.txt", "world");
    let options = write_file(host.path(), "opts.json", r#"{"mode": "upper"}"#);
    let output = host.run_cli(&[
        "--in",
        &format!("alpha={}", alpha.display()),
        "--in",
        &format!("beta={}", beta.display()),
        "--options",
        options.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_text(&output));
    let lines = ndjson(&output);

    let progress: Vec<f64> = events_of(&lines, "progress")
        .iter()
        .map(|e| e["fraction"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, [0.0, 0.5, 1.0]);
    let logs: Vec<&str> = events_of(&lines, "log")
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(logs.contains(&"inputs alpha,beta"), "{logs:?}");
    // EROFS, not EACCES: in/ is a read-only mount, not just read-only files.
    assert!(logs.contains(&"write in/: EROFS"), "{logs:?}");
    assert!(
        logs.iter().any(|l| l.starts_with("create in job dir: E")),
        "{logs:?}"
    );
    assert_eq!(events_of(&lines, "done").len(), 1);
    assert!(events_of(&lines, "error").is_empty(), "{lines:?}");
    assert!(stderr_text(&output).contains("diagnostics on stderr"));

    let result = lines.last().unwrap();
    assert_eq!(result["event"], "result");
    assert_eq!(result["success"], true);
    assert_eq!(result["ingest"]["files"].as_array().unwrap().len(), 3);
    let dest = host.dest();
    assert_eq!(fs::read_to_string(dest.join("alpha.out")).unwrap(), "HELLO");
    assert_eq!(fs::read_to_string(dest.join("beta.out")).unwrap(), "WORLD");
    let echoed: Value =
        serde_json::from_str(&fs::read_to_string(dest.join("options.echo")).unwrap()).unwrap();
    assert_eq!(echoed, json!({"mode": "upper"}));
    assert_eq!(
        fs::read_to_string(alpha).unwrap(),
        "hello",
        "host input changed"
    );
    assert!(!dest.join("planted").exists());
}

const PLANTING_WORKER: &str = r#"
import os
import airlock_worker as aw

canary = aw.options()["canary"]
out = os.path.join(aw.job_dir(), "out")

def attempt(action):
    try:
        action()
    except OSError as e:
        aw.log("refused: %s" % e)

attempt(lambda: os.symlink(canary, os.path.join(out, "link")))
attempt(lambda: os.symlink("/", os.path.join(out, "root")))
attempt(lambda: os.link(canary, os.path.join(out, "hard")))
attempt(lambda: os.mkfifo(os.path.join(out, "fifo")))
attempt(lambda: open(canary, "w").write("clobbered"))
os.makedirs(os.path.join(out, "sub"))
attempt(lambda: os.symlink(canary, os.path.join(out, "sub", "deep-link")))
with open(aw.output_path("ok.txt"), "w") as f:
    f.write("fine")
aw.done()
"#;

fn plant_and_check(profile: &str) {
    let host = Host::new(PLANTING_WORKER);
    let options = write_file(
        host.path(),
        "opts.json",
        json!({"canary": host.canary}).to_string(),
    );
    let output = host.run_cli(&["--profile", profile, "--options", options.to_str().unwrap()]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{profile}: {}",
        stderr_text(&output)
    );
    host.assert_canary_untouched();

    let lines = ndjson(&output);
    let report = &lines.last().unwrap()["ingest"];
    let skipped: Vec<(String, String)> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["rel_path"].as_str().unwrap().into(),
                s["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    for expected in [
        ("link", "symlink"),
        ("root", "symlink"),
        ("fifo", "fifo"),
        ("sub/deep-link", "symlink"),
    ] {
        let expected = (expected.0.to_string(), expected.1.to_string());
        assert!(
            skipped.contains(&expected),
            "{profile}: {expected:?} not in {skipped:?}"
        );
    }
    let dest = host.dest();
    assert_eq!(fs::read_to_string(dest.join("ok.txt")).unwrap(), "fine");
    for planted in ["link", "root", "hard", "fifo", "sub/deep-link"] {
        assert!(
            fs::symlink_metadata(dest.join(planted)).is_err(),
            "{profile}: {planted} was copied"
        );
    }
}

#[test]
fn planted_links_and_fifos_are_skipped_in_the_sandbox() {
    if !sandbox_available() {
        return skip("the untrusted profile cannot run on this host");
    }
    plant_and_check("untrusted");
}

#[test]
fn planted_links_are_skipped_even_where_the_worker_sees_the_host() {
    // Tier 0: the canary is visible to the worker, so following its links would leak it.
    plant_and_check("trusted");
}

const GARBAGE_WORKER: &str = r#"
import sys
out = sys.stdout.buffer
out.write(b"hello from print\n")
out.write(b"\xff\xfe not utf-8\n")
out.write(b'{"progress": 7}\n')
out.write(b'{"log": "' + b"x" * 70000 + b'"}\n')
out.write(b'{"v": 2, "done": true}\n')
out.write(b'{"log": "still alive"}\n')
out.flush()
"#;

#[test]
fn garbage_on_stdout_becomes_error_events_not_a_host_failure() {
    let host = Host::new(GARBAGE_WORKER);
    let output = host.run_cli(&["--profile", "trusted"]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit 0 without done is a failure"
    );
    let lines = ndjson(&output);
    let reasons: Vec<&str> = events_of(&lines, "error")
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    assert!(
        reasons[1].contains("UTF-8") && reasons[3].contains("longer than"),
        "{reasons:?}"
    );
    assert!(reasons[4].contains("protocol version"), "{reasons:?}");
    assert_eq!(
        events_of(&lines, "log").len(),
        1,
        "decoding continues after bad lines"
    );
    let result = lines.last().unwrap();
    assert_eq!(
        (result["success"].clone(), result["done_seen"].clone()),
        (json!(false), json!(false))
    );
    assert_eq!(result["events"]["errors"], 5);
    host.assert_canary_untouched();
}

#[test]
fn worker_exit_code_and_refusals() {
    let failing = Host::new("import sys\nprint('{\"done\": true}')\nsys.exit(3)\n");
    let output = failing.run_cli(&["--profile", "trusted"]);
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(ndjson(&output).last().unwrap()["success"], false);

    let host = Host::new("raise SystemExit('must not run')\n");
    fs::create_dir(host.dest()).unwrap();
    write_file(&host.dest(), "existing", "x");
    let output = host.run_cli(&["--profile", "trusted"]);
    assert_eq!(output.status.code(), Some(125));
    assert!(
        stderr_text(&output).contains("not an empty directory"),
        "{}",
        stderr_text(&output)
    );
    // The one result line of a worker that never started.
    let lines = ndjson(&output);
    assert!(
        lines.len() == 1 && lines[0]["status"] == "sandbox_error" && lines[0]["done_seen"] == false,
        "the worker must not have run: {lines:?}"
    );

    fs::remove_file(host.dest().join("existing")).unwrap();
    let output = host.run_cli(&["--profile", "trusted", "--in", "../evil=/etc/passwd"]);
    assert_eq!(output.status.code(), Some(125));
    assert!(
        stderr_text(&output).contains("invalid file name"),
        "{}",
        stderr_text(&output)
    );
}

#[test]
fn library_run_worker_reports_events_in_order() {
    let host = Host::new(UPPERCASE_WORKER);
    let input = write_file(host.path(), "data.txt", "abc");
    let mut policy = load_profile("trusted").unwrap();
    policy.filesystem.read_only.push(host.path().to_owned());
    let options = sandbox_options();
    let mut job = WorkerJob::new(host.worker_cmd(), host.dest());
    job.inputs.push(InputFile::new("data", &input));
    job.options = json!({"k": 1});
    job.jobs_root = Some(host.path().to_owned());

    let mut events = Vec::new();
    let mut stderr = Vec::new();
    let outcome = run_worker(&policy, &options, &job, |update| match update {
        WorkerUpdate::Event(event) => events.push(event.clone()),
        WorkerUpdate::Stderr(bytes) => stderr.extend_from_slice(bytes),
        _ => {}
    })
    .unwrap();

    assert!(outcome.success, "{outcome:?}");
    assert!(matches!(events.first(), Some(WorkerEvent::Log { .. })));
    assert_eq!(events.last(), Some(&WorkerEvent::Done));
    assert_eq!(outcome.events.last_progress, Some(1.0));
    assert!(String::from_utf8_lossy(&stderr).contains("diagnostics on stderr"));
    assert!(outcome.stderr_tail.contains("diagnostics on stderr"));
    let report = outcome.ingest.unwrap();
    assert_eq!(report.files.len(), 2, "{report:?}");
    assert_eq!(
        fs::read_to_string(host.dest().join("data.out")).unwrap(),
        "ABC"
    );
    let leftovers: Vec<_> = fs::read_dir(host.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("airlock-job-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "job directory not removed: {leftovers:?}"
    );
}

const SLOW_WORKER: &str = r#"
import json, sys, time
print(json.dumps({"progress": 0.1}), flush=True)
time.sleep(60)
print(json.dumps({"done": True}), flush=True)
"#;

/// A worker job stops when its token is cancelled: status `cancelled`, what it reported so
/// far delivered after its start, its job directory removed.
#[test]
fn library_run_worker_stops_when_cancelled() {
    let host = Host::new(SLOW_WORKER);
    let mut policy = load_profile("trusted").unwrap();
    policy.filesystem.read_only.push(host.path().to_owned());
    let mut job = WorkerJob::new(host.worker_cmd(), host.dest());
    job.jobs_root = Some(host.path().to_owned());
    let token = CancelToken::new();
    job.cancel = Some(token.clone());
    let mut updates = Vec::new();
    let outcome = run_worker(&policy, &sandbox_options(), &job, |update| match update {
        WorkerUpdate::Started(_) => updates.push("started"),
        WorkerUpdate::Event(WorkerEvent::Progress { .. }) => {
            updates.push("progress");
            token.cancel();
        }
        _ => {}
    })
    .unwrap();
    assert_eq!(outcome.result.status, RunStatus::Cancelled, "{outcome:?}");
    assert!(!outcome.success);
    assert_eq!(updates, ["started", "progress"]);
    let leftovers: Vec<_> = fs::read_dir(host.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("airlock-job-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "job directory not removed: {leftovers:?}"
    );
}
