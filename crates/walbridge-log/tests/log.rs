//! The log against a real file system: appends, reads and seeks, crash
//! recovery at every byte of the last record, corruption reports,
//! cursors, retention and max_size, segments written into zeros made ahead.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use walbridge_core::{LogicalMessage, Lsn};
use walbridge_log::{
    Entry, FsyncPolicy, Log, LogError, LogOptions, LogWriter, RecordEncoder, ResumePoint,
    Visibility, WhenFull,
};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// The payload of record `i`: a message whose content size varies.
fn payload(i: u64) -> Vec<u8> {
    let size = (i * 37 % 3000) as usize;
    RecordEncoder::default().message(&LogicalMessage {
        lsn: Lsn(i * 10),
        transactional: false,
        prefix: format!("r{i}"),
        content: Bytes::from(vec![(i % 251) as u8; size]),
    })
}

/// A record of about 100 kB.
fn big_record() -> Vec<u8> {
    RecordEncoder::default().message(&LogicalMessage {
        lsn: Lsn(1),
        transactional: false,
        prefix: "big".into(),
        content: Bytes::from(vec![7u8; 100_000]),
    })
}

fn prefix(entry: &Entry) -> String {
    match entry {
        Entry::Message(m) => m.prefix.clone(),
        other => panic!("unexpected record {other:?}"),
    }
}

fn small_segments() -> LogOptions {
    LogOptions {
        segment_size: 32 * 1024,
        ..LogOptions::default()
    }
}

async fn append_all(writer: &LogWriter, range: std::ops::Range<u64>) {
    for i in range {
        ok(writer.append(payload(i), Lsn(i * 10 + 5), true).await);
    }
}

/// Appends message `i`, with `size` bytes of content, as a unit readers
/// may take from memory.
async fn append_message(writer: &LogWriter, i: u64, size: usize) {
    let message = LogicalMessage {
        lsn: Lsn(i * 10),
        transactional: false,
        prefix: format!("r{i}"),
        content: Bytes::from(vec![1u8; size]),
    };
    let payload = RecordEncoder::default().message(&message);
    ok(writer
        .append_unit(payload, Entry::Message(message), Lsn(i * 10 + 5))
        .await);
}

/// Appends `range` on a task of its own (appends may wait at max_size); the task returns the writer.
fn spawn_appends(
    writer: LogWriter,
    range: std::ops::Range<u64>,
) -> tokio::task::JoinHandle<LogWriter> {
    tokio::spawn(async move {
        append_all(&writer, range).await;
        writer
    })
}

/// Options with small segments and a 96 kB `max_size`.
fn small_and_bounded(when_full: WhenFull) -> LogOptions {
    LogOptions {
        max_size: Some(96 * 1024),
        when_full,
        ..small_segments()
    }
}

async fn wait_for_head(log: &Log, next_seq: u64) {
    let mut head = log.subscribe();
    let waited = tokio::time::timeout(
        Duration::from_secs(10),
        head.wait_for(|h| h.next_seq >= next_seq),
    )
    .await;
    assert!(waited.is_ok(), "head did not reach {next_seq}");
}

fn read_all(log: &Log, from: u64) -> Vec<(u64, String)> {
    let mut reader = ok(log.reader(from));
    let mut out = Vec::new();
    while let Some(r) = ok(reader.try_next()) {
        out.push((r.seq, prefix(&r.entry)));
    }
    out
}

fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = ok(std::fs::read_dir(dir))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn records_read_back_in_order_from_any_position_across_segments() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    let mut last_lsn = log.subscribe_last_lsn();
    assert_eq!(*last_lsn.borrow_and_update(), Lsn::ZERO);
    append_all(&writer, 0..500).await;
    wait_for_head(&log, 500).await;
    // The source's watch follows the head.
    assert_eq!(last_lsn.has_changed().ok(), Some(true));
    assert_eq!(*last_lsn.borrow(), Lsn(499 * 10 + 5));
    assert!(segments(dir.path()).len() > 5, "segments rolled");
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 500);
    for (i, (seq, p)) in all.iter().enumerate() {
        assert_eq!((*seq, p.as_str()), (i as u64, format!("r{i}").as_str()));
    }
    for from in [1, 17, 100, 255, 499, 500] {
        let got = read_all(&log, from);
        assert_eq!(got.len() as u64, 500 - from);
        assert_eq!(got.first().map(|r| r.0), (from < 500).then_some(from));
    }
    assert_eq!(log.head().last_lsn, Lsn(499 * 10 + 5));
    ok(writer.close().await);

    // Reopened: same content, indexes loaded, appends continue.
    let (log, writer, recovery) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(*log.subscribe_last_lsn().borrow(), Lsn(499 * 10 + 5));
    assert_eq!(log.head().next_seq, 500);
    append_all(&writer, 500..510).await;
    wait_for_head(&log, 510).await;
    assert_eq!(read_all(&log, 250).len(), 260);
    ok(writer.close().await);
}

#[tokio::test]
async fn seq_after_lsn_finds_where_a_consumer_resumes() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    append_all(&writer, 0..300).await;
    wait_for_head(&log, 300).await;
    // Record i has LSN i*10+5.
    assert_eq!(ok(log.seq_after_lsn(Lsn(0))), 0);
    assert_eq!(ok(log.seq_after_lsn(Lsn(5))), 1);
    assert_eq!(ok(log.seq_after_lsn(Lsn(1234))), 123);
    assert_eq!(ok(log.seq_after_lsn(Lsn(1235))), 124);
    assert_eq!(ok(log.seq_after_lsn(Lsn(2995))), 300);
    assert_eq!(ok(log.seq_after_lsn(Lsn(1 << 40))), 300);
    ok(writer.close().await);
}

