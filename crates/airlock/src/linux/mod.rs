//! Linux-only plumbing: the raw syscall facade (`sys`, the only module allowed `unsafe`) and
//! process-tree helpers built on it.

pub mod beneath;
#[allow(unsafe_code)]
pub mod sys;
pub mod tree;

/// Converts strings to the C strings `execve` needs; an interior NUL is an error naming it.
pub fn c_strings(items: &[String]) -> std::io::Result<Vec<std::ffi::CString>> {
    items
        .iter()
        .map(|s| {
            std::ffi::CString::new(s.as_bytes()).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{s:?} contains a NUL byte"),
                )
            })
        })
        .collect()
}

/// Forks the calling process if it has exactly one thread, so that the child may run any
/// code; `None` when other threads exist (their locks could stay held in the child).
pub fn fork_if_single_threaded() -> std::io::Result<Option<sys::Forked>> {
    if !single_threaded()? {
        return Ok(None);
    }
    sys::fork_single_threaded().map(Some)
}

/// Whether this process has exactly one thread. Only this thread could start another one, so
/// the answer cannot change under the caller.
pub(crate) fn single_threaded() -> std::io::Result<bool> {
    Ok(std::fs::read_dir("/proc/self/task")?.count() == 1)
}

/// Forks the caller (single-threaded) as a child of its own parent (`CLONE_PARENT`): a warm
/// pool's init spawner starts each init as the pool's child, which the pool reaps and
/// signals as one it executed. The child's exit signal is the caller's own (SIGCHLD).
pub fn fork_as_sibling() -> std::io::Result<sys::Forked> {
    sys::clone_into_namespaces(nix::sched::CloneFlags::CLONE_PARENT)?.ok_or_else(|| {
        std::io::Error::other("the init spawner must be single-threaded to fork an init")
    })
}
