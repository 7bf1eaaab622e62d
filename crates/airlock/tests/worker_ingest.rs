//! Ingestion of a worker's `out/` against planted tricks, and an end-to-end run of the Python
//! helper. Every test checks that host files outside the destination stay untouched.
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use airlock::worker::{
    ingest, stage, validate_input_name, EventDecoder, IngestLimits, IngestReport, InputFile,
    SkipReason, WorkerError, WorkerEvent,
};

const CANARY_CONTENT: &str = "host secret, must never change or leave the host";

/// A host directory holding a canary file, a sandbox `out/` to plant tricks in, and the
/// (not yet existing) ingestion destination.
struct Host {
    root: tempfile::TempDir,
    out: PathBuf,
    dest: PathBuf,
    canary: PathBuf,
    canary_mtime: SystemTime,
}

impl Host {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        fs::create_dir(&out).unwrap();
        let canary = root.path().join("canary.txt");
        fs::write(&canary, CANARY_CONTENT).unwrap();
        let canary_mtime = fs::metadata(&canary).unwrap().modified().unwrap();
        Self {
            dest: root.path().join("dest"),
            out,
            canary,
            canary_mtime,
            root,
        }
    }

    fn plant(&self, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.out.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        path
    }

    /// Ingests and checks the invariants every ingestion must keep.
    fn ingest(&self, limits: &IngestLimits) -> IngestReport {
        let passwd_before = fs::read("/etc/passwd").ok();
        let outside_before = snapshot(self.root.path(), &self.dest);
        let report = ingest(&self.out, &self.dest, limits).unwrap();
        assert_eq!(
            snapshot(self.root.path(), &self.dest),
            outside_before,
            "ingestion changed something outside dest"
        );
        assert_eq!(fs::read_to_string(&self.canary).unwrap(), CANARY_CONTENT);
        assert_eq!(
            fs::metadata(&self.canary).unwrap().modified().unwrap(),
            self.canary_mtime
        );
        assert_eq!(fs::read("/etc/passwd").ok(), passwd_before);
        self.assert_dest_matches(&report);
        report
    }

    /// dest holds exactly the reported files, each a byte-exact copy of its source, and no
    /// symlinks or special files.
    fn assert_dest_matches(&self, report: &IngestReport) {
        let mut reported: Vec<&str> = report.files.iter().map(|f| f.rel_path.as_str()).collect();
        reported.sort();
        let mut found = Vec::new();
        collect_dest_files(&self.dest, &self.dest, &mut found);
        found.sort();
        assert_eq!(found, reported, "dest content differs from the report");
        for file in &report.files {
            let copied = fs::read(self.dest.join(&file.rel_path)).unwrap();
            assert_eq!(copied.len() as u64, file.bytes);
            assert_eq!(copied, fs::read(self.out.join(&file.rel_path)).unwrap());
        }
        assert_eq!(
            report.total_bytes,
            report.files.iter().map(|f| f.bytes).sum::<u64>()
        );
    }
}

fn collect_dest_files(root: &Path, dir: &Path, found: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            collect_dest_files(root, &entry.path(), found);
        } else {
            assert!(kind.is_file(), "dest holds a non-file {:?}", entry.path());
            let rel = entry.path().strip_prefix(root).unwrap().to_owned();
            found.push(rel.to_str().unwrap().to_owned());
        }
    }
}

/// Every path under `root` except `skip`, with type, size, mode and mtime (not following links).
fn snapshot(root: &Path, skip: &Path) -> BTreeMap<PathBuf, (u32, u64, SystemTime)> {
    let mut seen = BTreeMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path == skip {
                continue;
            }
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path.clone());
            }
            seen.insert(path, (meta.mode(), meta.len(), meta.modified().unwrap()));
        }
    }
    seen
}

