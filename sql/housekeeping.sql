-- Keeping the outbox small. Two ways; pick one.
--
-- 1. Delete in the same transaction. The application inserts the event and deletes it before
--    COMMIT. The table stays empty, yet the INSERT is in the WAL, and Ferry relays it (the
--    publication publishes INSERTs only, so the DELETE is not even sent):
--
--      BEGIN;
--      UPDATE orders SET status = 'paid' WHERE id = 42;
--      INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
--           VALUES (gen_random_uuid(), 'order', '42', 'OrderPaid', '{"id": 42}');
--      DELETE FROM outbox WHERE aggregatetype = 'order' AND aggregateid = '42';
--      COMMIT;
--
-- 2. A time-partitioned outbox, whose old partitions are dropped once Kafka has them (Ferry
--    confirms within a second; keep a margin for `ferry replay`, e.g. a day: what is dropped cannot
--    be sent again after a gap or a consumer bug). The publication must
--    publish via the partition root (sql/publication.sql does).
--   psql "$DATABASE_URL" -f sql/housekeeping.sql
CREATE TABLE IF NOT EXISTS public.outbox_partitioned (
    id            uuid        NOT NULL,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

-- Creates the partition for the day containing `day` (idempotent).
CREATE OR REPLACE FUNCTION public.outbox_partitioned_ensure(day date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name text := format('outbox_partitioned_%s', to_char(day, 'YYYYMMDD'));
BEGIN
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS public.%I PARTITION OF public.outbox_partitioned FOR VALUES FROM (%L) TO (%L)',
        name, day, day + 1);
END
$$;

-- Drops the partitions wholly older than `keep` (run it daily, e.g. from pg_cron).
CREATE OR REPLACE FUNCTION public.outbox_partitioned_drop_older_than(keep interval) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    dropped int := 0;
BEGIN
    FOR part IN
        SELECT c.relname
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'public.outbox_partitioned'::regclass
           AND c.relname ~ '^outbox_partitioned_[0-9]{8}$'
           AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= (now() - keep)::date
    LOOP
        EXECUTE format('DROP TABLE public.%I', part.relname);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

SELECT public.outbox_partitioned_ensure(current_date);
SELECT public.outbox_partitioned_ensure(current_date + 1);
