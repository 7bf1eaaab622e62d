//! The directory every worker job gets on its `PYTHONPATH`, read-only: the worker helper
//! `airlock_worker` (`progress()`, `inputs()`, `options()`, `output_path()`, `fetch()`: the
//! same file `python/airlock_worker.py` that the Python package and `airlock worker` users put
//! beside their workers) and the request's `program_files` (e.g. the worker module a client
//! shipped, run as `python3 -m NAME`).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The worker helper, built into the daemon so that it always matches the protocol it speaks.
pub const HELPER: &[u8] = include_bytes!("../../../../python/airlock_worker.py");

/// The helper's file name (import name `airlock_worker`).
pub const HELPER_NAME: &str = "airlock_worker.py";

/// Writes the helper and `files` into `root/lib` (files 0444) and returns that directory,
/// which the run gets read-only (the directory stays writable for the daemon, which removes
/// it with the job's workspace, root or not). A program file named like the helper is
/// ignored: the helper is the daemon's.
pub fn install(root: &Path, files: &[(String, Vec<u8>)]) -> io::Result<PathBuf> {
    let lib = root.join("lib");
    fs::create_dir(&lib)?;
    for (name, bytes) in files.iter().filter(|(name, _)| name != HELPER_NAME) {
        write_read_only(&lib.join(name), bytes)?;
    }
    write_read_only(&lib.join(HELPER_NAME), HELPER)?;
    Ok(lib)
}

fn write_read_only(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::write(path, bytes)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o444))
}

/// `PYTHONPATH` with `lib` first, keeping what the request set after it.
pub fn python_path(lib: &Path, env: &mut Vec<(String, String)>) {
    let lib = lib.display().to_string();
    match env.iter_mut().find(|(name, _)| name == "PYTHONPATH") {
        Some((_, value)) if !value.is_empty() => *value = format!("{lib}:{value}"),
        Some((_, value)) => *value = lib,
        None => env.push(("PYTHONPATH".into(), lib)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lib_holds_the_helper_and_the_program_files_read_only() {
        let root = tempfile::tempdir().unwrap();
        let files = vec![
            ("job.py".to_string(), b"print(1)".to_vec()),
            (HELPER_NAME.to_string(), b"forged".to_vec()),
        ];
        let lib = install(root.path(), &files).unwrap();
        assert_eq!(fs::read(lib.join("job.py")).unwrap(), b"print(1)");
        assert_eq!(fs::read(lib.join(HELPER_NAME)).unwrap(), HELPER);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&lib.join("job.py")), 0o444);
    }

    #[test]
    fn the_lib_goes_first_on_pythonpath() {
        let mut env = vec![("PYTHONPATH".to_string(), "/opt/x".to_string())];
        python_path(Path::new("/j/lib"), &mut env);
        assert_eq!(env[0].1, "/j/lib:/opt/x");
        let mut empty = Vec::new();
        python_path(Path::new("/j/lib"), &mut empty);
        assert_eq!(empty, [("PYTHONPATH".to_string(), "/j/lib".to_string())]);
    }
}
