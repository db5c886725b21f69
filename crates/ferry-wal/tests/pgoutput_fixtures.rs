//! Byte fixtures for every pgoutput message, written by hand from the PostgreSQL documentation
//! ("Logical Replication Message Formats", protocol versions 1 and 2), plus truncation and
//! hostile-input checks: the decoder must return an error, never panic. Each fixture has a module
//! of named tests (`update_old_streamed::truncated_at_every_offset_is_an_error`), so a failure
//! points at the message; `cargo test -p ferry-wal --test pgoutput_fixtures update_` runs some.

use bytes::Bytes;
use ferry_wal::pgoutput::*;
use ferry_wal::Lsn;

/// 2024-01-01T00:00:00Z: 757_382_400_000_000 µs after 2000-01-01.
const TS: [u8; 8] = [0x00, 0x02, 0xb0, 0xd5, 0xd4, 0xe9, 0x40, 0x00];
const TS_VALUE: PgTimestamp = PgTimestamp(757_382_400_000_000);
/// 0/16B3748
const LSN_A: [u8; 8] = [0, 0, 0, 0, 0x01, 0x6b, 0x37, 0x48];
/// 0/16B3778
const LSN_B: [u8; 8] = [0, 0, 0, 0, 0x01, 0x6b, 0x37, 0x78];
/// xid 742
const XID: [u8; 4] = [0, 0, 0x02, 0xe6];
/// xid 743 (a subtransaction)
const SUBXID: [u8; 4] = [0, 0, 0x02, 0xe7];
/// oid 16385
const OID: [u8; 4] = [0, 0, 0x40, 0x01];
/// oid 16390
const OID2: [u8; 4] = [0, 0, 0x40, 0x06];

