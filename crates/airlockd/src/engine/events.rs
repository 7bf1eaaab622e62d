//! A run's event stream: what subscribers see while it runs and what the store keeps after.
//!
//! Each live run has one append-only [`EventLog`]; every subscriber reads it by position, so
//! a slow subscriber only falls behind (it holds a cursor, not a queue) and the daemon's
//! memory per run is the log itself, which the policy's output caps bound.

use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::ToSchema;

use crate::store::{now_ms, StoredEvent};

/// One event of a run's stream (`event` names the kind).
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventBody {
    /// The program was started with these isolation layers in force.
    Started { layers: Vec<String> },
    /// A chunk of stdout: `text` is lossy UTF-8; `base64` carries the exact bytes when they
    /// are not valid UTF-8 (a chunk may split a character).
    Stdout {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base64: Option<String>,
    },
    Stderr {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base64: Option<String>,
    },
    /// A worker's progress report.
    Progress {
        fraction: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A worker's log line, or a line of its stdout that was not a valid event.
    Log { message: String },
    /// A decision of the egress gate (allowed or denied connection, DNS answer).
    Network {
        #[schema(value_type = Object)]
        decision: serde_json::Value,
    },
    /// The run ended: its full record (status, result, error).
    Ended {
        #[schema(value_type = Object)]
        run: serde_json::Value,
    },
    /// Sent on idle NDJSON streams so that proxies keep the connection.
    Keepalive,
}

impl EventBody {
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::Started { .. } => "started",
            EventBody::Stdout { .. } => "stdout",
            EventBody::Stderr { .. } => "stderr",
            EventBody::Progress { .. } => "progress",
            EventBody::Log { .. } => "log",
            EventBody::Network { .. } => "network",
            EventBody::Ended { .. } => "ended",
            EventBody::Keepalive => "keepalive",
        }
    }

    /// A decision of the egress gate, as the gate reports it (`decided` or `closed`, with the
    /// name, address, port, rule and reason).
    pub fn network(event: &airlock_egress::GateEvent) -> EventBody {
        EventBody::Network {
            decision: serde_json::to_value(event).unwrap_or_default(),
        }
    }

    /// The start of a run, with the layers in force by their JSON names.
    pub fn started(layers: &[airlock::Layer]) -> EventBody {
        EventBody::Started {
            layers: layers
                .iter()
                .map(|l| airlock::layer::layer_name(*l))
                .collect(),
        }
    }

    pub fn output(stderr: bool, bytes: &[u8]) -> EventBody {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let base64 = std::str::from_utf8(bytes)
            .is_err()
            .then(|| base64::engine::general_purpose::STANDARD.encode(bytes));
        if stderr {
            EventBody::Stderr { text, base64 }
        } else {
            EventBody::Stdout { text, base64 }
        }
    }
}

/// An event with its place in the stream.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct RunEventWire {
    /// Position in the run's stream, from 0; resume with `?from=` or `Last-Event-ID`.
    pub seq: u64,
    /// When the daemon saw it (Unix milliseconds).
    pub at_ms: i64,
    #[serde(flatten)]
    pub body: EventBody,
}

impl RunEventWire {
    pub fn from_stored(event: &StoredEvent) -> Option<RunEventWire> {
        Some(RunEventWire {
            seq: event.seq as u64,
            at_ms: event.at_ms,
            body: serde_json::from_value(event.data.clone()).ok()?,
        })
    }

    pub fn to_stored(&self) -> StoredEvent {
        StoredEvent {
            seq: self.seq as i64,
            at_ms: self.at_ms,
            kind: self.body.kind().to_string(),
            data: serde_json::to_value(&self.body).unwrap_or_default(),
        }
    }
}

/// The events of one live run.
#[derive(Debug)]
pub struct EventLog {
    events: Mutex<Vec<Arc<RunEventWire>>>,
    /// The number of events, and whether the log is closed.
    length: watch::Sender<(usize, bool)>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            events: Mutex::new(Vec::new()),
            length: watch::channel((0, false)).0,
        }
    }
}

impl EventLog {
    pub fn push(&self, body: EventBody) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = events.len() as u64;
        events.push(Arc::new(RunEventWire {
            seq,
            at_ms: now_ms(),
            body,
        }));
        let length = events.len();
        drop(events);
        self.length.send_replace((length, false));
    }

    /// No more events will come.
    pub fn close(&self) {
        let length = self
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        self.length.send_replace((length, true));
    }

    /// Events from position `from`, and whether the log is closed.
    pub fn read_from(&self, from: usize) -> (Vec<Arc<RunEventWire>>, bool) {
        let closed = self.length.borrow().1;
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        (events.iter().skip(from).cloned().collect(), closed)
    }

    pub fn watch(&self) -> watch::Receiver<(usize, bool)> {
        self.length.subscribe()
    }

    pub fn snapshot(&self) -> Vec<StoredEvent> {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.iter().map(|e| e.to_stored()).collect()
    }
}
