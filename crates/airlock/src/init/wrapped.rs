//! Wrapped runs: after Tier 0 the init execs an external sandbox tool (bwrap, runsc, runc)
//! with the program's argv appended. The tool builds the boundary; the init keeps watching
//! the tree, the clocks and the cgroup exactly as for the other backends.

use std::convert::Infallible;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::child::{finish_and_exec_with, send_setup, SetupMessage};
use crate::layer::Layer;
use crate::linux::sys;
use crate::result::RunStatus;
use crate::sandbox::seccomp;
use crate::spec::{Confinement, InitSpec, Outcome, WrapSpec};

pub(super) fn exec(
    spec: &InitSpec,
    wrap: &WrapSpec,
    mut layers: Vec<Layer>,
    tool_status: Option<RawFd>,
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
    let mut placed: Vec<(i32, i32)> = filters
        .iter()
        .map(|fd| fd.as_raw_fd())
        .zip(wrap.seccomp_fds.iter().copied())
        .collect();
    placed.extend(tool_status.zip(wrap.status_fd));
    finish_and_exec_with(spec, layers, || {
        sys::place_fds_inheritable(&placed)
            .map_err(|e| format!("cannot pass the seccomp filters to {tool}: {e}"))?;
        Ok((Path::new(tool).to_path_buf(), argv.clone()))
    })
}

/// The pipe a wrapped tool reports its status on, when it has one: (read end, write end).
pub(super) fn status_pipe(spec: &InitSpec) -> Result<Option<(OwnedFd, OwnedFd)>, String> {
    match &spec.confinement {
        Confinement::Wrapped(WrapSpec {
            status_fd: Some(_), ..
        }) => nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map(Some)
            .map_err(|e| format!("pipe: {e}")),
        _ => Ok(None),
    }
}

/// A program that "exited" while its tool never reported the program's exit never ran: the
/// tool failed setting up (bad mount source, no user namespaces, unknown option). Say so,
/// instead of passing the tool's exit code off as the program's.
pub(super) fn check_tool_ran_program(
    spec: &InitSpec,
    status: OwnedFd,
    outcome: &Outcome,
) -> Result<(), String> {
    if outcome.status != RunStatus::Exited {
        return Ok(());
    }
    let mut text = String::new();
    // Every writer is dead by now, so this reads to the end without blocking.
    let _ = std::io::Read::read_to_string(&mut std::fs::File::from(status), &mut text);
    if tool_reported_exit(&text) {
        return Ok(());
    }
    let tool = match &spec.confinement {
        Confinement::Wrapped(wrap) => wrap.tool_argv.first().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    Err(format!(
        "{tool} failed before the program started (exit code {}); its message is in the run's stderr",
        outcome.exit_code.unwrap_or(-1)
    ))
}

/// Whether bwrap's JSON status stream has the document it writes when the program exits.
pub(crate) fn tool_reported_exit(status: &str) -> bool {
    serde_json::Deserializer::from_str(status)
        .into_iter::<serde_json::Value>()
        .map_while(Result::ok)
        .any(|doc| doc.get("exit-code").is_some())
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

#[cfg(test)]
mod tests {
    use super::tool_reported_exit;

    #[test]
    fn only_an_exit_document_means_the_program_ran() {
        let started = r#"{ "child-pid": 25144, "pid-namespace": 4026532254 }"#;
        assert!(!tool_reported_exit(""));
        assert!(!tool_reported_exit(started));
        assert!(tool_reported_exit(&format!(
            "{started}\n{{ \"exit-code\": 1 }}"
        )));
        assert!(!tool_reported_exit(&format!("{started}\n{{ \"exit-co")));
    }
}
