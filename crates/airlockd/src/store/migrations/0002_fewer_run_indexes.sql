-- Fewer indexes on `runs`: each one is written at a run's admission, and each one holding
-- `status` again at its end (on PostgreSQL, an UPDATE of an indexed column writes every
-- index). What each query of `runs` uses after this:
--   by id, list ordered by id (all tenants)   the primary key
--   list of one tenant                        runs_tenant_id (tenant, id)
--   by idempotency key, and its uniqueness    runs_idempotency_key (tenant, idempotency_key)
--   recovery and active counts of a node,
--   list filtered by status                   runs_status_node (status, node)
--   pruning, list since a time                runs_created (created_ms)
-- `status` alone and `(node, status)` become one index led by `status`: `node = $1 AND
-- status IN (...)` reads it once per active status, and a filter by status reads its prefix.
DROP INDEX runs_status;
DROP INDEX runs_node_status;
CREATE INDEX runs_status_node ON runs (status, node);
-- Most runs have no idempotency key; such a row (NULL keys never conflict) needs no entry.
DROP INDEX runs_idempotency;
CREATE UNIQUE INDEX runs_idempotency_key ON runs (tenant, idempotency_key)
WHERE idempotency_key IS NOT NULL;