fn cat(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn col(flags: u8, name: &str, type_oid: u32) -> Column {
    Column {
        flags,
        name: name.into(),
        type_oid,
        type_modifier: -1,
    }
}

struct Fixture {
    name: &'static str,
    bytes: Bytes,
    in_stream: bool,
    expected: PgOutputMessage,
}

fn fixture(
    name: &'static str,
    in_stream: bool,
    parts: &[&[u8]],
    expected: PgOutputMessage,
) -> Fixture {
    Fixture {
        name,
        bytes: cat(parts),
        in_stream,
        expected,
    }
}

fn fixtures() -> Vec<Fixture> {
    use PgOutputMessage as M;
    // Relation columns: Int8 flags, String name, Int32 type oid, Int32 type modifier.
    let outbox_columns: &[&[u8]] = &[
        &[0, 3], // Int16 number of columns
        &[1],
        b"id\0",
        &[0, 0, 0, 20],
        &[0xff; 4], // key column, int8, typmod -1
        &[0],
        b"topic\0",
        &[0, 0, 0, 25],
        &[0xff; 4], // text
        &[0],
        b"payload\0",
        &[0, 0, 0x0e, 0xda],
        &[0xff; 4], // jsonb (3802)
    ];
    let relation = Relation {
        xid: None,
        oid: 16385,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            col(1, "id", 20),
            col(0, "topic", 25),
            col(0, "payload", 3802),
        ],
    };
    // TupleData: Int16 ncols, then 'n' | 'u' | 't'/'b' Int32 len Byte(len).
    let tuple3: &[u8] = &[
        0, 3, b't', 0, 0, 0, 2, b'4', b'2', b'n', b'b', 0, 0, 0, 3, 1, 2, 3,
    ];
    let tuple3_values = vec![
        text("42"),
        TupleValue::Null,
        TupleValue::Binary(Bytes::from_static(&[1, 2, 3])),
    ];
    let key_tuple: &[u8] = &[0, 2, b't', 0, 0, 0, 1, b'1', b'n'];
    let key_values = vec![text("1"), TupleValue::Null];
    let new_tuple: &[u8] = &[0, 2, b't', 0, 0, 0, 1, b'2', b'u'];
    let new_values = vec![text("2"), TupleValue::UnchangedToast];

    let mut relation_full = relation.clone();
    relation_full.xid = Some(743);
    relation_full.replica_identity = ReplicaIdentity::Full;
    relation_full.columns.truncate(1);

    vec![
        // Begin: Byte1('B') Int64 final_lsn Int64 commit_time Int32 xid
        fixture(
            "begin",
            false,
            &[b"B", &LSN_A, &TS, &XID],
            M::Begin(Begin {
                final_lsn: Lsn(0x16b3748),
                commit_time: TS_VALUE,
                xid: 742,
            }),
        ),
        // Commit: Byte1('C') Int8 flags Int64 commit_lsn Int64 end_lsn Int64 commit_time
        fixture(
            "commit",
            false,
            &[b"C", &[0], &LSN_A, &LSN_B, &TS],
            M::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(0x16b3748),
                end_lsn: Lsn(0x16b3778),
                commit_time: TS_VALUE,
            }),
        ),
        // Origin: Byte1('O') Int64 commit_lsn String name
        fixture(
            "origin",
            false,
            &[b"O", &LSN_B, b"node_a\0"],
            M::Origin(Origin {
                commit_lsn: Lsn(0x16b3778),
                name: "node_a".into(),
            }),
        ),
        // Relation: Byte1('R') Int32 oid String namespace String name Int8 replident Int16 ncols ...
        fixture(
            "relation",
            false,
            &[
                b"R",
                &OID,
                b"public\0",
                b"outbox\0",
                b"d",
                &outbox_columns.concat(),
            ],
            M::Relation(relation.clone()),
        ),
        // Streamed Relation: Int32 xid first; replica identity FULL, one column.
        fixture(
            "relation (streamed)",
            true,
            &[
                b"R",
                &SUBXID,
                &OID,
                b"public\0",
                b"outbox\0",
                b"f",
                &[0, 1],
                &[1],
                b"id\0",
                &[0, 0, 0, 20],
                &[0xff; 4],
            ],
            M::Relation(relation_full),
        ),
        // Type: Byte1('Y') [Int32 xid] Int32 oid String namespace String name
        fixture(
            "type",
            false,
            &[b"Y", &[0, 0, 0x40, 0x10], b"public\0", b"mood\0"],
            M::Type(Type {
                xid: None,
                oid: 16400,
                namespace: "public".into(),
                name: "mood".into(),
            }),
        ),
        fixture(
            "type (streamed)",
            true,
            &[b"Y", &XID, &[0, 0, 0x40, 0x10], b"\0", b"mood\0"],
            M::Type(Type {
                xid: Some(742),
                oid: 16400,
                namespace: String::new(),
                name: "mood".into(),
            }),
        ),
        // Insert: Byte1('I') [Int32 xid] Int32 oid Byte1('N') TupleData
        fixture(
            "insert",
            false,
            &[b"I", &OID, b"N", tuple3],
            M::Insert(Insert {
                xid: None,
                relation_oid: 16385,
                new: tuple3_values.clone().into(),
            }),
        ),
        fixture(
            "insert (streamed)",
            true,
            &[b"I", &XID, &OID, b"N", tuple3],
            M::Insert(Insert {
                xid: Some(742),
                relation_oid: 16385,
                new: tuple3_values.into(),
            }),
        ),
        fixture(
            "insert (zero columns)",
            false,
            &[b"I", &OID, b"N", &[0, 0]],
            M::Insert(Insert {
                xid: None,
                relation_oid: 16385,
                new: vec![].into(),
            }),
        ),
        // Update: Byte1('U') [Int32 xid] Int32 oid [Byte1('K'|'O') TupleData] Byte1('N') TupleData
        fixture(
            "update",
            false,
            &[b"U", &OID, b"N", new_tuple],
            M::Update(Box::new(Update {
                xid: None,
                relation_oid: 16385,
                old: None,
                new: new_values.clone().into(),
            })),
        ),
        fixture(
            "update (key)",
            false,
            &[b"U", &OID, b"K", key_tuple, b"N", new_tuple],
            M::Update(Box::new(Update {
                xid: None,
                relation_oid: 16385,
                old: Some(OldTuple::Key(key_values.clone().into())),
                new: new_values.clone().into(),
            })),
        ),
        fixture(
            "update (old, streamed)",
            true,
            &[b"U", &XID, &OID, b"O", key_tuple, b"N", new_tuple],
            M::Update(Box::new(Update {
                xid: Some(742),
                relation_oid: 16385,
                old: Some(OldTuple::Full(key_values.clone().into())),
                new: new_values.into(),
            })),
        ),
        // Delete: Byte1('D') [Int32 xid] Int32 oid Byte1('K'|'O') TupleData
        fixture(
            "delete (key)",
            false,
            &[b"D", &OID, b"K", key_tuple],
            M::Delete(Box::new(Delete {
                xid: None,
                relation_oid: 16385,
                old: OldTuple::Key(key_values.clone().into()),
            })),
        ),
        fixture(
            "delete (old, streamed)",
            true,
            &[b"D", &XID, &OID, b"O", key_tuple],
            M::Delete(Box::new(Delete {
                xid: Some(742),
                relation_oid: 16385,
                old: OldTuple::Full(key_values.into()),
            })),
        ),
        // Truncate: Byte1('T') [Int32 xid] Int32 nrelations Int8 options Int32 oid*
        fixture(
            "truncate",
            false,
            &[b"T", &[0, 0, 0, 2], &[3], &OID, &OID2],
            M::Truncate(Truncate {
                xid: None,
                options: Truncate::OPTION_CASCADE | Truncate::OPTION_RESTART_IDENTITY,
                relation_oids: vec![16385, 16390],
            }),
        ),
        fixture(
            "truncate (streamed)",
            true,
            &[b"T", &XID, &[0, 0, 0, 1], &[0], &OID],
            M::Truncate(Truncate {
                xid: Some(742),
                options: 0,
                relation_oids: vec![16385],
            }),
        ),
        // Message: Byte1('M') [Int32 xid] Int8 flags Int64 lsn String prefix Int32 len Byte(len)
        fixture(
            "message (transactional)",
            false,
            &[b"M", &[1], &LSN_A, b"ferry\0", &[0, 0, 0, 5], b"hello"],
            M::Message(LogicalMessage {
                xid: None,
                transactional: true,
                lsn: Lsn(0x16b3748),
                prefix: "ferry".into(),
                content: Bytes::from_static(b"hello"),
            }),
        ),
        fixture(
            "message (non-transactional)",
            false,
            &[b"M", &[0], &LSN_B, b"other\0", &[0, 0, 0, 0]],
            M::Message(LogicalMessage {
                xid: None,
                transactional: false,
                lsn: Lsn(0x16b3778),
                prefix: "other".into(),
                content: Bytes::new(),
            }),
        ),
        fixture(
            "message (streamed)",
            true,
            &[b"M", &XID, &[1], &LSN_A, b"ferry\0", &[0, 0, 0, 2], b"{}"],
            M::Message(LogicalMessage {
                xid: Some(742),
                transactional: true,
                lsn: Lsn(0x16b3748),
                prefix: "ferry".into(),
                content: Bytes::from_static(b"{}"),
            }),
        ),
        // Stream Start: Byte1('S') Int32 xid Int8 first_segment
        fixture(
            "stream start",
            false,
            &[b"S", &XID, &[1]],
            M::StreamStart(StreamStart {
                xid: 742,
                first_segment: true,
            }),
        ),
        // Stream Stop: Byte1('E')
        fixture("stream stop", true, &[b"E"], M::StreamStop),
        // Stream Commit: Byte1('c') Int32 xid Int8 flags Int64 commit_lsn Int64 end_lsn Int64 commit_time
        fixture(
            "stream commit",
            false,
            &[b"c", &XID, &[0], &LSN_A, &LSN_B, &TS],
            M::StreamCommit(StreamCommit {
                xid: 742,
                flags: 0,
                commit_lsn: Lsn(0x16b3748),
                end_lsn: Lsn(0x16b3778),
                commit_time: TS_VALUE,
            }),
        ),
        // Stream Abort: Byte1('A') Int32 xid Int32 subxact_xid
        fixture(
            "stream abort",
            false,
            &[b"A", &XID, &SUBXID],
            M::StreamAbort(StreamAbort {
                xid: 742,
                subxact_xid: 743,
            }),
        ),
    ]
}

