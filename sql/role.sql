-- A least-privilege role for Ferry. Run as a superuser (or, on managed services, the admin
-- role), after sql/outbox.sql:
--   psql "$ADMIN_URL" -v ferry_password="'change-me'" -f sql/role.sql
-- Ferry needs:
--   * LOGIN and REPLICATION, to open a replication connection and create/stream its slot
--     (on Amazon RDS/Aurora, REPLICATION cannot be granted: GRANT rds_replication TO ferry);
--   * CONNECT on the database;
--   * USAGE on the outbox's schema (Ferry looks the table up by name);
--   * SELECT on the outbox only (`ferry check` samples it; logical decoding itself needs none).
-- It does not own the outbox, so it cannot create the publication: the owner runs
-- sql/publication.sql once and Ferry runs with postgres.create_publication = false.
\if :{?ferry_password}
\else
\set ferry_password '''change-me'''
\endif
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ferry') THEN
        CREATE ROLE ferry WITH LOGIN REPLICATION;
    END IF;
END
$$;
ALTER ROLE ferry WITH LOGIN REPLICATION PASSWORD :ferry_password;
SELECT format('GRANT CONNECT ON DATABASE %I TO ferry', current_database()) \gexec
GRANT USAGE ON SCHEMA public TO ferry;
GRANT SELECT ON public.outbox TO ferry;
