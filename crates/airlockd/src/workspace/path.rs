//! Paths a client names inside a workspace, parsed into plain components.

/// Longest accepted path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components in a path.
pub const MAX_DEPTH: usize = 32;

/// A problem with a workspace file operation, mapped to an API error by the caller.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    #[error("invalid path {path:?}: {problem}")]
    BadPath { path: String, problem: &'static str },
    #[error("{path:?} does not exist")]
    NotFound { path: String },
    #[error("{path:?} leaves the workspace or goes through a symbolic link")]
    Escapes { path: String },
    #[error("{path:?} is not a regular file ({kind})")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path:?} has {links} hard links; only files with one link are served")]
    Hardlinked { path: String, links: u64 },
    #[error("{path:?} is {size} bytes, over the {max}-byte limit")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{path:?} changed while it was being read")]
    Changed { path: String },
    #[error("the workspace is full (its disk or file cap is reached)")]
    Full,
    #[error("{path:?} is a directory that is not empty")]
    NotEmpty { path: String },
    #[error("{path:?}: {cause}")]
    Io { path: String, cause: String },
}

/// A relative path inside a workspace, checked component by component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafePath {
    pub(super) components: Vec<String>,
}

impl SafePath {
    /// Parses `text` (`a/b/c.txt`; a leading or trailing `/` is ignored). The empty path is
    /// the workspace root.
    pub fn parse(text: &str) -> Result<SafePath, FileError> {
        let bad = |problem| FileError::BadPath {
            path: text.chars().take(200).collect(),
            problem,
        };
        if text.len() > MAX_PATH_BYTES {
            return Err(bad("longer than 4096 bytes"));
        }
        let trimmed = text.trim_matches('/');
        if trimmed.is_empty() {
            return Ok(SafePath {
                components: Vec::new(),
            });
        }
        let components: Vec<String> = trimmed.split('/').map(str::to_string).collect();
        if components.len() > MAX_DEPTH {
            return Err(bad("deeper than 32 components"));
        }
        for component in &components {
            if let Some(problem) = component_problem(component) {
                return Err(bad(problem));
            }
        }
        Ok(SafePath { components })
    }

    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    pub fn display(&self) -> String {
        self.components.join("/")
    }

    pub(super) fn split_last(&self) -> Option<(&[String], &String)> {
        self.components
            .split_last()
            .map(|(last, parents)| (parents, last))
    }
}

fn component_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("an empty component (\"//\")")
    } else if name == "." || name == ".." {
        Some("\".\" and \"..\" are not allowed")
    } else if name.contains('\0') {
        Some("a NUL byte")
    } else if name.chars().any(char::is_control) {
        Some("a control character")
    } else if name.len() > 255 {
        Some("a component longer than 255 bytes")
    } else {
        None
    }
}
