//! Privilege shedding for the sandbox init: `no_new_privs` and an empty capability state.
//!
//! Both are attributes of the calling *thread* (the kernel's task), inherited by children it
//! forks and kept across `execve`. The init is single-threaded when it calls these, so "thread"
//! and "process" coincide there; the tests rely on the per-thread scope to stay contained.

use caps::CapSet;

/// Why shedding privileges failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapsError {
    #[error("failed to set no_new_privs on the calling thread: {0}")]
    NoNewPrivs(#[source] nix::Error),
    #[error("failed to clear the {set} capability set: {source}")]
    Clear {
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("capability set {set} still holds {mask:#x} after clearing it")]
    StillHeld { set: &'static str, mask: u64 },
}

/// Sets `PR_SET_NO_NEW_PRIVS`: from now on `execve` can never grant privileges (setuid bits and
/// file capabilities are ignored). It cannot be unset, and it lets an unprivileged task install
/// seccomp filters and Landlock rulesets.
pub fn set_no_new_privs() -> Result<(), CapsError> {
    nix::sys::prctl::set_no_new_privs().map_err(CapsError::NoNewPrivs)
}

/// Whether the calling thread has `no_new_privs` set.
///
/// Asks the kernel with `PR_GET_NO_NEW_PRIVS` rather than parsing `/proc/self/status`, because
/// the attribute is per thread (`/proc/self` describes the thread-group leader, not the caller)
/// and because `/proc` may not be mounted inside a fresh root. (Only the tests ask.)
#[cfg(test)]
pub fn no_new_privs_is_set() -> bool {
    nix::sys::prctl::get_no_new_privs().unwrap_or(false)
}

/// Whether this process may mount (`CAP_SYS_ADMIN` in its effective set), which an in-memory
/// run directory needs.
pub fn can_mount() -> bool {
    caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SYS_ADMIN).unwrap_or(false)
}

/// Empties every capability set of the calling thread: bounding, ambient, inheritable,
/// effective and permitted.
///
/// The bounding set goes first because dropping from it needs `CAP_SETPCAP` in the effective
/// set, which the later steps remove. Clearing the bounding set matters even though the other
/// sets end up empty: it is what stops a later `execve` of a file with capabilities from
/// regaining them (together with `no_new_privs`).
pub fn drop_all_capabilities() -> Result<(), CapsError> {
    clear_bounding_set()?;
    clear_set(CapSet::Ambient, "ambient")?;
    clear_set(CapSet::Inheritable, "inheritable")?;
    clear_set(CapSet::Effective, "effective")?;
    clear_set(CapSet::Permitted, "permitted")?;
    verify_all_clear()
}

/// Drops each capability from the bounding set without asking first whether it is there
/// (`caps::clear` reads each one with `PR_CAPBSET_READ`: 41 syscalls of a run's setup for
/// nothing, since dropping one already gone succeeds). A capability the running kernel does not
/// know (older than the crate's list) fails to drop and fails to read: it is in no set.
/// [`verify_all_clear`] checks the outcome.
fn clear_bounding_set() -> Result<(), CapsError> {
    for cap in caps::all() {
        if let Err(source) = caps::drop(None, CapSet::Bounding, cap) {
            if caps::has_cap(None, CapSet::Bounding, cap).is_ok() {
                return Err(CapsError::Clear {
                    set: "bounding",
                    source,
                });
            }
        }
    }
    Ok(())
}

fn clear_set(set: CapSet, name: &'static str) -> Result<(), CapsError> {
    caps::clear(None, set).map_err(|source| CapsError::Clear { set: name, source })
}

/// The `caps` crate only drops the capabilities it knows by name from the bounding set; a newer
/// kernel may have more. `/proc/thread-self/status` shows the raw masks, so a capability the
/// crate missed is reported instead of silently kept. Without `/proc` the check is skipped:
/// the crate's list covers every capability up to `CAP_CHECKPOINT_RESTORE` (Linux 5.9+).
fn verify_all_clear() -> Result<(), CapsError> {
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else {
        return Ok(());
    };
    for (field, set) in [
        ("CapInh:", "inheritable"),
        ("CapPrm:", "permitted"),
        ("CapEff:", "effective"),
        ("CapBnd:", "bounding"),
        ("CapAmb:", "ambient"),
    ] {
        let mask = status_mask(&status, field).unwrap_or(0);
        if mask != 0 {
            return Err(CapsError::StillHeld { set, mask });
        }
    }
    Ok(())
}

/// Parses a hexadecimal capability mask line such as `CapBnd:\t000001ffffffffff`.
fn status_mask(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(field))?;
    u64::from_str_radix(line[field.len()..].trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use caps::Capability;
    use std::os::unix::fs::MetadataExt;

    fn in_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("test thread panicked")
    }

    #[test]
    fn no_new_privs_is_per_thread_and_sticks() {
        let (before, after) = in_thread(|| {
            let before = no_new_privs_is_set();
            set_no_new_privs().unwrap();
            (before, no_new_privs_is_set())
        });
        assert!(
            !before,
            "a fresh test thread must start without no_new_privs"
        );
        assert!(after);
        assert!(
            !in_thread(no_new_privs_is_set),
            "other threads must be unaffected"
        );
    }

    #[test]
    fn status_mask_parses_proc_lines() {
        let status = "Name:\tx\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        assert_eq!(status_mask(status, "CapBnd:"), Some(0x1ff_ffff_ffff));
        assert_eq!(status_mask(status, "CapAmb:"), Some(0));
        assert_eq!(status_mask(status, "CapEff:"), None);
    }

    /// chown to another uid needs CAP_CHOWN; after dropping everything it must fail with EPERM,
    /// while a sibling thread that kept its capabilities still succeeds.
    #[test]
    fn dropping_capabilities_refuses_privileged_chown() {
        if !caps::has_cap(None, CapSet::Effective, Capability::CAP_CHOWN).unwrap_or(false) {
            eprintln!("skipped: this test needs CAP_CHOWN in the effective set");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("owned");
        std::fs::write(&file, b"x").unwrap();
        let foreign_uid = Some(nix::unistd::Uid::from_raw(4242));

        let confined = file.clone();
        let (result, sets) = in_thread(move || {
            drop_all_capabilities().unwrap();
            let sets: Vec<usize> = [
                CapSet::Bounding,
                CapSet::Ambient,
                CapSet::Inheritable,
                CapSet::Effective,
                CapSet::Permitted,
            ]
            .into_iter()
            .map(|set| caps::read(None, set).unwrap().len())
            .collect();
            (nix::unistd::chown(&confined, foreign_uid, None), sets)
        });
        assert_eq!(result, Err(nix::errno::Errno::EPERM));
        assert_eq!(sets, vec![0; 5], "every capability set must be empty");
        assert_ne!(std::fs::metadata(&file).unwrap().uid(), 4242);

        let free = file.clone();
        in_thread(move || nix::unistd::chown(&free, foreign_uid, None)).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().uid(), 4242);
    }

    #[test]
    fn dropping_capabilities_empties_proc_status_masks() {
        let masks = in_thread(|| {
            drop_all_capabilities().unwrap();
            std::fs::read_to_string("/proc/thread-self/status").unwrap()
        });
        for field in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert_eq!(status_mask(&masks, field), Some(0), "{field} not empty");
        }
    }
}
