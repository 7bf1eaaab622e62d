//! A warm pool's shared root, the pool's half (the builder: `init::shared_root`). The
//! read-only part of a prepared sandbox's root — skeleton, generated `/etc` files, system and
//! `/etc` binds, `/dev`, the caller's binds — is the same for every sandbox of one plan, so
//! it is built once, in a user and mount namespace of its own that only descriptors keep
//! alive, and each sandbox's setup enters those namespaces before it makes its own: its root
//! is then a copy of mounts (every one locked by the kernel) instead of a tmpfs superblock
//! and ~20 binds made afresh, and its PID 1 adds only its own `/proc`, `/tmp`, `/dev/shm`
//! and workdir.
//!
//! The root holds a snapshot of the host's `/etc` files (binds of the files as they were),
//! as each sandbox's root did: it is built again once half the pool's idle expiry has
//! passed, and a sandbox prepared on it expires counting from the root's build, so that no
//! sandbox runs on a snapshot older than the expiry. Dropping the pool's [`SharedRoots`]
//! closes the descriptors, and the namespaces go with the last sandbox made in them.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{send, MsgFlags};

use super::builder::SandboxOptions;
use crate::confine::rootfs::{self, RootfsPlan, Workdir};
use crate::error::Error;
use crate::spec::shared_root::{SharedRootRequest, BUILT};
use crate::spec::{Confinement, InitSpec, SHARED_ROOT_ARG};

/// How long the builder may take (it mounts ~20 binds: milliseconds).
const BUILD_TIMEOUT_S: i64 = 10;

/// One shared root: the user and mount namespaces that hold it.
#[derive(Debug)]
pub struct SharedRoot {
    user: OwnedFd,
    mnt: OwnedFd,
    rootfs: RootfsPlan,
    built: Instant,
}

impl SharedRoot {
    /// Builds the root of `rootfs` in namespaces owned by the sandbox user (`credentials`:
    /// `None` for this process's own), by executing the init program as `__init shared-root`.
    pub fn build(
        options: &SandboxOptions,
        rootfs: &RootfsPlan,
        credentials: Option<crate::confine::Credentials>,
    ) -> Result<SharedRoot, Error> {
        let (ours, pid) =
            super::spawner::execute_init_helper(options, SHARED_ROOT_ARG, "the shared root")?;
        let answer = ask(&ours, rootfs, credentials);
        if answer.is_err() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        let [user, mnt] = answer?;
        Ok(SharedRoot {
            user,
            mnt,
            rootfs: rootfs.clone(),
            built: Instant::now(),
        })
    }

    /// The user and mount namespaces' descriptors, in the order of
    /// `spec::fds::SHARED_ROOT_FDS`.
    pub(super) fn fds(&self) -> [RawFd; 2] {
        [self.user.as_raw_fd(), self.mnt.as_raw_fd()]
    }

    /// When the root (and its `/etc` snapshot) was made.
    pub fn built(&self) -> Instant {
        self.built
    }
}

fn ask(
    socket: &OwnedFd,
    rootfs: &RootfsPlan,
    credentials: Option<crate::confine::Credentials>,
) -> Result<[OwnedFd; 2], Error> {
    let failed = |what: &str, e: std::io::Error| Error::io(what.to_string(), e);
    let timeout = nix::sys::time::TimeVal::new(BUILD_TIMEOUT_S, 0);
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
        .map_err(|e| failed("cannot set the shared root's timeout", e.into()))?;
    let request = SharedRootRequest {
        rootfs: rootfs.clone(),
        credentials,
    };
    let body = serde_json::to_vec(&request)
        .map_err(|e| failed("cannot encode the shared root's plan", e.into()))?;
    send(socket.as_raw_fd(), &body, MsgFlags::MSG_NOSIGNAL)
        .map_err(|e| failed("cannot send the shared root's plan", e.into()))?;
    let mut answer = vec![0u8; 64 << 10];
    let message = crate::linux::receive_with_fds::<2>(socket.as_fd(), &mut answer)
        .map_err(|e| failed("the shared root's builder did not answer", e.into()))?;
    let said = String::from_utf8_lossy(&answer[1..message.bytes.max(1)]).into_owned();
    match (
        message.bytes,
        answer[0],
        <[OwnedFd; 2]>::try_from(message.fds),
    ) {
        (1, BUILT, Ok(namespaces)) => Ok(namespaces),
        _ => Err(Error::io(
            format!("cannot build the shared root: {said}"),
            std::io::Error::other("shared root refused"),
        )),
    }
}

