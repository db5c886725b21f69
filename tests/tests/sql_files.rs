//! The files in `sql/` run as-is with psql, and do what their comments promise: the outbox
//! (jsonb and bytea), the publication, the least-privilege role, and both housekeeping
//! strategies (delete in the same transaction; dropped time partitions).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use ferry_testkit::kafka;
use ferry_testkit::pg;

fn sql_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sql")
        .join(name)
}

/// `psql -f <file>` as the given URL, with ON_ERROR_STOP: the file must run cleanly.
fn psql(url: &str, file: &str, vars: &[(&str, &str)]) {
    let mut cmd = Command::new("psql");
    cmd.arg(url).args(["-X", "-q", "-v", "ON_ERROR_STOP=1"]);
    for (k, v) in vars {
        cmd.arg("-v").arg(format!("{k}={v}"));
    }
    let out = cmd
        .arg("-f")
        .arg(sql_file(file))
        .output()
        .expect("run psql (the PostgreSQL client)");
    assert!(
        out.status.success(),
        "psql -f sql/{file} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn bare_world() -> World {
    World::bare(pg::shared().create_db().await, kafka::shared().brokers()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_role_relays_the_debezium_compatible_outbox() {
    let mut w = bare_world().await;
    psql(&w.db.url, "outbox.sql", &[]);
    psql(&w.db.url, "outbox.sql", &[]); // idempotent
    psql(&w.db.url, "publication.sql", &[]);
    psql(&w.db.url, "role.sql", &[("ferry_password", "'s3cret-Pw'")]);
    let topic = w.create_topic("order", 1).await;
    // Ferry as the role from sql/role.sql, through the publication from sql/publication.sql,
    // creating nothing but its slot.
    w.env.push((
        "FERRY_POSTGRES_URL".into(),
        w.db.url_as("ferry", "s3cret-Pw"),
    ));
    w.env
        .push(("FERRY_POSTGRES_PUBLICATION".into(), "ferry_outbox".into()));
    w.env
        .push(("FERRY_POSTGRES_CREATE_PUBLICATION".into(), "false".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.sql
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ('9b2f0b52-5a4c-4a57-9f44-d1c1b3b1f001', 'order', '42', 'OrderPaid', '{\"id\": 42}')",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 1).await;
    assert_eq!(
        got[0].header("id").as_deref(),
        Some("9b2f0b52-5a4c-4a57-9f44-d1c1b3b1f001")
    );
    assert_eq!(got[0].header("type").as_deref(), Some("OrderPaid"));
    assert_eq!(got[0].key.as_deref(), Some(&b"42"[..]));
    assert_eq!(got[0].value.as_deref(), Some(&b"{\"id\": 42}"[..]));
    // The role really is unprivileged: it may not write the outbox or create publications.
    let ferry_sql = pg::connect(&w.db.url_as("ferry", "s3cret-Pw")).await;
    let err = ferry_sql
        .batch_execute("INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'a', 'b', 'c')")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytea_outbox_relays_payload_bytes_exactly() {
    let mut w = bare_world().await;
    psql(&w.db.url, "outbox_bytea.sql", &[]);
    let topic = w.create_topic("blob", 1).await;
    w.env
        .push(("FERRY_OUTBOX_TABLE".into(), "public.outbox_bin".into()));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    // Not UTF-8, with NULs: the value must be these bytes, not their hex text.
    w.sql
        .batch_execute(
            "INSERT INTO outbox_bin (id, aggregatetype, aggregateid, type, payload)
             VALUES (gen_random_uuid(), 'blob', 'b-1', 'Avro', '\\x00ff10c3289f00'::bytea)",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 1).await;
    assert_eq!(
        got[0].value.as_deref(),
        Some(&[0x00, 0xff, 0x10, 0xc3, 0x28, 0x9f, 0x00][..])
    );
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_deleted_in_its_own_transaction_is_still_relayed() {
    let w = bare_world().await;
    psql(&w.db.url, "outbox.sql", &[]);
    let topic = w.create_topic("order", 1).await;
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.sql
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                  VALUES ('9b2f0b52-5a4c-4a57-9f44-d1c1b3b1f002', 'order', '7', 'OrderPaid', '{\"id\": 7}');
             DELETE FROM outbox WHERE aggregatetype = 'order' AND aggregateid = '7';
             COMMIT;",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 1).await;
    assert_eq!(
        got[0].header("id").as_deref(),
        Some("9b2f0b52-5a4c-4a57-9f44-d1c1b3b1f002")
    );
    let left: i64 = w
        .sql
        .query_one("SELECT count(*) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the table stays empty");
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_partitioned_outbox_is_relayed_and_old_partitions_drop() {
    let mut w = bare_world().await;
    psql(&w.db.url, "housekeeping.sql", &[]);
    psql(&w.db.url, "housekeeping.sql", &[]); // idempotent
    let topic = w.create_topic("order", 1).await;
    w.env.push((
        "FERRY_OUTBOX_TABLE".into(),
        "public.outbox_partitioned".into(),
    ));
    let mut ferry = w.start_ferry();
    ferry.wait_ready().await;
    w.sql
        .batch_execute(
            "INSERT INTO outbox_partitioned (id, aggregatetype, aggregateid, type, payload)
             VALUES (gen_random_uuid(), 'order', '1', 'OrderPlaced', '{}')",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 1).await;
    assert_eq!(got[0].header("type").as_deref(), Some("OrderPlaced"));
    // A partition from three days ago is dropped by the housekeeping function, today's is kept.
    w.sql
        .batch_execute("SELECT public.outbox_partitioned_ensure(current_date - 3)")
        .await
        .unwrap();
    let dropped: i32 = w
        .sql
        .query_one(
            "SELECT public.outbox_partitioned_drop_older_than('1 day')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dropped, 1);
    let kept: i64 = w
        .sql
        .query_one("SELECT count(*) FROM outbox_partitioned", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1);
    // Rows keep flowing after the drop.
    w.sql
        .batch_execute(
            "INSERT INTO outbox_partitioned (id, aggregatetype, aggregateid, type, payload)
             VALUES (gen_random_uuid(), 'order', '1', 'OrderPaid', '{}')",
        )
        .await
        .unwrap();
    let got = w.consume(&topic, 2).await;
    assert_eq!(got[1].header("type").as_deref(), Some("OrderPaid"));
    wait_until("ferry still streams", Duration::from_secs(10), || async {
        ferry.metric("ferry_streaming").await == Some(1.0)
    })
    .await;
    assert!(ferry.terminate().await.success(), "{}", ferry.log_text());
}
