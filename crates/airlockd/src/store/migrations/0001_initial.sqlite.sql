CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_no_recent_delete BEFORE DELETE ON audit
WHEN old.at_ms > (CAST(strftime('%s', 'now') AS INTEGER) - 86400) * 1000
BEGIN
    SELECT RAISE(ABORT, 'audit records younger than a day cannot be deleted');
END;