/// Cutting the segment anywhere inside its last record must leave exactly
/// the complete records before it, readable and appendable.
#[tokio::test]
async fn recovery_keeps_exactly_the_complete_records_at_every_cut() {
    let dir = ok(tempfile::tempdir());
    let original = dir.path().join("original");
    // One segment, grown by its appends (no zeros made ahead to roll into).
    let grown = LogOptions {
        preallocate: false,
        ..LogOptions::default()
    };
    let (log, writer, _) = ok(Log::open(&original, grown.clone()));
    append_all(&writer, 0..20).await;
    wait_for_head(&log, 20).await;
    ok(writer.close().await);
    let seg = segments(&original).remove(0);
    let bytes = ok(std::fs::read(&seg));
    let last_len = walbridge_log::frame::HEADER_LEN + payload(19).len();
    let last_start = bytes.len() - last_len;
    for cut in last_start..bytes.len() {
        let copy = dir.path().join(format!("cut-{cut}"));
        ok(std::fs::create_dir_all(&copy));
        ok(std::fs::write(
            copy.join(ok(seg.file_name().ok_or("no name"))),
            &bytes[..cut],
        ));
        let (log, writer, recovery) = ok(Log::open(&copy, grown.clone()));
        assert_eq!(log.head().next_seq, 19, "cut at {cut}");
        assert_eq!(log.head().last_lsn, Lsn(18 * 10 + 5));
        assert_eq!(recovery.truncated_bytes, (cut - last_start) as u64);
        assert_eq!(read_all(&log, 0).len(), 19);
        append_all(&writer, 19..21).await;
        wait_for_head(&log, 21).await;
        let all = read_all(&log, 0);
        assert_eq!(all.last().map(|r| r.1.as_str()), Some("r20"));
        ok(writer.close().await);
        ok(std::fs::remove_dir_all(&copy));
    }
}

#[tokio::test]
async fn an_unfinished_transaction_is_removed_even_across_segments() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    append_all(&writer, 0..10).await;
    // Chunks of a unit that never gets its last chunk, spanning several segments.
    for i in 10..200 {
        ok(writer.append(payload(i), Lsn(9999), false).await);
    }
    ok(writer.close().await);
    assert_eq!(
        log.head().next_seq,
        10,
        "the unfinished unit is never readable"
    );
    assert!(segments(dir.path()).len() > 3);
    let (log, writer, recovery) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(recovery.removed_records, 190);
    assert_eq!(log.head().next_seq, 10);
    assert_eq!(log.head().last_lsn, Lsn(9 * 10 + 5));
    append_all(&writer, 10..12).await;
    wait_for_head(&log, 12).await;
    assert_eq!(read_all(&log, 0).len(), 12);
    ok(writer.close().await);
}

/// Writes records `0..n` into a new log in `dir` (small segments) and
/// closes it: a log to damage, or to reopen.
async fn write_closed(dir: &Path, n: u64) {
    let (log, writer, _) = ok(Log::open(dir, small_segments()));
    append_all(&writer, 0..n).await;
    wait_for_head(&log, n).await;
    ok(writer.close().await);
}

#[tokio::test]
async fn damage_in_the_middle_is_an_error_naming_segment_and_offset() {
    let dir = ok(tempfile::tempdir());
    write_closed(dir.path(), 200).await;
    let first = segments(dir.path()).remove(0);
    let mut bytes = ok(std::fs::read(&first));
    let offset = 24 + walbridge_log::frame::HEADER_LEN + payload(0).len() + 40;
    bytes[offset] ^= 0x55;
    ok(std::fs::write(&first, &bytes));
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    let mut reader = ok(log.reader(0));
    assert!(ok(reader.try_next()).is_some());
    let err = reader
        .try_next()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("corrupt"), "{err}");
    assert!(err.contains(&first.display().to_string()), "{err}");
    assert!(
        err.contains(&format!(
            "offset {}",
            24 + walbridge_log::frame::HEADER_LEN + payload(0).len()
        )),
        "{err}"
    );
    ok(writer.close().await);
}

/// A crash while a roll creates the next segment: a walbridge before this
/// one named the file before writing its header, and left it empty; this
/// one writes the header under another name first. Opening removes both
/// leftovers and goes on from the records before them.
#[tokio::test]
async fn a_segment_whose_creation_a_crash_cut_short_is_removed() {
    let dir = ok(tempfile::tempdir());
    write_closed(dir.path(), 100).await;
    let before = segments(dir.path());
    assert!(before.len() > 1, "{before:?}");
    assert!(files(dir.path(), "creating").is_empty());
    let empty = dir.path().join(format!("{:020}.seg", 100));
    ok(std::fs::write(&empty, b""));
    let creating = dir.path().join(format!("{:020}.creating", 101));
    ok(std::fs::write(&creating, b"walbridge"));

    let (log, writer, recovery) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(recovery, walbridge_log::Recovery::default());
    assert_eq!(segments(dir.path()), before);
    assert!(!creating.exists());
    assert_eq!(log.head().next_seq, 100);
    append_all(&writer, 100..200).await;
    wait_for_head(&log, 200).await;
    let all: Vec<String> = read_all(&log, 0).into_iter().map(|r| r.1).collect();
    let expected: Vec<String> = (0..200).map(|i| format!("r{i}")).collect();
    assert_eq!(all, expected);
    ok(writer.close().await);
}

