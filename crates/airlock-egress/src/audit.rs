//! The gate's record keeping: decisions, counters and the live event stream.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::report::{Channel, Counters, Decision, DecisionRecord, GateEvent};

/// The callback receiving each event as it happens (the daemon streams them). It runs on the
/// gate's threads: keep it short (send on a channel).
pub type EventSink = Box<dyn Fn(&GateEvent) + Send + Sync>;

/// The most decision records a run keeps; past it they are counted, not kept.
pub const MAX_RECORDS: usize = 10_000;

pub(crate) struct Audit {
    records: Mutex<Vec<DecisionRecord>>,
    dropped: AtomicU64,
    next_id: AtomicU64,
    counters: Mutex<Counters>,
    sink: Option<EventSink>,
    /// Set when the run's report is taken: a thread ending later streams nothing.
    sealed: AtomicBool,
}

/// Where a kept record lives, to complete it when its stream closes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordSlot {
    index: Option<usize>,
    id: u64,
}

impl Audit {
    pub(crate) fn new(sink: Option<EventSink>) -> Audit {
        Audit {
            records: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            counters: Mutex::new(Counters::default()),
            sink,
            sealed: AtomicBool::new(false),
        }
    }

    /// A record stamped with the next id and the current time.
    pub(crate) fn new_record(&self, channel: Channel) -> DecisionRecord {
        DecisionRecord {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            channel,
            name: None,
            port: None,
            address: None,
            protocol: None,
            decision: Decision::Deny,
            reason: crate::report::Reason::NotAllowed,
            detail: None,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0.0,
            ended_by: None,
        }
    }

    /// Keeps a decision, counts it and streams it.
    pub(crate) fn decide(&self, record: DecisionRecord) -> RecordSlot {
        self.count_decision(&record);
        self.emit(GateEvent::Decided(record.clone()));
        let id = record.id;
        let mut records = self.lock_records();
        if records.len() >= MAX_RECORDS {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return RecordSlot { index: None, id };
        }
        records.push(record);
        RecordSlot {
            index: Some(records.len() - 1),
            id,
        }
    }

    /// Completes an allowed stream's record with its bytes and duration, and streams it.
    pub(crate) fn close(&self, slot: RecordSlot, traffic: Traffic) {
        let mut counters = self.lock_counters();
        counters.bytes_out += traffic.bytes_out;
        counters.bytes_in += traffic.bytes_in;
        drop(counters);
        let mut records = self.lock_records();
        let Some(record) = slot
            .index
            .and_then(|i| records.get_mut(i))
            .filter(|r| r.id == slot.id)
        else {
            return;
        };
        record.bytes_out = traffic.bytes_out;
        record.bytes_in = traffic.bytes_in;
        record.duration_ms = traffic.duration.as_secs_f64() * 1000.0;
        record.ended_by = traffic.ended_by;
        let closed = record.clone();
        drop(records);
        self.emit(GateEvent::Closed(closed));
    }

    fn count_decision(&self, record: &DecisionRecord) {
        let mut counters = self.lock_counters();
        let allowed = record.decision != Decision::Deny;
        match (record.channel, allowed) {
            (Channel::Dns, true) => counters.dns_answered += 1,
            (Channel::Dns, false) => counters.dns_refused += 1,
            (_, true) => counters.connections_allowed += 1,
            (_, false) => counters.connections_denied += 1,
        }
    }

    /// Stops streaming events: the run is over.
    pub(crate) fn seal(&self) {
        self.sealed.store(true, Ordering::Relaxed);
    }

    fn emit(&self, event: GateEvent) {
        if self.sealed.load(Ordering::Relaxed) {
            return;
        }
        if let Some(sink) = &self.sink {
            sink(&event);
        }
    }

    pub(crate) fn snapshot(&self) -> (Counters, Vec<DecisionRecord>, u64) {
        (
            self.lock_counters().clone(),
            self.lock_records().clone(),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    fn lock_records(&self) -> std::sync::MutexGuard<'_, Vec<DecisionRecord>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an allowed stream carried.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Traffic {
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
    pub(crate) duration: Duration,
    pub(crate) ended_by: Option<crate::report::Reason>,
}
