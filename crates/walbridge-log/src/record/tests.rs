use super::*;

fn relation(id: u32, name: &str) -> Arc<Relation> {
    Arc::new(Relation {
        id,
        schema: "public".into(),
        name: name.into(),
        replica_identity: ReplicaIdentity::Full,
        columns: vec![
            Column {
                name: "id".into(),
                type_oid: 23,
                type_modifier: -1,
                type_name: "int4".into(),
                kind: ValueKind::Int4,
                is_key: true,
                attnum: 3,
                not_null: true,
                missing_value: Some("it's 5".into()),
            },
            Column {
                name: "tags".into(),
                type_oid: 1009,
                type_modifier: -1,
                type_name: "_text".into(),
                kind: ValueKind::Array {
                    element: Box::new(ValueKind::Text),
                    delimiter: b',',
                },
                is_key: false,
                attnum: 0,
                not_null: false,
                missing_value: None,
            },
        ],
        partition_root: Some(walbridge_core::TableName {
            schema: "public".into(),
            name: "root".into(),
        }),
        primary_key: vec![0],
    })
}

fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

/// A transaction record as the generated types write it.
fn generated(info: &TransactionInfo, first: bool, last: bool, changes: &[Change]) -> Vec<u8> {
    let mut encoder = RecordEncoder::default();
    let mut relations = encoder.relations();
    let body = pb::record::Body::Transaction(pb::TransactionChunk {
        info: Some(transaction_to_pb(info)),
        first,
        last,
        changes: changes
            .iter()
            .map(|c| change_to_pb(c, &mut relations))
            .collect(),
    });
    finish(std::mem::take(&mut relations.list), body)
}

#[test]
fn every_kind_of_change_round_trips() {
    let a = relation(1, "a");
    // The same table with a changed schema in the same transaction: both descriptors travel.
    let mut altered = (*a).clone();
    altered.columns.pop();
    let a2 = Arc::new(altered);
    let b = relation(2, "b");
    let info = TransactionInfo {
        xid: 42,
        commit_lsn: Lsn(100),
        end_lsn: Lsn(108),
        commit_time: PgTimestamp(123_456),
        origin: Some(Origin {
            name: "pg_1".into(),
            lsn: Lsn(77),
        }),
        gid: Some("g1".into()),
        for_sink: None,
    };
    let changes = vec![
        Change::Insert {
            lsn: Lsn(10),
            relation: a.clone(),
            new: vec![text("1"), Datum::Null],
        },
        Change::Update {
            lsn: Lsn(11),
            relation: a.clone(),
            old: Some(OldRow {
                kind: OldRowKind::Full,
                row: vec![text("1"), Datum::Null],
            }),
            new: vec![text("2"), Datum::UnchangedToast],
        },
        Change::Update {
            lsn: Lsn(12),
            relation: b.clone(),
            old: None,
            new: vec![
                Datum::Binary(Bytes::from_static(&[0, 0, 0, 7])),
                text("{x}"),
            ],
        },
        Change::Delete {
            lsn: Lsn(13),
            relation: a2.clone(),
            old: OldRow {
                kind: OldRowKind::Key,
                row: vec![text("2")],
            },
        },
        Change::Truncate(Truncate {
            lsn: Lsn(14),
            relations: vec![a2.clone(), b.clone()],
            options: TruncateOptions {
                cascade: true,
                restart_identity: false,
            },
        }),
        Change::ReadRange(ReadRange {
            lsn: Lsn(14),
            relation: a.clone(),
            key: vec![(0, KeyOrder::Value), (1, KeyOrder::TextForm)],
            after: None,
            up_to: Some(vec!["9".into(), "x y".into()]),
            keys: vec![vec!["1".into(), "a".into()], vec!["9".into(), "x y".into()]],
        }),
        Change::Read {
            lsn: Lsn(14),
            relation: a.clone(),
            new: vec![text("9"), text("x y")],
        },
        Change::Message(LogicalMessage {
            lsn: Lsn(15),
            transactional: true,
            prefix: "p".into(),
            content: Bytes::from_static(b"\x00\xffbody"),
        }),
    ];
    let mut encoder = RecordEncoder::default();
    for (first, last) in [(true, true), (true, false), (false, false), (false, true)] {
        let payload = encoder.transaction(&info, first, last, &changes);
        assert_eq!(payload, generated(&info, first, last, &changes));
        let entry = decode(Bytes::from(payload)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            entry,
            Entry::Transaction {
                info: Arc::new(info.clone()),
                first,
                last,
                changes: changes.clone()
            }
        );
    }
}

