//! macOS: the Seatbelt backend (`sandbox-exec` with an SBPL profile). The profile generator is
//! pure and compiled on every platform, so it is unit-tested on Linux against golden files; the
//! runner that starts `sandbox-exec` exists on macOS only.

pub mod seatbelt;

#[cfg(target_os = "macos")]
pub mod sandbox_exec;
