//! Warm start in the daemon (`[warm]`): runs go to a sandbox prepared ahead (the library's
//! `WarmPool`) or, for code of an interpreter with a zygote, to a child forked from it
//! (`Zygote`); everything else, and every run warm start cannot take, runs cold.
//!
//! A run is sent to a pool only when its resolved policy and sandbox options are exactly the
//! pool's: the same limits, cgroup parent, layers and accounting as its cold run would get.
//! Pools are made per (profile, distinct resolved policy): tenants whose ceilings resolve a
//! profile to the same policy share one, the others get their own. A request that changes
//! anything (limits, network, backend) resolves to another policy and runs cold. Runs sent
//! files run cold (their workspace is made for the run, after any sandbox could be prepared).
//!
//! A session's runs go to the session's own pool: one sandbox prepared with the session's
//! cold run's plan (its workspace the workdir, bound at the workspace's own path, under the
//! same Landlock rules), made at the session's first run when its policy is a warm profile's,
//! replaced after each run, and torn down before the workspace is removed. The workspace is
//! the mount the daemon made for the session, whose parent no sandbox can write: nothing of
//! the session's tree is resolved when a run is handed over, so a program swapping names in
//! it for symlinks redirects nothing on the host.
//!
//! Pools and zygotes start in the background (the daemon serves meanwhile; runs go cold until
//! they are ready), are shut down after the engine drains, and die with the daemon: each
//! prepared sandbox's init and each zygote child watches a pipe or socket the daemon holds.

mod start_path;
mod zygote_run;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use airlock::interp::{InterpreterRegistry, ZygoteConfig};
use airlock::warm::{WarmBudget, WarmOptions, WarmPool};
use airlock::zygote::{Zygote, ZygoteOptions};
use airlock::{Policy, Sandbox, SandboxOptions};

use super::execute::CommandWork;
use crate::auth::Principal;
use crate::config::{WarmProfile, WarmSection};
use crate::resolve::{self, PolicyRequest, Resolved};
use crate::tenant::Tenant;

pub use start_path::{start_of, StartPath};
pub use zygote_run::CodeWork;
pub(super) use zygote_run::ZygoteFor;

/// What a run is matched on: its resolved policy (the library's equality: the same rules and
/// limits) and its sandbox options, exactly.
#[derive(Debug, Clone, PartialEq)]
struct Fingerprint(Policy, SandboxOptions);

impl Fingerprint {
    fn of(policy: &Policy, options: &SandboxOptions) -> Fingerprint {
        Fingerprint(policy.clone(), options.clone())
    }

    fn matches(&self, policy: &Policy, options: &SandboxOptions) -> bool {
        self.0 == *policy && self.1 == *options
    }
}

struct PreparedPool {
    profile: String,
    fingerprint: Fingerprint,
    pool: Arc<WarmPool>,
}

struct ZygoteSlot {
    profile: String,
    /// The interpreter's registry name and aliases.
    names: Vec<String>,
    fingerprint: Fingerprint,
    zygote: Arc<Zygote>,
}

/// A session's own prepared sandbox: planned as the session's cold run is (its workspace the
/// workdir), prepared after each run for the next one.
struct SessionPool {
    /// The warm profile it counts against.
    profile: String,
    fingerprint: Fingerprint,
    pool: Arc<WarmPool>,
}

/// What session pools may be made from: the budget and expiry of `[warm]`, and per warm
/// profile how many sessions may hold one.
#[derive(Default)]
struct SessionTerms {
    budget: Option<WarmBudget>,
    idle_expiry: std::time::Duration,
    /// Sessions per warm profile that may hold a pool.
    per_profile: BTreeMap<String, usize>,
    /// Each warm profile's policies as tenants resolve it (a session's before its workspace
    /// is added): a session of one of them may hold a pool.
    policies: Vec<(String, Fingerprint)>,
}