/// The fixture called `name`.
fn named(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name:?}"))
}

#[test]
fn a_fixture_for_every_message_type() {
    let mut tags: Vec<u8> = fixtures().iter().map(|f| f.expected.tag()).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 14, "a fixture for every message type");
}

fn decodes_to_its_message_and_encodes_back(f: &Fixture) {
    let got = decode(f.bytes.clone(), f.in_stream).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    assert_eq!(got, f.expected, "{}", f.name);
    assert_eq!(f.expected.encode(), f.bytes, "{}: encode", f.name);
    assert_eq!(
        f.expected.stream_xid().is_some(),
        f.in_stream && f.expected.tag() != tag::STREAM_STOP,
        "{}",
        f.name
    );
}

fn truncated_at_every_offset_is_an_error(f: &Fixture) {
    for len in 0..f.bytes.len() {
        let err = decode(f.bytes.slice(..len), f.in_stream)
            .expect_err(&format!("{} truncated to {len} bytes decoded", f.name));
        assert!(
            err.offset <= len,
            "{}: offset {} past the end {len}",
            f.name,
            err.offset
        );
        if len == 0 {
            assert_eq!(err.kind, DecodeErrorKind::Empty);
        } else {
            assert!(
                matches!(
                    err.kind,
                    DecodeErrorKind::UnexpectedEof { .. } | DecodeErrorKind::CountTooLarge { .. }
                ),
                "{} truncated to {len}: {err}",
                f.name
            );
        }
    }
}

