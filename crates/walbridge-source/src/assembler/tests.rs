use bytes::Bytes;
use walbridge_core::{Column, Datum, ReplicaIdentity, ValueKind};

use super::*;
use crate::pgoutput::PrepareBody;

fn relation(id: u32, columns: &[&str]) -> Relation {
    Relation {
        id,
        schema: "public".into(),
        name: format!("t{id}"),
        replica_identity: ReplicaIdentity::Default,
        columns: columns
            .iter()
            .map(|c| Column {
                name: (*c).into(),
                type_oid: 23,
                type_modifier: -1,
                type_name: "int4".into(),
                kind: ValueKind::Int4,
                is_key: *c == "id",
                attnum: 0,
                not_null: false,
                missing_value: None,
            })
            .collect(),
        partition_root: None,
        primary_key: Vec::new(),
    }
}

fn text(v: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(v.as_bytes()))
}

fn insert(xid: Option<u32>, rel: u32, v: &str) -> Message {
    Message::Insert {
        xid,
        relation_id: rel,
        new: vec![text(v)],
    }
}

fn values(txn: CommittedTransaction) -> Vec<String> {
    txn.changes
        .into_changes()
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|c| match c.unwrap_or_else(|e| panic!("{e}")) {
            Change::Insert { new, .. } => match &new[0] {
                Datum::Text(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            },
            Change::Message(m) => format!("msg:{}", m.prefix),
            other => format!("{other:?}"),
        })
        .collect()
}

/// A Begin of transaction `xid` that will commit at `final_lsn`.
fn begin(final_lsn: u64, xid: u32) -> Message {
    Message::Begin {
        final_lsn: Lsn(final_lsn),
        commit_time: PgTimestamp(0),
        xid,
    }
}

/// The Commit of the transaction most recently begun.
fn commit(commit_lsn: u64, end_lsn: u64) -> Message {
    Message::Commit {
        flags: 0,
        commit_lsn: Lsn(commit_lsn),
        end_lsn: Lsn(end_lsn),
        commit_time: PgTimestamp(0),
    }
}

fn committed(a: Assembled) -> CommittedTransaction {
    match a {
        Assembled::Committed(t) => t,
        other => panic!("expected a commit, got {other:?}"),
    }
}

fn push(a: &mut Assembler, m: Message) -> Assembled {
    a.push(Lsn(1), m).unwrap_or_else(|e| panic!("{e}"))
}

fn assembler(threshold: usize) -> (tempfile::TempDir, Assembler) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let a = Assembler::new(dir.path().to_path_buf(), threshold);
    (dir, a)
}

#[test]
fn plain_transaction_with_origin() {
    let (_dir, mut a) = assembler(1 << 20);
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        &mut a,
        Message::Begin {
            final_lsn: Lsn(100),
            commit_time: PgTimestamp(5),
            xid: 9,
        },
    );
    push(
        &mut a,
        Message::Origin {
            lsn: Lsn(7),
            name: "up".into(),
        },
    );
    push(&mut a, insert(None, 1, "a"));
    push(&mut a, insert(None, 1, "b"));
    let t = committed(push(
        &mut a,
        Message::Commit {
            flags: 0,
            commit_lsn: Lsn(100),
            end_lsn: Lsn(120),
            commit_time: PgTimestamp(5),
        },
    ));
    assert_eq!(t.info.xid, 9);
    assert_eq!(t.info.end_lsn, Lsn(120));
    assert_eq!(
        t.info.origin,
        Some(Origin {
            name: "up".into(),
            lsn: Lsn(7)
        })
    );
    assert_eq!(values(t), ["a", "b"]);
}

