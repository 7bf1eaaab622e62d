//! A warm pool's plan of its prepared sandboxes: made once, then filled in for each sandbox.
//!
//! Every sandbox of a pool is planned from the same policy, options and command (`/bin/true`,
//! or the pool's started interpreter), so its plan is a cold run's plan of that command; what
//! differs from one sandbox to the next is the run's id and the names made from it (the run
//! directory, the workdir below it and `HOME`, the cgroup, the root's workdir and the
//! generated files that name it, the Landlock rule on the workdir). A [`StandbyPlans`] plans
//! once, serialises the init's spec once, computes the shared root's key once, and gives each
//! sandbox the spec with the plan's run id replaced by a fresh one: the same bytes a plan of
//! that run id would have sent (a test holds them equal).
//!
//! What stays fresh for every sandbox:
//! - the run id, and the runtime directory's sweep of abandoned runs;
//! - the shared root: [`SharedRoots::for_key`] renews it once it is due, for every sandbox;
//! - a plan that reads the caller's writable paths (git metadata that `protect_git` binds
//!   read-only, their owner for an idmap) is never reused: those can change between two
//!   sandboxes under the program's hands, so such a pool plans each sandbox whole, as before;
//! - the rest of what a plan reads from the host (the probes of what the kernel supports,
//!   which `/etc` files and policy paths exist, the environment's passed variables) is at most
//!   [`PLAN_FOR`] old: the plan is made again after that, as if the sandbox had been prepared
//!   that much earlier. The init judges the layers it applied again before the program runs,
//!   and the `/etc` files' contents are the shared root's snapshot (renewed with it) or read
//!   by the sandbox's own setup.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::builder::Sandbox;
use super::gitguard::{self, PlantWatch};
use super::hints::HintFacts;
use super::prepare::{self, Effects, Prepared};
use super::shared_root::{SharedRoot, SharedRoots};
use super::standby::Prestart;
use crate::confine::rootfs::RootfsPlan;
use crate::error::Error;
use crate::net::EgressPlan;
use crate::spec::InitSpec;

/// How long a pool's plan is reused (see the module documentation).
pub(super) const PLAN_FOR: Duration = Duration::from_secs(1);

/// A pool's current plan (see the module documentation).
#[derive(Debug, Default)]
pub struct StandbyPlans {
    current: Mutex<Option<Arc<PoolPlan>>>,
    /// Plans made so far (the first, and each one made again after [`PLAN_FOR`]).
    made: std::sync::atomic::AtomicU64,
}

/// One plan of a pool's sandboxes, in the terms of the run it was made for (`run_id`).
#[derive(Debug)]
struct PoolPlan {
    made: Instant,
    run_id: String,
    /// The init's spec as planned (a warm one, with the started interpreter's argv).
    spec: InitSpec,
    /// Its JSON without and with a shared root (`InitSpec::shared_root`), made when first
    /// needed.
    bodies: [OnceLock<Result<String, String>>; 2],
    /// The shared root's key (`None`: the spec cannot use one).
    root_key: Option<RootfsPlan>,
    egress: Option<EgressPlan>,
    hints: HintFacts,
    backend: String,
    details: Vec<String>,
    warnings: Vec<String>,
    git_watch: Option<PlantWatch>,
    /// Made for one sandbox only: the plan reads the caller's writable paths.
    once: bool,
}

/// One sandbox's plan: its spec as the init reads it, and what the supervisor keeps.
pub(super) struct SandboxPlan {
    pub body: Vec<u8>,
    pub workdir: PathBuf,
    pub shared_root: Option<Arc<SharedRoot>>,
    pub egress: Option<EgressPlan>,
    pub hints: HintFacts,
    pub backend: String,
    pub details: Vec<String>,
    pub warnings: Vec<String>,
    pub git_watch: Option<PlantWatch>,
}

