-- The demo writer: one "business" transaction with its outbox events, as an application writes
-- them. docker-compose.yml's `writer` service runs this file with psql once a second.
--
-- Each run places an order for a random customer: in ONE transaction, the order's events
-- (OrderPlaced, then OrderPaid: same aggregate id, so the same Kafka key and partition, in
-- order) and the customer's (CustomerOrdered). Ferry relays them to outbox.event.order and
-- outbox.event.customer once the transaction commits, and only then; a rolled-back transaction
-- is never seen.

-- Pick the ids once, so all three events agree (psql variables).
SELECT (1 + floor(random() * 10))::int                     AS customer,
       (100000 + floor(random() * 900000))::int            AS order_no,
       round((5 + random() * 195)::numeric, 2)             AS total
\gset

BEGIN;

INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', :'order_no', 'OrderPlaced',
        jsonb_build_object('order', :order_no, 'customer', :customer,
                           'total', :total, 'currency', 'EUR', 'placed_at', now()));

INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', :'order_no', 'OrderPaid',
        jsonb_build_object('order', :order_no, 'amount', :total, 'paid_at', now()));

INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'customer', :'customer', 'CustomerOrdered',
        jsonb_build_object('customer', :customer, 'order', :order_no));

COMMIT;
