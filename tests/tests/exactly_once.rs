//! Exactly once from PostgreSQL through the log into a sink, however
//! often walbridge is killed: a writer runs 20,000 transactions of mixed
//! sizes (one row, a hundred rows, streamed 5,000-row transactions) while
//! walbridge is killed with SIGKILL at random moments and restarted.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;
use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{
    Rng, WORKLOAD_SCHEMA, assert_replays_to_publisher, crash_seed, transaction, write_while_killing,
};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(200);
const CHUNKS: u64 = 20;
const PER_CHUNK: u64 = 1000;

fn lsn(v: &Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("not an LSN: {v}"));
    let (hi, lo) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text}"));
    let hi = u64::from_str_radix(hi, 16).unwrap_or_else(|e| panic!("{text}: {e}"));
    let lo = u64::from_str_radix(lo, 16).unwrap_or_else(|e| panic!("{text}: {e}"));
    (hi << 32) | lo
}

#[test]
fn every_transaction_reaches_the_sink_exactly_once_across_repeated_kills() {
    let pg = Cluster::builder()
        .setting("logical_decoding_work_mem", "64kB")
        .setting("synchronous_commit", "off")
        .start();
    pg.psql(WORKLOAD_SCHEMA);
    pg.psql("CREATE PUBLICATION pub FOR TABLE t, g, big");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "status_interval = 1");
    // Segments written into zeros made ahead (1 MiB segments get a spare
    // after 125 ms of writing): the kills tear writes inside them.
    let config = std::fs::read_to_string(wb.config_path()).unwrap_or_default();
    wb.write_config(&format!(
        "{config}\n[log]\npreallocate = true\nsegment_size = \"1MiB\"\n"
    ));
    let seed = crash_seed();
    let mut rng = Rng::new(seed);
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    let interrupted = |log: &str| {
        log.contains("removed the unfinished end of the log")
            || log.contains("removing output written after")
    };
    let (running, kills, written) = write_while_killing(
        &pg,
        &wb,
        running,
        (CHUNKS, PER_CHUNK),
        &mut rng,
        1200,
        || {},
        || interrupted(&wb.log()),
    );
    let expected: u64 = (0..written).map(|i| transaction(i).1).sum();
    let lines = wb.wait_for_lines(expected as usize, WAIT);
    // Nothing more arrives: no duplicate trails behind.
    std::thread::sleep(Duration::from_secs(2));
    let status = running.stop(WAIT);
    let lines = if wb.lines().len() > lines.len() {
        wb.lines()
    } else {
        lines
    };
    let context = format!("seed {seed}, {kills} kills; walbridge log:\n{}", wb.log());
    assert!(status.success(), "{context}");
    assert!(kills >= 10);
    assert!(
        interrupted(&wb.log()),
        "no kill interrupted a write: {context}"
    );
    assert_eq!(lines.len() as u64, expected, "{context}");

    // Each change once, transactions in commit order.
    let mut seen = HashSet::new();
    let mut last_commit = 0;
    for line in &lines {
        let source = &line["source"];
        let commit = lsn(&source["commit_lsn"]);
        assert!(
            commit >= last_commit,
            "out of commit order: {line}; {context}"
        );
        last_commit = commit;
        assert!(
            seen.insert((
                commit,
                lsn(&source["lsn"]),
                line["after"]["id"].to_string(),
                line["before"]["id"].to_string()
            )),
            "duplicate: {line}; {context}"
        );
    }

    // Replayed, the changes give the publisher's final state.
    let events: Vec<&Value> = lines.iter().collect();
    assert_replays_to_publisher(&pg, &events, &format!("seed {seed}"));
}
