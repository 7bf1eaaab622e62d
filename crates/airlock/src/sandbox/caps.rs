//! STUB until the caps branch merges.
#[derive(Debug, thiserror::Error)]
#[error("caps: {0}")]
pub struct CapsError(String);
pub fn set_no_new_privs() -> Result<(), CapsError> { nix::sys::prctl::set_no_new_privs().map_err(|e| CapsError(e.to_string())) }
pub fn drop_all_capabilities() -> Result<(), CapsError> { Err(CapsError("not built yet".into())) }
