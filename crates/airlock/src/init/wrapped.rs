//! Wrapped runs: after Tier 0 the init execs an external sandbox tool (bwrap, runsc, runc)
//! with the program's argv appended. The tool builds the boundary; the init keeps watching
//! the tree, the clocks and the cgroup exactly as for the other backends.

use std::convert::Infallible;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::child::{finish_and_exec_with, send_setup, SetupMessage};
use crate::layer::Layer;
use crate::linux::sys;
use crate::sandbox::seccomp;
use crate::spec::{InitSpec, WrapSpec};

pub(super) fn exec(
    spec: &InitSpec,
    wrap: &WrapSpec,
    mut layers: Vec<Layer>,
) -> Result<Infallible, String> {
    if wrap.no_new_privs {
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
        layers.push(Layer::NoNewPrivs);
    }
    let filters = seccomp_descriptors(wrap)?;
    layers.extend(wrap.layers.iter().copied());
    for note in &wrap.notes {
        send_setup(&SetupMessage::Warning(note.clone()));
    }
    let mut argv = wrap.tool_argv.clone();
    if !wrap.argv_in_files {
        argv.extend(spec.argv.iter().cloned());
    }
    let tool = wrap
        .tool_argv
        .first()
        .ok_or("the wrapper has an empty command line")?;
    let placed: Vec<(i32, i32)> = filters
        .iter()
        .map(|fd| fd.as_raw_fd())
        .zip(wrap.seccomp_fds.iter().copied())
        .collect();
    finish_and_exec_with(spec, layers, || {
        sys::place_fds_inheritable(&placed)
            .map_err(|e| format!("cannot pass the seccomp filters to {tool}: {e}"))?;
        Ok((Path::new(tool).to_path_buf(), argv.clone()))
    })
}

/// Our seccomp filters as raw `struct sock_filter` arrays in memfds, for `--add-seccomp-fd`.
fn seccomp_descriptors(wrap: &WrapSpec) -> Result<Vec<OwnedFd>, String> {
    let Some(config) = &wrap.seccomp else {
        return Ok(Vec::new());
    };
    let programs = seccomp::build_filters(config).map_err(|e| e.to_string())?;
    programs
        .iter()
        .take(wrap.seccomp_fds.len())
        .map(filter_memfd)
        .collect()
}

fn filter_memfd(program: &seccompiler::BpfProgram) -> Result<OwnedFd, String> {
    let fd = nix::sys::memfd::memfd_create(
        c"airlock-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    file.write_all(&bytes)
        .map_err(|e| format!("cannot write the seccomp filter: {e}"))?;
    nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekSet)
        .map_err(|e| format!("lseek: {e}"))?;
    Ok(OwnedFd::from(file))
}

/// Removes the empty directories a tool may leave. Returns warnings for what could not be
/// removed.
pub(super) fn clean_up_after_tool(wrap: &WrapSpec) -> Vec<String> {
    let mut warnings = Vec::new();
    for dir in &wrap.cleanup_dirs {
        match std::fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A parent shared with other runs is still in use: that is theirs to remove.
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    || e.raw_os_error() == Some(libc::ENOTEMPTY) => {}
            Err(e) => warnings.push(format!(
                "cannot remove {} left by the sandbox tool: {e}",
                dir.display()
            )),
        }
    }
    warnings
}