#[test]
fn errors_on_protocol_violations() {
    let (_dir, mut a) = assembler(1 << 20);
    assert!(matches!(
        a.push(Lsn(1), insert(None, 1, "a")),
        Err(AssemblyError::UnknownRelation(1))
    ));
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        a.push(Lsn(1), insert(None, 1, "a")),
        Err(AssemblyError::OutsideTransaction(_))
    ));
    push(&mut a, begin(1, 1));
    let two = Message::Insert {
        xid: None,
        relation_id: 1,
        new: vec![Datum::Null, Datum::Null],
    };
    assert!(matches!(
        a.push(Lsn(1), two),
        Err(AssemblyError::ColumnCount {
            expected: 1,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        a.push(
            Lsn(1),
            Message::CommitPrepared {
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: PgTimestamp(0),
                xid: 1,
                gid: "g".into()
            }
        ),
        Err(AssemblyError::UnknownPrepared(_))
    ));
}

#[test]
fn interleaved_streams_with_subtransaction_abort_and_spill() {
    // A threshold this small spills after nearly every change.
    let (dir, mut a) = assembler(200);
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        &mut a,
        Message::StreamStart {
            xid: 10,
            first_segment: true,
        },
    );
    push(&mut a, insert(Some(10), 1, "10-a"));
    push(&mut a, insert(Some(11), 1, "10-sub11-x"));
    push(&mut a, Message::StreamStop);
    push(
        &mut a,
        Message::StreamStart {
            xid: 20,
            first_segment: true,
        },
    );
    push(&mut a, insert(Some(20), 1, "20-a"));
    push(&mut a, Message::StreamStop);
    // A plain transaction commits in between.
    push(&mut a, begin(50, 30));
    push(&mut a, insert(None, 1, "30-a"));
    assert_eq!(
        values(committed(push(
            &mut a,
            Message::Commit {
                flags: 0,
                commit_lsn: Lsn(50),
                end_lsn: Lsn(51),
                commit_time: PgTimestamp(0)
            }
        ))),
        ["30-a"]
    );
    push(
        &mut a,
        Message::StreamStart {
            xid: 10,
            first_segment: false,
        },
    );
    push(&mut a, insert(Some(11), 1, "10-sub11-y"));
    push(&mut a, Message::StreamStop);
    // Subtransaction 11 aborts: both its changes go, 10-a stays.
    push(
        &mut a,
        Message::StreamAbort {
            xid: 10,
            subxid: 11,
            abort: None,
        },
    );
    push(
        &mut a,
        Message::StreamStart {
            xid: 10,
            first_segment: false,
        },
    );
    push(&mut a, insert(Some(12), 1, "10-sub12"));
    push(&mut a, insert(Some(10), 1, "10-b"));
    push(&mut a, Message::StreamStop);
    // Transaction 20 aborts entirely.
    push(
        &mut a,
        Message::StreamAbort {
            xid: 20,
            subxid: 20,
            abort: None,
        },
    );
    assert!(a.stats().spilled >= 1);
    let t = committed(push(
        &mut a,
        Message::StreamCommit {
            xid: 10,
            flags: 0,
            commit_lsn: Lsn(90),
            end_lsn: Lsn(91),
            commit_time: PgTimestamp(0),
        },
    ));
    assert_eq!(t.info.commit_lsn, Lsn(90));
    assert!(t.changes.is_spilled());
    assert_eq!(values(t), ["10-a", "10-sub12", "10-b"]);
    assert_eq!(a.stats().aborted, 1);
    // Spill files are gone once read back or discarded.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .map(|d| d.count())
        .into_iter()
        .collect();
    assert_eq!(left, [0]);
}

#[test]
fn relations_inside_a_stream_stay_with_that_transaction() {
    let (_dir, mut a) = assembler(1 << 20);
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        &mut a,
        Message::StreamStart {
            xid: 10,
            first_segment: true,
        },
    );
    a.set_relation(relation(1, &["id", "added"]), Some(10))
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        &mut a,
        Message::Insert {
            xid: Some(10),
            relation_id: 1,
            new: vec![text("1"), text("2")],
        },
    );
    push(&mut a, Message::StreamStop);
    // A plain transaction still uses the committed one-column shape.
    push(&mut a, begin(5, 2));
    push(&mut a, insert(None, 1, "x"));
    committed(push(&mut a, commit(5, 6)));
    let t = committed(push(
        &mut a,
        Message::StreamCommit {
            xid: 10,
            flags: 0,
            commit_lsn: Lsn(9),
            end_lsn: Lsn(10),
            commit_time: PgTimestamp(0),
        },
    ));
    let changes: Vec<_> = t
        .changes
        .into_changes()
        .unwrap_or_else(|e| panic!("{e}"))
        .collect();
    let Ok(Change::Insert { relation, .. }) = &changes[0] else {
        panic!("not an insert")
    };
    assert_eq!(relation.columns.len(), 2);
    // pgoutput counts the schema as sent once the streamed transaction
    // commits: later plain transactions get no Relation message and use it.
    push(&mut a, begin(15, 3));
    push(
        &mut a,
        Message::Insert {
            xid: None,
            relation_id: 1,
            new: vec![text("3"), text("4")],
        },
    );
    let later = committed(push(&mut a, commit(15, 16)));
    let changes: Vec<_> = later
        .changes
        .into_changes()
        .unwrap_or_else(|e| panic!("{e}"))
        .collect();
    let Ok(Change::Insert { relation, .. }) = &changes[0] else {
        panic!("not an insert")
    };
    assert_eq!(relation.columns.len(), 2);
}

