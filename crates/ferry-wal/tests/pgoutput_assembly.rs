//! Outbox transaction assembly: table-driven cases for each rule, and a property test of random
//! streams (through the real encoder and decoder) against a simple reference model.

use std::sync::Arc;

use bytes::Bytes;
use ferry_wal::assembly::*;
use ferry_wal::pgoutput::*;
use ferry_wal::Lsn;
use proptest::prelude::*;

const OUTBOX: u32 = 16385;
/// `audit.outbox`: same table name, other schema.
const AUDIT: u32 = 16390;
const OTHER: u32 = 16400;

/// The outbox, under a publication `FOR ALL TABLES`: other tables' inserts are skipped by design.
fn source(prefix: Option<&str>) -> OutboxSource {
    OutboxSource {
        other_tables: OtherTables {
            all: true,
            ..OtherTables::default()
        },
        ..OutboxSource::table("public", "outbox", prefix.map(Into::into))
    }
}

fn relation(oid: u32, schema: &str, table: &str, columns: &[&str]) -> PgOutputMessage {
    PgOutputMessage::Relation(Relation {
        xid: None,
        oid,
        namespace: schema.into(),
        name: table.into(),
        replica_identity: ReplicaIdentity::Default,
        columns: columns
            .iter()
            .map(|c| Column {
                flags: 0,
                name: (*c).into(),
                type_oid: if *c == "id" { 20 } else { 25 },
                type_modifier: -1,
            })
            .collect(),
    })
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn insert(oid: u32, values: &[&str]) -> PgOutputMessage {
    PgOutputMessage::Insert(Insert {
        xid: None,
        relation_oid: oid,
        new: values.iter().map(|v| text(v)).collect::<Vec<_>>().into(),
    })
}

fn update(oid: u32) -> PgOutputMessage {
    PgOutputMessage::Update(Box::new(Update {
        xid: None,
        relation_oid: oid,
        old: None,
        new: vec![text("1")].into(),
    }))
}

fn delete(oid: u32) -> PgOutputMessage {
    PgOutputMessage::Delete(Box::new(Delete {
        xid: None,
        relation_oid: oid,
        old: OldTuple::Key(vec![text("1")].into()),
    }))
}

fn truncate(oids: &[u32]) -> PgOutputMessage {
    PgOutputMessage::Truncate(Truncate {
        xid: None,
        options: 0,
        relation_oids: oids.to_vec(),
    })
}

fn message(transactional: bool, prefix: &str, content: &str) -> PgOutputMessage {
    PgOutputMessage::Message(LogicalMessage {
        xid: None,
        transactional,
        lsn: Lsn(7),
        prefix: prefix.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    })
}

fn begin(xid: u32, final_lsn: u64) -> PgOutputMessage {
    PgOutputMessage::Begin(Begin {
        final_lsn: Lsn(final_lsn),
        commit_time: PgTimestamp(1),
        xid,
    })
}

fn commit(commit_lsn: u64, end_lsn: u64) -> PgOutputMessage {
    PgOutputMessage::Commit(Commit {
        flags: 0,
        commit_lsn: Lsn(commit_lsn),
        end_lsn: Lsn(end_lsn),
        commit_time: PgTimestamp(1),
    })
}

/// Feeds messages at LSNs 100, 200, ...; returns the events, or the first error.
fn feed(
    asm: &mut Assembler,
    msgs: Vec<PgOutputMessage>,
) -> Result<Vec<OutboxEvent>, AssemblyError> {
    let mut events = Vec::new();
    for (i, m) in msgs.into_iter().enumerate() {
        if let Some(e) = asm.push(Lsn(100 * (i as u64 + 1)), m)? {
            events.push(e);
        }
    }
    Ok(events)
}

fn relations() -> Vec<PgOutputMessage> {
    vec![
        relation(OUTBOX, "public", "outbox", &["id", "topic", "payload"]),
        relation(AUDIT, "audit", "outbox", &["id", "topic", "payload"]),
        relation(OTHER, "public", "orders", &["id"]),
    ]
}

fn row_text(row: &OutboxRow, column: &str) -> String {
    match row.get(column) {
        Some((_, TupleValue::Text(b))) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("column {column}: {other:?}"),
    }
}

#[test]
fn outbox_inserts_are_rows_and_every_transaction_has_begin_and_commit() {
    let mut asm = Assembler::new(source(None));
    let mut msgs = relations();
    msgs.extend([
        begin(10, 5000),
        insert(OTHER, &["1"]),
        insert(OUTBOX, &["1", "orders", "{}"]),
        insert(AUDIT, &["2", "orders", "{}"]),
        insert(OUTBOX, &["3", "users", "[]"]),
        commit(5000, 5040),
        begin(11, 6000),
        insert(OTHER, &["2"]),
        commit(6000, 6040),
    ]);
    let events = feed(&mut asm, msgs).unwrap();
    assert_eq!(events.len(), 6, "{events:#?}");
    assert_eq!(
        events[0],
        OutboxEvent::Begin(TxnBegin {
            xid: 10,
            commit_lsn: Lsn(5000),
            commit_time: PgTimestamp(1)
        })
    );
    let OutboxEvent::Row(row) = &events[1] else {
        panic!("{:?}", events[1])
    };
    assert_eq!((row.xid, row.lsn), (10, Lsn(600)));
    assert_eq!(row.get("id"), Some((20, text("1"))));
    assert_eq!(row_text(row, "topic"), "orders");
    assert_eq!(row.get("missing"), None);
    let OutboxEvent::Row(row) = &events[2] else {
        panic!("{:?}", events[2])
    };
    assert_eq!(row_text(row, "id"), "3");
    assert_eq!(
        events[3],
        OutboxEvent::Commit(TxnCommit {
            xid: 10,
            commit_lsn: Lsn(5000),
            end_lsn: Lsn(5040),
            commit_time: PgTimestamp(1),
            rows: 2
        })
    );
    assert!(matches!(
        events[4],
        OutboxEvent::Begin(TxnBegin { xid: 11, .. })
    ));
    assert!(matches!(
        events[5],
        OutboxEvent::Commit(TxnCommit {
            xid: 11,
            rows: 0,
            end_lsn: Lsn(6040),
            ..
        })
    ));
    let stats = asm.stats();
    assert_eq!(
        (
            stats.transactions,
            stats.relations,
            stats.outbox_rows,
            stats.other_inserts
        ),
        (2, 3, 2, 3)
    );
    assert_eq!(asm.open_xid(), None);
}

/// Several outbox tables: each row says which (its position in the source's list), whatever
/// the order the relations are described in, and tables of different layouts are read by their
/// own columns; a table renamed into the list counts from its next Relation message.
#[test]
fn rows_of_several_outbox_tables_carry_their_table() {
    let mut asm = Assembler::new(OutboxSource {
        tables: vec![
            SourceTable {
                schema: "audit".into(),
                table: "outbox".into(),
            },
            SourceTable {
                schema: "public".into(),
                table: "outbox".into(),
            },
            SourceTable {
                schema: "billing".into(),
                table: "events".into(),
            },
        ],
        message_prefix: None,
        other_tables: OtherTables {
            all: true,
            ..OtherTables::default()
        },
        oids: Vec::new(),
    });
    const BILLING: u32 = 16500;
    let mut msgs = relations();
    msgs.extend([
        relation(BILLING, "billing", "events_old", &["event_id", "body"]),
        begin(10, 5000),
        insert(OUTBOX, &["1", "orders", "{}"]),
        insert(AUDIT, &["2", "audit", "{}"]),
        insert(OTHER, &["3"]),
        insert(BILLING, &["4", "{}"]),
        commit(5000, 5040),
        // ALTER TABLE billing.events_old RENAME TO events: the server describes it again.
        relation(BILLING, "billing", "events", &["event_id", "body"]),
        begin(11, 6000),
        insert(BILLING, &["5", "{\"n\": 1}"]),
        insert(AUDIT, &["6", "audit", "{}"]),
        commit(6000, 6040),
    ]);
    let rows: Vec<(usize, String)> = feed(&mut asm, msgs)
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            OutboxEvent::Row(r) => {
                let id = if r.table == 2 { "event_id" } else { "id" };
                Some((r.table, row_text(r, id).to_string()))
            }
            _ => None,
        })
        .collect();
    let want: Vec<(usize, String)> = [(1, "1"), (0, "2"), (2, "5"), (0, "6")]
        .iter()
        .map(|(t, id)| (*t, id.to_string()))
        .collect();
    assert_eq!(rows, want);
    let stats = asm.stats();
    assert_eq!((stats.outbox_rows, stats.other_inserts), (4, 2));
}