#[tokio::test]
async fn damage_too_far_from_the_end_of_the_last_segment_is_not_taken_for_a_torn_write() {
    let dir = ok(tempfile::tempdir());
    // Large enough for more than a write batch of records after the damage.
    let zero_filled = preallocated(16 << 20);
    let (log, writer, _) = ok(Log::open(dir.path(), zero_filled.clone()));
    let next = write_until_into_zeros(&log, &writer, dir.path(), 0, || {}).await;
    let big = big_record();
    for i in next..next + 120 {
        ok(writer.append(big.clone(), Lsn(i), true).await);
    }
    wait_for_head(&log, next + 120).await;
    ok(writer.close().await);
    let seg = ok(segments(dir.path()).pop().ok_or("no segment"));
    // Preallocated: the zeros after the records do not count as the end
    // the damage is measured from.
    assert_eq!(file_len(&seg), 16 << 20);
    let mut bytes = ok(std::fs::read(&seg));
    bytes[24 + walbridge_log::frame::HEADER_LEN] ^= 1;
    ok(std::fs::write(&seg, &bytes));
    match Log::open(dir.path(), zero_filled.clone()) {
        Err(LogError::Corrupt { offset, .. }) => assert_eq!(offset, 24),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("corruption 12 MB before the end was taken for a torn write"),
    }
}

#[tokio::test]
async fn segments_behind_every_cursor_are_removed_and_retention_keeps_history() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    log.register_cursor("a", 0);
    log.register_cursor("b", 0);
    append_all(&writer, 0..400).await;
    wait_for_head(&log, 400).await;
    let before = segments(dir.path()).len();
    ok(log.advance_cursor("a", 400));
    assert_eq!(segments(dir.path()).len(), before, "b still needs them");
    ok(log.advance_cursor("b", 200));
    let after = segments(dir.path()).len();
    assert!(after < before);
    assert!(log.first_seq() <= 200);
    assert_eq!(read_all(&log, 200).len(), 200);
    assert!(matches!(log.reader(0), Err(LogError::Gone { .. })));
    ok(log.advance_cursor("b", 400));
    assert_eq!(
        segments(dir.path()).len(),
        1,
        "only the active segment is left"
    );
    assert_eq!(log.head().last_lsn, Lsn(399 * 10 + 5));
    ok(writer.close().await);
    // The resume LSN survives the removal of every record.
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(log.head().last_lsn, Lsn(399 * 10 + 5));
    ok(writer.close().await);

    let kept = ok(tempfile::tempdir());
    let options = LogOptions {
        retention_size: Some(100 * 1024),
        ..small_segments()
    };
    let (log, writer, _) = ok(Log::open(kept.path(), options));
    log.register_cursor("a", 0);
    append_all(&writer, 0..400).await;
    wait_for_head(&log, 400).await;
    ok(log.advance_cursor("a", 400));
    let size = log.size();
    assert!(size <= 100 * 1024 + 32 * 1024 + 4096, "{size}");
    assert!(size >= 60 * 1024, "history is kept for replay: {size}");
    ok(writer.close().await);
}

#[tokio::test]
async fn at_max_size_appends_block_until_the_slow_cursor_moves() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_and_bounded(WhenFull::Block)));
    log.register_cursor("slow", 0);
    let appending = spawn_appends(writer, 0..300);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!appending.is_finished(), "appends stop at max_size");
    let stuck_at = log.head().next_seq;
    assert!(stuck_at < 300);
    assert!(log.size() <= 96 * 1024 + 40 * 1024);
    // The consumer catches up bit by bit; the appends go on.
    while !appending.is_finished() {
        let head = log.head().next_seq;
        ok(log.advance_cursor("slow", head));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let writer = ok(appending.await);
    wait_for_head(&log, 300).await;
    ok(writer.close().await);
}

#[tokio::test]
async fn at_max_size_a_unit_begun_is_finished_and_the_next_waits() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_and_bounded(WhenFull::DropSink)));
    log.register_cursor("stuck", 0);
    log.register_cursor("other", 0);
    // One unit of 120 records, past max_size: no cursor can move inside
    // it, so waiting at max_size there would wait for good.
    let unit = tokio::spawn(async move {
        for i in 0..120 {
            ok(writer.append(payload(i), Lsn(10_000), i == 119).await);
        }
        writer
    });
    let writer = ok(tokio::time::timeout(Duration::from_secs(10), unit)
        .await
        .unwrap_or_else(|_| panic!("the unit did not finish")));
    wait_for_head(&log, 120).await;
    assert!(log.size() > 96 * 1024, "the unit went past max_size");
    // The next unit waits until a cursor moves on.
    let next = spawn_appends(writer, 120..121);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!next.is_finished());
    ok(log.advance_cursor("other", 120));
    assert!(log.is_dropped("stuck"));
    let writer = ok(next.await);
    ok(writer.close().await);
}

#[tokio::test]
async fn at_max_size_drop_sink_gives_up_on_the_slow_cursor() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_and_bounded(WhenFull::DropSink)));
    log.register_cursor("slow", 0);
    log.register_cursor("fast", 0);
    let appending = spawn_appends(writer, 0..400);
    // `fast` keeps up, a little behind the head; `slow` never moves.
    while !appending.is_finished() {
        let head = log.head().next_seq;
        ok(log.advance_cursor("fast", head.saturating_sub(3)));
        assert!(log.size() <= 96 * 1024 + 40 * 1024, "{}", log.size());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let writer = ok(appending.await);
    wait_for_head(&log, 400).await;
    ok(log.advance_cursor("fast", 400));
    assert!(log.is_dropped("slow"));
    assert!(!log.is_dropped("fast"));
    assert!(log.size() <= 96 * 1024 + 40 * 1024, "{}", log.size());
    ok(writer.close().await);
}

