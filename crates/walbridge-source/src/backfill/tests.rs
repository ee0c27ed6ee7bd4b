use std::sync::Arc;

use bytes::Bytes;
use walbridge_core::{
    Change, Column, Datum, Lsn, OldRow, OldRowKind, Relation, ReplicaIdentity, Row, Truncate,
    TruncateOptions, ValueKind,
};

use super::*;

fn relation() -> Arc<Relation> {
    let column = |name: &str, type_name: &str, is_key: bool| Column {
        name: name.into(),
        type_oid: 20,
        type_modifier: -1,
        type_name: type_name.into(),
        kind: ValueKind::Int8,
        is_key,
        attnum: 0,
        not_null: false,
        missing_value: None,
    };
    Arc::new(Relation {
        id: 7,
        schema: "public".into(),
        name: "t".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![column("id", "int8", true), column("v", "int8", false)],
        partition_root: None,
        primary_key: vec![0],
    })
}

fn row(id: i64, v: i64) -> Row {
    vec![
        Datum::Text(Bytes::from(id.to_string())),
        Datum::Text(Bytes::from(v.to_string())),
    ]
}

fn insert(r: &Arc<Relation>, id: i64, v: i64) -> Change {
    Change::Insert {
        lsn: Lsn(1),
        relation: r.clone(),
        new: row(id, v),
    }
}

fn update(r: &Arc<Relation>, from: i64, to: i64, v: i64) -> Change {
    Change::Update {
        lsn: Lsn(1),
        relation: r.clone(),
        old: (from != to).then(|| OldRow {
            kind: OldRowKind::Key,
            row: vec![Datum::Text(Bytes::from(from.to_string())), Datum::Null],
        }),
        new: row(to, v),
    }
}

fn delete(r: &Arc<Relation>, id: i64) -> Change {
    Change::Delete {
        lsn: Lsn(1),
        relation: r.clone(),
        old: OldRow {
            kind: OldRowKind::Key,
            row: vec![Datum::Text(Bytes::from(id.to_string())), Datum::Null],
        },
    }
}

fn key(id: i64) -> ReadKey {
    ReadKey {
        parts: vec![KeyPart::Integer(id)],
        text: vec![id.to_string()],
    }
}

fn copies(mode: CopyMode) -> Copies {
    let mut c = Copies::default();
    c.start(&StoredCopy {
        oid: 7,
        table: "public.t".into(),
        mode,
        after: None,
        marks: Vec::new(),
        sink: None,
    });
    c
}

/// Passes `change` of `xid` through, returning what goes downstream.
fn pass(c: &mut Copies, xid: u32, change: Change) -> Vec<Change> {
    let mut out = Vec::new();
    let mut finished = Vec::new();
    c.filter(xid, change, &mut out, &mut finished);
    out
}

/// A chunk (after, up_to] read under a snapshot showing xids below 100.
fn chunk(
    c: &mut Copies,
    id: u64,
    r: &Arc<Relation>,
    rows: &[(i64, i64)],
    up_to: Option<i64>,
) -> (ChunkRead, tokio::sync::oneshot::Receiver<bool>) {
    let (done, told) = tokio::sync::oneshot::channel();
    c.announce(Opening {
        id,
        oid: 7,
        up_to: up_to.map(|u| key(u).parts),
    });
    assert!(c.low(id));
    (
        ChunkRead {
            id,
            oid: 7,
            relation: r.clone(),
            rows: rows.iter().map(|&(k, v)| (key(k), row(k, v))).collect(),
            snapshot: PgSnapshot {
                xmin: 100,
                xmax: 100,
                running: Vec::new(),
            },
            up_to: up_to.map(key),
            key: vec![(0, walbridge_core::KeyOrder::Value)],
            done,
        },
        told,
    )
}

fn ids(changes: &[Change]) -> Vec<(char, i64)> {
    let id = |row: &Row| match &row[0] {
        Datum::Text(t) => std::str::from_utf8(t)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1),
        _ => -1,
    };
    changes
        .iter()
        .map(|c| match c {
            Change::Insert { new, .. } => ('c', id(new)),
            Change::Read { new, .. } => ('r', id(new)),
            Change::Update { new, .. } => ('u', id(new)),
            Change::Delete { old, .. } => ('d', id(&old.row)),
            _ => ('?', -1),
        })
        .collect()
}