/// An INSERT into a table the publication lists by name and no outbox entry is stops the
/// assembly before its transaction's commit (so nothing of it is confirmed), naming the table;
/// one the publication covers by schema, or that was taken out of it, is skipped.
#[test]
fn an_insert_into_a_listed_table_no_entry_relays_is_refused_unless_skipped_by_design() {
    let msgs = || {
        let mut msgs = relations();
        msgs.extend([
            begin(10, 5000),
            insert(OUTBOX, &["1", "orders", "{}"]),
            insert(OTHER, &["3"]),
            insert(OUTBOX, &["2", "orders", "{}"]),
            commit(5000, 5040),
        ]);
        msgs
    };
    let refused = OutboxSource::table("public", "outbox", None);
    let mut asm = Assembler::new(refused);
    let mut events = Vec::new();
    let mut error = None;
    for (i, m) in msgs().into_iter().enumerate() {
        match asm.push(Lsn(100 + i as u64), m) {
            Ok(e) => events.extend(e),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    match error {
        Some(AssemblyError::UnrelayedInsert {
            xid: 10,
            namespace,
            name,
            ..
        }) => assert_eq!((namespace.as_str(), name.as_str()), ("public", "orders")),
        other => panic!("expected UnrelayedInsert, got {other:?}"),
    }
    assert!(
        !events.iter().any(|e| matches!(e, OutboxEvent::Commit(_))),
        "the transaction never commits: {events:?}"
    );
    let skipping = [
        OtherTables {
            schemas: vec!["public".into()],
            ..OtherTables::default()
        },
        OtherTables {
            tables: vec![SourceTable {
                schema: "public".into(),
                table: "orders".into(),
            }],
            ..OtherTables::default()
        },
    ];
    for other_tables in skipping {
        let mut asm = Assembler::new(OutboxSource {
            other_tables: other_tables.clone(),
            ..OutboxSource::table("public", "outbox", None)
        });
        let events = feed(&mut asm, msgs()).unwrap();
        assert!(
            matches!(
                events.last(),
                Some(OutboxEvent::Commit(TxnCommit { rows: 2, .. }))
            ),
            "{other_tables:?}: {events:?}"
        );
        assert_eq!(asm.stats().other_inserts, 1);
    }
    // A relation under another name that is an outbox table by oid (a partition, a rename) is
    // relayed, not refused.
    let mut asm = Assembler::new(OutboxSource {
        oids: vec![(OTHER, 0)],
        ..OutboxSource::table("public", "outbox", None)
    });
    let mut by_oid = relations();
    by_oid.extend([begin(11, 6000), insert(OTHER, &["9"]), commit(6000, 6040)]);
    let events = feed(&mut asm, by_oid).unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, OutboxEvent::Row(r) if r.table == 0)),
        "{events:?}"
    );
    // Another schema's table is still refused under FOR TABLES IN SCHEMA.
    assert!(!OtherTables {
        schemas: vec!["billing".into()],
        ..OtherTables::default()
    }
    .skips("public", "orders"));
}