fn with_a_trailing_byte_is_an_error(f: &Fixture) {
    let long = cat(&[&f.bytes, &[0]]);
    let err = decode(long, f.in_stream).expect_err(f.name);
    assert_eq!(
        err.kind,
        DecodeErrorKind::TrailingBytes { count: 1 },
        "{}",
        f.name
    );
    assert_eq!(err.offset, f.bytes.len(), "{}", f.name);
}

/// Per fixture, a module of named tests (`insert_streamed::truncated_at_every_offset_is_an_error`),
/// so a failure names the message; and a test that every fixture is listed here.
macro_rules! per_fixture {
    ($($module:ident => $name:literal,)*) => {
        $(
            mod $module {
                #[test]
                fn decodes_to_its_message_and_encodes_back() {
                    super::decodes_to_its_message_and_encodes_back(&super::named($name));
                }

                #[test]
                fn truncated_at_every_offset_is_an_error() {
                    super::truncated_at_every_offset_is_an_error(&super::named($name));
                }

                #[test]
                fn with_a_trailing_byte_is_an_error() {
                    super::with_a_trailing_byte_is_an_error(&super::named($name));
                }
            }
        )*

        #[test]
        fn every_fixture_has_its_named_tests() {
            let listed: Vec<&str> = vec![$($name),*];
            let all: Vec<&str> = fixtures().iter().map(|f| f.name).collect();
            assert_eq!(listed, all, "per_fixture! lists every fixture, in order");
        }
    };
}

per_fixture! {
    begin => "begin",
    commit => "commit",
    origin => "origin",
    relation => "relation",
    relation_streamed => "relation (streamed)",
    type_ => "type",
    type_streamed => "type (streamed)",
    insert => "insert",
    insert_streamed => "insert (streamed)",
    insert_zero_columns => "insert (zero columns)",
    update => "update",
    update_key => "update (key)",
    update_old_streamed => "update (old, streamed)",
    delete_key => "delete (key)",
    delete_old_streamed => "delete (old, streamed)",
    truncate => "truncate",
    truncate_streamed => "truncate (streamed)",
    message_transactional => "message (transactional)",
    message_non_transactional => "message (non-transactional)",
    message_streamed => "message (streamed)",
    stream_start => "stream start",
    stream_stop => "stream stop",
    stream_commit => "stream commit",
    stream_abort => "stream abort",
}

