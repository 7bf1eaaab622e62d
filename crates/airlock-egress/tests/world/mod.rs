//! The shared test world (`airlock-testworld`), plus a gate started the way airlock starts
//! one: configure inside the sandbox namespace, send the descriptors over a socketpair,
//! receive them, start the gate inside the gate namespace.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::sync::mpsc;

use airlock_egress::{EgressConfig, EgressPolicy, Gate, GateEvent, RunningGate, SandboxSockets};
pub use airlock_testworld::*;

/// Builds the world, or says why the test skips.
#[macro_export]
macro_rules! world_or_skip {
    () => {
        match world::skip_reason() {
            Some(reason) => {
                eprintln!("{reason}");
                return;
            }
            None => world::World::new(),
        }
    };
}

/// A gate serving the world's sandbox.
pub struct StartedGate {
    pub gate: RunningGate,
    pub proxy_port: u16,
    pub events: mpsc::Receiver<GateEvent>,
}

impl StartedGate {
    pub fn proxy(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy_port)
    }
}

/// Starting a gate for the world's sandbox namespace.
pub trait GateWorld {
    fn start_gate(&self, config: EgressConfig) -> StartedGate;
}

impl GateWorld for World {
    fn start_gate(&self, config: EgressConfig) -> StartedGate {
        let mut config = config;
        config.resolver.get_or_insert_with(|| RESOLVER.to_string());
        start_gate_in(&self.sandbox_ns, &self.gate_ns, config)
    }
}

/// A gate for the sandbox namespace `sandbox_ns`, started in `gate_ns` (both by name).
pub fn start_gate_in(sandbox_ns: &str, gate_ns: &str, config: EgressConfig) -> StartedGate {
    let policy = EgressPolicy::parse(&config).expect("policy");
    let plan = policy.sandbox_plan().expect("plan");
    let (sandbox_end, gate_end) = UnixStream::pair().unwrap();
    in_netns(sandbox_ns, move || {
        airlock_egress::sandbox_side::configure(&plan)
            .expect("configure")
            .send(&sandbox_end)
            .expect("send")
    });
    let sockets = SandboxSockets::receive(&gate_end).expect("receive");
    let proxy_port = sockets.proxy_port;
    let (sender, events) = mpsc::channel();
    let sink = Box::new(move |event: &GateEvent| {
        let _ = sender.send(event.clone());
    });
    let gate = in_netns(gate_ns, move || {
        Gate::start(policy, sockets, Some(sink)).expect("gate")
    });
    StartedGate {
        gate,
        proxy_port,
        events,
    }
}
