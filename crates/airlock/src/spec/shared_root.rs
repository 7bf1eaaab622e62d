//! The wire between a warm pool and its shared root's builder (`init::shared_root`): one
//! request on the builder's socket, one answer (a byte, then the namespaces' descriptors or
//! an error's text).

use serde::{Deserialize, Serialize};

use crate::confine::rootfs::RootfsPlan;
use crate::confine::Credentials;

/// What the pool asks for.
#[derive(Serialize, Deserialize, Debug)]
pub struct SharedRootRequest {
    pub rootfs: RootfsPlan,
    /// The sandbox user, who owns the shared root's user namespace (so that each sandbox's
    /// setup, as that user, may enter it); `None`: this process's own.
    pub credentials: Option<Credentials>,
}

/// The answer's first byte: the namespaces follow, or an error's text does.
pub const BUILT: u8 = b'+';
pub const FAILED: u8 = b'-';
