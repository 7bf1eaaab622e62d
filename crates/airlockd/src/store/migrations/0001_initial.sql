-- The run store, shared by every daemon of a fleet. Written once for SQLite and PostgreSQL:
-- only BIGINT and TEXT columns (times are Unix milliseconds, documents are JSON text), and
-- {{audit_id}} is the one dialect word (an auto-increasing primary key).

-- One row per run, from admission to its end. `request` never holds env values, stdin or
-- file contents unless the store is configured to keep them.
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    key_name TEXT NOT NULL,
    kind TEXT NOT NULL,
    session_id TEXT,
    node TEXT NOT NULL,
    status TEXT NOT NULL,
    priority BIGINT NOT NULL,
    idempotency_key TEXT,
    request_hash TEXT,
    request TEXT NOT NULL,
    profile TEXT,
    policy TEXT,
    backend TEXT,
    result TEXT,
    error TEXT,
    outputs TEXT,
    network TEXT,
    created_ms BIGINT NOT NULL,
    started_ms BIGINT,
    ended_ms BIGINT,
    queue_ms BIGINT,
    wall_ms BIGINT
);
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant, idempotency_key);
CREATE INDEX runs_tenant_id ON runs (tenant, id);
CREATE INDEX runs_status ON runs (status);
CREATE INDEX runs_node_status ON runs (node, status);
CREATE INDEX runs_created ON runs (created_ms);

-- The event stream of a finished run (started, stdout, stderr, progress, log, network); the
-- `ended` event is the run's result.
CREATE TABLE run_events (
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Network decisions of the egress gate, one row per decision (filled once the gate exists).
CREATE TABLE run_network (
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    host TEXT,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    key_name TEXT NOT NULL,
    node TEXT NOT NULL,
    status TEXT NOT NULL,
    profile TEXT NOT NULL,
    spec TEXT NOT NULL,
    workspace TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    last_active_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    idle_timeout_ms BIGINT NOT NULL,
    ended_ms BIGINT,
    end_reason TEXT
);
CREATE INDEX sessions_tenant_status ON sessions (tenant, status);
CREATE INDEX sessions_node_status ON sessions (node, status);

-- Security-relevant events. Append-only (a trigger refuses updates and deletes of records
-- younger than a day) and chained: each record's hash covers the previous record's hash.
CREATE TABLE audit (
    id {{audit_id}},
    at_ms BIGINT NOT NULL,
    node TEXT NOT NULL,
    tenant TEXT,
    key_name TEXT,
    kind TEXT NOT NULL,
    run_id TEXT,
    detail TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_at ON audit (at_ms);
CREATE INDEX audit_tenant ON audit (tenant, id);

-- The daemons of the fleet: where to reach each, and when it last said it was alive.
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    advertise TEXT,
    pid BIGINT NOT NULL,
    started_ms BIGINT NOT NULL,
    heartbeat_ms BIGINT NOT NULL
);