#[test]
fn updates_deletes_and_truncates_are_counted_by_table_and_skipped() {
    let mut asm = Assembler::new(source(None));
    let mut msgs = relations();
    msgs.extend([
        begin(10, 5000),
        update(OUTBOX),
        update(OTHER),
        update(AUDIT),
        delete(OUTBOX),
        delete(OUTBOX),
        delete(OTHER),
        truncate(&[OTHER, OUTBOX]),
        truncate(&[OTHER]),
        truncate(&[AUDIT, OTHER]),
        commit(5000, 5040),
    ]);
    let events = feed(&mut asm, msgs).unwrap();
    assert_eq!(events.len(), 2);
    let expected = AssemblyStats {
        transactions: 1,
        relations: 3,
        outbox_updates: 1,
        other_updates: 2,
        outbox_deletes: 2,
        other_deletes: 1,
        outbox_truncates: 1,
        other_truncates: 2,
        ..AssemblyStats::default()
    };
    assert_eq!(*asm.stats(), expected);
}

#[test]
fn a_relation_change_mid_stream_remaps_later_rows_by_name() {
    let mut asm = Assembler::new(source(None));
    let mut msgs = relations();
    msgs.extend([
        begin(10, 5000),
        insert(OUTBOX, &["1", "t1", "p1"]),
        // ALTER TABLE ... a column added in front; the server resends the layout.
        relation(
            OUTBOX,
            "public",
            "outbox",
            &["tenant", "payload", "id", "topic"],
        ),
        insert(OUTBOX, &["acme", "p2", "2", "t2"]),
        commit(5000, 5040),
    ]);
    let events = feed(&mut asm, msgs).unwrap();
    let rows: Vec<&OutboxRow> = events
        .iter()
        .filter_map(|e| match e {
            OutboxEvent::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (row_text(rows[0], "id"), row_text(rows[0], "payload")),
        ("1".to_owned(), "p1".to_owned())
    );
    assert_eq!(
        rows[0].get("tenant"),
        None,
        "the earlier row keeps its snapshot"
    );
    assert_eq!(rows[0].relation.columns.len(), 3);
    assert_eq!(
        (row_text(rows[1], "id"), row_text(rows[1], "payload")),
        ("2".to_owned(), "p2".to_owned())
    );
    assert_eq!(row_text(rows[1], "tenant"), "acme");
    assert!(Arc::ptr_eq(
        &rows[1].relation,
        asm.relation(OUTBOX).unwrap()
    ));

    // A relation renamed away from the outbox stops matching; one renamed to it starts.
    let events = feed(
        &mut asm,
        vec![
            relation(OUTBOX, "public", "outbox_old", &["id"]),
            relation(OTHER, "public", "outbox", &["id"]),
            begin(11, 6000),
            insert(OUTBOX, &["3"]),
            insert(OTHER, &["4"]),
            commit(6000, 6040),
        ],
    )
    .unwrap();
    assert!(matches!(&events[1], OutboxEvent::Row(r) if row_text(r, "id") == "4"));
    assert_eq!(events.len(), 3);
}

#[test]
fn reset_forgets_relations_and_the_open_transaction_but_keeps_stats() {
    let mut asm = Assembler::new(source(None));
    let mut msgs = relations();
    msgs.extend([begin(10, 5000), insert(OUTBOX, &["1", "t", "p"])]);
    feed(&mut asm, msgs).unwrap();
    assert_eq!(asm.open_xid(), Some(10));
    asm.reset();
    assert_eq!(asm.open_xid(), None);
    assert!(asm.relation(OUTBOX).is_none());
    assert_eq!(asm.stats().outbox_rows, 1);
    // The server restarts at a transaction boundary and resends relations.
    let err = feed(
        &mut asm,
        vec![begin(10, 5000), insert(OUTBOX, &["1", "t", "p"])],
    )
    .unwrap_err();
    assert!(matches!(
        err,
        AssemblyError::UnknownRelation {
            oid: OUTBOX,
            xid: 10,
            ..
        }
    ));
    asm.reset();
    let mut msgs = vec![begin(10, 5000)];
    msgs.extend(relations());
    msgs.extend([insert(OUTBOX, &["1", "t", "p"]), commit(5000, 5040)]);
    let events = feed(&mut asm, msgs).unwrap();
    assert!(matches!(
        events.last(),
        Some(OutboxEvent::Commit(TxnCommit { rows: 1, .. }))
    ));
}

#[test]
fn logical_messages_are_selected_by_prefix_and_transactionality() {
    let mut asm = Assembler::new(source(Some("ferry")));
    let events = feed(
        &mut asm,
        vec![
            message(false, "ferry", "not atomic"),
            message(false, "other", "x"),
            begin(10, 5000),
            message(true, "ferry", "one"),
            message(true, "ferry-v2", "x"),
            message(true, "", "x"),
            message(true, "ferry", "two"),
            commit(5000, 5040),
        ],
    )
    .unwrap();
    let contents: Vec<(&[u8], Lsn, Lsn)> = events
        .iter()
        .filter_map(|e| match e {
            OutboxEvent::Message(m) => Some((&m.content[..], m.lsn, m.message_lsn)),
            _ => None,
        })
        .collect();
    assert_eq!(
        contents,
        vec![
            (&b"one"[..], Lsn(400), Lsn(7)),
            (&b"two"[..], Lsn(700), Lsn(7))
        ]
    );
    assert!(matches!(
        events.last(),
        Some(OutboxEvent::Commit(TxnCommit { rows: 2, .. }))
    ));
    let s = asm.stats();
    assert_eq!(
        (
            s.outbox_messages,
            s.non_transactional_outbox_messages,
            s.other_messages
        ),
        (2, 1, 3)
    );

    // Without a configured prefix no message is an outbox record.
    let mut asm = Assembler::new(source(None));
    let events = feed(
        &mut asm,
        vec![begin(1, 10), message(true, "ferry", "x"), commit(10, 20)],
    )
    .unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(asm.stats().other_messages, 1);
}

#[test]
fn origin_and_type_messages_are_ignored() {
    let mut asm = Assembler::new(source(None));
    let events = feed(
        &mut asm,
        vec![
            PgOutputMessage::Type(Type {
                xid: None,
                oid: 1,
                namespace: "public".into(),
                name: "mood".into(),
            }),
            begin(1, 10),
            PgOutputMessage::Origin(Origin {
                commit_lsn: Lsn(3),
                name: "node".into(),
            }),
            commit(10, 20),
        ],
    )
    .unwrap();
    assert_eq!(events.len(), 2);
}

#[test]
fn protocol_misuse_is_a_typed_error_naming_xid_and_lsn() {
    use AssemblyError as E;
    let streamed_insert = PgOutputMessage::Insert(Insert {
        xid: Some(99),
        relation_oid: OUTBOX,
        new: vec![].into(),
    });
    type Check = fn(&AssemblyError) -> bool;
    let cases: Vec<(&str, Vec<PgOutputMessage>, Check)> = vec![
        ("commit without begin", vec![commit(10, 20)], |e| {
            matches!(
                e,
                E::CommitWithoutBegin {
                    commit_lsn: Lsn(10),
                    lsn: Lsn(100)
                }
            )
        }),
        (
            "begin inside a transaction",
            vec![begin(1, 10), begin(2, 30)],
            |e| {
                matches!(
                    e,
                    E::BeginInsideTransaction {
                        xid: 2,
                        lsn: Lsn(200),
                        open_xid: 1,
                        open_commit_lsn: Lsn(10)
                    }
                )
            },
        ),
        (
            "commit lsn differs from begin",
            vec![begin(1, 10), commit(11, 20)],
            |e| {
                matches!(
                    e,
                    E::CommitLsnMismatch {
                        xid: 1,
                        lsn: Lsn(200),
                        begin_final_lsn: Lsn(10),
                        commit_lsn: Lsn(11)
                    }
                )
            },
        ),
        (
            "insert outside a transaction",
            vec![insert(OUTBOX, &["1"])],
            |e| {
                matches!(
                    e,
                    E::OutsideTransaction {
                        what: "Insert",
                        lsn: Lsn(100)
                    }
                )
            },
        ),
        ("delete outside a transaction", vec![delete(OTHER)], |e| {
            matches!(e, E::OutsideTransaction { what: "Delete", .. })
        }),
        (
            "transactional message outside a transaction",
            vec![message(true, "ferry", "x")],
            |e| {
                matches!(
                    e,
                    E::OutsideTransaction {
                        what: "transactional Message",
                        ..
                    }
                )
            },
        ),
        (
            "insert into an undescribed relation",
            vec![begin(1, 10), insert(OUTBOX, &["1"])],
            |e| {
                matches!(
                    e,
                    E::UnknownRelation {
                        what: "Insert",
                        xid: 1,
                        lsn: Lsn(200),
                        oid: OUTBOX
                    }
                )
            },
        ),
        (
            "update of an undescribed relation",
            vec![begin(1, 10), update(5)],
            |e| {
                matches!(
                    e,
                    E::UnknownRelation {
                        what: "Update",
                        oid: 5,
                        ..
                    }
                )
            },
        ),
        (
            "truncate of an undescribed relation",
            vec![begin(1, 10), truncate(&[5])],
            |e| {
                matches!(
                    e,
                    E::UnknownRelation {
                        what: "Truncate",
                        oid: 5,
                        ..
                    }
                )
            },
        ),
        (
            "outbox row with the wrong column count",
            vec![
                relation(OUTBOX, "public", "outbox", &["id", "payload"]),
                begin(1, 10),
                insert(OUTBOX, &["1"]),
            ],
            |e| {
                matches!(
                    e,
                    E::ColumnCountMismatch {
                        xid: 1,
                        lsn: Lsn(300),
                        values: 1,
                        columns: 2,
                        ..
                    }
                )
            },
        ),
        (
            "stream start in protocol v1",
            vec![PgOutputMessage::StreamStart(StreamStart {
                xid: 99,
                first_segment: true,
            })],
            |e| {
                matches!(
                    e,
                    E::StreamingMessage {
                        what: "Stream Start",
                        xid: None,
                        stream_xid: Some(99),
                        lsn: Lsn(100)
                    }
                )
            },
        ),
        (
            "stream stop in protocol v1",
            vec![begin(1, 10), PgOutputMessage::StreamStop],
            |e| {
                matches!(
                    e,
                    E::StreamingMessage {
                        what: "Stream Stop",
                        xid: Some(1),
                        stream_xid: None,
                        ..
                    }
                )
            },
        ),
        (
            "streamed-form insert in protocol v1",
            vec![begin(1, 10), streamed_insert],
            |e| {
                matches!(
                    e,
                    E::StreamingMessage {
                        what: "Insert",
                        xid: Some(1),
                        stream_xid: Some(99),
                        ..
                    }
                )
            },
        ),
    ];
    for (name, msgs, check) in cases {
        let mut asm = Assembler::new(source(Some("ferry")));
        let err = feed(&mut asm, msgs).expect_err(name);
        assert!(check(&err), "{name}: {err:?}");
    }
}

#[test]
fn assembly_errors_read_well() {
    let mut asm = Assembler::new(source(None));
    let err = feed(
        &mut asm,
        vec![begin(742, 0x16b3748), commit(0x16b3749, 0x16b3778)],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Commit of xid 742 at 0/C8 has commit_lsn 0/16B3749, but its Begin said 0/16B3748"
    );
}

// ---- property test against a reference model ----

#[derive(Debug, Clone)]
enum Op {
    OutboxInsert(u16),
    OtherInsert,
    OutboxUpdate,
    OtherDelete,
    Truncate {
        outbox: bool,
    },
    Message {
        transactional: bool,
        ours: bool,
    },
    /// The server resends the outbox layout, alternating between two column orders.
    Relayout,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u16>().prop_map(Op::OutboxInsert),
        2 => Just(Op::OtherInsert),
        1 => Just(Op::OutboxUpdate),
        1 => Just(Op::OtherDelete),
        1 => any::<bool>().prop_map(|outbox| Op::Truncate { outbox }),
        2 => (any::<bool>(), any::<bool>()).prop_map(|(transactional, ours)| Op::Message { transactional, ours }),
        1 => Just(Op::Relayout),
    ]
}

