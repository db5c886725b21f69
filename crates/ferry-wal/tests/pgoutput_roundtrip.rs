//! Property tests of the pgoutput codec: `decode(encode(m)) == m` for arbitrary messages of
//! every type in both stream forms, and arbitrary or mutated bytes never panic the decoder and,
//! when they decode, re-encode to exactly themselves.

use bytes::Bytes;
use ferry_wal::pgoutput::*;
use ferry_wal::Lsn;
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    // No NUL (the terminator); includes non-ASCII UTF-8.
    "[a-zA-Z_][a-zA-Z0-9_ é€]{0,12}|"
}

fn data() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn ts() -> impl Strategy<Value = PgTimestamp> {
    any::<i64>().prop_map(PgTimestamp)
}

fn xid(streamed: bool) -> impl Strategy<Value = Option<u32>> {
    any::<u32>().prop_map(move |x| streamed.then_some(x))
}

fn tuple() -> impl Strategy<Value = Tuple> {
    let value = prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        data().prop_map(TupleValue::Text),
        data().prop_map(TupleValue::Binary),
    ];
    prop::collection::vec(value, 0..6).prop_map(Tuple::from)
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn replica_identity() -> impl Strategy<Value = ReplicaIdentity> {
    prop_oneof![
        Just(ReplicaIdentity::Default),
        Just(ReplicaIdentity::Nothing),
        Just(ReplicaIdentity::Full),
        Just(ReplicaIdentity::Index),
    ]
}

fn column() -> impl Strategy<Value = Column> {
    (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| Column {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

/// Messages whose form does not depend on the stream state.
fn plain_message() -> impl Strategy<Value = PgOutputMessage> {
    use PgOutputMessage as M;
    prop_oneof![
        (lsn(), ts(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| M::Begin(Begin {
            final_lsn,
            commit_time,
            xid
        })),
        (any::<u8>(), lsn(), lsn(), ts()).prop_map(|(flags, commit_lsn, end_lsn, commit_time)| {
            M::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            })
        }),
        (lsn(), name()).prop_map(|(commit_lsn, name)| M::Origin(Origin { commit_lsn, name })),
        (any::<u32>(), any::<bool>())
            .prop_map(|(xid, first_segment)| M::StreamStart(StreamStart { xid, first_segment })),
        Just(M::StreamStop),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), ts()).prop_map(
            |(xid, flags, commit_lsn, end_lsn, commit_time)| M::StreamCommit(StreamCommit {
                xid,
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            })
        ),
        (any::<u32>(), any::<u32>())
            .prop_map(|(xid, subxact_xid)| M::StreamAbort(StreamAbort { xid, subxact_xid })),
    ]
}

/// Messages with an xid in their streamed form, in the given form.
fn xid_message(streamed: bool) -> impl Strategy<Value = PgOutputMessage> {
    use PgOutputMessage as M;
    prop_oneof![
        (
            xid(streamed),
            any::<u32>(),
            name(),
            name(),
            replica_identity(),
            prop::collection::vec(column(), 0..5)
        )
            .prop_map(|(xid, oid, namespace, name, replica_identity, columns)| {
                M::Relation(Relation {
                    xid,
                    oid,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (xid(streamed), any::<u32>(), name(), name()).prop_map(|(xid, oid, namespace, name)| {
            M::Type(Type {
                xid,
                oid,
                namespace,
                name,
            })
        }),
        (xid(streamed), any::<u32>(), tuple()).prop_map(|(xid, relation_oid, new)| {
            M::Insert(Insert {
                xid,
                relation_oid,
                new,
            })
        }),
        (
            xid(streamed),
            any::<u32>(),
            prop::option::of(old_tuple()),
            tuple()
        )
            .prop_map(|(xid, relation_oid, old, new)| M::Update(Box::new(Update {
                xid,
                relation_oid,
                old,
                new,
            }))),
        (xid(streamed), any::<u32>(), old_tuple()).prop_map(|(xid, relation_oid, old)| {
            M::Delete(Box::new(Delete {
                xid,
                relation_oid,
                old,
            }))
        }),
        (
            xid(streamed),
            any::<u8>(),
            prop::collection::vec(any::<u32>(), 0..5)
        )
            .prop_map(|(xid, options, relation_oids)| M::Truncate(Truncate {
                xid,
                options,
                relation_oids,
            })),
        (xid(streamed), any::<bool>(), lsn(), name(), data()).prop_map(
            |(xid, transactional, lsn, prefix, content)| M::Message(LogicalMessage {
                xid,
                transactional,
                lsn,
                prefix,
                content,
            })
        ),
    ]
}

fn message() -> impl Strategy<Value = PgOutputMessage> {
    prop_oneof![plain_message(), xid_message(false), xid_message(true)]
}

/// Decodes in both stream states; whatever decodes must re-encode to the input exactly.
fn check_exact(bytes: &Bytes) -> Result<(), TestCaseError> {
    for in_stream in [false, true] {
        if let Ok(msg) = decode(bytes.clone(), in_stream) {
            prop_assert_eq!(&msg.encode(), bytes);
            prop_assert_eq!(decode(msg.encode(), in_stream), Ok(msg));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_inverts_encode(m in message()) {
        let bytes = m.encode();
        prop_assert_eq!(bytes[0], m.tag());
        prop_assert_eq!(decode(bytes, m.stream_xid().is_some()), Ok(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        check_exact(&Bytes::from(bytes))?;
    }

    #[test]
    fn arbitrary_bytes_after_a_known_tag_never_panic(
        tag in prop::sample::select(b"BCORYIUDTMSEcA".to_vec()),
        rest in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = vec![tag];
        bytes.extend(rest);
        check_exact(&Bytes::from(bytes))?;
    }

    #[test]
    fn mutated_messages_never_panic(
        m in message(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = m.encode().to_vec();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        check_exact(&Bytes::from(bytes.clone()))?;
        bytes.truncate(cut.index(bytes.len() + 1));
        check_exact(&Bytes::from(bytes))?;
    }
}
