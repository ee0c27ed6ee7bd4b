//! The hand-off against a real log: readers that keep up take records
//! from memory, and what they take is exactly what the file gives; a
//! reader that falls behind reads on from the file and takes from memory
//! again once it has caught up.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use walbridge_core::{
    Change, Column, Datum, LogicalMessage, Lsn, OldRow, OldRowKind, PgTimestamp, Relation,
    ReplicaIdentity, SequenceValue, SequenceValues, SourceEvent, TransactionInfo, ValueKind,
};
use walbridge_log::{Appender, Entry, Log, LogOptions, LogReader, ReadRecord, Visibility};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn relation() -> Arc<Relation> {
    let column = |name: &str, type_oid, type_name: &str, kind, is_key, attnum| Column {
        name: name.into(),
        type_oid,
        type_modifier: -1,
        type_name: type_name.into(),
        kind,
        is_key,
        attnum,
        not_null: is_key,
        missing_value: None,
    };
    Arc::new(Relation {
        id: 16384,
        schema: "public".into(),
        name: "accounts".into(),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            column("id", 23, "int4", ValueKind::Int4, true, 1),
            column("note", 25, "text", ValueKind::Text, false, 2),
        ],
        partition_root: None,
        primary_key: vec![0],
    })
}

fn text(s: String) -> Datum {
    Datum::Text(Bytes::from(s))
}

/// Transaction `i`: one to three changes of every kind, or, `large`, five
/// inserts of more than a record's bytes, so it is written in chunks.
fn transaction(i: u64, large: bool, relation: &Arc<Relation>) -> Vec<SourceEvent> {
    let lsn = Lsn(1_000 + i * 100);
    let info = Arc::new(TransactionInfo {
        xid: i as u32,
        commit_lsn: lsn,
        end_lsn: Lsn(lsn.0 + 8),
        commit_time: PgTimestamp(i as i64 * 1_000),
        origin: None,
        gid: None,
        for_sink: None,
    });
    let note = if large {
        "x".repeat(300_000)
    } else {
        format!("note {i}")
    };
    let changes = if large { 5 } else { 1 + i % 3 };
    let mut events = vec![SourceEvent::Begin(info.clone())];
    for c in 0..changes {
        let key = text(format!("{}", i * 10 + c));
        let change = match (i + c) % 3 {
            _ if large => Change::Insert {
                lsn: Lsn(lsn.0 - 50 + c),
                relation: relation.clone(),
                new: vec![key, text(note.clone())],
            },
            0 => Change::Insert {
                lsn: Lsn(lsn.0 - 50 + c),
                relation: relation.clone(),
                new: vec![key, text(note.clone())],
            },
            1 => Change::Update {
                lsn: Lsn(lsn.0 - 50 + c),
                relation: relation.clone(),
                old: None,
                new: vec![key, Datum::UnchangedToast],
            },
            _ => Change::Delete {
                lsn: Lsn(lsn.0 - 50 + c),
                relation: relation.clone(),
                old: OldRow {
                    kind: OldRowKind::Key,
                    row: vec![key, Datum::Null],
                },
            },
        };
        events.push(SourceEvent::Change(change));
    }
    events.push(SourceEvent::Commit(info));
    events
}

/// What follows transaction `i`, now and then: a message or sequences.
fn between(i: u64) -> Option<SourceEvent> {
    let lsn = Lsn(1_000 + i * 100 + 10);
    match i % 25 {
        7 => Some(SourceEvent::Message(LogicalMessage {
            lsn,
            transactional: false,
            prefix: format!("m{i}"),
            content: Bytes::from(vec![i as u8; 100]),
        })),
        19 => Some(SourceEvent::Sequences(SequenceValues {
            lsn,
            read_time: PgTimestamp(i as i64),
            sequences: vec![SequenceValue {
                schema: "public".into(),
                name: "accounts_id_seq".into(),
                last_value: i as i64,
            }],
        })),
        _ => None,
    }
}

/// Appends transactions `range`. After every fourth, waits until it is
/// durable and `readers` have read everything readable (each reports its
/// position after reading all it could), as readers keeping up with a
/// steady stream do between its transactions: what follows is handed to
/// them.
async fn append(
    appender: &mut Appender,
    range: std::ops::Range<u64>,
    relation: &Arc<Relation>,
    (log, readers): (&Log, &mut [watch::Receiver<u64>]),
) {
    for i in range {
        let large = i % 40 == 39;
        let after = between(i);
        // The LSN the log gives the last record (see Appender).
        let last_lsn = Lsn(1_000 + i * 100 + if after.is_some() { 10 } else { 8 });
        // Two batches of three are written by the appender itself, one by
        // the writer thread: both hand records over.
        appender.begin_batch(i % 3 != 1);
        for event in transaction(i, large, relation).into_iter().chain(after) {
            ok(appender.append(event).await);
        }
        ok(appender.end_batch().await);
        if i % 4 == 0 {
            let caught_up = async {
                let mut head = log.subscribe();
                let head = *head.wait_for(|h| h.last_lsn >= last_lsn).await?;
                for reader in readers.iter_mut() {
                    reader.wait_for(|&at| at >= head.next_seq).await?;
                }
                Ok::<(), watch::error::RecvError>(())
            };
            let waited = tokio::time::timeout(Duration::from_secs(10), caught_up).await;
            assert!(
                matches!(waited, Ok(Ok(()))),
                "the readers did not catch up after {i}"
            );
        }
    }
}

/// Everything readable now.
fn read_now(reader: &mut LogReader) -> Vec<ReadRecord> {
    let mut records = Vec::new();
    while let Some(record) = ok(reader.try_next()) {
        records.push(record);
    }
    records
}

