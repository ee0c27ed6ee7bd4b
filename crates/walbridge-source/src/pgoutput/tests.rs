use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use walbridge_core::{Datum, Lsn, PgTimestamp, ReplicaIdentity};

use super::encode::encode;
use super::*;

fn datum() -> impl Strategy<Value = Datum> {
    prop_oneof![
        Just(Datum::Null),
        Just(Datum::UnchangedToast),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| Datum::Text(Bytes::from(v))),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| Datum::Binary(Bytes::from(v))),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    proptest::collection::vec(datum(), 0..8)
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_ é]{0,12}"
}

fn identity() -> impl Strategy<Value = ReplicaIdentity> {
    prop_oneof![
        Just(ReplicaIdentity::Default),
        Just(ReplicaIdentity::Nothing),
        Just(ReplicaIdentity::Full),
        Just(ReplicaIdentity::Index)
    ]
}

fn old_kind() -> impl Strategy<Value = OldTupleKind> {
    prop_oneof![Just(OldTupleKind::Key), Just(OldTupleKind::Old)]
}

fn prepare_body() -> impl Strategy<Value = PrepareBody> {
    (
        any::<u8>(),
        any::<u64>(),
        any::<u64>(),
        any::<i64>(),
        any::<u32>(),
        name(),
    )
        .prop_map(|(flags, p, e, t, xid, gid)| PrepareBody {
            flags,
            prepare_lsn: Lsn(p),
            end_lsn: Lsn(e),
            prepare_time: PgTimestamp(t),
            xid,
            gid,
        })
}

/// Data messages, with `xid` set iff inside a stream block.
fn data_message(in_stream: bool) -> impl Strategy<Value = Message> {
    let xid = if in_stream {
        any::<u32>().prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    };
    let column = (any::<bool>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(is_key, name, type_oid, type_modifier)| RelationColumn {
            is_key,
            name,
            type_oid,
            type_modifier,
        },
    );
    prop_oneof![
        (
            xid.clone(),
            any::<u32>(),
            name(),
            name(),
            identity(),
            proptest::collection::vec(column, 0..6)
        )
            .prop_map(|(xid, id, schema, name, replica_identity, columns)| {
                Message::Relation {
                    xid,
                    body: RelationBody {
                        id,
                        schema,
                        name,
                        replica_identity,
                        columns,
                    },
                }
            }),
        (xid.clone(), any::<u32>(), name(), name()).prop_map(|(xid, oid, schema, name)| {
            Message::Type {
                xid,
                oid,
                schema,
                name,
            }
        }),
        (xid.clone(), any::<u32>(), row()).prop_map(|(xid, relation_id, new)| Message::Insert {
            xid,
            relation_id,
            new
        }),
        (
            xid.clone(),
            any::<u32>(),
            proptest::option::of((old_kind(), row())),
            row()
        )
            .prop_map(|(xid, relation_id, old, new)| Message::Update {
                xid,
                relation_id,
                old,
                new
            }),
        (xid.clone(), any::<u32>(), old_kind(), row()).prop_map(|(xid, relation_id, k, r)| {
            Message::Delete {
                xid,
                relation_id,
                old: (k, r),
            }
        }),
        (
            xid.clone(),
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec(any::<u32>(), 0..5)
        )
            .prop_map(
                |(xid, cascade, restart_identity, relation_ids)| Message::Truncate {
                    xid,
                    cascade,
                    restart_identity,
                    relation_ids
                }
            ),
        (
            xid,
            any::<bool>(),
            any::<u64>(),
            name(),
            proptest::collection::vec(any::<u8>(), 0..30)
        )
            .prop_map(
                |(xid, transactional, lsn, prefix, content)| Message::Message {
                    xid,
                    transactional,
                    lsn: Lsn(lsn),
                    prefix,
                    content: Bytes::from(content),
                }
            ),
    ]
}

fn control_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (any::<u64>(), any::<i64>(), any::<u32>()).prop_map(|(l, t, xid)| Message::Begin {
            final_lsn: Lsn(l),
            commit_time: PgTimestamp(t),
            xid
        }),
        (any::<u8>(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(|(flags, c, e, t)| {
            Message::Commit {
                flags,
                commit_lsn: Lsn(c),
                end_lsn: Lsn(e),
                commit_time: PgTimestamp(t),
            }
        }),
        (any::<u64>(), name()).prop_map(|(l, name)| Message::Origin { lsn: Lsn(l), name }),
        (
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>()
        )
            .prop_map(|(flags, xid, c, e, t)| {
                Message::StreamCommit {
                    xid,
                    flags,
                    commit_lsn: Lsn(c),
                    end_lsn: Lsn(e),
                    commit_time: PgTimestamp(t),
                }
            }),
        (
            any::<u32>(),
            any::<u32>(),
            proptest::option::of((any::<u64>(), any::<i64>()))
        )
            .prop_map(|(xid, subxid, a)| {
                Message::StreamAbort {
                    xid,
                    subxid,
                    abort: a.map(|(l, t)| (Lsn(l), PgTimestamp(t))),
                }
            }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<u32>(),
            name()
        )
            .prop_map(|(p, e, t, xid, gid)| {
                Message::BeginPrepare {
                    prepare_lsn: Lsn(p),
                    end_lsn: Lsn(e),
                    prepare_time: PgTimestamp(t),
                    xid,
                    gid,
                }
            }),
        prepare_body().prop_map(Message::Prepare),
        prepare_body().prop_map(Message::StreamPrepare),
        (
            any::<u8>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<u32>(),
            name()
        )
            .prop_map(|(flags, c, e, t, xid, gid)| Message::CommitPrepared {
                flags,
                commit_lsn: Lsn(c),
                end_lsn: Lsn(e),
                commit_time: PgTimestamp(t),
                xid,
                gid
            }),
        (
            any::<u8>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
            name()
        )
            .prop_map(
                |(flags, p, r, pt, rt, xid, gid)| Message::RollbackPrepared {
                    flags,
                    prepare_end_lsn: Lsn(p),
                    rollback_end_lsn: Lsn(r),
                    prepare_time: PgTimestamp(pt),
                    rollback_time: PgTimestamp(rt),
                    xid,
                    gid
                }
            ),
    ]
}