/// What the model expects, in an order-preserving, comparable form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Begin(u32),
    Row {
        id: String,
        payload: String,
        lsn: Lsn,
    },
    Message(Vec<u8>),
    Commit {
        xid: u32,
        rows: u64,
        end_lsn: Lsn,
    },
}

const LAYOUTS: [&[&str]; 2] = [
    &["id", "topic", "payload"],
    &["payload", "extra", "topic", "id"],
];

proptest! {
    #[test]
    fn assembly_matches_a_reference_model(
        txns in prop::collection::vec((prop::collection::vec(op(), 0..8), any::<bool>()), 0..12),
        with_prefix in any::<bool>(),
    ) {
        let mut asm = Assembler::new(source(with_prefix.then_some("ferry")));
        let mut expected = Vec::new();
        let mut actual = Vec::new();
        let mut expected_stats = AssemblyStats::default();
        let mut layout = 0usize;
        let wal = std::cell::Cell::new(0u64);
        let send = |asm: &mut Assembler, m: PgOutputMessage, actual: &mut Vec<Seen>| -> Result<(), TestCaseError> {
            wal.set(wal.get() + 16);
            // Through the real codec, as the reader does.
            let decoded = decode(m.encode(), false).map_err(|e| TestCaseError::fail(e.to_string()))?;
            match asm.push(Lsn(wal.get()), decoded).map_err(|e| TestCaseError::fail(e.to_string()))? {
                None => {}
                Some(OutboxEvent::Begin(b)) => actual.push(Seen::Begin(b.xid)),
                Some(OutboxEvent::Row(r)) => actual.push(Seen::Row {
                    id: row_text(&r, "id").to_owned(),
                    payload: row_text(&r, "payload").to_owned(),
                    lsn: r.lsn,
                }),
                Some(OutboxEvent::Message(m)) => actual.push(Seen::Message(m.content.to_vec())),
                Some(OutboxEvent::Commit(c)) => actual.push(Seen::Commit { xid: c.xid, rows: c.rows, end_lsn: c.end_lsn }),
            }
            Ok(())
        };
        let describe = |layout: usize| relation(OUTBOX, "public", "outbox", LAYOUTS[layout]);

        send(&mut asm, describe(layout), &mut actual)?;
        send(&mut asm, relation(OTHER, "public", "orders", &["id"]), &mut actual)?;
        expected_stats.relations += 2;
        for (t, (ops, reconnect_after)) in txns.iter().enumerate() {
            let xid = 1000 + t as u32;
            let commit_lsn = 1_000_000 * (t as u64 + 1);
            send(&mut asm, begin(xid, commit_lsn), &mut actual)?;
            expected.push(Seen::Begin(xid));
            let mut rows = 0;
            for op in ops {
                match op {
                    Op::OutboxInsert(n) => {
                        let (id, payload) = (n.to_string(), format!("p{n}"));
                        let values: Vec<&str> = LAYOUTS[layout]
                            .iter()
                            .map(|c| match *c { "id" => id.as_str(), "payload" => payload.as_str(), _ => "-" })
                            .collect();
                        send(&mut asm, insert(OUTBOX, &values), &mut actual)?;
                        expected.push(Seen::Row { id, payload, lsn: Lsn(wal.get()) });
                        expected_stats.outbox_rows += 1;
                        rows += 1;
                    }
                    Op::OtherInsert => {
                        send(&mut asm, insert(OTHER, &["1"]), &mut actual)?;
                        expected_stats.other_inserts += 1;
                    }
                    Op::OutboxUpdate => {
                        send(&mut asm, update(OUTBOX), &mut actual)?;
                        expected_stats.outbox_updates += 1;
                    }
                    Op::OtherDelete => {
                        send(&mut asm, delete(OTHER), &mut actual)?;
                        expected_stats.other_deletes += 1;
                    }
                    Op::Truncate { outbox } => {
                        let oids: &[u32] = if *outbox { &[OTHER, OUTBOX] } else { &[OTHER] };
                        send(&mut asm, truncate(oids), &mut actual)?;
                        if *outbox { expected_stats.outbox_truncates += 1 } else { expected_stats.other_truncates += 1 }
                    }
                    Op::Message { transactional, ours } => {
                        let content = format!("m{}", wal.get());
                        send(&mut asm, message(*transactional, if *ours { "ferry" } else { "fer" }, &content), &mut actual)?;
                        match (*transactional, *ours && with_prefix) {
                            (true, true) => {
                                expected.push(Seen::Message(content.into_bytes()));
                                expected_stats.outbox_messages += 1;
                                rows += 1;
                            }
                            (false, true) => expected_stats.non_transactional_outbox_messages += 1,
                            _ => expected_stats.other_messages += 1,
                        }
                    }
                    Op::Relayout => {
                        layout = 1 - layout;
                        send(&mut asm, describe(layout), &mut actual)?;
                        expected_stats.relations += 1;
                    }
                }
            }
            send(&mut asm, commit(commit_lsn, commit_lsn + 40), &mut actual)?;
            expected.push(Seen::Commit { xid, rows, end_lsn: Lsn(commit_lsn + 40) });
            expected_stats.transactions += 1;
            if *reconnect_after {
                asm.reset();
                send(&mut asm, describe(layout), &mut actual)?;
                send(&mut asm, relation(OTHER, "public", "orders", &["id"]), &mut actual)?;
                expected_stats.relations += 2;
            }
        }
        prop_assert_eq!(actual, expected);
        prop_assert_eq!(*asm.stats(), expected_stats);
    }
}