#[tokio::test]
async fn interval_fsync_makes_appends_readable_at_once_and_survives_reopen() {
    let dir = ok(tempfile::tempdir());
    let options = LogOptions {
        fsync: FsyncPolicy::Interval(Duration::from_millis(50)),
        ..small_segments()
    };
    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    append_all(&writer, 0..100).await;
    wait_for_head(&log, 100).await;
    // The last segment's records are fsynced within the interval by the
    // sync thread, nothing more appended; the writer thread fsyncs only
    // the segments it seals.
    let synced = tokio::time::timeout(Duration::from_secs(10), async {
        while log.syncs().sync_thread == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        synced.is_ok(),
        "no fsync by the sync thread: {:?}",
        log.syncs()
    );
    let syncs = log.syncs();
    assert_eq!(syncs.writer, segments(dir.path()).len() as u64 - 1);
    assert_eq!(syncs.appender, 0);
    ok(writer.close().await);
    let (log, writer, recovery) = ok(Log::open(dir.path(), options));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0).len(), 100);
    ok(writer.close().await);
}

#[tokio::test]
async fn a_reader_waits_for_new_records() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    let mut reader = ok(log.reader(0));
    assert!(ok(reader.try_next()).is_none());
    let follower = tokio::spawn(async move {
        let mut seen = 0;
        while seen < 50 {
            match ok(reader.try_next()) {
                Some(r) => {
                    assert_eq!(r.seq, seen);
                    seen += 1;
                }
                None => reader.wait().await,
            }
        }
        seen
    });
    append_all(&writer, 0..50).await;
    let seen = ok(tokio::time::timeout(Duration::from_secs(10), follower).await);
    assert_eq!(ok(seen), 50);
    ok(writer.close().await);
}

#[tokio::test]
async fn retention_time_keeps_read_segments_until_they_are_old_enough() {
    let dir = ok(tempfile::tempdir());
    let options = LogOptions {
        retention_time: Some(Duration::from_millis(400)),
        ..small_segments()
    };
    let (log, writer, _) = ok(Log::open(dir.path(), options));
    log.register_cursor("a", 0);
    append_all(&writer, 0..300).await;
    wait_for_head(&log, 300).await;
    let before = segments(dir.path()).len();
    ok(log.advance_cursor("a", 300));
    assert_eq!(
        segments(dir.path()).len(),
        before,
        "young segments are kept for replay"
    );
    assert_eq!(read_all(&log, 0).len(), 300, "and can be replayed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    ok(log.collect());
    assert_eq!(segments(dir.path()).len(), 1, "old ones go");
    ok(writer.close().await);
}

#[tokio::test]
async fn drop_sink_drops_only_the_slowest_even_when_another_is_a_little_behind() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_and_bounded(WhenFull::DropSink)));
    log.register_cursor("stuck", 0);
    log.register_cursor("behind", 0);
    let appending = spawn_appends(writer, 0..200);
    // While both are level, nobody is dropped: the appends wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!appending.is_finished());
    assert!(!log.is_dropped("stuck") && !log.is_dropped("behind"));
    // Both still hold the first segment; only the one furthest behind goes.
    ok(log.advance_cursor("behind", 1));
    assert!(log.is_dropped("stuck"));
    assert!(!log.is_dropped("behind"));
    assert_eq!(log.first_seq(), 0, "the segment `behind` needs stays");
    while !appending.is_finished() {
        ok(log.advance_cursor("behind", log.head().next_seq));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let writer = ok(appending.await);
    ok(log.advance_cursor("behind", 200));
    assert!(!log.is_dropped("behind"));
    assert!(log.size() <= 96 * 1024, "{}", log.size());
    ok(writer.close().await);
}

#[tokio::test]
async fn an_unfinished_unit_is_seen_only_by_readers_that_ask_for_it_and_gone_after_reopen() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    append_all(&writer, 0..3).await;
    // Three records of a unit that has not ended.
    for i in 3..6 {
        ok(writer.append(payload(i), Lsn(i * 10 + 5), false).await);
    }
    wait_for_head(&log, 3).await;
    let mut complete = ok(log.reader(0));
    let mut unfinished = ok(log.reader_with(0, Visibility::Unfinished));
    let seen = |reader: &mut walbridge_log::LogReader| {
        let mut seqs = Vec::new();
        while let Some(r) = ok(reader.try_next()) {
            seqs.push((r.seq, r.unit_end));
        }
        seqs
    };
    let mut read = Vec::new();
    while read.len() < 6 {
        read.extend(seen(&mut unfinished));
        if read.len() < 6 {
            ok(tokio::time::timeout(Duration::from_secs(10), unfinished.wait()).await);
        }
    }
    assert_eq!(
        read,
        [
            (0, true),
            (1, true),
            (2, true),
            (3, false),
            (4, false),
            (5, false)
        ]
    );
    assert_eq!(seen(&mut complete), [(0, true), (1, true), (2, true)]);
    // A crash before the unit ends: reopening removes it for everyone.
    drop(writer);
    drop(log);
    let (log, writer, recovery) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(recovery.removed_records, 3);
    let mut unfinished = ok(log.reader_with(0, Visibility::Unfinished));
    assert_eq!(seen(&mut unfinished).len(), 3);
    // A reader of unfinished units wakes for every durable record.
    let waiting = tokio::spawn(async move {
        unfinished.wait().await;
        ok(unfinished.try_next()).map(|r| (r.seq, r.unit_end))
    });
    ok(writer.append(payload(3), Lsn(35), false).await);
    let next = ok(ok(
        tokio::time::timeout(Duration::from_secs(10), waiting).await
    ));
    assert_eq!(next, Some((3, false)));
    ok(writer.close().await);
}