fn reason_of(report: &IngestReport, rel: &str) -> SkipReason {
    report
        .skipped
        .iter()
        .find(|s| s.rel_path == rel)
        .unwrap_or_else(|| panic!("{rel:?} not reported as skipped in {report:#?}"))
        .reason
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn regular_files_are_copied_byte_exact_with_fresh_modes() {
    let host = Host::new();
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    host.plant("blob.bin", &every_byte);
    host.plant("empty", "");
    host.plant("nested/dir/result.json", "{\"ok\": true}");
    let setuid = host.plant("tool", "#!/bin/sh\n");
    fs::set_permissions(&setuid, fs::Permissions::from_mode(0o4755)).unwrap();

    let report = host.ingest(&IngestLimits::default());

    assert!(report.skipped.is_empty(), "{report:#?}");
    assert_eq!(report.truncated_by_limit, None);
    let names: Vec<&str> = report.files.iter().map(|f| f.rel_path.as_str()).collect();
    assert_eq!(
        names,
        ["blob.bin", "empty", "nested/dir/result.json", "tool"]
    );
    assert_eq!(fs::read(host.dest.join("blob.bin")).unwrap(), every_byte);
    let mode = fs::metadata(host.dest.join("tool")).unwrap().mode() & 0o7777;
    assert_eq!(
        mode & 0o7111,
        0,
        "no set-id or exec bits travel back: {mode:o}"
    );
}

#[test]
fn symlinks_to_host_files_are_skipped_not_followed() {
    let host = Host::new();
    symlink(&host.canary, host.out.join("to_canary")).unwrap();
    symlink("/etc/passwd", host.out.join("to_passwd")).unwrap();
    symlink("../canary.txt", host.out.join("relative")).unwrap();
    symlink("nowhere", host.out.join("dangling")).unwrap();
    host.plant("real.txt", "real");

    let report = host.ingest(&IngestLimits::default());

    for name in ["to_canary", "to_passwd", "relative", "dangling"] {
        assert_eq!(reason_of(&report, name), SkipReason::Symlink);
        assert!(fs::symlink_metadata(host.dest.join(name)).is_err());
    }
    assert_eq!(report.files.len(), 1);
}

#[test]
fn symlinked_directory_is_not_entered() {
    let host = Host::new();
    let host_dir = host.root.path().join("host_dir");
    fs::create_dir(&host_dir).unwrap();
    fs::write(host_dir.join("private"), "host data").unwrap();
    symlink(&host_dir, host.out.join("linked_dir")).unwrap();
    symlink("/etc", host.out.join("etc")).unwrap();

    let report = host.ingest(&IngestLimits::default());

    assert_eq!(reason_of(&report, "linked_dir"), SkipReason::Symlink);
    assert_eq!(reason_of(&report, "etc"), SkipReason::Symlink);
    assert!(report.files.is_empty());
}

#[test]
fn hardlink_to_host_file_is_skipped() {
    let host = Host::new();
    fs::hard_link(&host.canary, host.out.join("linked_canary")).unwrap();
    let pair = host.plant("pair_a", "twice");
    fs::hard_link(&pair, host.out.join("pair_b")).unwrap();

    let report = host.ingest(&IngestLimits::default());

    assert_eq!(reason_of(&report, "linked_canary"), SkipReason::Hardlink);
    assert_eq!(reason_of(&report, "pair_a"), SkipReason::Hardlink);
    assert_eq!(reason_of(&report, "pair_b"), SkipReason::Hardlink);
    assert!(report.files.is_empty());
}

#[test]
fn fifo_is_skipped_without_blocking() {
    let host = Host::new();
    let fifo = host.out.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    host.plant("after.txt", "after");

    // Run in a thread so a blocking open fails the test instead of hanging it.
    let (sender, receiver) = mpsc::channel();
    let (out, dest) = (host.out.clone(), host.dest.clone());
    std::thread::spawn(move || {
        let _ = sender.send(ingest(&out, &dest, &IngestLimits::default()));
    });
    let report = receiver
        .recv_timeout(Duration::from_secs(20))
        .expect("ingestion blocked on a FIFO")
        .unwrap();

    assert_eq!(reason_of(&report, "pipe"), SkipReason::Fifo);
    assert_eq!(report.files.len(), 1);
    host.assert_dest_matches(&report);
}

#[test]
fn unix_socket_is_skipped() {
    let host = Host::new();
    let _listener = std::os::unix::net::UnixListener::bind(host.out.join("sock")).unwrap();

    let report = host.ingest(&IngestLimits::default());

    assert_eq!(reason_of(&report, "sock"), SkipReason::Socket);
}

#[test]
fn device_node_is_skipped() {
    let host = Host::new();
    let node = host.out.join("null_like");
    let created = nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    );
    if let Err(err) = created {
        eprintln!("skipping device_node_is_skipped: mknod not permitted here ({err})");
        return;
    }

    let report = host.ingest(&IngestLimits::default());

    assert_eq!(reason_of(&report, "null_like"), SkipReason::Device);
}