#[test]
fn a_new_tables_changes_wait_for_their_chunk_and_follow_its_rows() {
    let r = relation();
    let mut c = copies(CopyMode::NewTable);
    // Before any chunk: everything is ahead, left out.
    assert!(pass(&mut c, 50, insert(&r, 5, 0)).is_empty());
    let (read, mut told) = chunk(&mut c, 1, &r, &[(1, 1), (5, 0)], Some(10));
    // In the window: kept aside. xid 90 is in the read, xid 120 is not.
    assert!(pass(&mut c, 90, update(&r, 1, 1, 2)).is_empty());
    assert!(pass(&mut c, 120, update(&r, 5, 5, 7)).is_empty());
    assert!(pass(&mut c, 120, insert(&r, 8, 8)).is_empty());
    // Ahead of the chunk: left out.
    assert!(pass(&mut c, 120, insert(&r, 11, 0)).is_empty());
    let unit = c.high(read, Lsn(500)).unwrap_or_else(|| panic!("no unit"));
    assert_eq!(told.try_recv(), Ok(true));
    assert_eq!(
        ids(&unit.changes),
        vec![('r', 1), ('r', 5), ('u', 5), ('c', 8)],
        "the rows, then what the read did not show"
    );
    // Copied keys stream as usual now; later ones still wait.
    assert_eq!(ids(&pass(&mut c, 130, delete(&r, 5))), vec![('d', 5)]);
    assert!(pass(&mut c, 130, delete(&r, 11)).is_empty());
}

#[test]
fn a_row_moving_between_copied_and_uncopied_keys_is_split() {
    let r = relation();
    let mut c = copies(CopyMode::NewTable);
    let (read, _told) = chunk(&mut c, 1, &r, &[(1, 1)], Some(10));
    c.high(read, Lsn(500));
    // From copied to ahead: only its leaving.
    assert_eq!(
        ids(&pass(&mut c, 130, update(&r, 1, 20, 0))),
        vec![('d', 1)]
    );
    // From ahead to copied: only its arriving.
    assert_eq!(
        ids(&pass(&mut c, 131, update(&r, 30, 2, 0))),
        vec![('c', 2)]
    );
    // Both copied: as it is.
    assert_eq!(ids(&pass(&mut c, 132, update(&r, 2, 3, 0))), vec![('u', 3)]);
}

#[test]
fn a_resync_streams_everything_and_applies_late_window_changes_again() {
    let r = relation();
    let mut c = copies(CopyMode::Resync);
    assert_eq!(ids(&pass(&mut c, 50, insert(&r, 5, 0))), vec![('c', 5)]);
    let (read, _told) = chunk(&mut c, 1, &r, &[(1, 1), (2, 2), (3, 3)], Some(3));
    assert_eq!(ids(&pass(&mut c, 90, update(&r, 1, 1, 9))), vec![('u', 1)]);
    assert_eq!(ids(&pass(&mut c, 120, update(&r, 2, 2, 9))), vec![('u', 2)]);
    assert_eq!(ids(&pass(&mut c, 121, insert(&r, 0, 0))), vec![('c', 0)]);
    assert_eq!(
        ids(&pass(&mut c, 122, update(&r, 3, -1, 0))),
        vec![('u', -1)]
    );
    assert_eq!(ids(&pass(&mut c, 120, update(&r, 7, 7, 9))), vec![('u', 7)]);
    let unit = c.high(read, Lsn(500)).unwrap_or_else(|| panic!("no unit"));
    let Some(Change::ReadRange(range)) = unit.changes.first() else {
        panic!("no range first: {:?}", unit.changes.first());
    };
    assert_eq!(
        (&range.after, &range.up_to, &range.keys),
        (
            &None,
            &Some(vec!["3".to_owned()]),
            &vec![
                vec!["1".to_owned()],
                vec!["2".to_owned()],
                vec!["3".to_owned()]
            ]
        ),
        "the range read, and the keys found in it"
    );
    assert_eq!(
        ids(&unit.changes[1..]),
        vec![
            ('r', 1),
            ('r', 2),
            ('r', 3),
            ('u', 2),
            ('r', 0),
            ('d', 3),
            ('r', -1)
        ],
        "the rows as read, then again what came after the read: an insert as an upsert, a moved row whole"
    );
}

