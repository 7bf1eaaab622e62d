//! The run engine: admits runs, runs each on a thread of its own through the library, streams
//! its events and records its end.
//!
//! A run is recorded (`queued`) before its id is returned to anyone, marked `running` when it
//! holds its slots, and recorded terminal, with its events, before anyone can see it ended:
//! the store commit comes first, then the log closes and waiters wake.

pub mod admission;
pub mod events;
mod execute;
mod live;
mod record;
pub mod spawner;
mod submit;
mod timeline;
pub mod warm;
pub mod worker_lib;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::audit::Audit;
use crate::error::ErrorDetail;
use crate::metrics::{LatencyLabels, Metrics, RunLabels, StartLabels, TenantLabels, WarmLabels};
use crate::resolve::Resolved;
use crate::store::{Ending, NewRun, Store};
use crate::tenant::Tenant;
use crate::workspace::Workspace;
use admission::Admission;

pub use execute::{CallWork, CommandWork, WorkerWork};
pub use live::{LiveRun, StopOnDrop};
pub use record::PendingInsert;
pub use submit::Submitted;
pub use timeline::{Step, Timeline};
pub use warm::{CodeWork, StartPath, WarmStarts};

/// What a run does once it has its slots.
#[derive(Debug)]
pub enum Work {
    Command(CommandWork),
    Worker(WorkerWork),
    Call(Box<CallWork>),
}

/// A run ready to be admitted.
#[derive(Debug)]
pub struct Job {
    pub record: NewRun,
    pub tenant: Arc<Tenant>,
    pub key_name: String,
    pub priority: i32,
    pub resolved: Resolved,
    pub work: Work,
    pub queue_timeout: Duration,
}

/// Where runs keep files on this node.
#[derive(Debug, Clone)]
pub struct EnginePaths {
    /// Workspaces of runs that were sent files, and worker jobs.
    pub work: PathBuf,
    /// Worker outputs, one directory per run.
    pub outputs: PathBuf,
}

