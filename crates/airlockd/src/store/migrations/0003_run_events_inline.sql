-- A run's events go into its own row at its end when their JSON is short (16 KiB at most;
-- store/ending.rs): a short run's end is then one UPDATE of `runs` (its row and the status
-- index), where a row per event in `run_events` wrote that table and its primary key as
-- well. Longer streams, and runs recorded before this migration, keep their `run_events`
-- rows (NULL here).
ALTER TABLE runs ADD COLUMN events TEXT;