#[tokio::test]
async fn written_within_finds_the_oldest_segment_written_to_recently() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    log.register_cursor("a", 0);
    append_all(&writer, 0..150).await;
    wait_for_head(&log, 150).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    append_all(&writer, 150..300).await;
    wait_for_head(&log, 300).await;

    let (base, lsn) = ok(log.written_within(Duration::from_secs(3600)));
    assert_eq!(
        (base, lsn),
        (0, ok(log.start_lsn())),
        "everything is recent"
    );

    let (base, lsn) = ok(log.written_within(Duration::from_millis(300)));
    assert!(
        base > 0 && base <= 150,
        "the segment the second batch began in starts at or before 150, after 0: {base}"
    );
    assert!(
        lsn < Lsn(base * 10 + 5) && lsn >= Lsn((base - 1) * 10 + 5),
        "the LSN just before record {base}: {lsn}"
    );
    assert_eq!(read_all(&log, base).first().map(|r| r.0), Some(base));
    ok(writer.close().await);
}

/// The files in `dir` named `*.<extension>`.
fn files(dir: &Path, extension: &str) -> Vec<std::path::PathBuf> {
    ok(std::fs::read_dir(dir))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == extension))
        .collect()
}

fn file_len(path: &Path) -> u64 {
    ok(std::fs::metadata(path)).len()
}

/// The layout version in a segment's header.
fn version(seg: &Path) -> u32 {
    let bytes = ok(std::fs::read(seg));
    u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]])
}

/// Segments of `segment_size`, preallocated: a spare is asked for once a
/// segment has been written to for as long as it takes to fill at 8 MiB/s
/// (125 ms for 1 MiB).
fn preallocated(segment_size: u64) -> LogOptions {
    LogOptions {
        segment_size,
        preallocate: true,
        ..LogOptions::default()
    }
}

/// Appends records from `next` on, ten at a time with a pause between
/// (calling `each` after each ten), as a steady stream does, until the
/// log writes into a segment zero-filled ahead. Returns the next record.
async fn write_until_into_zeros(
    log: &Log,
    writer: &LogWriter,
    dir: &Path,
    mut next: u64,
    mut each: impl FnMut(),
) -> u64 {
    for _ in 0..400 {
        append_all(writer, next..next + 10).await;
        next += 10;
        wait_for_head(log, next).await;
        each();
        let last = ok(segments(dir).pop().ok_or("no segment"));
        if version(&last) == walbridge_log::segment::VERSION_PREALLOCATED {
            return next;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the log never wrote into zeros made ahead: {:?}",
        segments(dir)
    );
}

/// A new log's first segment grows as it is written (a new log is usually
/// followed by a bulk load). Once it has been written to for longer than
/// a bulk load takes to fill it, a spare is made and the writer moves
/// into it at once: a reader following the writer never takes the zeros
/// for records, a reopened log finds its end where the records end
/// (nothing to repair) and goes on writing into the same zeros.
#[tokio::test]
async fn a_steady_stream_moves_into_zeros_made_ahead_and_the_log_reopens_at_their_end() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    assert_eq!(
        version(&segments(dir.path())[0]),
        walbridge_log::segment::VERSION
    );
    let mut reader = ok(log.reader(0));
    let mut seen = Vec::new();
    let mut read = || {
        while let Some(r) = ok(reader.try_next()) {
            seen.push(prefix(&r.entry));
        }
    };
    let mut next = write_until_into_zeros(&log, &writer, dir.path(), 0, &mut read).await;
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 2, "{segs:?}");
    assert!(file_len(&segs[0]) < 1 << 20, "left before it was full");
    let bytes = ok(std::fs::read(&segs[0]));
    assert_ne!(bytes.last(), Some(&0), "the first segment grew");
    for _ in 0..5 {
        append_all(&writer, next..next + 30).await;
        next += 30;
        wait_for_head(&log, next).await;
        read();
    }
    let expected: Vec<String> = (0..next).map(|i| format!("r{i}")).collect();
    assert_eq!(seen, expected);
    assert_eq!(segments(dir.path()), segs);
    assert_eq!(file_len(&segs[1]), 1 << 20, "written into, not grown");
    ok(writer.close().await);

    let (log, writer, recovery) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(recovery.removed_records, 0);
    assert_eq!(log.head().next_seq, next);
    append_all(&writer, next..next + 100).await;
    wait_for_head(&log, next + 100).await;
    let all: Vec<String> = read_all(&log, 0).into_iter().map(|r| r.1).collect();
    let expected: Vec<String> = (0..next + 100).map(|i| format!("r{i}")).collect();
    assert_eq!(all, expected);
    assert_eq!(segments(dir.path()), segs);
    assert_eq!(file_len(&segs[1]), 1 << 20, "written on into the zeros");
    ok(writer.close().await);
}

/// A bulk load (the initial copy, a catch-up) fills each segment sooner
/// than a spare is asked for: it writes no zeros, its segments grow as
/// they are written. (16 MiB segments: a spare is asked for after 2 s of
/// writing one, which 16 MiB of appends take far less than.)
#[tokio::test]
async fn a_bulk_load_writes_no_zeros() {
    let dir = ok(tempfile::tempdir());
    let options = preallocated(16 << 20);
    let (log, writer, _) = ok(Log::open(dir.path(), options));
    let big = big_record();
    for i in 0..400 {
        ok(writer.append(big.clone(), Lsn(i), true).await);
    }
    wait_for_head(&log, 400).await;
    ok(writer.close().await);
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 3, "{segs:?}");
    assert!(
        segs.iter()
            .all(|s| version(s) == walbridge_log::segment::VERSION),
        "a segment was zero-filled ahead"
    );
    assert!(files(dir.path(), "spare").is_empty());
    assert!(files(dir.path(), "zeroing").is_empty());
}

