//! The caller's directories as the program's own. As root, airlock runs the program as an
//! unprivileged user; a workdir or `--rw` path the caller gives belongs to someone else on the
//! host (usually root), where the program could neither write nor create. Each such path is
//! planned as an idmapped mount (see `confine::idmap`) that shows its owner as the program's
//! user, so that what the program creates belongs on the host to the owner. Decided here, for
//! every backend; the init makes the mounts.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::builder::Command;
use super::prepare::{credentials, Workdir};
use crate::backend::Backend;
use crate::confine::idmap::MappedPath;
use crate::confine::Credentials;
use crate::error::Error;

/// The caller's writable paths whose owner is not the program's user, mapped to it; none when
/// the program runs as the caller itself (airlock without root, or root kept).
pub(super) fn mapped_paths(
    command: &Command,
    backend: &dyn Backend,
    workdir: &Workdir,
) -> Result<Vec<MappedPath>, Error> {
    let policy = &command.sandbox.policy;
    let Some(program) = credentials(policy).filter(|_| policy.filesystem.workspace) else {
        return Ok(Vec::new());
    };
    let writable_workdir =
        (!workdir.fresh && !policy.filesystem.workdir_read_only).then_some(workdir.path.as_path());
    let candidates = writable_workdir
        .into_iter()
        .chain(policy.filesystem.read_write.iter().map(|p| p.as_path()));
    let mut mapped = Vec::new();
    for path in candidates {
        let Some(owner) = owner_of(path).filter(|owner| *owner != program) else {
            continue;
        };
        if let Err(reason) = backend.works_in_mapped_paths(policy) {
            return Err(unmappable(path, owner, program, &reason));
        }
        mapped.push(MappedPath {
            path: path.to_path_buf(),
            owner,
            program,
        });
    }
    Ok(mapped)
}

fn owner_of(path: &Path) -> Option<Credentials> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Credentials {
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

fn unmappable(path: &Path, owner: Credentials, program: Credentials, reason: &str) -> Error {
    Error::WorkdirUnusable {
        path: path.to_path_buf(),
        owner_uid: owner.uid,
        program_uid: program.uid,
        reason: format!(
            "{reason}; use another backend (native, bwrap, or container with runc, crun or podman), give the directory to the sandbox user (chown -R {}:{} {}), or run airlock as its owner",
            program.uid,
            program.gid,
            path.display()
        ),
    }
}

/// What the plan and the result say about the mapped paths.
pub(super) fn details(mapped: &[MappedPath]) -> Vec<String> {
    mapped
        .iter()
        .map(|m| {
            format!(
                "{}: its owner {}:{} is the program's user {}:{} (idmapped mount); what the program creates there belongs to {}:{} on the host",
                m.path.display(),
                m.owner.uid,
                m.owner.gid,
                m.program.uid,
                m.program.gid,
                m.owner.uid,
                m.owner.gid
            )
        })
        .collect()
}
