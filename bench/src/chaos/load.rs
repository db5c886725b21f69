//! The application load of a chaos run, and the ground truth it records.
//!
//! Writers each own a few keys and commit short transactions of 1–5 outbox rows; every row
//! carries a run-unique `id` and, for its key, a `seq` that only grows (a rolled-back row
//! uses up its seq, so the committed seqs of a key grow in commit order). One transaction in
//! ten is rolled back on purpose. Every transaction also inserts its name into
//! `chaos_commits`, atomically with its rows: when a COMMIT's reply is lost (the server was
//! stopped under it), the writer reconnects and looks the name up. Writers connect to
//! PostgreSQL directly, not through the proxy, so a lost reply always means the backend is
//! gone and the transaction is settled either way. Beside them: a deleter removing published
//! rows in transactions of their own, noise on a table outside the publication, and (with
//! `--big-txn`) one transaction of 1,000,000 rows.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_testkit::faults::Rng;

/// One committed row.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: u64,
    pub key: String,
    pub seq: u64,
}

/// What the application committed and rolled back.
#[derive(Debug, Default)]
pub struct Truth {
    pub committed: Vec<Row>,
    pub rolled_back: HashSet<u64>,
    pub txns_committed: u64,
    pub txns_rolled_back: u64,
    /// Transactions whose COMMIT reply was lost and that the status table settled.
    pub txns_in_doubt: u64,
}

pub const DDL: &str = "
    CREATE TABLE outbox (
        id bigint PRIMARY KEY,
        aggregatetype text NOT NULL,
        aggregateid text NOT NULL,
        type text NOT NULL,
        payload jsonb NOT NULL
    );
    CREATE TABLE chaos_commits (txn text PRIMARY KEY);
    CREATE TABLE noise (id int PRIMARY KEY, n bigint NOT NULL);";

/// Ids of the 1,000,000-row transaction start here, far above the writers'.
const BIG_ID_BASE: u64 = 1 << 40;
pub const BIG_ROWS: u64 = 1_000_000;
const KEYS_PER_WRITER: u64 = 8;

/// The shared state of the load.
pub struct Load {
    pub url: String,
    pub truth: Mutex<Truth>,
    pub stop: AtomicBool,
    next_id: AtomicU64,
}

impl Load {
    pub fn new(url: String) -> Arc<Load> {
        Arc::new(Load {
            url,
            truth: Mutex::default(),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        })
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Connects, retrying while the server is down (until the load stops and `give_up` is
    /// set).
    async fn connect(&self, give_up: bool) -> Option<tokio_postgres::Client> {
        loop {
            if let Ok((c, conn)) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await {
                tokio::spawn(conn);
                return Some(c);
            }
            if give_up && self.stopped() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `batch` (a whole transaction, BEGIN to COMMIT/ROLLBACK, named `txn` in
    /// `chaos_commits`) and says whether it committed, settling a lost reply by looking the
    /// name up.
    async fn settle(
        &self,
        client: &mut Option<tokio_postgres::Client>,
        batch: &str,
        txn: &str,
    ) -> bool {
        if client.is_none() {
            *client = self.connect(false).await;
        }
        let c = client.as_ref().expect("connected");
        match c.batch_execute(batch).await {
            Ok(()) => batch.ends_with("COMMIT"),
            Err(_) => {
                *client = None;
                self.truth
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .txns_in_doubt += 1;
                loop {
                    let c = self.connect(false).await.expect("connect retries");
                    if let Ok(rows) = c
                        .query("SELECT 1 FROM chaos_commits WHERE txn = $1", &[&txn])
                        .await
                    {
                        *client = Some(c);
                        return !rows.is_empty();
                    }
                }
            }
        }
    }

    /// One writer: transactions over its own keys until the load stops.
    pub async fn writer(self: Arc<Load>, w: u64, seed: u64) {
        let mut rng = Rng::new(seed ^ (w.wrapping_mul(0x9E37_79B9)));
        let mut seqs: HashMap<u64, u64> = HashMap::new();
        let mut client = None;
        let mut t = 0u64;
        while !self.stopped() {
            t += 1;
            let txn = format!("w{w}-t{t}");
            let mut rows = Vec::new();
            for _ in 0..rng.range(1, 5) {
                let k = rng.range(0, KEYS_PER_WRITER - 1);
                let seq = seqs.entry(k).or_default();
                *seq += 1;
                rows.push(Row {
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    key: format!("w{w}-k{k}"),
                    seq: *seq,
                });
            }
            let values: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "({0}, 'chaos', '{1}', 'Changed', '{{\"id\":{0},\"key\":\"{1}\",\"seq\":{2}}}')",
                        r.id, r.key, r.seq
                    )
                })
                .collect();
            let rollback = rng.chance(0.1);
            let batch = format!(
                "BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES {}; \
                 INSERT INTO chaos_commits VALUES ('{txn}'); {}",
                values.join(", "),
                if rollback { "ROLLBACK" } else { "COMMIT" }
            );
            let committed = self.settle(&mut client, &batch, &txn).await;
            self.record(committed, rows);
            tokio::time::sleep(Duration::from_millis(rng.range(2, 20))).await;
        }
    }

    /// The 1,000,000-row transaction (keys `big-0`..`big-99`, seq = row number).
    pub async fn big_txn(self: Arc<Load>) {
        let mut client = None;
        let batch = format!(
            "BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT {BIG_ID_BASE} + g, 'chaos', 'big-' || (g % 100), 'Changed', \
               jsonb_build_object('id', {BIG_ID_BASE} + g, 'key', 'big-' || (g % 100), 'seq', g) \
             FROM generate_series(1, {BIG_ROWS}) g; \
             INSERT INTO chaos_commits VALUES ('big'); COMMIT"
        );
        let committed = self.settle(&mut client, &batch, "big").await;
        let rows = (1..=BIG_ROWS)
            .map(|g| Row {
                id: BIG_ID_BASE + g,
                key: format!("big-{}", g % 100),
                seq: g,
            })
            .collect();
        self.record(committed, rows);
    }

    fn record(&self, committed: bool, rows: Vec<Row>) {
        let mut truth = self.truth.lock().unwrap_or_else(|e| e.into_inner());
        if committed {
            truth.txns_committed += 1;
            truth.committed.extend(rows);
        } else {
            truth.txns_rolled_back += 1;
            truth.rolled_back.extend(rows.iter().map(|r| r.id));
        }
    }

    /// Deletes the oldest rows, 50 at a time, each batch a transaction of its own.
    pub async fn deleter(self: Arc<Load>) {
        let mut client = None;
        while !self.stopped() {
            if client.is_none() {
                client = self.connect(true).await;
            }
            let Some(c) = client.as_ref() else { return };
            if c.batch_execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 50)",
            )
            .await
            .is_err()
            {
                client = None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Updates a table outside the publication.
    pub async fn noise(self: Arc<Load>) {
        let mut client = None;
        let mut n = 0i64;
        while !self.stopped() {
            if client.is_none() {
                client = self.connect(true).await;
            }
            let Some(c) = client.as_ref() else { return };
            n += 1;
            if c.batch_execute(&format!(
                "INSERT INTO noise VALUES ({}, {n}) ON CONFLICT (id) DO UPDATE SET n = excluded.n",
                n % 100
            ))
            .await
            .is_err()
            {
                client = None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
