//! A slot handed over the moment its instance's session ends, not at a standby's next poll.
//!
//! PostgreSQL says nothing when a replication slot is released: a standby could only ask again
//! every `postgres.standby_poll_interval` (2 s by default), and a take-over waited on average
//! half of it. So the instance streaming from a slot also holds an advisory lock named after
//! it ([`hold`]), on its ordinary SQL connection, for as long as its session lasts; a standby
//! waits for that lock ([`wait_for_release`]), which PostgreSQL grants the moment the holder's
//! backend ends: its session closed the connection, or its process died and the kernel closed
//! the socket (kill -9 included). The standby then tries the slot at once.
//!
//! The lock decides nothing: the slot's `active_pid` still says who streams, and a standby
//! whose wait found no holder (an instance of an older Ferry, `pg_recvlogical`, a
//! transaction-pooling proxy that keeps the lock on another server connection) polls as
//! before. The lock is the two-key form, `pg_advisory_lock(int4, int4)`: [`CLASS`] and a hash of
//! the slot's name ([`lock_key`]), so it cannot be taken for an application's one-key (`bigint`)
//! lock, which PostgreSQL keeps apart (`pg_locks.objsubid` 1 against 2). Advisory locks need no
//! privilege, work on a server in recovery, and are never written to the WAL.
//!
//! A standby's wait is a transaction-level shared request, so nothing outlives the wait's
//! transaction on the connection the standby's next session reuses. It is bounded by
//! `lock_timeout` inside a PL/pgSQL block that catches the timeout: a wait that runs out is
//! neither an error in the server's log nor a rolled-back transaction in its statistics. While
//! it waits it is a lock wait like any other (`pg_locks.granted` false, `pg_blocking_pids`
//! naming the streaming instance's backend), and its statement holds a snapshot: each wait
//! lasts at most [`WAIT_STEP`], so neither lasts long.

use std::time::Duration;

/// The first key of every slot's lock: "Fery" in ASCII.
pub const CLASS: i32 = 0x4665_7279;

/// The longest one wait lasts before the standby asks again: shorter than PostgreSQL's default
/// `deadlock_timeout` (1 s), so a wait ends before the deadlock check would run, and short
/// enough that its statement's snapshot holds back the server's cleanup of deleted rows no
/// longer than a short query's would.
pub const WAIT_STEP: Duration = Duration::from_millis(500);

/// The advisory lock of `slot`: ([`CLASS`], the slot name's 32-bit FNV-1a hash).
pub fn lock_key(slot: &str) -> (i32, i32) {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in slot.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (CLASS, i32::from_ne_bytes(hash.to_ne_bytes()))
}

/// Tries to take `slot`'s lock on `sql` for as long as that connection lasts (the session that
/// streams from the slot). Whether it was taken: a standby's probe holds the lock shared for a
/// moment, and an ended instance's backend may not have ended yet (a lost node's lingers until
/// the server's TCP keepalive gives up on it), so the caller tries again until it is held.
pub async fn hold(sql: &tokio_postgres::Client, slot: &str) -> Result<bool, tokio_postgres::Error> {
    let (class, key) = lock_key(slot);
    let row = sql
        .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&class, &key])
        .await?;
    Ok(row.get(0))
}

/// The backend holding `slot`'s lock ([`hold`]) in the connection's database, if one does: its
/// pid (`pg_locks`, which every role may read).
pub async fn holder(
    sql: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<i32>, tokio_postgres::Error> {
    let (class, key) = lock_key(slot);
    // The two-key form's keys are stored as `classid` and `objid` (oids: an int4's bits).
    let row = sql
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
               AND mode = 'ExclusiveLock' AND objsubid = 2 \
               AND classid = $1::int4::oid AND objid = $2::int4::oid \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&class, &key],
        )
        .await?;
    Ok(row.and_then(|r| r.get(0)))
}

/// How a standby's [`wait_for_release`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The lock's holder let go while this waited: its session ended, so try the slot now.
    Released,
    /// Nobody held the lock when asked.
    Unheld,
    /// The lock was still held when the wait (`at_most`, at most [`WAIT_STEP`]) ran out.
    StillHeld,
}

/// Waits, at most `at_most` (capped at [`WAIT_STEP`]), for the session holding `slot`'s lock to
/// end. The wait is PostgreSQL's own: a shared request queued behind the holder's exclusive
/// one. The connection's `statement_timeout` (and `transaction_timeout`) are lifted for the
/// wait's transaction (a role's shorter one would end every wait with an error);
/// `lock_timeout` bounds it instead. It runs in PL/pgSQL (`USAGE` on the language, which
/// PostgreSQL grants to everyone by default).
pub async fn wait_for_release(
    sql: &mut tokio_postgres::Client,
    slot: &str,
    at_most: Duration,
) -> Result<Waited, tokio_postgres::Error> {
    let (class, key) = lock_key(slot);
    let millis = at_most.min(WAIT_STEP).as_millis().max(1);
    // A DO block takes no parameters: the keys are integers, written in.
    let wait = format!(
        "DO $ferry$ BEGIN
           IF pg_try_advisory_xact_lock_shared({class}, {key}) THEN
             PERFORM set_config('ferry.handover', 'unheld', true);
           ELSE
             BEGIN
               PERFORM set_config('lock_timeout', '{millis}', true);
               PERFORM pg_advisory_xact_lock_shared({class}, {key});
               PERFORM set_config('ferry.handover', 'released', true);
             EXCEPTION WHEN lock_not_available THEN
               PERFORM set_config('ferry.handover', 'held', true);
             END;
           END IF;
         END $ferry$"
    );
    let tx = sql.transaction().await?;
    // (transaction_timeout exists from PostgreSQL 17 on: set where it exists.)
    tx.batch_execute(
        "SET LOCAL statement_timeout = 0; \
         SELECT set_config(name, '0', true) FROM pg_settings WHERE name = 'transaction_timeout'",
    )
    .await?;
    tx.batch_execute(&wait).await?;
    let outcome: String = tx
        .query_one("SELECT current_setting('ferry.handover')", &[])
        .await?
        .get(0);
    // Ends the transaction, and with it the shared lock if it was granted.
    tx.commit().await?;
    Ok(match outcome.as_str() {
        "released" => Waited::Released,
        "unheld" => Waited::Unheld,
        _ => Waited::StillHeld,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_key_is_its_names_fnv1a_hash_under_ferrys_class() {
        // FNV-1a 32-bit reference values: "" is the offset basis, "a" 0xe40c292c.
        assert_eq!(lock_key(""), (CLASS, 0x811c_9dc5_u32 as i32));
        assert_eq!(lock_key("a"), (CLASS, 0xe40c_292c_u32 as i32));
        assert_ne!(lock_key("ferry"), lock_key("ferry2"));
        assert_eq!(lock_key("ferry"), lock_key("ferry"));
    }
}
