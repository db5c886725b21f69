-- Variant: an outbox whose payload is opaque bytes (Avro, Protobuf, ...). Ferry sends the bytes
-- exactly as stored. Point Ferry at it with `[outbox] table = "public.outbox_bin"`.
--   psql "$DATABASE_URL" -f sql/outbox_bytea.sql
CREATE TABLE IF NOT EXISTS public.outbox_bin (
    id            uuid        PRIMARY KEY,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    payload       bytea,
    created_at    timestamptz NOT NULL DEFAULT now()
);
