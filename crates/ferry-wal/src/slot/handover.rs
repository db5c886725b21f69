//! A slot handed over the moment its instance dies, not at a standby's next poll.
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
//! whose wait found no holder (an instance of an older Ferry, `pg_recvlogical`, a pooler
//! that does not keep a session's locks) polls as before. The lock is the two-key form,
//! `pg_advisory_lock(int4, int4)`: [`CLASS`] and a hash of the slot's name ([`lock_key`]), so it
//! cannot be taken for an application's one-key (`bigint`) lock, which PostgreSQL keeps apart
//! (`pg_locks.objsubid` 1 against 2). Advisory locks need no privilege, work on a server in
//! recovery, and are never written to the WAL.

use std::time::Duration;

use tokio_postgres::error::SqlState;

/// The first key of every slot's lock: "Fery" in ASCII.
pub const CLASS: i32 = 0x4665_7279;

/// The advisory lock of `slot`: ([`CLASS`], the slot name's 32-bit FNV-1a hash).
pub fn lock_key(slot: &str) -> (i32, i32) {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in slot.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (CLASS, i32::from_ne_bytes(hash.to_ne_bytes()))
}

/// Takes `slot`'s lock on `sql` for as long as that connection lasts (the session that streams
/// from the slot). Whether it was taken: another backend may still hold it (an instance whose
/// backend has not ended yet), and then this session's end wakes no standby, which polls.
pub async fn hold(sql: &tokio_postgres::Client, slot: &str) -> Result<bool, tokio_postgres::Error> {
    let (class, key) = lock_key(slot);
    let row = sql
        .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&class, &key])
        .await?;
    Ok(row.get(0))
}

/// How a standby's [`wait_for_release`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The lock's holder let go while this waited: its session ended, so try the slot now.
    Released,
    /// Nobody held the lock: whatever holds the slot is not a Ferry session that took it.
    Unheld,
    /// The lock was still held when `at_most` ran out.
    StillHeld,
}

/// Waits, at most `at_most`, for the session holding `slot`'s lock to end. The wait is
/// PostgreSQL's own (a shared lock request queued behind the holder's exclusive one), bounded by
/// `lock_timeout` in a transaction of its own, so the connection is idle again when this
/// returns, with no lock and no setting left on it.
pub async fn wait_for_release(
    sql: &mut tokio_postgres::Client,
    slot: &str,
    at_most: Duration,
) -> Result<Waited, tokio_postgres::Error> {
    let (class, key) = lock_key(slot);
    let free: bool = sql
        .query_one(
            "SELECT pg_try_advisory_lock_shared($1, $2)",
            &[&class, &key],
        )
        .await?
        .get(0);
    let waited = if free {
        Waited::Unheld
    } else {
        // lock_timeout is an integer of milliseconds; 0 would mean no limit.
        let millis = at_most.as_millis().clamp(1, i32::MAX as u128).to_string();
        let tx = sql.transaction().await?;
        tx.query_one("SELECT set_config('lock_timeout', $1, true)", &[&millis])
            .await?;
        match tx
            .query_one("SELECT pg_advisory_lock_shared($1, $2)", &[&class, &key])
            .await
        {
            Ok(_) => {
                tx.commit().await?;
                Waited::Released
            }
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tx.rollback().await?;
                return Ok(Waited::StillHeld);
            }
            Err(e) => return Err(e),
        }
    };
    // A session-level lock outlives the transaction that took it: let it go at once.
    sql.query_one("SELECT pg_advisory_unlock_shared($1, $2)", &[&class, &key])
        .await?;
    Ok(waited)
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
