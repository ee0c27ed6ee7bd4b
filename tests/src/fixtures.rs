//! Shared test data and workloads.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::Cluster;
use crate::walbridge::{Deployment, Running};

/// Tables of every common type: built-ins, arrays, an enum, a composite,
/// a range and a domain, in table `t` with primary key `id`.
pub const TYPES_SCHEMA: &str = "
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pair AS (n int, label text);
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TABLE t (
  id int PRIMARY KEY,
  i2 int2, i4 int4, i8 int8,
  num numeric, num_nan numeric,
  f4 float4, f8 float8, f_nan float8, f_inf float8, f_ninf float4,
  txt text, vc varchar(10), ch char(3),
  raw bytea, flag bool,
  d date, d_bc date, tm time, tmz timetz, ts timestamp, tstz timestamptz, iv interval,
  u uuid, js json, jsb jsonb,
  ints int4[], texts text[], moods mood[],
  m mood, comp pair, rng int4range, dom positive
)";

/// One row of every type in `t`; replace `ID` with the key.
pub const TYPES_ROW: &str = "
INSERT INTO t VALUES (ID,
  -32768, 2147483647, 9223372036854775807,
  '12345678901234567890.123456789', 'NaN',
  0.1, 1.5e300, 'NaN', 'Infinity', '-Infinity',
  E'h\\u00e9\\tllo \"q\"\\n', 'short', 'ab',
  '\\xdeadbeef', true,
  '2024-02-29', '0044-03-15 BC', '13:14:15.123456', '13:14:15+05:30', '2024-02-29 13:14:15.5', '2024-02-29 13:14:15.5+02',
  '1 year 2 months 3 days 04:05:06.5',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"b\": 1, \"a\": [1, 2.50]}', '{\"b\": 1, \"a\": [1, 2.50]}',
  '{1,NULL,3}', '{{\"a b\",c},{d,NULL}}', '{happy,sad}',
  'happy', ROW(1, 'x'), '[1,5)', 7
)";

/// The tables [`transaction`] writes.
pub const WORKLOAD_SCHEMA: &str = "CREATE TABLE t (id bigint PRIMARY KEY, n int, pad text);
     CREATE TABLE g (id bigint PRIMARY KEY);
     CREATE TABLE big (id bigint PRIMARY KEY, pad text)";

/// Waits until each [`WORKLOAD_SCHEMA`] table of `target` equals the
/// `publisher`'s; fails with `context()` when one does not in `timeout`.
pub fn assert_workload_replicated(
    publisher: &Cluster,
    target: &Cluster,
    timeout: std::time::Duration,
    context: &dyn Fn() -> String,
) {
    for (table, columns) in [("t", "id, n, pad"), ("g", "id"), ("big", "id, pad")] {
        let expected = publisher.table_digest("postgres", table, columns);
        let got = target.wait_for_digest("postgres", table, columns, &expected, timeout);
        assert_eq!(got, expected, "table {table} differs; {}", context());
    }
}

/// The SQL of transaction `i` of a mixed workload on [`WORKLOAD_SCHEMA`]
/// (one-row inserts, updates that increment a counter, inserts and
/// deletes, 100-row updates, 5,000-row inserts that stream) and the number
/// of row changes it makes. Applying one twice changes the result.
pub fn transaction(i: u64) -> (String, u64) {
    let mut sql = format!("BEGIN; INSERT INTO t VALUES ({i}, 0, 'r{i}');");
    let mut changes = 1;
    if i.is_multiple_of(7) {
        sql += &format!("UPDATE t SET n = n + 1, pad = 'u{i}' WHERE id = {};", i / 2);
        changes += 1;
    }
    if i.is_multiple_of(11) {
        sql += &format!("INSERT INTO g VALUES ({i});");
        changes += 1;
        // Only rows there are: counted changes are the changes made.
        if i >= 22 {
            sql += &format!("DELETE FROM g WHERE id = {};", i - 11);
            changes += 1;
        }
    }
    if i % 250 == 100 {
        sql += &format!(
            "UPDATE t SET n = n + 1 WHERE id BETWEEN {} AND {i};",
            i - 99
        );
        changes += 100;
    }
    if i % 1000 == 500 {
        sql += &format!(
            "INSERT INTO big SELECT {i} * 10000 + s, repeat('y', 200) FROM generate_series(1, 5000) s;"
        );
        changes += 5000;
    }
    sql += "COMMIT;";
    (sql, changes)
}

