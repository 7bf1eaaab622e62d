//! The C floors of `bench/floor/`: compiled when a measurement needs one, and run. Shared by
//! `airlock-bench` and `warm-throughput` (included by path: the crate has no library).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `bench/floor/NAME.c` compiled into `dir` (`cc -O2`, as `tests/c_tools.rs` checks it builds).
pub fn compile(name: &str, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("floor/{name}.c"));
    let binary = dir.join(name);
    let compiled = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !compiled.success() {
        return Err(format!("cc could not compile {}", source.display()));
    }
    Ok(binary)
}

/// Runs a throughput floor (`CALLERS SECONDS MAX_RUNS ...`) and reads the numbers of the one
/// line it prints: runs, seconds (positive), then whatever it adds.
pub fn run(binary: &Path, args: &[String]) -> Result<Vec<f64>, String> {
    let output = Command::new(binary)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Result<Vec<f64>, _> = text.split_whitespace().map(str::parse).collect();
    match (output.status.success(), fields) {
        (true, Ok(fields)) if fields.len() >= 2 && fields[1] > 0.0 => Ok(fields),
        _ => Err(format!(
            "{} {} failed: {}",
            binary.display(),
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}