#[test]
fn absurd_names_are_skipped() {
    let host = Host::new();
    host.plant("new\nline", "x");
    host.plant("esc\x1b[31mred", "x");
    host.plant("bell\x07", "x");
    host.plant(&"n".repeat(200), "x");
    let non_utf8 = host.out.join(OsStr::from_bytes(b"bad\xff\xfename"));
    fs::write(&non_utf8, "x").unwrap();
    // No Linux filesystem stores a 300-byte name, so the sandbox cannot plant one either.
    let too_long = fs::write(host.out.join("x".repeat(300)), "x");
    assert!(too_long.is_err());
    host.plant("fine.txt", "fine");

    let limits = IngestLimits {
        max_name_bytes: 100,
        ..IngestLimits::default()
    };
    let report = host.ingest(&limits);

    for shown in [
        "new\\u{a}line",
        "esc\\u{1b}[31mred",
        "bell\\u{7}",
        &"n".repeat(200),
        "bad\u{FFFD}\u{FFFD}name",
    ] {
        assert_eq!(reason_of(&report, shown), SkipReason::BadName);
    }
    let names: Vec<&str> = report.files.iter().map(|f| f.rel_path.as_str()).collect();
    assert_eq!(names, ["fine.txt"]);
}

#[test]
fn deep_tree_is_cut_at_max_depth() {
    let host = Host::new();
    let mut rel = String::new();
    for level in 1..=20 {
        rel.push_str(&format!("d{level}/"));
        host.plant(&format!("{rel}f{level}"), format!("level {level}"));
    }

    let report = host.ingest(&IngestLimits::default());

    // d1/.../d7/f7 has 8 components, the deepest allowed; d8 could only hold deeper paths.
    let mut copied: Vec<usize> = report
        .files
        .iter()
        .map(|f| f.rel_path.split('/').count())
        .collect();
    copied.sort();
    assert_eq!(copied, (2..=8).collect::<Vec<_>>());
    assert_eq!(
        reason_of(&report, "d1/d2/d3/d4/d5/d6/d7/d8"),
        SkipReason::TooDeep
    );
    assert!(!host.dest.join("d1/d2/d3/d4/d5/d6/d7/d8").exists());
}

#[test]
fn depth_is_bounded_even_with_an_unbounded_limit() {
    let host = Host::new();
    let deepest = "d/".repeat(200);
    host.plant(&format!("{deepest}bottom"), "b");
    let limits = IngestLimits {
        max_depth: u32::MAX,
        ..IngestLimits::default()
    };

    let report = host.ingest(&limits);

    let cut_at = "d/".repeat(airlock::worker::ingest::DEPTH_CEILING as usize);
    assert_eq!(
        reason_of(&report, cut_at.trim_end_matches('/')),
        SkipReason::TooDeep
    );
    assert!(report.files.is_empty());
}

#[test]
fn inode_bomb_stops_at_max_files() {
    let host = Host::new();
    for i in 0..300 {
        host.plant(&format!("f{i:04}"), "x");
    }
    let limits = IngestLimits {
        max_files: 25,
        ..IngestLimits::default()
    };

    let report = host.ingest(&limits);

    assert_eq!(report.files.len(), 25);
    assert_eq!(report.skipped.len(), 1, "the walk stops at the limit");
    assert_eq!(report.skipped[0].reason, SkipReason::LimitReached);
    assert!(report.truncated_by_limit.unwrap().contains("file count"));
}

#[test]
fn directories_count_towards_max_files() {
    let host = Host::new();
    for i in 0..20 {
        fs::create_dir(host.out.join(format!("empty{i:02}"))).unwrap();
    }
    let limits = IngestLimits {
        max_files: 5,
        ..IngestLimits::default()
    };

    let report = host.ingest(&limits);

    assert!(report.truncated_by_limit.is_some());
    assert_eq!(fs::read_dir(&host.dest).unwrap().count(), 5);
}

#[test]
fn file_over_max_file_bytes_is_skipped() {
    let host = Host::new();
    host.plant("big.bin", vec![7u8; 4097]);
    host.plant("exact.bin", vec![8u8; 4096]);
    let limits = IngestLimits {
        max_file_bytes: 4096,
        ..IngestLimits::default()
    };

    let report = host.ingest(&limits);

    assert_eq!(reason_of(&report, "big.bin"), SkipReason::TooLarge);
    assert_eq!(report.files.len(), 1);
    assert_eq!(report.files[0].bytes, 4096);
    assert_eq!(report.truncated_by_limit, None);
}