/// The shared root a pool prepares its sandboxes on, replaced when the plan changes or the
/// root's age reaches `renew_after`.
#[derive(Debug)]
pub struct SharedRoots {
    current: Mutex<Option<Arc<SharedRoot>>>,
    /// A plan whose root could not be built, and why: its sandboxes build their own.
    refused: Mutex<Option<(RootfsPlan, String)>>,
    renew_after: Option<Duration>,
    built: std::sync::atomic::AtomicU64,
    /// Cold runs that were given the current root (`existing_for`).
    lent_to_cold: std::sync::atomic::AtomicU64,
}

impl SharedRoots {
    /// `renew_after`: half the pool's idle expiry (`None`: never renewed for age).
    pub fn new(renew_after: Option<Duration>) -> SharedRoots {
        SharedRoots {
            current: Mutex::new(None),
            refused: Mutex::new(None),
            renew_after,
            built: Default::default(),
            lent_to_cold: Default::default(),
        }
    }

    /// The key of the shared root `spec`'s sandbox can be prepared on (see
    /// [`same_for_every_run`]); `None` when the spec cannot use one (see [`shareable`]). The
    /// same for every sandbox of a pool's plan, so a pool computes it once a plan
    /// (`super::standby_plan`).
    pub(super) fn key_for(spec: &InitSpec) -> Option<RootfsPlan> {
        shareable(spec).map(same_for_every_run)
    }