#[test]
fn a_record_of_many_tables_names_each_descriptor_once() {
    // More tables than are looked up by a scan, visited twice in turn.
    let tables: Vec<_> = (0..40).map(|i| relation(i, &format!("t{i}"))).collect();
    // Values of every length class: empty, short, and longer than a
    // one-byte length; the first change at LSN 0 (a field left out).
    let changes: Vec<_> = (0..80)
        .map(|i| Change::Insert {
            lsn: Lsn(i * 1_000),
            relation: tables[(i % 40) as usize].clone(),
            new: vec![text(&i.to_string()), text(&"v".repeat((i * 7) as usize))],
        })
        .collect();
    let info = TransactionInfo {
        xid: 7,
        commit_lsn: Lsn(90),
        end_lsn: Lsn(98),
        commit_time: PgTimestamp(1),
        origin: None,
        gid: None,
        for_sink: None,
    };
    let payload = RecordEncoder::default().transaction(&info, true, true, &changes);
    assert_eq!(payload, generated(&info, true, true, &changes));
    let record = RecordView::decode(Bytes::from(payload.clone())).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.relations.len(), 40);
    let entry = decode(Bytes::from(payload)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        entry,
        Entry::Transaction {
            info: Arc::new(info),
            first: true,
            last: true,
            changes,
        }
    );
}

fn copy_text(rows: &[Row]) -> CopyText {
    CopyText::from_rows(rows).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn format_1_snapshot_rows_read_as_copy_text() {
    let rows = vec![vec![text("1"), text("a\tb")], vec![text("2"), Datum::Null]];
    let mut encoder = RecordEncoder::default();
    let mut relations = encoder.relations();
    relations.index(&relation(3, "c"));
    let payload = finish(
        std::mem::take(&mut relations.list),
        pb::record::Body::Snapshot(pb::SnapshotRows {
            consistent_point: 500,
            rows: rows.iter().map(row_to_pb).collect(),
            copy_text: Bytes::new(),
        }),
    );
    match decode(Bytes::from(payload)) {
        Ok(Entry::Snapshot(batch)) => {
            assert_eq!(batch.rows, copy_text(&rows));
            assert_eq!(&batch.rows.text()[..], b"1\ta\\tb\n2\t\\N\n");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn snapshots_and_messages_round_trip() {
    let mut encoder = RecordEncoder::default();
    let batch = SnapshotBatch {
        relation: relation(3, "c"),
        rows: copy_text(&[vec![text("1"), text("{a,b}")], vec![text("2"), Datum::Null]]),
        consistent_point: Lsn(500),
    };
    let entry = decode(Bytes::from(encoder.snapshot(&batch))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entry, Entry::Snapshot(batch));
    let entry =
        decode(Bytes::from(encoder.snapshot_complete(Lsn(500)))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        entry,
        Entry::SnapshotComplete {
            consistent_point: Lsn(500)
        }
    );
    let m = LogicalMessage {
        lsn: Lsn(9),
        transactional: false,
        prefix: "x".into(),
        content: Bytes::from_static(b"hello"),
    };
    let entry = decode(Bytes::from(encoder.message(&m))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entry, Entry::Message(m));
    let values = SequenceValues {
        lsn: Lsn(12),
        read_time: PgTimestamp(77),
        sequences: vec![SequenceValue {
            schema: "public".into(),
            name: "t_id_seq".into(),
            last_value: i64::MIN + 1,
        }],
    };
    let entry = decode(Bytes::from(encoder.sequences(&values))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entry, Entry::Sequences(values));
}

#[test]
fn the_generated_record_type_reads_what_the_encoder_writes() {
    let batch = SnapshotBatch {
        relation: relation(3, "c"),
        rows: copy_text(&[vec![text("1"), text("{a,b}")]]),
        consistent_point: Lsn(500),
    };
    let payload = RecordEncoder::default().snapshot(&batch);
    let record = pb::Record::decode(payload.as_slice()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.relations.len(), 1);
    assert_eq!(record.relations[0].name, "c");
    assert_eq!(record.relations[0].columns[1].type_name, "_text");
    // And the cached decoder shares one descriptor across records.
    let mut decoder = RecordDecoder::default();
    let first = decoder.decode(Bytes::from(payload.clone()));
    let second = decoder.decode(Bytes::from(payload));
    match (first, second) {
        (Ok(Entry::Snapshot(a)), Ok(Entry::Snapshot(b))) => {
            assert!(Arc::ptr_eq(&a.relation, &b.relation));
            assert_eq!(a, batch);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_newer_format_is_refused_and_garbage_is_an_error() {
    let record = pb::Record {
        format: FORMAT + 1,
        relations: vec![],
        body: Some(pb::record::Body::SnapshotComplete(pb::SnapshotComplete {
            consistent_point: 1,
        })),
    };
    assert!(matches!(
        decode(Bytes::from(record.encode_to_vec())),
        Err(RecordError::Format(_))
    ));
    assert!(decode(Bytes::from_static(b"\xff\xff\xff")).is_err());
    // A change pointing at a relation the record does not carry.
    let record = pb::Record {
        format: FORMAT,
        relations: vec![],
        body: Some(pb::record::Body::Transaction(pb::TransactionChunk {
            info: Some(pb::Transaction::default()),
            first: true,
            last: true,
            changes: vec![pb::Change {
                lsn: 1,
                kind: Some(pb::change::Kind::Insert(pb::Insert {
                    relation: 3,
                    new: None,
                })),
            }],
        })),
    };
    assert!(matches!(
        decode(Bytes::from(record.encode_to_vec())),
        Err(RecordError::Invalid(_))
    ));
}
