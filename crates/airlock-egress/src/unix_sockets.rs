//! `unix_sockets`: the host Unix sockets a run may reach, expanded at start. Only the
//! expansion and its checks live here; exposing them (a bind mount at the same path) is the
//! launcher's part.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use crate::error::EgressError;

/// Expands every entry (a path or a glob) to existing sockets, sorted and without
/// duplicates. An entry that is relative, matches nothing, or names something that is not a
/// socket is an error naming the entry: a run never starts with fewer sockets than asked.
pub fn expand(patterns: &[String]) -> Result<Vec<PathBuf>, EgressError> {
    let mut sockets = Vec::new();
    for pattern in patterns {
        sockets.extend(expand_one(pattern)?);
    }
    sockets.sort();
    sockets.dedup();
    Ok(sockets)
}

fn expand_one(pattern: &str) -> Result<Vec<PathBuf>, EgressError> {
    let error = |problem: String, fix: &str| EgressError::UnixSocket {
        pattern: pattern.to_string(),
        problem,
        fix: fix.to_string(),
    };
    if !pattern.starts_with('/') {
        return Err(error(
            "the path is relative".into(),
            "write an absolute path, e.g. /run/app/rpc.sock",
        ));
    }
    let paths = glob::glob(pattern)
        .map_err(|e| error(e.to_string(), "fix the glob pattern (`*`, `?`, `[...]`)"))?;
    let mut matched = Vec::new();
    for path in paths {
        let path =
            path.map_err(|e| error(e.to_string(), "make the path readable by the supervisor"))?;
        let metadata = std::fs::metadata(&path)
            .map_err(|e| error(format!("{}: {e}", path.display()), "check the path"))?;
        if !metadata.file_type().is_socket() {
            return Err(error(
                format!("{} is not a socket", path.display()),
                "list only Unix sockets; a glob must not match other files",
            ));
        }
        matched.push(path);
    }
    if matched.is_empty() {
        return Err(error(
            "no socket matches".into(),
            "start the service first, or fix the path",
        ));
    }
    Ok(matched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn globs_expand_to_existing_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        for service in ["a", "b"] {
            std::fs::create_dir(dir.path().join(service)).unwrap();
        }
        let _a = UnixListener::bind(dir.path().join("a/rpc.sock")).unwrap();
        let _b = UnixListener::bind(dir.path().join("b/rpc.sock")).unwrap();
        let pattern = format!("{}/*/rpc.sock", dir.path().display());
        let found = expand(&[pattern.clone(), pattern.clone()]).unwrap();
        assert_eq!(
            found,
            vec![dir.path().join("a/rpc.sock"), dir.path().join("b/rpc.sock")]
        );

        std::fs::write(dir.path().join("a/plain.sock"), "").unwrap();
        let not_socket = expand(&[format!("{}/a/*.sock", dir.path().display())])
            .unwrap_err()
            .to_string();
        assert!(not_socket.contains("is not a socket"), "{not_socket}");
        let none = expand(&[format!("{}/c/*.sock", dir.path().display())])
            .unwrap_err()
            .to_string();
        assert!(none.contains("no socket matches"), "{none}");
        assert!(expand(&["run/x.sock".into()])
            .unwrap_err()
            .to_string()
            .contains("relative"));
    }
}
