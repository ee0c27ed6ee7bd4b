//! Decoder and assembler throughput over a generated pgoutput stream shaped
//! like pgbench's TPC-B transactions: three updates and one insert of
//! narrow rows per transaction.
//!
//! `cargo bench -p walbridge-source --bench decoder`

use std::hint::black_box;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use walbridge_core::{Column, Datum, Lsn, PgTimestamp, Relation, ReplicaIdentity, ValueKind};
use walbridge_source::assembler::{Assembled, Assembler};
use walbridge_source::pgoutput::encode::encode;
use walbridge_source::pgoutput::{Decoder, Message};

const TRANSACTIONS: usize = 200_000;

fn text(s: &str) -> Datum {
    Datum::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn relation(id: u32, columns: usize) -> Relation {
    Relation {
        id,
        schema: "public".into(),
        name: format!("pgbench_{id}"),
        replica_identity: ReplicaIdentity::Default,
        columns: (0..columns)
            .map(|i| Column {
                name: format!("c{i}"),
                type_oid: 23,
                type_modifier: -1,
                type_name: "int4".into(),
                kind: ValueKind::Int4,
                is_key: i == 0,
                attnum: 0,
                not_null: false,
                missing_value: None,
            })
            .collect(),
        partition_root: None,
        primary_key: Vec::new(),
    }
}

fn stream() -> Vec<Bytes> {
    let mut messages = Vec::with_capacity(TRANSACTIONS * 6);
    let mut push = |m: Message| {
        let mut out = BytesMut::new();
        encode(&m, false, &mut out);
        messages.push(out.freeze());
    };
    for t in 0..TRANSACTIONS {
        let lsn = Lsn(t as u64 * 1000);
        push(Message::Begin {
            final_lsn: lsn,
            commit_time: PgTimestamp(t as i64),
            xid: t as u32,
        });
        for rel in 1..=3 {
            push(Message::Update {
                xid: None,
                relation_id: rel,
                old: None,
                new: vec![
                    text(&t.to_string()),
                    text("1"),
                    text("-4242"),
                    text("                                        "),
                ],
            });
        }
        push(Message::Insert {
            xid: None,
            relation_id: 4,
            new: vec![
                text("1"),
                text("7"),
                text(&t.to_string()),
                text("-4242"),
                text("2026-12-01 12:00:00.123456"),
            ],
        });
        push(Message::Commit {
            flags: 0,
            commit_lsn: lsn,
            end_lsn: Lsn(lsn.0 + 48),
            commit_time: PgTimestamp(t as i64),
        });
    }
    messages
}

fn main() {
    let messages = stream();
    let bytes: usize = messages.iter().map(Bytes::len).sum();
    let count = messages.len();

    let start = Instant::now();
    let mut decoder = Decoder::new();
    for m in &messages {
        black_box(decoder.decode(m.clone()).ok());
    }
    let decode = start.elapsed().as_secs_f64();
    println!(
        "decode:            {:>8.1} MB/s  {:>10.0} messages/s  ({count} messages, {:.1} MB)",
        bytes as f64 / decode / 1e6,
        count as f64 / decode,
        bytes as f64 / 1e6
    );

    let dir = std::env::temp_dir().join(format!("walbridge-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut assembler = Assembler::new(dir.clone(), 64 << 20);
    for (id, columns) in [(1, 4), (2, 4), (3, 4), (4, 5)] {
        let _ = assembler.set_relation(relation(id, columns), None);
    }
    let start = Instant::now();
    let mut decoder = Decoder::new();
    let mut changes = 0usize;
    for m in &messages {
        let Ok(message) = decoder.decode(m.clone()) else {
            continue;
        };
        if let Ok(Assembled::Committed(txn)) = assembler.push(Lsn(1), message)
            && let Ok(iter) = txn.changes.into_changes()
        {
            changes += iter.count();
        }
    }
    let total = start.elapsed().as_secs_f64();
    println!(
        "decode + assemble: {:>8.1} MB/s  {:>10.0} messages/s  {:>9.0} transactions/s  ({changes} changes)",
        bytes as f64 / total / 1e6,
        count as f64 / total,
        TRANSACTIONS as f64 / total
    );
    let _ = std::fs::remove_dir_all(dir);
}
