//! `filesystem.protect_git`: what the program may do to the caller's git repositories.

use serde::{Deserialize, Serialize};

use super::InvalidValue;

/// What the program may do to the git repositories in the caller's writable directories.
/// git runs code named by a repository's metadata (hooks, `core.fsmonitor`, `core.hooksPath`,
/// `core.sshCommand`, filter and diff drivers in `config`, a `commondir` or `gitdir:` pointer
/// to another such directory, submodules registered in the index): a program that can write
/// it gets code run on the host at the user's next `git status`. See docs/isolation.md.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum GitProtection {
    /// Every `.git` (directory or `gitdir:` file) in the workdir and `read_write` paths, found
    /// by a bounded walk, and the git directories they point to inside those paths, are
    /// read-only binds: the program reads the history (`git log`, `git diff`, `git status`)
    /// but cannot commit, and cannot rename, remove or replace a `.git`.
    #[default]
    ReadOnly,
    /// No protection: for code you trust with your repositories (it can commit).
    Off,
}

impl GitProtection {
    pub(super) fn is_default(&self) -> bool {
        *self == GitProtection::default()
    }
}

impl std::str::FromStr for GitProtection {
    type Err = InvalidValue;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "read-only" => Ok(GitProtection::ReadOnly),
            "off" => Ok(GitProtection::Off),
            _ => Err(InvalidValue {
                key: "filesystem.protect_git",
                value: value.to_string(),
                allowed: "read-only or off".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::profile::apply;
    use crate::policy::{builtin, parse_profile};

    #[test]
    fn untrusted_protects_git_and_a_profile_or_a_flag_turns_it_off() {
        let untrusted = builtin("untrusted").unwrap();
        assert_eq!(untrusted.filesystem.protect_git, GitProtection::ReadOnly);
        let file = parse_profile("[filesystem]\nprotect_git = \"off\"\n", "p").unwrap();
        let policy = apply(untrusted, file);
        assert_eq!(policy.filesystem.protect_git, GitProtection::Off);
        assert_eq!("read-only".parse(), Ok(GitProtection::ReadOnly));
        let refused = "hooks".parse::<GitProtection>().unwrap_err();
        assert!(
            refused.to_string().contains("read-only or off"),
            "{refused}"
        );
        assert!(parse_profile("[filesystem]\nprotect_git = \"hooks\"\n", "p").is_err());
    }
}
