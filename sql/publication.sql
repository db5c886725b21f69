-- The publication Ferry streams. Ferry creates it itself when `postgres.create_publication = true`
-- and its role may; otherwise the table's owner runs this once:
--   psql "$DATABASE_URL" -f sql/publication.sql
-- Only INSERTs are published: Ferry relays inserted events; publishing UPDATE/DELETE would make
-- the application's housekeeping DELETEs require a replica identity and send Ferry rows it skips.
-- publish_via_partition_root makes a partitioned outbox's rows arrive under the parent's name.
-- Several outbox tables (`[[tables]]` in ferry.toml) share the one publication: list them all
-- (`FOR TABLE public.outbox, billing.events`), and add one later with
--   ALTER PUBLICATION ferry_outbox ADD TABLE billing.events;
-- (Ferry never alters an existing publication; `ferry check` names a table it lacks.)
CREATE PUBLICATION ferry_outbox FOR TABLE public.outbox
    WITH (publish = 'insert', publish_via_partition_root = true);