impl StandbyPlans {
    /// The plan of one more sandbox of `sandbox`, on a root of `shared_roots` when it serves.
    pub(super) fn next(
        &self,
        sandbox: &Sandbox,
        prestart: Option<&Prestart>,
        shared_roots: Option<&SharedRoots>,
    ) -> Result<SandboxPlan, Error> {
        let plan = match self.reusable() {
            Some(plan) => {
                // The runtime directory's sweep of abandoned runs, as each run's plan does.
                prepare::runtime_dir(&sandbox.options, Effects::Run)?;
                plan
            }
            None => {
                let plan = Arc::new(PoolPlan::make(sandbox, prestart)?);
                self.made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if !plan.once {
                    *self.lock() = Some(Arc::clone(&plan));
                }
                plan
            }
        };
        let run_id = match plan.once {
            true => plan.run_id.clone(),
            false => crate::rundir::new_run_id(),
        };
        let shared_root = match (shared_roots, &plan.root_key) {
            (Some(roots), Some(key)) => roots.for_key(&sandbox.options, key, plan.spec.credentials),
            _ => None,
        };
        let body = plan.body(shared_root.is_some())?;
        let workdir = plan.spec.workdir.to_string_lossy();
        Ok(SandboxPlan {
            body: body.replace(&plan.run_id, &run_id).into_bytes(),
            workdir: PathBuf::from(workdir.replace(&plan.run_id, &run_id)),
            shared_root,
            egress: plan.egress.clone(),
            hints: plan.hints.clone(),
            backend: plan.backend.clone(),
            details: plan.details.clone(),
            warnings: plan.warnings.clone(),
            git_watch: plan.git_watch.clone(),
        })
    }