#[test]
fn total_bytes_cap_is_enforced() {
    let host = Host::new();
    for name in ["a", "b", "c", "d", "e"] {
        host.plant(name, vec![b'z'; 400]);
    }
    host.plant("f_small", "tiny");
    let limits = IngestLimits {
        max_total_bytes: 1000,
        ..IngestLimits::default()
    };

    let report = host.ingest(&limits);

    let names: Vec<&str> = report.files.iter().map(|f| f.rel_path.as_str()).collect();
    assert_eq!(names, ["a", "b", "f_small"], "later small files still fit");
    assert_eq!(report.total_bytes, 804);
    for name in ["c", "d", "e"] {
        assert_eq!(reason_of(&report, name), SkipReason::LimitReached);
    }
    assert!(report.truncated_by_limit.unwrap().contains("total size"));
}

#[test]
fn growing_file_is_never_copied_past_its_cap() {
    let host = Host::new();
    let path = host.plant("growing.log", vec![b'g'; 1 << 20]);
    let (stop_sender, stop) = mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let mut file = fs::OpenOptions::new().append(true).open(path).unwrap();
        while stop.try_recv().is_err() {
            file.write_all(&[b'g'; 4096]).unwrap();
        }
    });
    let limits = IngestLimits {
        max_file_bytes: 64 << 20,
        ..IngestLimits::default()
    };

    let report = ingest(&host.out, &host.dest, &limits).unwrap();
    stop_sender.send(()).unwrap();
    writer.join().unwrap();

    // Depending on timing the copy saw a stable snapshot or a change; never a torn copy.
    match report.files.as_slice() {
        [] => assert_eq!(
            reason_of(&report, "growing.log"),
            SkipReason::ChangedDuringCopy
        ),
        [file] => {
            let copied = fs::read(host.dest.join("growing.log")).unwrap();
            assert_eq!(copied.len() as u64, file.bytes);
            assert!(copied.iter().all(|&b| b == b'g'));
        }
        more => panic!("unexpected files {more:?}"),
    }
}

#[test]
fn dest_must_be_fresh_and_is_never_followed() {
    let host = Host::new();
    host.plant("result.txt", "r");

    fs::create_dir(&host.dest).unwrap();
    fs::write(host.dest.join("existing"), "keep").unwrap();
    let err = ingest(&host.out, &host.dest, &IngestLimits::default()).unwrap_err();
    assert!(matches!(err, WorkerError::DestNotEmpty { .. }), "{err}");
    assert_eq!(
        fs::read_to_string(host.dest.join("existing")).unwrap(),
        "keep"
    );

    let host_dir = host.root.path().join("host_dir");
    fs::create_dir(&host_dir).unwrap();
    let linked_dest = host.root.path().join("linked_dest");
    symlink(&host_dir, &linked_dest).unwrap();
    let err = ingest(&host.out, &linked_dest, &IngestLimits::default()).unwrap_err();
    assert!(matches!(err, WorkerError::DestNotEmpty { .. }), "{err}");
    assert_eq!(fs::read_dir(&host_dir).unwrap().count(), 0);

    let empty_dest = host.root.path().join("empty_dest");
    fs::create_dir(&empty_dest).unwrap();
    let report = ingest(&host.out, &empty_dest, &IngestLimits::default()).unwrap();
    assert_eq!(report.files.len(), 1);
}

#[test]
fn out_dir_replaced_by_a_symlink_is_refused() {
    let host = Host::new();
    fs::remove_dir(&host.out).unwrap();
    symlink(host.root.path(), &host.out).unwrap();

    let err = ingest(&host.out, &host.dest, &IngestLimits::default()).unwrap_err();

    assert!(err.to_string().contains("sandbox output"), "{err}");
    assert!(!host.dest.exists() || fs::read_dir(&host.dest).unwrap().count() == 0);
}

#[test]
fn unreadable_entries_are_reported_when_not_root() {
    if is_root() {
        eprintln!("skipping unreadable_entries_are_reported_when_not_root: root reads mode 000");
        return;
    }
    let host = Host::new();
    let locked = host.plant("locked", "x");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    let report = host.ingest(&IngestLimits::default());
    assert_eq!(reason_of(&report, "locked"), SkipReason::Unreadable);
}