#[test]
fn watermarks_of_unknown_chunks_and_stale_reads_are_ignored() {
    let r = relation();
    let mut c = copies(CopyMode::NewTable);
    assert!(!c.low(42), "not announced (an earlier run's)");
    let (read, mut told) = chunk(&mut c, 1, &r, &[(1, 1)], Some(10));
    c.reset_windows();
    assert!(c.high(read, Lsn(500)).is_none());
    assert!(told.try_recv().is_err(), "the worker reads it again");
}

#[test]
fn a_truncate_ends_the_copy() {
    let r = relation();
    let mut c = copies(CopyMode::NewTable);
    let mut out = Vec::new();
    let mut finished = Vec::new();
    c.filter(
        60,
        Change::Truncate(Truncate {
            lsn: Lsn(1),
            relations: vec![r.clone()],
            options: TruncateOptions::default(),
        }),
        &mut out,
        &mut finished,
    );
    assert_eq!(finished, vec![7]);
    assert_eq!(out.len(), 1);
    assert_eq!(ids(&pass(&mut c, 61, insert(&r, 1, 1))), vec![('c', 1)]);
}

#[test]
fn a_new_tables_rows_before_it_has_a_key_wait_for_the_copy() {
    let keyless = Arc::new(Relation {
        replica_identity: ReplicaIdentity::Default,
        columns: relation()
            .columns
            .iter()
            .map(|c| Column {
                is_key: false,
                attnum: 0,
                not_null: false,
                missing_value: None,
                ..c.clone()
            })
            .collect(),
        primary_key: Vec::new(),
        ..(*relation()).clone()
    });
    let mut c = copies(CopyMode::NewTable);
    assert!(
        pass(&mut c, 50, insert(&keyless, 1, 0)).is_empty(),
        "CREATE TABLE AS: the rows come before the key"
    );
    let mut r = copies(CopyMode::Resync);
    assert_eq!(
        ids(&pass(&mut r, 50, insert(&keyless, 1, 0))),
        vec![('c', 1)]
    );
}

#[test]
fn a_resync_delivers_a_row_moving_from_unread_keys_whole() {
    let r = relation();
    let mut c = copies(CopyMode::Resync);
    let (read, _told) = chunk(&mut c, 1, &r, &[(1, 1)], Some(10));
    c.high(read, Lsn(500));
    // The target may lack row 30 (not re-read yet): row 2 is written whole.
    assert_eq!(
        ids(&pass(&mut c, 130, update(&r, 30, 2, 0))),
        vec![('d', 30), ('r', 2)]
    );
    // Within the part read, or within the part not read: as it is.
    assert_eq!(ids(&pass(&mut c, 131, update(&r, 2, 3, 0))), vec![('u', 3)]);
    assert_eq!(
        ids(&pass(&mut c, 132, update(&r, 30, 40, 0))),
        vec![('u', 40)]
    );
}

#[test]
fn a_replaced_table_is_truncated_then_read_whole_then_given_its_late_changes_as_they_were() {
    let r = relation();
    let mut c = copies(CopyMode::Replace);
    // Outside the window: as it is.
    assert_eq!(ids(&pass(&mut c, 50, insert(&r, 5, 0))), vec![('c', 5)]);
    let (read, _told) = chunk(&mut c, 1, &r, &[(5, 0), (1, 1)], None);
    // In the window, every change streams; those the read does not show
    // (xid 100 and up) come again after the rows, unchanged.
    assert_eq!(ids(&pass(&mut c, 90, update(&r, 1, 1, 9))), vec![('u', 1)]);
    assert_eq!(ids(&pass(&mut c, 120, insert(&r, 8, 8))), vec![('c', 8)]);
    assert_eq!(ids(&pass(&mut c, 121, delete(&r, 5))), vec![('d', 5)]);
    let unit = c.high(read, Lsn(500)).unwrap_or_else(|| panic!("no unit"));
    let Some(Change::Truncate(truncate)) = unit.changes.first() else {
        panic!("no truncate first: {:?}", unit.changes.first());
    };
    assert_eq!(truncate.relations.len(), 1);
    assert_eq!(
        ids(&unit.changes[1..]),
        vec![('r', 5), ('r', 1), ('c', 8), ('d', 5)]
    );
    assert!(unit.up_to.is_none(), "one unit: the copy is complete");
}