    /// Plans made so far.
    pub fn made(&self) -> u64 {
        self.made.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Forgets the current plan: the next sandbox is planned again (a preparation failed,
    /// which a change on the host may explain).
    pub fn forget(&self) {
        *self.lock() = None;
    }

    fn reusable(&self) -> Option<Arc<PoolPlan>> {
        let current = self.lock();
        current
            .as_ref()
            .filter(|plan| plan.made.elapsed() < PLAN_FOR)
            .cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<PoolPlan>>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PoolPlan {
    fn make(sandbox: &Sandbox, prestart: Option<&Prestart>) -> Result<PoolPlan, Error> {
        let Prepared {
            plan,
            mut spec,
            warnings,
            egress,
            git_watch,
            run_id,
        } = super::standby::plan_standby(sandbox, Effects::Run)?;
        spec.warm = true;
        spec.argv = Vec::new();
        if let Some(prestart) = prestart {
            spec.argv = prestart.argv.clone();
            spec.warm_prestart = true;
        }
        let workdir = prepare::Workdir {
            path: spec.workdir.clone(),
            fresh: !spec.workdir_is_callers,
            owned: false,
        };
        let reads_writable_paths = !gitguard::writable_roots(&sandbox.policy, &workdir).is_empty();
        Ok(PoolPlan {
            made: Instant::now(),
            root_key: SharedRoots::key_for(&spec),
            spec,
            bodies: Default::default(),
            egress,
            hints: HintFacts::of(&plan),
            backend: plan.backend.clone(),
            details: plan.details,
            warnings,
            git_watch,
            once: reads_writable_paths,
            run_id,
        })
    }

    /// The spec's JSON, with `shared_root` set as given.
    fn body(&self, shared_root: bool) -> Result<&str, Error> {
        let made = self.bodies[shared_root as usize].get_or_init(|| {
            let spec = InitSpec {
                shared_root,
                ..self.spec.clone()
            };
            serde_json::to_string(&spec).map_err(|e| e.to_string())
        });
        made.as_deref().map_err(|e| {
            Error::io(
                "cannot encode the run spec",
                std::io::Error::other(e.clone()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::SandboxOptions;

    fn sandbox(runtime: &std::path::Path, read_write: Vec<PathBuf>) -> Sandbox {
        let mut policy = crate::policy::load_profile("untrusted").unwrap();
        policy.filesystem.read_write = read_write;
        let options = SandboxOptions {
            runtime_dir: Some(runtime.to_path_buf()),
            ..SandboxOptions::default()
        };
        Sandbox::with_options(policy, options).unwrap()
    }

    fn spec(planned: &SandboxPlan) -> InitSpec {
        serde_json::from_slice(&planned.body).unwrap()
    }

    fn run_id(spec: &InitSpec) -> String {
        let name = spec.run_dir.file_name().unwrap().to_string_lossy();
        name.into_owned()
    }

    /// What a plan of `sandbox` made for its own run (as every sandbox's was before the pool
    /// made one plan for many), with its run id as `RUN`.
    fn planned_whole(sandbox: &Sandbox) -> String {
        let prepared = super::super::standby::plan_standby(sandbox, Effects::Run).unwrap();
        let spec = InitSpec {
            warm: true,
            argv: Vec::new(),
            ..prepared.spec
        };
        let body = serde_json::to_string(&spec).unwrap();
        body.replace(&prepared.run_id, "RUN")
    }

    /// Two sandboxes of one plan: each its own run id, run directory, workdir (and `HOME`) and
    /// cgroup, and each spec exactly what planning its own run whole gives.
    #[test]
    fn each_sandbox_gets_the_plan_of_its_own_run() {
        let runtime = tempfile::tempdir().unwrap();
        let sandbox = sandbox(runtime.path(), Vec::new());
        let plans = StandbyPlans::default();
        let (one, two) = (
            plans.next(&sandbox, None, None).unwrap(),
            plans.next(&sandbox, None, None).unwrap(),
        );
        assert_eq!(plans.made(), 1);
        let (a, b) = (spec(&one), spec(&two));
        assert_ne!(run_id(&a), run_id(&b));
        assert_ne!(a.run_dir, b.run_dir);
        for (planned, spec) in [(&one, &a), (&two, &b)] {
            assert_eq!(planned.workdir, spec.workdir);
            assert!(spec.workdir.starts_with(&spec.run_dir), "{spec:?}");
            let home = spec.env.iter().find(|(k, _)| k == "HOME").unwrap();
            assert_eq!(home.1, spec.workdir.display().to_string());
            if let Some(cgroup) = &spec.cgroup {
                assert_eq!(cgroup.run_id, run_id(spec));
            }
            let body = String::from_utf8(planned.body.clone()).unwrap();
            assert_eq!(body.replace(&run_id(spec), "RUN"), planned_whole(&sandbox));
        }
    }

    /// The plan is made again once it is [`PLAN_FOR`] old, and after a failed preparation.
    #[test]
    fn a_plan_is_made_again_when_due_or_forgotten() {
        let runtime = tempfile::tempdir().unwrap();
        let sandbox = sandbox(runtime.path(), Vec::new());
        let plans = StandbyPlans::default();
        plans.next(&sandbox, None, None).unwrap();
        plans.next(&sandbox, None, None).unwrap();
        assert_eq!(plans.made(), 1);
        std::thread::sleep(PLAN_FOR);
        plans.next(&sandbox, None, None).unwrap();
        assert_eq!(plans.made(), 2);
        plans.forget();
        plans.next(&sandbox, None, None).unwrap();
        assert_eq!(plans.made(), 3);
    }

    /// A pool whose program may write a caller's path plans each sandbox whole: git metadata
    /// that appears there between two sandboxes is bound read-only in the second.
    #[test]
    fn git_metadata_made_after_a_plan_is_protected_in_the_next_sandbox() {
        let runtime = tempfile::tempdir().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let sandbox = sandbox(runtime.path(), vec![workspace.path().to_path_buf()]);
        let plans = StandbyPlans::default();
        let git = workspace.path().join("repo/.git");
        let before = plans.next(&sandbox, None, None).unwrap();
        assert!(!String::from_utf8_lossy(&before.body).contains(&*git.to_string_lossy()));
        std::fs::create_dir_all(&git).unwrap();
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let after = plans.next(&sandbox, None, None).unwrap();
        assert!(
            String::from_utf8_lossy(&after.body).contains(&*git.to_string_lossy()),
            "{}",
            String::from_utf8_lossy(&after.body)
        );
        assert!(after.git_watch.is_some());
        assert_eq!(plans.made(), 2);
    }
}