#[test]
fn tuple_values_and_message_content_are_slices_of_the_input() {
    let within = |input: &Bytes, part: &Bytes| {
        let start = input.as_ptr() as usize;
        let p = part.as_ptr() as usize;
        assert!(
            p >= start && p + part.len() <= start + input.len(),
            "not a slice of the input"
        );
    };
    for f in fixtures() {
        match decode(f.bytes.clone(), f.in_stream).unwrap() {
            PgOutputMessage::Insert(i) => {
                for v in i.new.iter() {
                    if let ValueRef::Text(s) | ValueRef::Binary(s) = v {
                        within(&f.bytes, &s.to_bytes());
                    }
                }
            }
            PgOutputMessage::Message(m) if !m.content.is_empty() => within(&f.bytes, &m.content),
            _ => {}
        }
    }
}

#[test]
fn the_stream_state_changes_what_the_bytes_mean() {
    // Read in the other stream state, the same bytes are an error or a different message (a
    // streamed Message can even decode "successfully" with garbage fields): hence [`Decoder`].
    for f in fixtures()
        .into_iter()
        .filter(|f| b"RYIUDTM".contains(&f.expected.tag()))
    {
        if let Ok(other) = decode(f.bytes.clone(), !f.in_stream) {
            assert_ne!(other, f.expected, "{}", f.name);
        }
    }
}

fn err(parts: &[&[u8]], in_stream: bool) -> DecodeError {
    decode(cat(parts), in_stream).expect_err("hostile input decoded")
}

/// Hostile inputs, one named test per kind of lie: each is a typed error, never a panic or an
/// allocation sized by the input.
mod hostile {
    use super::*;
    use DecodeErrorKind as K;

    #[test]
    fn unknown_tags_and_protocol_version_3_messages() {
        assert_eq!(err(&[b"Z"], false).kind, K::UnknownTag);
        assert_eq!(err(&[&[0xff], &[0; 40]], false).kind, K::UnknownTag);
        // Protocol version 3 (two-phase) messages are not decoded.
        assert_eq!(err(&[b"b"], false).kind, K::UnknownTag);
    }

    #[test]
    fn a_tuple_count_beyond_the_message_is_refused_before_allocating() {
        // A tuple claiming 32767 columns in 3 bytes: rejected before allocating.
        let e = err(&[b"I", &OID, b"N", &[0x7f, 0xff], b"nnn"], false);
        assert_eq!(
            e.kind,
            K::CountTooLarge {
                count: 32767,
                min_item_len: 1,
                remaining: 3
            }
        );
        assert_eq!(e.offset, 6);
    }

    #[test]
    fn negative_column_counts_and_lengths() {
        // Negative column counts and lengths.
        assert_eq!(
            err(&[b"I", &OID, b"N", &[0xff, 0xff]], false).kind,
            K::NegativeLength { length: -1 }
        );
        let e = err(
            &[b"I", &OID, b"N", &[0, 1], b"t", &[0xff, 0xff, 0xff, 0xff]],
            false,
        );
        assert_eq!((e.kind, e.offset), (K::NegativeLength { length: -1 }, 9));
        let e = err(&[b"I", &OID, b"N", &[0, 1], b"b", &[0x80, 0, 0, 0]], false);
        assert_eq!(e.kind, K::NegativeLength { length: i32::MIN });
    }

    #[test]
    fn a_value_length_beyond_the_message() {
        // A value length far beyond the message.
        let e = err(
            &[
                b"I",
                &OID,
                b"N",
                &[0, 1],
                b"t",
                &[0x7f, 0xff, 0xff, 0xff],
                b"abc",
            ],
            false,
        );
        assert_eq!(
            (e.kind, e.offset),
            (
                K::UnexpectedEof {
                    needed: 0x7fff_ffff - 3
                },
                13
            )
        );
    }

    #[test]
    fn message_content_length_beyond_the_message_or_negative() {
        // Message content length beyond the message, and negative.
        let e = err(&[b"M", &[1], &LSN_A, b"p\0", &[0x10, 0, 0, 0]], false);
        assert!(matches!(e.kind, K::UnexpectedEof { .. }));
        let e = err(
            &[b"M", &[1], &LSN_A, b"p\0", &[0xff, 0xff, 0xff, 0xfe]],
            false,
        );
        assert_eq!(e.kind, K::NegativeLength { length: -2 });
    }