/// A quiet source, whose segment would take longer than an hour to fill
/// at the rate it is written, gets no spare: its log is the size of its
/// records. (1 MiB segments: a spare is due after 125 ms of writing, but a
/// record of a hundred bytes every 300 ms would take hours to fill one.)
#[tokio::test]
async fn a_quiet_source_writes_no_zeros() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    for i in 0..4 {
        append_all(&writer, i..i + 1).await;
        wait_for_head(&log, i + 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ok(writer.close().await);
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert!(
        file_len(&segs[0]) < 4096,
        "the segment grew with its records"
    );
    assert!(files(dir.path(), "spare").is_empty());
    assert!(files(dir.path(), "zeroing").is_empty());
}

/// A steady stream's rolls go into spares made while the segment before
/// was written, and cut the zeros after that segment's records: only the
/// segment being written has zeros after them, a sealed one is read (and
/// its index rebuilt) like any other. A spare left ready at closing is
/// the next run's, one being made is never left.
#[tokio::test]
async fn rolls_go_into_spares_and_cut_the_zeros_after_the_records() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    let mut next = write_until_into_zeros(&log, &writer, dir.path(), 0, || {}).await;
    // Record i is up to 3,000 bytes: about 700 fill 1 MiB, appended in
    // steps that take longer than the 125 ms after which a spare is asked
    // for (the spare thread may still fall behind on a busy machine: a
    // segment begun without one grows, and is left when one is ready).
    while segments(dir.path()).len() < 4 {
        append_all(&writer, next..next + 100).await;
        next += 100;
        wait_for_head(&log, next).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Long enough into the last segment for the next spare.
    tokio::time::sleep(Duration::from_millis(200)).await;
    append_all(&writer, next..next + 10).await;
    next += 10;
    wait_for_head(&log, next).await;
    for _ in 0..200 {
        if !files(dir.path(), "spare").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ok(writer.close().await);
    let left = files(dir.path(), "spare");
    assert_eq!(left.len(), 1, "the next spare was made: {left:?}");
    assert!(files(dir.path(), "zeroing").is_empty());
    let segs = segments(dir.path());
    assert!(
        segs[1..]
            .iter()
            .all(|s| version(s) == walbridge_log::segment::VERSION_PREALLOCATED),
        "every segment after the first was a spare"
    );
    for seg in &segs[..segs.len() - 1] {
        let _ = std::fs::remove_file(seg.with_extension("idx"));
        let bytes = ok(std::fs::read(seg));
        assert_ne!(bytes.last(), Some(&0), "{} ends in zeros", seg.display());
    }
    assert_eq!(file_len(&segs[segs.len() - 1]), 1 << 20);
    let (log, writer, recovery) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, next - 800).len(), 800);
    // The spare left is the next segment.
    let before = segments(dir.path()).len();
    append_all(&writer, next..next + 1000).await;
    wait_for_head(&log, next + 1000).await;
    assert!(segments(dir.path()).len() > before);
    assert!(!left[0].exists(), "{} was not used", left[0].display());
    ok(writer.close().await);
}

/// A crash in the middle of a write into zeros leaves part of a frame
/// before them: recovery cuts it back like any torn tail, writing zeros
/// over it so that the room made ahead stays.
#[tokio::test]
async fn a_write_torn_inside_the_zeros_is_cut_back() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    let next = write_until_into_zeros(&log, &writer, dir.path(), 0, || {}).await;
    append_all(&writer, next..next + 50).await;
    let next = next + 50;
    wait_for_head(&log, next).await;
    let end = log.head().end;
    ok(writer.close().await);
    let seg = ok(segments(dir.path()).pop().ok_or("no segment"));
    // Half a frame, as a write cut short leaves it.
    let torn = {
        let mut frame = Vec::new();
        walbridge_log::frame::encode(&mut frame, next, Lsn(next * 10 + 5), true, &payload(next));
        frame.truncate(frame.len() / 2);
        frame
    };
    {
        use std::os::unix::fs::FileExt;
        let file = ok(std::fs::OpenOptions::new().write(true).open(&seg));
        ok(file.write_all_at(&torn, end));
    }
    let (log, writer, recovery) = ok(Log::open(dir.path(), preallocated(1 << 20)));
    assert_eq!(recovery.truncated_bytes, torn.len() as u64);
    assert_eq!(log.head().next_seq, next);
    assert_eq!(file_len(&seg), 1 << 20, "the room stays");
    append_all(&writer, next..next + 10).await;
    wait_for_head(&log, next + 10).await;
    assert_eq!(read_all(&log, 0).len(), next as usize + 10);
    ok(writer.close().await);
}

/// Appends `range` as one batch (see [`LogWriter::begin_batch`]).
async fn append_batch(writer: &LogWriter, range: std::ops::Range<u64>, alone: bool) {
    writer.begin_batch(alone);
    append_all(writer, range).await;
    ok(writer.end_batch().await);
}

/// Appends message `i` as a batch alone (see [`LogWriter::begin_batch`]).
async fn append_batch_of_message(writer: &LogWriter, i: u64) {
    writer.begin_batch(true);
    append_message(writer, i, 0).await;
    ok(writer.end_batch().await);
}

/// Fsyncs nothing waits for come an hour apart: none in a test.
fn hour_between_fsyncs() -> LogOptions {
    LogOptions {
        sync_gap: Duration::from_secs(3600),
        ..LogOptions::default()
    }
}

/// Given time enough for an fsync nothing held back, the log made none.
async fn nothing_fsynced(log: &Log) {
    tokio::time::sleep(Duration::from_millis(50)).await;
    let syncs = log.syncs();
    assert_eq!(
        (syncs.sync_thread, syncs.appender, syncs.writer),
        (0, 0, 0),
        "{syncs:?}"
    );
    assert_eq!(log.head().next_seq, 0);
}

