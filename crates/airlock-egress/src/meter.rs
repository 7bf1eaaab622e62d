//! Per-run caps: connections (total and at once), bytes each way, DNS queries. A cap reached
//! refuses the next request (or cuts the stream that crossed it) and is remembered for the
//! report.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::policy::Limits;
use crate::report::LimitKind;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// From the sandbox.
    Out,
    /// To the sandbox.
    In,
}

impl Direction {
    /// The cap on this direction.
    pub(crate) fn limit(self) -> LimitKind {
        match self {
            Direction::Out => LimitKind::BytesOut,
            Direction::In => LimitKind::BytesIn,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Meter {
    limits: Limits,
    connections: AtomicU64,
    concurrent: Arc<AtomicU64>,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    dns_queries: AtomicU64,
    hit: Mutex<BTreeSet<LimitKind>>,
}

/// One open connection's slot; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Admission {
    concurrent: Arc<AtomicU64>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.concurrent.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Meter {
    pub(crate) fn new(limits: Limits) -> Meter {
        Meter {
            limits,
            connections: AtomicU64::new(0),
            concurrent: Arc::new(AtomicU64::new(0)),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            dns_queries: AtomicU64::new(0),
            hit: Mutex::new(BTreeSet::new()),
        }
    }

    /// Opens a slot for a connection the gate accepted (counted from accept to close, so
    /// streams still being read count too), or names the cap that refuses it.
    pub(crate) fn open_slot(&self) -> Result<Admission, LimitKind> {
        if !take_one(&self.concurrent, self.limits.concurrent) {
            return Err(self.note(LimitKind::Concurrent));
        }
        Ok(Admission {
            concurrent: Arc::clone(&self.concurrent),
        })
    }

    /// Admits one more connection to a destination, or names the cap that refuses it (a
    /// byte cap already reached refuses new connections too).
    pub(crate) fn admit_connection(&self) -> Result<(), LimitKind> {
        for direction in [Direction::Out, Direction::In] {
            if self.remaining(direction) == 0 {
                return Err(self.note(direction.limit()));
            }
        }
        if !take_one(&self.connections, self.limits.connections) {
            return Err(self.note(LimitKind::Connections));
        }
        Ok(())
    }

    /// Counts one DNS query; false past the cap.
    pub(crate) fn admit_dns_query(&self) -> bool {
        take_one(&self.dns_queries, self.limits.dns_queries) || {
            self.note(LimitKind::DnsQueries);
            false
        }
    }

    /// Grants up to `wanted` bytes in one direction; fewer when the cap is reached (and the
    /// cap is then recorded as hit).
    pub(crate) fn take_bytes(&self, direction: Direction, wanted: u64) -> u64 {
        let (used, cap) = self.counter(direction);
        let mut granted = 0;
        let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            granted = wanted.min(cap.saturating_sub(current));
            Some(current + granted)
        });
        if granted < wanted {
            self.note(direction.limit());
        }
        granted
    }

    fn remaining(&self, direction: Direction) -> u64 {
        let (used, cap) = self.counter(direction);
        cap.saturating_sub(used.load(Ordering::Acquire))
    }

    fn counter(&self, direction: Direction) -> (&AtomicU64, u64) {
        match direction {
            Direction::Out => (&self.bytes_out, self.limits.bytes_out),
            Direction::In => (&self.bytes_in, self.limits.bytes_in),
        }
    }

    fn note(&self, kind: LimitKind) -> LimitKind {
        self.hit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind);
        kind
    }

    /// Every cap reached so far.
    pub(crate) fn limits_hit(&self) -> Vec<LimitKind> {
        self.hit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

/// Adds one to `counter` unless it has reached `cap`.
fn take_one(counter: &AtomicU64, cap: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            connections: 3,
            concurrent: 2,
            bytes_out: 100,
            bytes_in: 1000,
            dns_queries: 2,
        }
    }

    #[test]
    fn connection_caps_total_and_concurrent() {
        let meter = Meter::new(limits());
        let a = meter.open_slot().unwrap();
        let _b = meter.open_slot().unwrap();
        assert_eq!(meter.open_slot().unwrap_err(), LimitKind::Concurrent);
        drop(a);
        let _c = meter.open_slot().unwrap();
        for _ in 0..3 {
            meter.admit_connection().unwrap();
        }
        assert_eq!(
            meter.admit_connection().unwrap_err(),
            LimitKind::Connections
        );
        assert_eq!(
            meter.limits_hit(),
            vec![LimitKind::Connections, LimitKind::Concurrent]
        );
    }

    #[test]
    fn byte_cap_grants_exactly_up_to_the_cap_then_refuses_connections() {
        let meter = Meter::new(limits());
        assert_eq!(meter.take_bytes(Direction::Out, 60), 60);
        assert_eq!(meter.take_bytes(Direction::Out, 60), 40);
        assert_eq!(meter.take_bytes(Direction::Out, 1), 0);
        assert_eq!(meter.admit_connection().unwrap_err(), LimitKind::BytesOut);
        assert!(meter.admit_dns_query() && meter.admit_dns_query() && !meter.admit_dns_query());
        assert_eq!(
            meter.limits_hit(),
            vec![LimitKind::BytesOut, LimitKind::DnsQueries]
        );
    }
}