    #[test]
    fn truncate_relation_count_beyond_the_message_or_negative() {
        // Truncate with 2^31-1 relations, and a negative count.
        let e = err(&[b"T", &[0x7f, 0xff, 0xff, 0xff], &[0], &OID], false);
        assert!(matches!(
            e.kind,
            K::CountTooLarge {
                count: 0x7fff_ffff,
                min_item_len: 4,
                remaining: 4
            }
        ));
        assert_eq!(
            err(&[b"T", &[0xff, 0xff, 0xff, 0xff], &[0]], false).kind,
            K::NegativeLength { length: -1 }
        );
    }

    #[test]
    fn relation_column_count_beyond_the_message_or_negative() {
        // Relation with 32767 columns but a few bytes, and a negative column count.
        let e = err(
            &[b"R", &OID, b"s\0", b"t\0", b"d", &[0x7f, 0xff], &[0; 20]],
            false,
        );
        assert!(matches!(
            e.kind,
            K::CountTooLarge {
                count: 32767,
                min_item_len: 10,
                ..
            }
        ));
        assert!(matches!(
            err(&[b"R", &OID, b"s\0", b"t\0", b"d", &[0x80, 0]], false).kind,
            K::NegativeLength { .. }
        ));
    }

    #[test]
    fn bad_enumerations_and_markers() {
        // Bad enumerations and markers.
        let e = err(&[b"R", &OID, b"s\0", b"t\0", b"x", &[0, 0]], false);
        assert_eq!(
            (e.kind, e.offset),
            (
                K::InvalidValue {
                    field: "replica identity",
                    value: b'x'
                },
                9
            )
        );
        assert_eq!(
            err(&[b"I", &OID, b"N", &[0, 1], b"x"], false).kind,
            K::UnknownTupleKind { kind: b'x' }
        );
        assert!(matches!(
            err(&[b"I", &OID, b"K", &[0, 0]], false).kind,
            K::UnexpectedMarker { found: b'K', .. }
        ));
        assert!(matches!(
            err(&[b"U", &OID, b"X", &[0, 0]], false).kind,
            K::UnexpectedMarker { found: b'X', .. }
        ));
        assert!(matches!(
            err(&[b"U", &OID, b"K", &[0, 0], b"K", &[0, 0]], false).kind,
            K::UnexpectedMarker { .. }
        ));
        assert!(matches!(
            err(&[b"D", &OID, b"N", &[0, 0]], false).kind,
            K::UnexpectedMarker { .. }
        ));
        assert!(matches!(
            err(&[b"M", &[2], &LSN_A, b"p\0", &[0; 4]], false).kind,
            K::InvalidValue { value: 2, .. }
        ));
        assert!(matches!(
            err(&[b"S", &XID, &[7]], false).kind,
            K::InvalidValue { value: 7, .. }
        ));
    }

    #[test]
    fn invalid_utf8_and_a_missing_terminator() {
        // Invalid UTF-8 and a missing NUL terminator.
        let e = err(&[b"O", &LSN_A, &[0xc3, 0x28, 0]], false);
        assert_eq!(
            (e.kind, e.offset),
            (
                K::InvalidUtf8 {
                    field: "origin name"
                },
                9
            )
        );
        let e = err(&[b"O", &LSN_A, b"no-terminator"], false);
        assert_eq!((e.kind, e.offset), (K::UnexpectedEof { needed: 1 }, 22));
    }
}