fn encoded(message: &Message, in_stream: bool) -> Bytes {
    let mut out = BytesMut::new();
    encode(message, in_stream, &mut out);
    out.freeze()
}

/// A decoder positioned inside a stream block.
fn streaming_decoder() -> Decoder {
    let mut d = Decoder::new();
    let start = encoded(
        &Message::StreamStart {
            xid: 7,
            first_segment: true,
        },
        false,
    );
    assert_eq!(
        d.decode(start),
        Ok(Message::StreamStart {
            xid: 7,
            first_segment: true
        })
    );
    d
}

proptest! {
    #[test]
    fn round_trips_outside_stream_blocks(m in prop_oneof![data_message(false), control_message()]) {
        let mut d = Decoder::new();
        prop_assert_eq!(d.decode(encoded(&m, false)), Ok(normalized(m)));
    }

    #[test]
    fn round_trips_inside_stream_blocks(m in data_message(true)) {
        let mut d = streaming_decoder();
        prop_assert_eq!(d.decode(encoded(&m, true)), Ok(normalized(m)));
    }

    #[test]
    fn every_truncation_is_an_error(m in prop_oneof![data_message(false), control_message()]) {
        let full = encoded(&m, false);
        for len in 0..full.len() {
            let mut d = Decoder::new();
            let result = d.decode(full.slice(..len));
            // A stream abort without its optional trailer is itself valid.
            if !matches!(m, Message::StreamAbort { abort: Some(_), .. }) || len != 9 {
                prop_assert!(result.is_err(), "prefix of {} bytes decoded as {:?}", len, result);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200), in_stream: bool) {
        let mut d = if in_stream { streaming_decoder() } else { Decoder::new() };
        let _ = d.decode(Bytes::from(data));
    }

    #[test]
    fn column_data_is_not_copied(payload in proptest::collection::vec(any::<u8>(), 1..64)) {
        let m = Message::Insert { xid: None, relation_id: 1, new: vec![Datum::Text(Bytes::from(payload))] };
        let buf = encoded(&m, false);
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let Ok(Message::Insert { new, .. }) = Decoder::new().decode(buf.clone()) else {
            return Err(TestCaseError::fail("not an insert"));
        };
        let Datum::Text(value) = &new[0] else { return Err(TestCaseError::fail("not text")) };
        prop_assert!(range.contains(&(value.as_ptr() as usize)));
    }
}

/// The decoder reports an empty schema as `pg_catalog`, as pgoutput means it.
fn normalized(m: Message) -> Message {
    match m {
        Message::Relation { xid, mut body } => {
            if body.schema.is_empty() {
                body.schema = "pg_catalog".into();
            }
            Message::Relation { xid, body }
        }
        other => other,
    }
}

#[test]
fn stream_blocks_switch_xid_parsing() {
    let mut d = Decoder::new();
    assert!(!d.in_stream_block());
    d.decode(encoded(
        &Message::StreamStart {
            xid: 9,
            first_segment: false,
        },
        false,
    ))
    .ok();
    assert!(d.in_stream_block());
    let insert = Message::Insert {
        xid: Some(9),
        relation_id: 5,
        new: vec![Datum::Null],
    };
    assert_eq!(d.decode(encoded(&insert, true)), Ok(insert));
    d.decode(encoded(&Message::StreamStop, false)).ok();
    assert!(!d.in_stream_block());
}

#[test]
fn rejects_bad_fields_with_typed_errors() {
    let mut d = Decoder::new();
    assert_eq!(d.decode(Bytes::new()), Err(DecodeError::Empty));
    assert_eq!(
        d.decode(Bytes::from_static(b"Z")),
        Err(DecodeError::UnknownTag(b'Z'))
    );
    // Insert with a bad tuple kind.
    let bad = Bytes::from_static(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b'x']);
    assert!(matches!(
        d.decode(bad),
        Err(DecodeError::Invalid { tag: 'I', .. })
    ));
    // Negative length of a text datum.
    let bad = Bytes::from_static(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(
        d.decode(bad),
        Err(DecodeError::Malformed { tag: 'I', .. })
    ));
    let trailing = Bytes::from_static(&[b'E', 0]);
    assert_eq!(
        d.decode(trailing),
        Err(DecodeError::TrailingBytes { tag: 'E', count: 1 })
    );
}