impl SessionTerms {
    /// The warm profile `resolved` is exactly (a session's policy before its workspace is
    /// added), if any.
    fn profile_of(&self, resolved: &Resolved) -> Option<String> {
        self.policies
            .iter()
            .find(|(_, f)| f.matches(&resolved.policy, &resolved.options))
            .map(|(profile, _)| profile.clone())
    }
}

/// The node's prepared sandboxes and zygotes; empty until they have started.
#[derive(Default)]
pub struct WarmStarts {
    pools: Mutex<Vec<PreparedPool>>,
    zygotes: Mutex<Vec<ZygoteSlot>>,
    /// Sessions' prepared sandboxes, by session id.
    sessions: Mutex<BTreeMap<String, SessionPool>>,
    session_terms: Mutex<SessionTerms>,
    /// Set at shutdown: what starts after it is torn down at once.
    closed: AtomicBool,
}

impl std::fmt::Debug for WarmStarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmStarts")
            .field("pools", &lock(&self.pools).len())
            .field("zygotes", &lock(&self.zygotes).len())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One pool or zygote to start: the profile, the policy a tenant resolves it to.
struct Target {
    profile: String,
    resolved: Resolved,
    fingerprint: Fingerprint,
}

impl WarmStarts {
    /// Starts what `[warm]` lists (blocking: zygote templates start here). Failures are
    /// logged and leave that profile cold; they never fail the daemon or a run.
    pub fn start(
        &self,
        section: &WarmSection,
        tenants: &[Arc<Tenant>],
        base_options: &SandboxOptions,
        registry: &InterpreterRegistry,
    ) {
        let budget = WarmBudget::new(section.budget);
        let targets = targets(section, tenants, base_options);
        *lock(&self.session_terms) = SessionTerms {
            budget: Some(budget.clone()),
            idle_expiry: section.idle_expiry.0,
            per_profile: section
                .profiles
                .iter()
                .map(|(name, profile)| (name.clone(), profile.sessions))
                .collect(),
            policies: targets
                .iter()
                .map(|t| (t.profile.clone(), t.fingerprint.clone()))
                .collect(),
        };
        for target in targets {
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            let profile = &section.profiles[&target.profile];
            if profile.ready > 0 {
                self.start_pool(&target, profile.ready, section, &budget);
            }
            for (name, zygote) in zygotes_of(profile, registry) {
                self.start_zygote(&target, &name, &zygote, registry);
            }
        }
    }

    fn start_pool(
        &self,
        target: &Target,
        ready: usize,
        section: &WarmSection,
        budget: &WarmBudget,
    ) {
        let mut options = WarmOptions::new(ready);
        options.idle_expiry = Some(section.idle_expiry.0);
        options.budget = Some(budget.clone());
        let pool = Sandbox::with_options(
            target.resolved.policy.clone(),
            target.resolved.options.clone(),
        )
        .and_then(|sandbox| sandbox.warm(options));
        match pool {
            Ok(pool) => self.keep(
                &self.pools,
                PreparedPool {
                    profile: target.profile.clone(),
                    fingerprint: target.fingerprint.clone(),
                    pool: Arc::new(pool),
                },
            ),
            Err(e) => tracing::warn!(
                profile = %target.profile,
                "warm: no prepared sandboxes for this profile, its runs go cold: {e}"
            ),
        }
    }

    fn start_zygote(
        &self,
        target: &Target,
        name: &str,
        config: &ZygoteConfig,
        registry: &InterpreterRegistry,
    ) {
        let Some((canonical, interpreter)) = registry.get(name) else {
            return;
        };
        let mut options = ZygoteOptions::python(&[]);
        options.program = interpreter.argv[0].clone().into();
        options.preload = config.preload.clone();
        let zygote = Sandbox::with_options(
            target.resolved.policy.clone(),
            target.resolved.options.clone(),
        )
        .and_then(|sandbox| sandbox.zygote(options));
        match zygote {
            Ok(zygote) => {
                let mut names = vec![canonical.to_string()];
                names.extend(interpreter.aliases.iter().cloned());
                let slot = ZygoteSlot {
                    profile: target.profile.clone(),
                    names,
                    fingerprint: target.fingerprint.clone(),
                    zygote: Arc::new(zygote),
                };
                self.keep(&self.zygotes, slot);
            }
            Err(e) => tracing::warn!(
                profile = %target.profile,
                interpreter = %canonical,
                "warm: no zygote, this interpreter's code runs go cold: {e}"
            ),
        }
    }

