//! Files a command stages into its sandbox (`Command::file`): checked before anything is
//! created, for cold and warm runs alike.

use super::builder::Command;
use crate::error::Error;
use crate::spec::Confinement;

/// Files are staged by the native sandbox's PID 1, into a workdir made for the run
/// (`fresh_workdir`); each file's name and size are checked here.
pub(super) fn check(
    command: &Command,
    confinement: &Confinement,
    fresh_workdir: bool,
) -> Result<(), Error> {
    if command.files.is_empty() {
        return Ok(());
    }
    crate::spec::check_staged_files(&command.files)?;
    if !matches!(confinement, Confinement::Native(_)) || !fresh_workdir {
        return Err(Error::Command(
            "files are staged into a workdir the sandbox makes, by the native backend; use the native backend without a workdir of your own, or write the files into your workdir yourself".into(),
        ));
    }
    Ok(())
}
