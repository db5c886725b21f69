-- The tables of `ferry inbox` (Kafka into this database, exactly once), for the defaults:
-- inbox.table = "public.ferry_inbox", inbox.payload_type = "jsonb". `ferry inbox` creates them
-- itself when they are missing (inbox.create_tables = true, the default); run this file instead
-- when Ferry's role may not create tables:
--   psql "$DATABASE_URL" -f sql/inbox.sql
-- Then grant Ferry's role SELECT, INSERT, UPDATE, DELETE on the five tables. For a payload that
-- is not JSON, make the inbox's and its payload column's type text or bytea and set
-- inbox.payload_type to match.
--
-- The application's side (README, "The inbox"): in its own transaction, take the unprocessed
-- rows whose key has no earlier unprocessed row, oldest first, skipping rows another worker
-- holds,
--   SELECT topic, "partition", "offset", key, event_id, payload FROM ferry_inbox i
--   WHERE processed_at IS NULL
--     AND NOT EXISTS (SELECT 1 FROM ferry_inbox j
--                     WHERE j.topic = i.topic AND j.key = i.key AND j.processed_at IS NULL
--                       AND (j."partition", j."offset") < (i."partition", i."offset"))
--   ORDER BY topic, "partition", "offset" LIMIT 100 FOR UPDATE SKIP LOCKED;
-- apply them, set processed_at = now() on them, and COMMIT; LISTEN ferry_inbox to wake up when
-- rows come (and poll now and then). Without the NOT EXISTS, two workers apply one key's rows
-- out of order (one takes a key's first row, the other skips it and takes the second). Each
-- transaction takes at most one row per key; rows without a key are not ordered.

-- The inbox: one row per record stored, in the consuming service's database.
CREATE TABLE IF NOT EXISTS "public"."ferry_inbox" (
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    key             bytea,
    headers         jsonb       NOT NULL,
    event_id        text,
    payload         jsonb,
    kafka_timestamp timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz,
    PRIMARY KEY (topic, "partition", "offset")
);
-- The application's queue: unprocessed rows, per key in offset order.
CREATE INDEX IF NOT EXISTS "ferry_inbox_unprocessed" ON "public"."ferry_inbox" (topic, "partition", "offset") WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS "ferry_inbox_by_key" ON "public"."ferry_inbox" (topic, key, "partition", "offset") WHERE processed_at IS NULL;
-- The cleanup of processed rows.
CREATE INDEX IF NOT EXISTS "ferry_inbox_processed" ON "public"."ferry_inbox" (processed_at) WHERE processed_at IS NOT NULL;

-- Event ids stored within the retention window (inbox.dedup_retention).
CREATE TABLE IF NOT EXISTS "public"."ferry_inbox_dedup" (
    event_id    text        PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "ferry_inbox_dedup_received" ON "public"."ferry_inbox_dedup" (received_at);

-- Records that cannot be stored in the inbox, with why.
CREATE TABLE IF NOT EXISTS "public"."ferry_inbox_dead_letters" (
    topic           text        NOT NULL,
    "partition"     integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    key             bytea,
    headers         jsonb       NOT NULL,
    event_id        text,
    payload         bytea,
    kafka_timestamp timestamptz,
    reason          text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, "partition", "offset")
);

-- Each partition's next offset, per consumer group: written in the same transaction as the rows.
CREATE TABLE IF NOT EXISTS "public"."ferry_inbox_offsets" (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    "partition"    integer     NOT NULL,
    next_offset    bigint,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- The highest source position stored per partition and `ferry run` source (inbox.positions).
CREATE TABLE IF NOT EXISTS "public"."ferry_inbox_marks" (
    consumer_group text    NOT NULL,
    topic          text    NOT NULL,
    "partition"    integer NOT NULL,
    source         text    NOT NULL,
    commit_lsn     pg_lsn  NOT NULL,
    row_index      integer NOT NULL,
    PRIMARY KEY (consumer_group, topic, "partition", source)
);