    /// Adds a started pool or zygote, or tears it down if the daemon is shutting down.
    fn keep<T>(&self, list: &Mutex<Vec<T>>, item: T) {
        let mut list = lock(list);
        if self.closed.load(Ordering::SeqCst) {
            drop(list);
            drop(item);
            return;
        }
        list.push(item);
    }

    /// Warm start for `work`, if it may have one: a run whose sandbox holds nothing of the
    /// host's (no files sent, no session workspace), so that its policy is the one a prepared
    /// sandbox or zygote was made for.
    pub(super) fn for_run(&self, work: &CommandWork) -> Option<&WarmStarts> {
        (work.workspace.is_none() && work.shared_workdir.is_none()).then_some(self)
    }

    /// The prepared sandbox pool of `session`, whose run has `policy` (its workspace the
    /// workdir) resolved from `resolved`. `None` runs this one cold: the session has no pool
    /// yet (one is made now, when its profile's plain runs are warm here and the profile's
    /// `sessions` allow one more, and serves the session's next runs), or its pool was made
    /// for another policy (a request that changed the limits, say).
    pub(super) fn session_pool(
        &self,
        session: &str,
        policy: &Policy,
        resolved: &Resolved,
    ) -> Option<Arc<WarmPool>> {
        let mut sessions = lock(&self.sessions);
        if let Some(held) = sessions.get(session) {
            let matches = held.fingerprint.matches(policy, &resolved.options);
            return matches.then(|| Arc::clone(&held.pool));
        }
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let terms = lock(&self.session_terms);
        let profile = terms.profile_of(resolved)?;
        let allowed = terms.per_profile.get(&profile).copied().unwrap_or(0);
        let held = sessions.values().filter(|s| s.profile == profile).count();
        if held >= allowed {
            return None;
        }
        match session_pool(policy, &resolved.options, &terms) {
            Ok(pool) => {
                let fingerprint = Fingerprint::of(policy, &resolved.options);
                let pool = Arc::new(pool);
                let held = SessionPool {
                    profile,
                    fingerprint,
                    pool,
                };
                sessions.insert(session.to_string(), held);
            }
            Err(e) => tracing::warn!(
                session,
                "warm: no prepared sandbox for this session, its runs go cold: {e}"
            ),
        }
        None
    }

    /// Takes `session`'s prepared sandboxes away; dropping what is returned tears them down
    /// and waits until they are gone (before the session's workspace is removed).
    pub fn forget_session(&self, session: &str) -> Option<impl Send> {
        lock(&self.sessions).remove(session).map(|held| held.pool)
    }

    /// The zygote of `work`'s interpreter made for `policy`, if `work` is code and there is
    /// one: it may take the run (see [`ZygoteFor::run`]).
    pub(super) fn zygote_for(
        &self,
        policy: &Policy,
        resolved: &Resolved,
        work: &CommandWork,
    ) -> Option<ZygoteFor> {
        let code = work.code.as_ref()?;
        let zygote = self.zygote_of(&code.language, policy, &resolved.options)?;
        Some(ZygoteFor(zygote))
    }

    /// The pool whose sandboxes are exactly what `policy` with `options` would set up.
    pub(super) fn pool_for(
        &self,
        policy: &Policy,
        options: &SandboxOptions,
    ) -> Option<Arc<WarmPool>> {
        lock(&self.pools)
            .iter()
            .find(|p| p.fingerprint.matches(policy, options))
            .map(|p| Arc::clone(&p.pool))
    }