#[test]
fn a_relation_first_described_in_a_stream_serves_later_transactions() {
    let (_dir, mut a) = assembler(1 << 20);
    push(
        &mut a,
        Message::StreamStart {
            xid: 10,
            first_segment: true,
        },
    );
    a.set_relation(relation(7, &["id"]), Some(10))
        .unwrap_or_else(|e| panic!("{e}"));
    push(&mut a, insert(Some(10), 7, "1"));
    push(&mut a, Message::StreamStop);
    committed(push(
        &mut a,
        Message::StreamCommit {
            xid: 10,
            flags: 0,
            commit_lsn: Lsn(9),
            end_lsn: Lsn(10),
            commit_time: PgTimestamp(0),
        },
    ));
    push(&mut a, begin(15, 3));
    push(&mut a, insert(None, 7, "2"));
    let t = committed(push(&mut a, commit(15, 16)));
    assert_eq!(values(t), vec!["2".to_owned()]);
}

#[test]
fn two_phase_commit_and_rollback() {
    let (_dir, mut a) = assembler(1 << 20);
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let prepare = |gid: &str, lsn: u64| PrepareBody {
        flags: 0,
        prepare_lsn: Lsn(lsn),
        end_lsn: Lsn(lsn + 1),
        prepare_time: PgTimestamp(0),
        xid: 3,
        gid: gid.into(),
    };
    for (gid, lsn) in [("keep", 10), ("drop", 20)] {
        push(
            &mut a,
            Message::BeginPrepare {
                prepare_lsn: Lsn(lsn),
                end_lsn: Lsn(lsn + 1),
                prepare_time: PgTimestamp(0),
                xid: 3,
                gid: gid.into(),
            },
        );
        push(&mut a, insert(None, 1, gid));
        assert!(matches!(
            push(&mut a, Message::Prepare(prepare(gid, lsn))),
            Assembled::Nothing
        ));
    }
    assert_eq!(a.oldest_pending_prepare(), Some(Lsn(10)));
    let rollback = Message::RollbackPrepared {
        flags: 0,
        prepare_end_lsn: Lsn(21),
        rollback_end_lsn: Lsn(30),
        prepare_time: PgTimestamp(0),
        rollback_time: PgTimestamp(0),
        xid: 3,
        gid: "drop".into(),
    };
    assert!(matches!(push(&mut a, rollback), Assembled::Nothing));
    let t = committed(push(
        &mut a,
        Message::CommitPrepared {
            flags: 0,
            commit_lsn: Lsn(40),
            end_lsn: Lsn(41),
            commit_time: PgTimestamp(0),
            xid: 3,
            gid: "keep".into(),
        },
    ));
    assert_eq!(t.info.gid.as_deref(), Some("keep"));
    assert_eq!(t.info.end_lsn, Lsn(41));
    assert_eq!(values(t), ["keep"]);
    assert_eq!(a.oldest_pending_prepare(), None);
}

#[test]
fn memory_stays_under_the_threshold() {
    let (_dir, mut a) = assembler(64 * 1024);
    a.set_relation(relation(1, &["id"]), None)
        .unwrap_or_else(|e| panic!("{e}"));
    push(&mut a, begin(1, 1));
    let payload = "x".repeat(1000);
    for _ in 0..10_000 {
        push(&mut a, insert(None, 1, &payload));
        let held = a.current.as_ref().map_or(0, |t| t.changes.memory_bytes);
        assert!(held <= 64 * 1024 + 2000, "{held} bytes held in memory");
    }
    let t = committed(push(&mut a, commit(1, 2)));
    assert_eq!(t.changes.len(), 10_000);
    assert_eq!(values(t).len(), 10_000);
}
