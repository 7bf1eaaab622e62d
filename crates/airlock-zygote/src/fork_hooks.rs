//! CPython's fork work, called by hand: the one place in this binary with `unsafe`.
//!
//! Why here and not in airlock's Linux module (`airlock::linux::sys`, which holds every other
//! `unsafe`): these are calls into the interpreter this binary embeds, which the library
//! never links. The template clones each run's PID 1 straight into its new namespaces with a
//! raw `clone` (`airlock::linux::sys::fork_with_flags`), which `os.fork` cannot do; so
//! the interpreter's own before- and after-fork work, which `os.fork` does around its
//! `fork()`, is done here around that `clone` and in the process that runs Python after it.
#![allow(unsafe_code)]

use pyo3::Python;

/// `PyOS_BeforeFork`: the interpreter's before-fork hooks run and its import lock taken.
pub fn before_fork(_holding_the_gil: Python<'_>) {
    // SAFETY: CPython documents this call as safe from a thread holding the GIL before a
    // fork; the `Python` token proves the GIL is held.
    unsafe { pyo3::ffi::PyOS_BeforeFork() }
}

/// `PyOS_AfterFork_Parent`: the import lock released, the parent's after-fork hooks run.
pub fn after_fork_parent(_holding_the_gil: Python<'_>) {
    // SAFETY: called in the parent with the GIL held, after a fork that `before_fork`
    // prepared, as CPython documents.
    unsafe { pyo3::ffi::PyOS_AfterFork_Parent() }
}

/// `PyOS_AfterFork_Child`: the interpreter's locks and thread states made anew for this
/// process, the child's after-fork hooks run (`random` reseeded, ...).
pub fn after_fork_child(_holding_the_gil: Python<'_>) {
    // SAFETY: called once in a process forked (directly or through processes that ran no
    // Python) from a thread that held the GIL and had called `before_fork`, before any
    // other Python runs in it, as CPython documents.
    unsafe { pyo3::ffi::PyOS_AfterFork_Child() }
}
