CREATE FUNCTION airlockd_audit_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'the audit log is append-only';
    END IF;
    IF OLD.at_ms > (extract(epoch FROM now())::bigint - 86400) * 1000 THEN
        RAISE EXCEPTION 'audit records younger than a day cannot be deleted';
    END IF;
    RETURN OLD;
END
$$;
CREATE TRIGGER audit_guard BEFORE UPDATE OR DELETE ON audit
FOR EACH ROW EXECUTE FUNCTION airlockd_audit_guard();