/// The engine of one node.
#[derive(Debug)]
pub struct Engine {
    pub store: Store,
    pub node: String,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<Audit>,
    pub paths: EnginePaths,
    pub python: String,
    pub keep_output: bool,
    /// Prepared sandboxes and zygotes (`[warm]`), filled in the background at start-up.
    pub warm: WarmStarts,
    /// Forks the inits of cold command runs (started with the daemon).
    pub spawner: Arc<spawner::ColdSpawner>,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    pub(crate) runtime: tokio::runtime::Handle,
    draining: AtomicBool,
}

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        node: String,
        admission: Arc<Admission>,
        metrics: Arc<Metrics>,
        audit: Arc<Audit>,
        paths: EnginePaths,
        python: String,
        keep_output: bool,
    ) -> Engine {
        Engine {
            store,
            node,
            admission,
            metrics,
            audit,
            paths,
            python,
            keep_output,
            warm: WarmStarts::default(),
            spawner: Arc::default(),
            live: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
            draining: AtomicBool::new(false),
        }
    }

    /// Adds `live` to the runs this node serves.
    fn register(&self, live: LiveRun) -> Arc<LiveRun> {
        let live = Arc::new(live);
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(live.id.clone(), Arc::clone(&live));
        live
    }

    /// Lets go of a live run: it leaves the table of live runs, its event log closes and its
    /// waiters wake. After its end (recorded or not), or for a run whose admission record the
    /// store did not take (nothing of it started; its caller answers with the store's error).
    fn let_go(&self, live: &LiveRun) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&live.id);
        live.log.close();
        live.done.send_replace(true);
    }

    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    pub fn live_runs(&self) -> Vec<Arc<LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// SIGTERM: admit nothing more; cancel queued runs now; let running ones finish within
    /// `grace`, then cancel them; return once every run has its terminal record.
    pub async fn drain(&self, grace: Duration) {
        self.draining.store(true, Ordering::Relaxed);
        let shutting_down = || ErrorDetail {
            kind: "shutting_down".into(),
            message: "the daemon shut down before the run could start".into(),
            fix: "submit the run again".into(),
        };
        for run in self.live_runs().iter().filter(|r| !r.is_running()) {
            run.stop(Some(shutting_down()));
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.live_runs().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for run in self.live_runs() {
            run.stop(Some(ErrorDetail {
                kind: "shutting_down".into(),
                message: format!(
                    "the daemon shut down and its {}s grace period for running runs passed",
                    grace.as_secs()
                ),
                fix: "submit the run again".into(),
            }));
        }
        while !self.live_runs().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Records a run's end (the store first), updates metrics and the audit log, then lets
    /// subscribers and waiters know.
    async fn finish(
        &self,
        live: &LiveRun,
        mut ending: Ending,
        tenant: &str,
        wall: Option<Duration>,
        record: Option<NewRun>,
    ) {
        if ending.status == "cancelled" && ending.error.is_none() {
            ending.error = live
                .stop_reason()
                .map(|r| serde_json::to_value(r).unwrap_or_default());
        }
        let started = live
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .started;
        (ending.started_ms, ending.queue_ms) = started.unzip();
        ending.ended_ms = crate::store::now_ms();
        let events = live.log.snapshot();
        let mut stored = false;
        for attempt in 0..5u64 {
            match self.store.finish_run(&live.id, &ending, &events).await {
                Ok(()) => {
                    stored = true;
                    break;
                }
                Err(e) => {
                    tracing::error!(run = %live.id, "cannot record the run's end (attempt {}): {e}", attempt + 1);
                    tokio::time::sleep(Duration::from_millis(200 * (attempt + 1))).await;
                }
            }
        }
        live.mark(Step::Recorded);
        self.count(&ending, tenant, wall);
        match record {
            // Moved, not copied: the request, policy and result documents are the answer's
            // largest parts.
            Some(record) if stored => {
                *live.recorded.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(ending.into_row(record));
            }
            _ if !stored => {
                tracing::error!(run = %live.id, "the run's end is not recorded; a restart marks it lost");
            }
            _ => {}
        }
        self.let_go(live);
    }

    fn count(&self, ending: &Ending, tenant: &str, wall: Option<Duration>) {
        let backend = ending.backend.clone().unwrap_or_else(|| "none".into());
        self.metrics
            .runs
            .get_or_create(&RunLabels {
                status: ending.status.clone(),
                backend: backend.clone(),
                tenant: tenant.into(),
            })
            .inc();
        if let Some(start) = warm::start_of(ending) {
            self.metrics
                .runs_by_start
                .get_or_create(&StartLabels {
                    start: start.name().into(),
                    tenant: tenant.into(),
                })
                .inc();
        }
        if let Some(wall) = wall {
            self.admission.observe_run(wall);
            self.metrics
                .run_seconds
                .get_or_create(&LatencyLabels {
                    backend,
                    tenant: tenant.into(),
                })
                .observe(wall.as_secs_f64());
        }
    }

    /// Refreshes the queue gauges (called when metrics are scraped).
    pub fn refresh_gauges(&self) {
        let stats = self.admission.stats();
        self.metrics.queue_depth.clear();
        for (tenant, count) in stats.queued_per_tenant {
            self.metrics
                .queue_depth
                .get_or_create(&TenantLabels { tenant })
                .set(count as i64);
        }
        self.metrics.warm_ready.clear();
        for ((kind, profile), count) in self.warm.ready() {
            self.metrics
                .warm_ready
                .get_or_create(&WarmLabels { kind, profile })
                .set(count as i64);
        }
        self.metrics.running.clear();
        for (tenant, count) in stats.running_per_tenant {
            self.metrics
                .running
                .get_or_create(&TenantLabels { tenant })
                .set(count as i64);
        }
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

fn internal_ending(message: &str) -> Ending {
    Ending {
        status: "sandbox_error".into(),
        error: Some(serde_json::json!({
            "kind": "internal",
            "message": message,
            "fix": "retry; an operator should read the daemon's log",
        })),
        ..Ending::default()
    }
}

/// Keeps a workspace until dropped, then removes it (a run's own files, a worker's job).
#[derive(Debug)]
pub struct OwnedWorkspace(pub Workspace);

impl Drop for OwnedWorkspace {
    fn drop(&mut self) {
        if let Err(e) = self.0.remove() {
            tracing::warn!("cannot remove workspace {}: {e}", self.0.dir.display());
        }
    }
}