/// The reader's next record, waiting up to 10 s for it.
async fn next_record(reader: &mut walbridge_log::LogReader) -> walbridge_log::ReadRecord {
    loop {
        match ok(reader.try_next()) {
            Some(record) => return record,
            None => ok(tokio::time::timeout(Duration::from_secs(10), reader.wait()).await),
        }
    }
}

/// A batch with nothing waiting after it is written, fsynced and readable
/// by the time its appender ends it: the appender wrote it itself. (With
/// a long fsync interval no fsync can make one slow, which would send the
/// next batch to the writer thread.)
#[tokio::test]
async fn a_batch_alone_is_readable_when_its_appender_ends_it() {
    let dir = ok(tempfile::tempdir());
    let options = LogOptions {
        fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
        ..LogOptions::default()
    };
    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    let mut next = 0;
    for size in 1..=20 {
        append_batch(&writer, next..next + size, true).await;
        next += size;
        assert_eq!(log.head().next_seq, next, "readable at once");
    }
    ok(writer.close().await);
    let (log, writer, recovery) = ok(Log::open(dir.path(), options));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0).len() as u64, next);
    ok(writer.close().await);
}

/// A batch alone, with every write fsynced: the appender writes it and
/// goes on; readers of written records take it at once, and the sync
/// thread makes it durable, then readable to the rest. Later batches go
/// to the appender or, after a slow fsync, to the writer thread; closing
/// the writer makes durable the last.
#[tokio::test]
async fn a_batch_alone_is_made_durable_by_the_sync_thread_while_its_appender_goes_on() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), LogOptions::default()));
    let mut written = ok(log.reader_with(0, Visibility::Written));
    let mut next = 0;
    for size in 1..=20 {
        writer.begin_batch(true);
        for i in next..next + size {
            append_message(&writer, i, 0).await;
        }
        ok(writer.end_batch().await);
        for i in next..next + size {
            let record = loop {
                match ok(written.try_next()) {
                    Some(record) => break record,
                    // Only the first batch is sure to be the appender's.
                    None if size > 1 => written.wait().await,
                    None => panic!("the first batch was not shown at once"),
                }
            };
            assert_eq!((record.seq, prefix(&record.entry)), (i, format!("r{i}")));
        }
        next += size;
        if size == 1 {
            wait_for_head(&log, next).await;
            let syncs = log.syncs();
            assert_eq!((syncs.sync_thread, syncs.writer), (1, 0), "{syncs:?}");
        }
    }
    ok(writer.close().await);
    assert_eq!(log.head().next_seq, next, "durable at close");
    let (log, writer, recovery) = ok(Log::open(dir.path(), LogOptions::default()));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0).len() as u64, next);
    ok(writer.close().await);
}

/// While only readers of written records follow the log, nothing waits
/// for the batches appenders write to be durable: the readers have each
/// at once, and the sync thread fsyncs none before the gap since the last
/// fsync is over (an hour here: none at all). A reader of durable records
/// opened meanwhile is not kept waiting: the next batch wakes the sync
/// thread, which makes everything durable with one fsync, and each batch
/// after it as it comes. Closing makes the rest durable.
#[tokio::test]
async fn batches_nobody_waits_for_share_the_sync_threads_fsyncs() {
    let dir = ok(tempfile::tempdir());
    let options = hour_between_fsyncs();
    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    let mut written = ok(log.reader_with(0, Visibility::Written));
    for i in 0..20 {
        append_batch_of_message(&writer, i).await;
        // The appender wrote it (no fsync has been slow) and showed it.
        let record = ok(written.try_next());
        assert_eq!(
            record.map(|r| r.seq),
            Some(i),
            "batch {i} not shown at once"
        );
    }
    nothing_fsynced(&log).await;

    let mut durable = ok(log.reader_with(0, Visibility::CompleteUnits));
    append_batch_of_message(&writer, 20).await;
    wait_for_head(&log, 21).await;
    assert_eq!(log.syncs().sync_thread, 1, "{:?}", log.syncs());
    for i in 21..30 {
        append_batch_of_message(&writer, i).await;
        wait_for_head(&log, i + 1).await;
    }
    for i in 0..30 {
        let record = ok(durable.try_next());
        assert_eq!(record.map(|r| r.seq), Some(i));
    }
    drop(durable);

    append_batch_of_message(&writer, 30).await;
    ok(writer.close().await);
    assert_eq!(log.head().next_seq, 31, "durable at close");
    let (log, writer, recovery) = ok(Log::open(dir.path(), options));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0).len(), 31);
    ok(writer.close().await);
}

/// A reader of written units takes a small unit as soon as it is written,
/// before its fsync, and does not hold the sync thread's fsyncs back (it
/// is no reader of durable records); of a unit still being written it sees
/// nothing until the unit's end is durable, as a reader of complete units.
#[tokio::test]
async fn a_reader_of_written_units_takes_small_units_before_their_fsync_and_large_ones_whole() {
    let dir = ok(tempfile::tempdir());
    let options = hour_between_fsyncs();
    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    let mut units = ok(log.reader_with(0, Visibility::WrittenUnits));
    for i in 0..5 {
        append_batch_of_message(&writer, i).await;
        let record = ok(units.try_next());
        assert_eq!(record.map(|r| r.seq), Some(i), "unit {i} not shown at once");
    }
    nothing_fsynced(&log).await;

    // A unit of four records: the first three durable (the writer thread
    // writes and fsyncs them), the unit not ended.
    for i in 5..8 {
        ok(writer.append(payload(i), Lsn(i * 10 + 5), false).await);
    }
    let mut unfinished = ok(log.reader_with(0, Visibility::Unfinished));
    for _ in 0..8 {
        next_record(&mut unfinished).await;
    }
    assert_eq!(
        log.head().next_seq,
        5,
        "the small units are durable with them"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        ok(units.try_next()).map(|r| r.seq),
        None,
        "nothing of an unfinished unit"
    );
    ok(writer.append(payload(8), Lsn(85), true).await);
    for i in 5..9 {
        let record = next_record(&mut units).await;
        assert_eq!((record.seq, record.unit_end), (i, i == 8));
    }
    drop(unfinished);
    // Small units again, after the unit.
    for i in 9..12 {
        append_batch_of_message(&writer, i).await;
        assert_eq!(next_record(&mut units).await.seq, i);
    }
    ok(writer.close().await);
    assert_eq!(log.head().next_seq, 12, "durable at close");
    let (log, writer, recovery) = ok(Log::open(dir.path(), options));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0).len(), 12);
    ok(writer.close().await);
}

