//! Prometheus metrics (`GET /metrics`): runs by status, backend and tenant; queue depth and
//! wait; run latency; denials by reason; sandbox set-up failures; sessions; HTTP requests.
//! Label values are bounded: tenants come from the configuration, statuses, backends and
//! reasons from fixed lists, routes from the router's templates.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    pub status: String,
    pub backend: String,
    pub tenant: String,
}

/// A run's start path (`cold`, `warm`, `zygote`) and tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabels {
    pub start: String,
    pub tenant: String,
}

/// Warm start's readiness: `kind` is `prepared` (sandboxes ready) or `zygote` (zygotes
/// serving), per profile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WarmLabels {
    pub kind: String,
    pub profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub backend: String,
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub route: String,
    pub method: String,
    pub status: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 33 minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    pub runs: Family<RunLabels, Counter>,
    pub runs_by_start: Family<StartLabels, Counter>,
    pub warm_ready: Family<WarmLabels, Gauge>,
    pub run_seconds: HistogramFamily<LatencyLabels>,
    pub queue_wait_seconds: Histogram,
    /// Waited runs still going when their caller's wait ended, moved from the request's
    /// thread to one of their own.
    pub runs_handed_over: Counter,
    pub queue_depth: Family<TenantLabels, Gauge>,
    pub running: Family<TenantLabels, Gauge>,
    pub denials: Family<ReasonLabels, Counter>,
    pub setup_failures: Family<ReasonLabels, Counter>,
    pub sessions_active: Gauge,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_seconds: HistogramFamily<ReasonLabels>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("airlockd");
        let runs = Family::<RunLabels, Counter>::default();
        registry.register(
            "runs",
            "Runs ended, by status, backend and tenant",
            runs.clone(),
        );
        let runs_by_start = Family::<StartLabels, Counter>::default();
        registry.register(
            "runs_by_start",
            "Runs ended, by how their sandbox started (cold, warm, zygote) and tenant",
            runs_by_start.clone(),
        );
        let warm_ready = Family::<WarmLabels, Gauge>::default();
        registry.register(
            "warm_ready",
            "Prepared sandboxes ready (kind prepared, or session: sessions' own), zygotes serving, by profile ([warm])",
            warm_ready.clone(),
        );
        let run_seconds: HistogramFamily<LatencyLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "run_duration_seconds",
            "Wall time of runs from start to end",
            run_seconds.clone(),
        );
        let queue_wait_seconds = latency_histogram();
        registry.register(
            "queue_wait_seconds",
            "Time runs waited for a slot",
            queue_wait_seconds.clone(),
        );
        let runs_handed_over = Counter::default();
        registry.register(
            "runs_handed_over",
            "Waited runs still going when their caller's wait ended, handed over from the request's thread to a thread of their own",
            runs_handed_over.clone(),
        );
        let queue_depth = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "queue_depth",
            "Runs waiting for a slot, by tenant",
            queue_depth.clone(),
        );
        let running = Family::<TenantLabels, Gauge>::default();
        registry.register("running", "Runs holding a slot, by tenant", running.clone());
        let denials = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "denials",
            "Requests and runs refused, by reason",
            denials.clone(),
        );
        let setup_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "sandbox_setup_failures",
            "Sandboxes that could not be set up, by kind",
            setup_failures.clone(),
        );
        let sessions_active = Gauge::default();
        registry.register(
            "sessions_active",
            "Sessions alive on this node",
            sessions_active.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered",
            http_requests.clone(),
        );
        let http_seconds: HistogramFamily<ReasonLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to the response head, by route (label reason = route)",
            http_seconds.clone(),
        );
        Metrics {
            registry,
            runs,
            runs_by_start,
            warm_ready,
            run_seconds,
            queue_wait_seconds,
            runs_handed_over,
            queue_depth,
            running,
            denials,
            setup_failures,
            sessions_active,
            http_requests,
            http_seconds,
        }
    }

    pub fn deny(&self, reason: &str) {
        self.denials
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!("cannot encode metrics: {e}");
        }
        out
    }
}