/// Replays change events of the [`WORKLOAD_SCHEMA`] tables — Debezium
/// envelopes (`op`, `before`, `after`, `source.table`) as the jsonl and
/// kafka sinks write them — in the order given, and checks that the
/// result is each table as `publisher` holds it now. A change applied
/// twice or left out shows (updates increment a counter, deletes must
/// find their row).
pub fn assert_replays_to_publisher(publisher: &Cluster, events: &[&Value], context: &str) {
    let columns = |table: &str| -> &'static [&'static str] {
        match table {
            "t" => &["id", "n", "pad"],
            "g" => &["id"],
            _ => &["id", "pad"],
        }
    };
    let row_text = |image: &Value, columns: &[&str]| {
        columns
            .iter()
            .map(|c| match &image[*c] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut tables: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    for event in events {
        let table = event["source"]["table"].as_str().unwrap_or_default();
        let rows = tables.entry(table.to_owned()).or_default();
        match event["op"].as_str() {
            Some("c" | "u" | "r") => {
                let id = event["after"]["id"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{event}; {context}"));
                rows.insert(id, row_text(&event["after"], columns(table)));
            }
            Some("d") => {
                let id = event["before"]["id"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{event}; {context}"));
                assert!(
                    rows.remove(&id).is_some(),
                    "delete of a missing row: {event}; {context}"
                );
            }
            other => panic!("unexpected op {other:?}: {event}; {context}"),
        }
    }
    for table in ["t", "g", "big"] {
        let expected = publisher.psql(&format!(
            "SELECT {} FROM {table} ORDER BY id",
            columns(table).join(", ")
        ));
        let replayed: Vec<String> = tables
            .get(table)
            .map(|rows| rows.values().cloned().collect())
            .unwrap_or_default();
        assert_eq!(
            replayed.join("\n"),
            expected,
            "table {table} differs; {context}"
        );
    }
}

/// The seed of a crash test: `WALBRIDGE_CRASH_SEED` to repeat a run, the
/// clock otherwise (every failure message names it).
pub fn crash_seed() -> u64 {
    std::env::var("WALBRIDGE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// A small deterministic generator, so a failing run can be repeated from its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A number below `below`.
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// Runs the [`transaction`]s on `publisher`, `per_chunk` at a time, while
/// walbridge (`running`, of `wb`) is killed with SIGKILL and started again.
///
/// Each kill waits 300 ms plus up to `spread_ms` (drawn from `rng`), then
/// until walbridge's log or output grows, and kills at once: so the kills
/// land while walbridge writes, whatever the machine's load, and do not
/// depend on luck to interrupt a write. `after_kill` runs after each kill.
/// The writing goes on past `chunks` chunks (up to four times as many)
/// until `seen_enough` holds after at least ten kills, so a test can make
/// sure the situation it checks happened. Returns the process running at
/// the end, the number of kills and the number of transactions written
/// (`0..n`).
#[allow(clippy::too_many_arguments)]
pub fn write_while_killing(
    publisher: &Cluster,
    wb: &Deployment,
    mut running: Running,
    (chunks, per_chunk): (u64, u64),
    rng: &mut Rng,
    spread_ms: u64,
    mut after_kill: impl FnMut(),
    mut seen_enough: impl FnMut() -> bool,
) -> (Running, u32, u64) {
    let enough = std::sync::atomic::AtomicBool::new(false);
    let mut kills = 0;
    let mut written = 0;
    running = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut chunk = 0;
            while chunk < chunks
                || (chunk < 4 * chunks && !enough.load(std::sync::atomic::Ordering::SeqCst))
            {
                let sql: String = (chunk * per_chunk..(chunk + 1) * per_chunk)
                    .map(|i| transaction(i).0)
                    .collect();
                publisher.psql(&sql);
                chunk += 1;
                std::thread::sleep(Duration::from_millis(150));
            }
            chunk * per_chunk
        });
        while !writer.is_finished() || kills < 10 {
            std::thread::sleep(Duration::from_millis(300 + rng.next(spread_ms)));
            if kills >= 10 && seen_enough() {
                enough.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            wb.wait_for_growth(Duration::from_secs(2));
            running.kill();
            kills += 1;
            after_kill();
            running = wb.start();
        }
        written = writer
            .join()
            .unwrap_or_else(|_| panic!("the writer panicked"));
        running
    });
    (running, kills, written)
}

/// Replays JSON lines of a table with columns `id` and `v` into an image
/// (id to v), failing on any duplicate or gap: a row read or inserted
/// twice, an update or delete of a row never delivered.
pub fn replay_image(lines: &[Value]) -> Result<BTreeMap<i64, i64>, String> {
    let mut table = BTreeMap::new();
    for l in lines {
        let id = |row: &Value| row["id"].as_i64().ok_or_else(|| format!("no id in {l}"));
        match l["op"].as_str() {
            Some("r") | Some("c") => {
                let id = id(&l["after"])?;
                if table
                    .insert(id, l["after"]["v"].as_i64().unwrap_or(-1))
                    .is_some()
                {
                    return Err(format!("row {id} delivered twice: {l}"));
                }
            }
            Some("u") if l["before"]["id"].is_i64() && l["before"]["id"] != l["after"]["id"] => {
                // The key changed: the row leaves its old key for a new one.
                let from = id(&l["before"])?;
                let Some(_) = table.remove(&from) else {
                    return Err(format!("row {from} moved, but it was never delivered: {l}"));
                };
                let to = id(&l["after"])?;
                if table
                    .insert(to, l["after"]["v"].as_i64().unwrap_or(-1))
                    .is_some()
                {
                    return Err(format!("row {from} moved onto row {to}, which exists: {l}"));
                }
            }
            Some("u") => {
                let id = id(&l["after"])?;
                if table
                    .insert(id, l["after"]["v"].as_i64().unwrap_or(-1))
                    .is_none()
                {
                    return Err(format!(
                        "update of row {id}, which was never delivered: {l}"
                    ));
                }
            }
            Some("d") => {
                let id = id(&l["before"])?;
                if table.remove(&id).is_none() {
                    return Err(format!(
                        "delete of row {id}, which was never delivered: {l}"
                    ));
                }
            }
            other => return Err(format!("unexpected op {other:?}")),
        }
    }
    Ok(table)
}