/// Readers of each visibility follow an appender writing batch after
/// batch while the sync thread makes earlier ones durable: whenever the
/// sync thread publishes, the appender may have records in the buffer not
/// written yet, and no end may take those in. Every reader gets every
/// record, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_follow_an_appender_while_the_sync_thread_publishes_behind_it() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    let total = 600;
    let readers: Vec<_> = [
        Visibility::Written,
        Visibility::WrittenUnits,
        Visibility::Unfinished,
        Visibility::CompleteUnits,
    ]
    .into_iter()
    .map(|visibility| {
        let mut reader = ok(log.reader_with(0, visibility));
        tokio::spawn(async move {
            let mut next = 0;
            while next < total {
                match reader.try_next() {
                    Ok(Some(record)) => {
                        assert_eq!(
                            (record.seq, prefix(&record.entry)),
                            (next, format!("r{next}")),
                            "{visibility:?}"
                        );
                        next += 1;
                    }
                    Ok(None) => reader.wait().await,
                    Err(e) => panic!("{visibility:?} at {next}: {e}"),
                }
            }
        })
    })
    .collect();
    let mut next = 0;
    while next < total {
        let size = (next % 3 + 1).min(total - next);
        writer.begin_batch(true);
        for i in next..next + size {
            if i > next {
                // The sync thread's fsync of the previous batch ends while
                // this one is in the buffer.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            append_message(&writer, i, (i % 200) as usize).await;
        }
        ok(writer.end_batch().await);
        next += size;
    }
    for reader in readers {
        let done = tokio::time::timeout(Duration::from_secs(30), reader).await;
        assert!(matches!(done, Ok(Ok(()))), "{done:?}");
    }
    ok(writer.close().await);
}

/// Batches written by their appender and batches handed to the writer
/// thread, interleaved, with segments rolling inside both (the thread
/// makes each new segment): every record once, in order, in the file and
/// after reopening.
#[tokio::test]
async fn batches_written_here_and_by_the_writer_thread_keep_their_order_across_rolls() {
    let dir = ok(tempfile::tempdir());
    let (log, writer, _) = ok(Log::open(dir.path(), small_segments()));
    let mut next = 0;
    for i in 0..300 {
        let size = i % 7 + 1;
        append_batch(&writer, next..next + size, i % 3 != 0).await;
        next += size;
    }
    wait_for_head(&log, next).await;
    assert!(segments(dir.path()).len() > 10, "segments rolled");
    let expected: Vec<(u64, String)> = (0..next).map(|i| (i, format!("r{i}"))).collect();
    assert_eq!(read_all(&log, 0), expected);
    ok(writer.close().await);
    let (log, writer, recovery) = ok(Log::open(dir.path(), small_segments()));
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(read_all(&log, 0), expected);
    ok(writer.close().await);
}

#[tokio::test]
async fn a_position_past_what_a_crash_kept_resumes_where_the_log_reopened() {
    let dir = ok(tempfile::tempdir());
    let options = LogOptions {
        preallocate: false,
        ..small_segments()
    };
    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    assert_eq!(log.epoch(), 1);
    append_all(&writer, 0..6).await;
    ok(writer.close().await);
    // The segments as the disk holds them after their last fsync.
    let fsynced: Vec<_> = segments(dir.path())
        .into_iter()
        .map(|path| (path.clone(), ok(std::fs::read(&path))))
        .collect();

    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    assert_eq!(log.epoch(), 2);
    append_all(&writer, 6..10).await;
    ok(writer.close().await);
    // The machine went down before records 6..10 reached the disk.
    for path in segments(dir.path()) {
        ok(std::fs::remove_file(path));
    }
    for (path, bytes) in &fsynced {
        ok(std::fs::write(path, bytes));
    }

    let (log, writer, _) = ok(Log::open(dir.path(), options.clone()));
    assert_eq!(log.epoch(), 3);
    assert_eq!(log.head().next_seq, 6);
    let lost = ResumePoint::Lost {
        next: 6,
        last_lsn: Lsn(55),
    };
    assert_eq!(log.resume_point(2, 10), lost);
    assert_eq!(log.resume_point(2, 7), lost);
    assert_eq!(log.resume_point(2, 6), ResumePoint::Kept(6));
    assert_eq!(log.resume_point(1, 4), ResumePoint::Kept(4));
    // Other records take the lost numbers; epoch 3's positions hold.
    append_all(&writer, 20..26).await;
    assert_eq!(log.resume_point(3, 10), ResumePoint::Kept(10));
    ok(writer.close().await);
    let (log, writer, _) = ok(Log::open(dir.path(), options));
    assert_eq!(log.epoch(), 4);
    assert_eq!(log.resume_point(2, 10), lost, "remembered across openings");
    assert_eq!(log.resume_point(3, 10), ResumePoint::Kept(10));
    assert_eq!(read_all(&log, 6)[0], (6, "r20".to_owned()));
    ok(writer.close().await);
}
