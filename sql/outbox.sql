-- The outbox table, with Debezium's Outbox Event Router column names, so an application that
-- writes for Debezium needs no change. Run as the application's schema owner:
--   psql "$DATABASE_URL" -f sql/outbox.sql
-- The application inserts one row per event, in the same transaction as its business change.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid        PRIMARY KEY,           -- event id: the Kafka header `id`, for deduplication
    aggregatetype text        NOT NULL,              -- topic: outbox.event.<aggregatetype>
    aggregateid   text        NOT NULL,              -- Kafka key: one aggregate's events stay in order
    type          text        NOT NULL,              -- event type: the Kafka header `type`
    payload       jsonb,                             -- the record value, as stored
    created_at    timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE public.outbox IS
    'Transactional outbox relayed to Kafka by Ferry (Debezium-compatible columns).';

-- Optional: the writer's W3C trace context, sent on as the traceparent/tracestate headers
-- (outbox.tracing_column = "tracingspancontext"; Debezium's column name and format are accepted):
--   ALTER TABLE public.outbox ADD COLUMN IF NOT EXISTS tracingspancontext text;
