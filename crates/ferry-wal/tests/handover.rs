//! The slot hand-over lock (`ferry_wal::slot::handover`) against a real PostgreSQL: a standby's
//! wait finds no holder, runs out while the holder holds on, or ends when the holder lets go;
//! the holder is found by its pid;
//! a role's short `statement_timeout` does not end it, and nothing outlives a wait on the
//! standby's connection.

use std::time::Duration;

use ferry_testkit::pg;
use ferry_testkit::process::wait_until;
use ferry_wal::slot::handover::{self, Waited, CLASS};

/// Waits for this database's hand-over locks that began less than 100 ms ago (so that most of
/// a wait's step is still ahead of it).
async fn waiting(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND classid::bigint = $1 AND NOT granted \
         AND waitstart > clock_timestamp() - interval '100 milliseconds' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        &[&i64::from(CLASS)],
    )
    .await
    .unwrap()
    .get(0)
}

/// Advisory locks the connection's own backend holds.
async fn own_locks(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_finds_no_holder_runs_out_while_held_and_ends_when_the_holder_lets_go() {
    let db = pg::shared().create_db().await;
    let observer = db.client().await;
    // One slot name whose key is negative as an int4, one whose key is positive.
    let slots = ["ferry_slot", "ferry"];
    assert!(handover::lock_key(slots[0]).1 < 0 && handover::lock_key(slots[1]).1 > 0);
    for slot in slots {
        let mut standby = db.client().await;
        // Shorter than a wait: lifted for the wait's transaction.
        standby
            .batch_execute("SET statement_timeout = 100")
            .await
            .unwrap();
        let step = handover::WAIT_STEP;
        let waited = handover::wait_for_release(&mut standby, slot, step).await;
        assert_eq!(waited.unwrap(), Waited::Unheld, "{slot}: nobody holds it");

        assert_eq!(handover::holder(&observer, slot).await.unwrap(), None);
        let holder = db.client().await;
        assert!(handover::hold(&holder, slot).await.unwrap(), "{slot}");
        let pid: i32 = holder
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            handover::holder(&observer, slot).await.unwrap(),
            Some(pid),
            "{slot}: the holder found"
        );
        let waited = handover::wait_for_release(&mut standby, slot, step).await;
        assert_eq!(
            waited.unwrap(),
            Waited::StillHeld,
            "{slot}: held throughout"
        );
        assert_eq!(
            own_locks(&standby).await,
            0,
            "{slot}: a wait leaves no lock"
        );
        // The connection is as it was: the role's statement_timeout is back.
        let timeout: String = standby
            .query_one("SHOW statement_timeout", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(timeout, "100ms", "{slot}");

        // The holder lets go while the standby waits.
        let waiter = tokio::spawn(async move {
            let mut waited = Waited::StillHeld;
            while waited == Waited::StillHeld {
                waited = handover::wait_for_release(&mut standby, slot, step)
                    .await
                    .unwrap();
            }
            (standby, waited)
        });
        wait_until(
            "the standby has just begun a wait for the lock",
            Duration::from_secs(30),
            || async { waiting(&observer).await == 1 },
        )
        .await;
        let (class, key) = handover::lock_key(slot);
        holder
            .execute("SELECT pg_advisory_unlock($1, $2)", &[&class, &key])
            .await
            .unwrap();
        let (standby, waited) = waiter.await.unwrap();
        assert_eq!(waited, Waited::Released, "{slot}: let go during the wait");
        assert_eq!(own_locks(&standby).await, 0, "{slot}");
    }
}