#[test]
fn errors_read_well() {
    let e = err(&[b"I", &OID, b"N", &[0, 1], b"t", &[0, 0]], false);
    assert_eq!(
        e.to_string(),
        "pgoutput Insert ('I') message: unexpected end of data at offset 9: need 2 more bytes"
    );
    let e = err(&[b"I", &OID, b"N", &[0, 1], b"t", &[0, 0, 0, 4]], false);
    assert_eq!(
        e.to_string(),
        "pgoutput Insert ('I') message: unexpected end of data at offset 13: need 4 more bytes"
    );
    assert_eq!(
        err(&[], false).to_string(),
        "pgoutput message: empty message"
    );
    assert_eq!(
        err(&[b"Z"], false).to_string(),
        "pgoutput message with tag 'Z' (0x5a): unknown message tag at offset 0"
    );
    assert_eq!(
        err(&[&[0x01]], false).to_string(),
        "pgoutput message with tag 0x01: unknown message tag at offset 0"
    );
    assert_eq!(
        err(&[b"E", &[0, 0]], false).to_string(),
        "pgoutput Stream Stop ('E') message: 2 trailing bytes at offset 1 after a complete message (protocol version mismatch?)"
    );
    let e = err(&[b"I", &OID, b"N", &[0, 1], b"?"], false);
    assert_eq!(
        e.to_string(),
        "pgoutput Insert ('I') message: unknown tuple column kind '?' (0x3f) at offset 8 (expected 'n', 'u', 't' or 'b')"
    );
}

#[test]
fn decoder_reads_the_stream_block_form_between_start_and_stop() {
    let mut d = Decoder::new();
    let insert = cat(&[b"I", &OID, b"N", &[0, 1], b"n"]);
    let streamed_insert = cat(&[b"I", &XID, &OID, b"N", &[0, 1], b"n"]);

    assert_eq!(d.decode(insert.clone()).unwrap().stream_xid(), None);
    assert!(
        d.decode(streamed_insert.clone()).is_err(),
        "streamed form outside a block"
    );
    assert!(!d.in_stream());

    d.decode(cat(&[b"S", &XID, &[1]])).unwrap();
    assert_eq!(d.stream_xid(), Some(742));
    assert_eq!(
        d.decode(streamed_insert.clone()).unwrap().stream_xid(),
        Some(742)
    );
    assert!(
        d.decode(insert.clone()).is_err(),
        "plain form inside a block"
    );
    let e = d.decode(cat(&[b"S", &XID, &[0]])).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::StreamStartInsideStream { open_xid: 742 }
    );
    assert!(
        d.in_stream(),
        "a rejected Stream Start leaves the block open"
    );

    assert_eq!(d.decode(cat(&[b"E"])).unwrap(), PgOutputMessage::StreamStop);
    assert!(!d.in_stream());
    let e = d.decode(cat(&[b"E"])).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::StreamStopOutsideStream);
    assert_eq!(
        e.to_string(),
        "pgoutput Stream Stop ('E') message: arrived outside a stream block"
    );

    // Stream Commit arrives outside the block.
    d.decode(cat(&[b"c", &XID, &[0], &LSN_A, &LSN_B, &TS]))
        .unwrap();
    d.decode(cat(&[b"S", &XID, &[0]])).unwrap();
    d.reset();
    assert!(!d.in_stream());
    assert_eq!(d.decode(insert).unwrap().stream_xid(), None);
}

#[test]
fn timestamps_convert_to_unix_time() {
    use std::time::{Duration, UNIX_EPOCH};
    assert_eq!(TS_VALUE.to_unix_micros(), Some(1_704_067_200_000_000));
    assert_eq!(
        TS_VALUE.to_system_time(),
        Some(UNIX_EPOCH + Duration::from_secs(1_704_067_200))
    );
    assert_eq!(PgTimestamp(0).to_unix_micros(), Some(946_684_800_000_000));
    assert_eq!(
        PgTimestamp::from_unix_micros(1_704_067_200_000_000),
        Some(TS_VALUE)
    );
    assert_eq!(
        PgTimestamp::from_system_time(UNIX_EPOCH + Duration::from_secs(1_704_067_200)),
        TS_VALUE
    );
    // Before 1970, and the infinity sentinels.
    let before = PgTimestamp(-PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS - 1_000_000);
    assert_eq!(
        before.to_system_time(),
        Some(UNIX_EPOCH - Duration::from_secs(1))
    );
    assert_eq!(
        PgTimestamp::from_system_time(UNIX_EPOCH - Duration::from_secs(1)),
        before
    );
    assert_eq!(PgTimestamp(i64::MAX).to_unix_micros(), None);
    assert_eq!(PgTimestamp(i64::MAX).to_system_time(), None);
    assert!(PgTimestamp::now() > TS_VALUE);
}
