//! Serving a run's events as Server-Sent Events or NDJSON.
//!
//! The stream pulls: each time the connection can take more, it reads the next events from
//! the run's log by position. A client that reads slowly only falls behind (the server keeps
//! no per-client queue; hyper's buffer is bounded and a client that stops reading entirely is
//! dropped by the connection's stall timeout). A client that disconnects drops the stream;
//! the run is not affected.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::types::RunView;
use crate::daemon::Daemon;
use crate::engine::events::{EventBody, RunEventWire};
use crate::engine::LiveRun;
use crate::store::{now_ms, StoredEvent};

/// The wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Sse,
    Ndjson,
}

impl Format {
    /// `?format=` wins; else `Accept: text/event-stream` means SSE; else NDJSON.
    pub fn choose(asked: Option<&str>, headers: &HeaderMap) -> Option<Format> {
        match asked {
            Some("sse") => Some(Format::Sse),
            Some("ndjson") => Some(Format::Ndjson),
            Some(_) => None,
            None => {
                let accept = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                Some(if accept.contains("text/event-stream") {
                    Format::Sse
                } else {
                    Format::Ndjson
                })
            }
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Sse => "text/event-stream",
            Format::Ndjson => "application/x-ndjson",
        }
    }

    fn encode(self, event: &RunEventWire) -> Bytes {
        let json = serde_json::to_string(event).unwrap_or_default();
        match self {
            Format::Sse => format!(
                "id: {}\nevent: {}\ndata: {json}\n\n",
                event.seq,
                event.body.kind()
            )
            .into(),
            Format::Ndjson => format!("{json}\n").into(),
        }
    }

    fn keepalive(self) -> Bytes {
        match self {
            Format::Sse => Bytes::from_static(b": keepalive\n\n"),
            Format::Ndjson => Bytes::from_static(b"{\"event\":\"keepalive\"}\n"),
        }
    }
}

/// Where the events come from.
pub enum Source {
    Live(Arc<LiveRun>),
    Stored(Vec<StoredEvent>),
}

struct State {
    daemon: Arc<Daemon>,
    run_id: String,
    source: Source,
    format: Format,
    next: usize,
    pending: VecDeque<Bytes>,
    finished: bool,
    keepalive: Duration,
}

/// The streaming response.
pub fn respond(
    daemon: Arc<Daemon>,
    run_id: String,
    source: Source,
    from: usize,
    format: Format,
) -> Response {
    let keepalive = daemon
        .config
        .server
        .stream_keepalive
        .0
        .max(Duration::from_millis(100));
    let state = State {
        daemon,
        run_id,
        source,
        format,
        next: from,
        pending: VecDeque::new(),
        finished: false,
        keepalive,
    };
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let chunk = state.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), state))
    });
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

impl State {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some(chunk);
            }
            if self.finished {
                return None;
            }
            if let Some(keepalive) = self.fill().await {
                return Some(keepalive);
            }
        }
    }

    /// Queues the next events; returns a keep-alive when nothing came for a while.
    async fn fill(&mut self) -> Option<Bytes> {
        match &self.source {
            Source::Stored(events) => {
                let wires: Vec<RunEventWire> = events
                    .iter()
                    .filter_map(RunEventWire::from_stored)
                    .collect();
                for event in wires.iter().filter(|e| e.seq as usize >= self.next) {
                    self.pending.push_back(self.format.encode(event));
                }
                let end = wires.last().map_or(0, |e| e.seq as usize + 1);
                self.end(end.max(self.next)).await;
                None
            }
            Source::Live(live) => {
                let live = Arc::clone(live);
                let mut watch = live.log.watch();
                let (events, closed) = live.log.read_from(self.next);
                if !events.is_empty() {
                    self.next += events.len();
                    for event in events {
                        self.pending.push_back(self.format.encode(&event));
                    }
                    return None;
                }
                if closed {
                    self.end(self.next).await;
                    return None;
                }
                let changed = tokio::time::timeout(self.keepalive, watch.changed()).await;
                changed.is_err().then(|| self.format.keepalive())
            }
        }
    }

    /// Queues the `ended` event: the run's full record from the store.
    async fn end(&mut self, seq: usize) {
        self.finished = true;
        let run = match self.daemon.store.run(&self.run_id).await {
            Ok(Some(row)) => serde_json::to_value(RunView::from_row(&row)).unwrap_or_default(),
            _ => serde_json::json!({"id": self.run_id, "status": "unknown"}),
        };
        let event = RunEventWire {
            seq: seq as u64,
            at_ms: now_ms(),
            body: EventBody::Ended { run },
        };
        self.pending.push_back(self.format.encode(&event));
    }
}
