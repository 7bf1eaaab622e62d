//! `TOOL --version`, remembered per binary in the runtime directory. A tool's version cannot
//! change without its file changing, and asking costs a process start on every run (runsc, a
//! Go binary, takes about 20 ms to print it). The entry is keyed by the file's identity
//! (device, inode, size, modification time), so an upgraded tool is asked again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The first line of `binary --version`, from `cache_dir` when it holds an entry for exactly
/// this file, else by running it (and remembering the answer when `cache_dir` is given).
pub(crate) fn version_line(binary: &Path, cache_dir: Option<&Path>) -> Option<String> {
    let identity = file_identity(binary)?;
    let entry = cache_dir.map(|dir| entry_path(dir, binary));
    if let Some(cached) = entry.as_deref().and_then(|e| read_entry(e, &identity)) {
        return Some(cached);
    }
    let line = ask(binary)?;
    if let Some(entry) = entry {
        // A cache that cannot be written only costs the next run another question.
        let _ = write_entry(&entry, &identity, &line);
    }
    Some(line)
}

fn ask(binary: &Path) -> Option<String> {
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .env_clear()
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().next()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

fn file_identity(binary: &Path) -> Option<String> {
    let meta = std::fs::metadata(binary).ok()?;
    Some(format!(
        "{} {} {} {} {}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

fn entry_path(dir: &Path, binary: &Path) -> PathBuf {
    let name: String = binary
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(".tool-versions").join(name)
}

fn read_entry(entry: &Path, identity: &str) -> Option<String> {
    let text = std::fs::read_to_string(entry).ok()?;
    let (stored_identity, line) = text.split_once('\n')?;
    (stored_identity == identity && !line.is_empty()).then(|| line.to_string())
}

fn write_entry(entry: &Path, identity: &str, line: &str) -> std::io::Result<()> {
    let dir = entry.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // Written aside and renamed, so a concurrent run never reads half an entry.
    let partial = dir.join(format!(".partial-{}", std::process::id()));
    std::fs::write(&partial, format!("{identity}\n{line}"))?;
    std::fs::rename(&partial, entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A script printing `version`. It is written by a child process: a write descriptor
    /// held by this process could leak into another test thread's fork and make the exec
    /// fail with ETXTBSY.
    fn fake_tool(dir: &Path, version: &str) -> PathBuf {
        let tool = dir.join("tool");
        let counter = dir.join("asked");
        let script = format!(
            "#!/bin/sh\necho x >> {}\necho '{version}'\necho second line\n",
            counter.display()
        );
        let written = std::process::Command::new("/bin/sh")
            .args(["-c", "printf '%s' \"$1\" > \"$2\"", "sh", &script])
            .arg(&tool)
            .status()
            .unwrap();
        assert!(written.success());
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        tool
    }

    fn times_asked(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("asked"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[test]
    fn a_cached_version_is_not_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let tool = fake_tool(dir.path(), "tool 1.2.3");
        let cache = dir.path().join("cache");
        for _ in 0..3 {
            assert_eq!(
                version_line(&tool, Some(&cache)).as_deref(),
                Some("tool 1.2.3")
            );
        }
        assert_eq!(times_asked(dir.path()), 1);
    }

    #[test]
    fn a_changed_binary_is_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let tool = fake_tool(dir.path(), "tool 1.0.0");
        assert_eq!(
            version_line(&tool, Some(&cache)).as_deref(),
            Some("tool 1.0.0")
        );
        let tool = fake_tool(dir.path(), "tool 2.0.0-longer");
        assert_eq!(
            version_line(&tool, Some(&cache)).as_deref(),
            Some("tool 2.0.0-longer")
        );
        assert_eq!(times_asked(dir.path()), 2);
    }

    #[test]
    fn without_a_cache_every_call_asks() {
        let dir = tempfile::tempdir().unwrap();
        let tool = fake_tool(dir.path(), "tool 1.2.3");
        version_line(&tool, None);
        version_line(&tool, None);
        assert_eq!(times_asked(dir.path()), 2);
    }

    #[test]
    fn a_missing_binary_has_no_version() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(version_line(&dir.path().join("absent"), None), None);
    }
}