const PYTHON: &str = "/usr/bin/python3";

fn python_helper_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

fn run_python(script: &str, job_dir: &Path, extra_env: &[(&str, &str)]) -> std::process::Output {
    Command::new(PYTHON)
        .envs(extra_env.iter().copied())
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", python_helper_dir())
        .env("AIRLOCK_JOB_DIR", job_dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap()
}

const WORKER_SCRIPT: &str = r#"
import airlock_worker as aw

factor = aw.options()["factor"]
numbers = [int(n) for n in open(aw.inputs()["numbers.txt"]).read().split()]
aw.progress(0.5, "read %d numbers" % len(numbers))
with open(aw.output_path("result.txt"), "w") as out:
    out.write(" ".join(str(n * factor) for n in numbers))
for bad in ["../escape", "a/b", "new\nline"]:
    try:
        aw.output_path(bad)
    except ValueError:
        aw.log("rejected %r" % bad)
try:
    aw.progress(1.5)
except ValueError:
    aw.log("rejected 1.5")
print("stray print")
aw.progress(1)
aw.done()
"#;

#[test]
fn python_worker_round_trip() {
    if !Path::new(PYTHON).exists() {
        eprintln!("skipping python_worker_round_trip: {PYTHON} not found");
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let numbers = host.path().join("numbers-source");
    fs::write(&numbers, "1 2 3").unwrap();
    let job = stage(
        &host.path().join("job"),
        &[InputFile::new("numbers.txt", &numbers)],
        &serde_json::json!({"factor": 2}),
        None,
    )
    .unwrap();

    let output = run_python(WORKER_SCRIPT, &job.job_dir, &[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let mut decoder = EventDecoder::new();
    let mut events = Vec::new();
    for chunk in output.stdout.chunks(7) {
        events.extend(decoder.feed(chunk));
    }
    assert!(decoder.done_seen());
    events.extend(decoder.finish());
    let log = |message: &str| WorkerEvent::Log {
        message: message.into(),
    };
    assert_eq!(
        events,
        [
            WorkerEvent::Progress {
                fraction: 0.5,
                message: Some("read 3 numbers".into())
            },
            log("rejected '../escape'"),
            log("rejected 'a/b'"),
            log("rejected 'new\\nline'"),
            log("rejected 1.5"),
            WorkerEvent::Error {
                line: "stray print".into(),
                reason: "line is not valid JSON: expected value at line 1 column 1".into()
            },
            WorkerEvent::Progress {
                fraction: 1.0,
                message: None
            },
            WorkerEvent::Done,
        ]
    );

    let dest = host.path().join("results");
    let report = ingest(&job.out_dir, &dest, &IngestLimits::default()).unwrap();
    assert!(report.skipped.is_empty(), "{report:#?}");
    assert_eq!(report.files.len(), 1);
    assert_eq!(
        fs::read_to_string(dest.join("result.txt")).unwrap(),
        "2 4 6"
    );
    job.remove().unwrap();
}

#[test]
fn python_name_rule_matches_the_host() {
    if !Path::new(PYTHON).exists() {
        eprintln!("skipping python_name_rule_matches_the_host: {PYTHON} not found");
        return;
    }
    let names = [
        "ok.txt",
        "..x",
        ".hidden",
        "résumé",
        "",
        ".",
        "..",
        "a/b",
        "a\0b",
        "tab\there",
        "del\x7f",
        "c1\u{85}",
        "zero\u{200b}width",
        &"x".repeat(255),
        &"x".repeat(256),
        &"é".repeat(128),
    ];
    let script = "import json, os, airlock_worker as aw\n\
        print(json.dumps([aw.name_problem(n) is None for n in json.loads(os.environ['NAMES'])]))";
    let names_json = serde_json::to_string(&names).unwrap();
    let output = run_python(script, Path::new("/nonexistent"), &[("NAMES", &names_json)]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let python_accepts: Vec<bool> = serde_json::from_slice(&output.stdout).unwrap();
    let host_accepts: Vec<bool> = names
        .iter()
        .map(|n| validate_input_name(n).is_ok())
        .collect();
    assert_eq!(python_accepts, host_accepts, "names: {names:?}");
}