    /// The shared root of `key` (from [`SharedRoots::key_for`]), built now if none serves it
    /// (none yet, another plan's, or due for renewal: checked for every sandbox, so that no
    /// sandbox is prepared on a root older than `renew_after`); `None` when it could not be
    /// built (the sandbox builds its own root, as a cold run's).
    pub(super) fn for_key(
        &self,
        options: &SandboxOptions,
        key: &RootfsPlan,
        credentials: Option<crate::confine::Credentials>,
    ) -> Option<Arc<SharedRoot>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(root) = self.serving(&current, key) {
            return Some(root);
        }
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if refused.as_ref().is_some_and(|(plan, _)| plan == key) {
            return None;
        }
        // The old root goes once its last sandbox is prepared (each holds an `Arc` until
        // then) and its namespaces with the last sandbox made in them.
        *current = None;
        match SharedRoot::build(options, key, credentials) {
            Ok(root) => {
                self.built.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                *current = Some(Arc::new(root));
                current.clone()
            }
            Err(e) => {
                *refused = Some((key.clone(), e.to_string()));
                None
            }
        }
    }

    /// The current root when it serves `spec` (the same plan, not due for renewal), neither
    /// built nor waited for while one is being built: a warm pool's command that found no
    /// sandbox ready runs cold on it (`launch::start`), or builds its own root as any cold run.
    /// The root's plan is not made again to see that `spec` can share one: a root exists only
    /// for a key that [`shareable`] passed, and a spec whose key is the same differs from it
    /// only in its workdir's run directory, below the base that test looks at.
    pub fn existing_for(&self, spec: &InitSpec) -> Option<Arc<SharedRoot>> {
        let rootfs = same_for_every_run(fits(spec)?);
        let current = self.current.try_lock().ok()?;
        let root = self.serving(&current, &rootfs)?;
        self.lent_to_cold
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(root)
    }

    /// `current` when it serves `rootfs` (the key of `same_for_every_run`): built from the
    /// same plan and not due for renewal. One test for prepared sandboxes and cold runs alike.
    fn serving(
        &self,
        current: &Option<Arc<SharedRoot>>,
        rootfs: &RootfsPlan,
    ) -> Option<Arc<SharedRoot>> {
        let young = |root: &SharedRoot| {
            self.renew_after
                .is_none_or(|limit| root.built.elapsed() < limit)
        };
        let root = current.as_ref().filter(|r| r.rootfs == *rootfs && young(r));
        root.cloned()
    }

    /// Cold runs given a root by [`SharedRoots::existing_for`] so far.
    pub fn lent_to_cold(&self) -> u64 {
        self.lent_to_cold.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Roots built so far, and why the last plan's could not be (if it could not).
    pub fn stats(&self) -> (u64, Option<String>) {
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        let built = self.built.load(std::sync::atomic::Ordering::SeqCst);
        (built, refused.as_ref().map(|(_, why)| why.clone()))
    }

    /// Drops the current root (the pool is shut down).
    pub fn clear(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// `rootfs` with what differs between runs of one pool and is not in the shared root (the
/// tmpfs workdir's own directories, see `rootfs::plan_shared_root`) left out, for finding the
/// root of a sandbox's plan.
fn same_for_every_run(rootfs: &RootfsPlan) -> RootfsPlan {
    let mut key = rootfs.clone();
    let workdir = rootfs.workdir.path().display().to_string();
    if let (Some(base), Workdir::Tmpfs { path, .. }) =
        (rootfs::shared_workdir_base(rootfs), &mut key.workdir)
    {
        *path = base.join("run").join("work");
        let same = path.display().to_string();
        for file in &mut key.generated_files {
            file.contents = file.contents.replace(&workdir, &same);
        }
    }
    key
}

/// The root plan of a spec whose sandbox can be prepared on a shared root, or whose cold run
/// can use one (a warm pool's command that found no sandbox ready): one that [`fits`] and
/// whose read-only part can be built apart from the run's own mounts (no host path bound
/// under a mount it makes afresh).
fn shareable(spec: &InitSpec) -> Option<&RootfsPlan> {
    fits(spec).filter(|rootfs| rootfs::plan_shared_root(rootfs).is_some())
}

/// The root plan of a native sandbox without a terminal whose workdir is its own tmpfs, not
/// kept, and no idmapped path (the init maps those in its own mount namespace, which the
/// shared root's builder does not see): what [`shareable`] asks first, without planning the
/// root's mounts.
fn fits(spec: &InitSpec) -> Option<&RootfsPlan> {
    let Confinement::Native(native) = &spec.confinement else {
        return None;
    };
    let rootfs = &native.rootfs;
    let own_workdir = matches!(rootfs.workdir, Workdir::Tmpfs { .. });
    (!spec.tty && !spec.keep && own_workdir && spec.mapped.is_empty()).then_some(rootfs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::prepare::Effects;
    use crate::supervisor::Sandbox;

    fn spec(runtime: &std::path::Path, read_only: Vec<std::path::PathBuf>) -> InitSpec {
        let mut policy = crate::policy::load_profile("untrusted").unwrap();
        policy.filesystem.read_only.extend(read_only);
        let options = SandboxOptions {
            runtime_dir: Some(runtime.to_path_buf()),
            ..SandboxOptions::default()
        };
        let sandbox = Sandbox::with_options(policy, options).unwrap();
        let prepared = super::super::standby::plan_standby(&sandbox, Effects::Run).unwrap();
        prepared.spec
    }

    /// A root held by descriptors that are no namespaces: `existing_for` only compares.
    fn root_for(key: RootfsPlan) -> SharedRoots {
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let roots = SharedRoots::new(None);
        *roots.current.lock().unwrap() = Some(Arc::new(SharedRoot {
            user: fd(),
            mnt: fd(),
            rootfs: key,
            built: Instant::now(),
        }));
        roots
    }

    /// A cold fallback gets the pool's root for its own plan of another run (another run id),
    /// never for a plan that differs from the root's (here, one more path bound), nor for a
    /// run that cannot share one.
    #[test]
    fn a_fallback_gets_the_root_of_its_own_plan_only() {
        let runtime = tempfile::tempdir().unwrap();
        // Not under `/tmp`, which each run mounts afresh (a bind there cannot be shared).
        let extra = tempfile::tempdir_in("/var/tmp").unwrap();
        let pool = spec(runtime.path(), Vec::new());
        let roots = root_for(SharedRoots::key_for(&pool).unwrap());
        let same_plan = spec(runtime.path(), Vec::new());
        assert_ne!(same_plan.run_dir, pool.run_dir);
        assert!(roots.existing_for(&same_plan).is_some());
        let other_plan = spec(runtime.path(), vec![extra.path().to_path_buf()]);
        assert!(SharedRoots::key_for(&other_plan).is_some());
        assert!(roots.existing_for(&other_plan).is_none());
        let tty = InitSpec {
            tty: true,
            ..same_plan
        };
        assert!(roots.existing_for(&tty).is_none());
        assert_eq!(roots.lent_to_cold(), 1);
    }
}
