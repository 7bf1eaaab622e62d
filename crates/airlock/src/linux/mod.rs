//! Linux-only plumbing: the raw syscall facade (`sys`, the only module allowed `unsafe`) and
//! process-tree helpers built on it.

pub mod beneath;
#[allow(unsafe_code)]
pub mod sys;
pub mod tree;