/// Whether `record` ends transaction `xid`.
fn commits(record: &ReadRecord, xid: u64) -> bool {
    matches!(&record.entry, Entry::Transaction { info, last: true, .. } if u64::from(info.xid) == xid)
}

/// Reads, waiting for new records, until transaction `xid` ends. Returns
/// the records and how many of them came from memory.
async fn read_through(reader: &mut LogReader, xid: u64) -> (Vec<ReadRecord>, u64) {
    follow(reader, xid, &watch::Sender::new(0)).await
}

/// [`read_through`], reporting its position to `at` each time it has read
/// everything readable.
async fn follow(
    reader: &mut LogReader,
    xid: u64,
    at: &watch::Sender<u64>,
) -> (Vec<ReadRecord>, u64) {
    let mut records = Vec::new();
    let before = reader.from_memory();
    loop {
        records.extend(read_now(reader));
        at.send_replace(reader.next_seq());
        if records.last().is_some_and(|r| commits(r, xid)) {
            return (records, reader.from_memory() - before);
        }
        let waited = tokio::time::timeout(Duration::from_secs(10), reader.wait()).await;
        assert!(waited.is_ok(), "no record after {}", reader.next_seq());
    }
}

fn from_file(log: &Log, visibility: Visibility) -> Vec<ReadRecord> {
    let mut reader = ok(log.reader_with(0, visibility));
    let records = read_now(&mut reader);
    assert_eq!(reader.from_memory(), 0);
    records
}

#[tokio::test]
async fn readers_that_keep_up_take_from_memory_exactly_what_the_file_gives() {
    let dir = ok(tempfile::tempdir());
    let options = LogOptions {
        segment_size: 256 * 1024,
        ..LogOptions::default()
    };
    let (log, writer, _) = ok(Log::open(dir.path(), options));
    let relation = relation();
    let mut appender = Appender::new(writer);
    // Readers of every kind follow the writer from the start.
    let last = 399;
    let mut followers = Vec::new();
    let mut positions = Vec::new();
    for visibility in [
        Visibility::CompleteUnits,
        Visibility::Unfinished,
        Visibility::Written,
    ] {
        let mut reader = ok(log.reader_with(0, visibility));
        let at = watch::Sender::new(0);
        positions.push(at.subscribe());
        followers.push(tokio::spawn(
            async move { follow(&mut reader, last, &at).await },
        ));
    }
    append(
        &mut appender,
        0..last + 1,
        &relation,
        (&log, &mut positions),
    )
    .await;
    let mut followed = Vec::new();
    for follower in followers {
        followed.push(ok(follower.await));
    }
    ok(appender.close().await);

    let from_memory: u64 = followed.iter().map(|(_, m)| m).sum();
    assert_eq!(
        log.records_read(),
        (from_memory, 3 * followed[0].0.len() as u64 - from_memory)
    );
    let file = from_file(&log, Visibility::CompleteUnits);
    assert_eq!(file, from_file(&log, Visibility::Unfinished));
    assert_eq!(file, from_file(&log, Visibility::Written));
    // 400 transactions (10 in chunks), 16 messages, 16 sequence records.
    let chunks = file.iter().filter(|r| !r.unit_end).count();
    assert_eq!(file.len() - chunks, 400 + 16 + 16);
    assert!(chunks >= 10, "{chunks} chunks");
    let kinds = ["complete units", "unfinished units", "written records"];
    for (kind, (records, _)) in kinds.iter().zip(&followed) {
        assert!(
            *records == file,
            "what a reader of {kind} took differs from the file"
        );
    }
    // Most records came from memory (about 390 of 442 here): all but
    // those of a large transaction and the few after it (read from the
    // file until its reader subscribes again).
    for (kind, (_, from_memory)) in kinds.iter().zip(&followed) {
        assert!(
            *from_memory as usize > file.len() * 3 / 4,
            "the reader of {kind} took {from_memory} of {} records from memory",
            file.len()
        );
    }
}

#[tokio::test]
async fn a_reader_that_falls_behind_reads_on_from_the_file_then_from_memory_again() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), LogOptions::default()));
    let relation = relation();
    let mut appender = Appender::new(writer);
    let mut reader = ok(log.reader(0));
    assert!(read_now(&mut reader).is_empty());

    // Caught up: what is appended now is taken from memory.
    append_small(&mut appender, 0..10, &relation).await;
    let (records, from_memory) = read_through(&mut reader, 9).await;
    assert_eq!((records.len(), from_memory), (10, 10));

    // It stops reading while more than its share of memory is appended:
    // dropped from the hand-off, it reads on from the file where it was.
    append_small(&mut appender, 10..20_010, &relation).await;
    let (records, from_memory) = read_through(&mut reader, 20_009).await;
    assert_eq!(records.len(), 20_000);
    let file = from_file(&log, Visibility::CompleteUnits);
    assert!(
        records[..] == file[10..],
        "the reader that fell behind read something else"
    );
    assert!(
        from_memory < 10_000,
        "{from_memory} of 20,000 records came from memory although the reader fell behind"
    );

    // Caught up again, it takes from memory again.
    assert!(read_now(&mut reader).is_empty());
    append_small(&mut appender, 20_010..20_020, &relation).await;
    let (records, from_memory) = read_through(&mut reader, 20_019).await;
    assert_eq!((records.len(), from_memory), (10, 10));
    ok(appender.close().await);
}

/// Appends transactions of one record each, without pauses.
async fn append_small(
    appender: &mut Appender,
    range: std::ops::Range<u64>,
    relation: &Arc<Relation>,
) {
    for i in range {
        for event in transaction(i, false, relation) {
            ok(appender.append(event).await);
        }
    }
}
