//! The benchmark's C tools still build, warning-free: `floor/*.c` (compiled at run time by
//! `tools::compile_floor`) and `layers/*.c` (compiled by hand, as their headers say). Each is
//! compiled and linked the way those do (`cc -O2 -o BINARY SOURCE`), with `-Wall -Wextra
//! -Werror` added, into a temporary directory.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C compiler the benchmark uses (Rust links with it, so CI has it).
const CC: &str = "cc";

/// The flags of `tools::compile_floor` and of the by-hand commands, then the warnings.
const FLAGS: [&str; 4] = ["-O2", "-Wall", "-Wextra", "-Werror"];

/// The `.c` files directly under `dir` of the bench crate, sorted.
fn c_sources(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut sources: Vec<PathBuf> = entries
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "c"))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C sources in {}", dir.display());
    sources
}

#[test]
fn floor_and_layers_c_tools_compile_without_warnings() {
    match Command::new(CC).arg("--version").output() {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return eprintln!("skipped: no C compiler `{CC}` on PATH to build bench/ C tools");
        }
        Err(e) => panic!("cannot run {CC}: {e}"),
    }
    let out = tempfile::tempdir().expect("temporary directory");
    let mut failures = Vec::new();
    let sources: Vec<PathBuf> = ["floor", "layers"]
        .into_iter()
        .flat_map(c_sources)
        .collect();
    for source in &sources {
        let binary = out.path().join(source.file_stem().expect("file name"));
        let compiled = Command::new(CC)
            .args(FLAGS)
            .arg("-o")
            .arg(&binary)
            .arg(source)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {CC}: {e}"));
        if !compiled.status.success() || !binary.is_file() {
            failures.push(format!(
                "{CC} {} -o {} {}: {}\n{}{}",
                FLAGS.join(" "),
                binary.display(),
                source.display(),
                compiled.status,
                String::from_utf8_lossy(&compiled.stdout),
                String::from_utf8_lossy(&compiled.stderr),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} C tools do not build cleanly:\n\n{}",
        failures.len(),
        sources.len(),
        failures.join("\n")
    );
}