    /// The zygote of `language` made for exactly `policy` with `options`.
    fn zygote_of(
        &self,
        language: &str,
        policy: &Policy,
        options: &SandboxOptions,
    ) -> Option<Arc<Zygote>> {
        lock(&self.zygotes)
            .iter()
            .find(|z| {
                z.fingerprint.matches(policy, options) && z.names.iter().any(|n| n == language)
            })
            .map(|z| Arc::clone(&z.zygote))
    }

    /// Prepared sandboxes ready (`prepared`) and zygotes serving (`zygote`), per profile.
    pub fn ready(&self) -> BTreeMap<(String, String), usize> {
        let mut ready = BTreeMap::new();
        for pool in lock(&self.pools).iter() {
            let key = ("prepared".to_string(), pool.profile.clone());
            *ready.entry(key).or_default() += pool.pool.stats().ready;
        }
        for session in lock(&self.sessions).values() {
            let key = ("session".to_string(), session.profile.clone());
            *ready.entry(key).or_default() += session.pool.stats().ready;
        }
        for slot in lock(&self.zygotes).iter() {
            *ready
                .entry(("zygote".into(), slot.profile.clone()))
                .or_default() += 1;
        }
        ready
    }

    /// Tears every prepared sandbox and zygote down and waits until they are gone (a run
    /// still holding one finishes first; its sandbox goes with it).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let pools = std::mem::take(&mut *lock(&self.pools));
        let zygotes = std::mem::take(&mut *lock(&self.zygotes));
        let sessions = std::mem::take(&mut *lock(&self.sessions));
        let session_pools = sessions.into_values().map(|s| s.pool);
        for pool in pools.into_iter().map(|p| p.pool).chain(session_pools) {
            if let Ok(pool) = Arc::try_unwrap(pool) {
                pool.shutdown();
            }
        }
        drop(zygotes);
    }
}

/// One prepared sandbox kept ready for a session's next run, from the shared budget.
fn session_pool(
    policy: &Policy,
    options: &SandboxOptions,
    terms: &SessionTerms,
) -> Result<WarmPool, airlock::Error> {
    let mut warm = WarmOptions::new(1);
    warm.parallel = 1;
    warm.idle_expiry = Some(terms.idle_expiry);
    warm.budget = terms.budget.clone();
    Sandbox::with_options(policy.clone(), options.clone())?.warm(warm)
}

/// Each warm profile, resolved for each tenant that has it, once per distinct policy.
fn targets(
    section: &WarmSection,
    tenants: &[Arc<Tenant>],
    base_options: &SandboxOptions,
) -> Vec<Target> {
    let mut targets: Vec<Target> = Vec::new();
    for profile in section.profiles.keys() {
        for tenant in tenants.iter().filter(|t| t.policies.contains_key(profile)) {
            let caller = Principal {
                tenant: Arc::clone(tenant),
                key_name: "warm".into(),
            };
            let request = PolicyRequest::default();
            let Ok(resolved) = resolve::resolve(&caller, Some(profile), &request, base_options)
            else {
                continue;
            };
            let fingerprint = Fingerprint::of(&resolved.policy, &resolved.options);
            if !targets.iter().any(|t| t.fingerprint == fingerprint) {
                targets.push(Target {
                    profile: profile.clone(),
                    resolved,
                    fingerprint,
                });
            }
        }
    }
    targets
}

/// The profile's zygotes: its own table, and every registry entry with a `zygote` (the
/// profile's table wins for an interpreter in both).
fn zygotes_of(
    profile: &WarmProfile,
    registry: &InterpreterRegistry,
) -> BTreeMap<String, ZygoteConfig> {
    let mut zygotes: BTreeMap<String, ZygoteConfig> = BTreeMap::new();
    for name in registry.names() {
        if let Some((canonical, interpreter)) = registry.get(&name) {
            if let Some(zygote) = &interpreter.zygote {
                zygotes.insert(canonical.to_string(), zygote.clone());
            }
        }
    }
    for (name, zygote) in &profile.zygotes {
        let canonical = registry.get(name).map_or(name.as_str(), |(c, _)| c);
        zygotes.insert(canonical.to_string(), zygote.clone());
    }
    zygotes
}
