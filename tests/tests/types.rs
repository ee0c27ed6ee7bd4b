//! Every common type arrives as the documented JSON, identically from the
//! snapshot and from the stream, in text and in binary mode.

use std::time::Duration;

use serde_json::{Value, json};
use walbridge_tests::Cluster;
use walbridge_tests::fixtures::{TYPES_ROW as ROW, TYPES_SCHEMA as SCHEMA};
use walbridge_tests::walbridge::Deployment;

const WAIT: Duration = Duration::from_secs(60);

fn expected() -> Value {
    json!({
        "i2": -32768, "i4": 2147483647, "i8": 9223372036854775807i64,
        "num": "12345678901234567890.123456789", "num_nan": "NaN",
        "f4": 0.1, "f8": 1.5e300, "f_nan": "NaN", "f_inf": "Infinity", "f_ninf": "-Infinity",
        "txt": "h\u{e9}\tllo \"q\"\n", "vc": "short", "ch": "ab ",
        "raw": "3q2+7w==", "flag": true,
        "d": "2024-02-29", "d_bc": "-0043-03-15", "tm": "13:14:15.123456", "tmz": "13:14:15+05:30",
        "ts": "2024-02-29T13:14:15.5", "tstz": "2024-02-29T11:14:15.5Z", "iv": "P1Y2M3DT4H5M6.5S",
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "js": {"b": 1, "a": [1, 2.50]}, "jsb": {"a": [1, 2.50], "b": 1},
        "ints": [1, null, 3], "texts": [["a b", "c"], ["d", null]], "moods": ["happy", "sad"],
        "m": "happy", "comp": "(1,x)", "rng": "[1,5)", "dom": 7
    })
}

/// Compares numbers by value (text and binary modes may spell them differently).
fn assert_same(actual: &Value, expected: &Value, path: &str) {
    match (actual, expected) {
        (Value::Number(a), Value::Number(e)) => {
            assert_eq!(a.as_f64(), e.as_f64(), "{path}: {a} != {e}");
        }
        (Value::Object(a), Value::Object(e)) => {
            assert_eq!(
                a.keys().collect::<Vec<_>>(),
                e.keys().collect::<Vec<_>>(),
                "{path}: keys"
            );
            for (k, v) in e {
                assert_same(&a[k], v, &format!("{path}.{k}"));
            }
        }
        (Value::Array(a), Value::Array(e)) => {
            assert_eq!(a.len(), e.len(), "{path}: length");
            for (i, (x, y)) in a.iter().zip(e).enumerate() {
                assert_same(x, y, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(actual, expected, "{path}"),
    }
}

fn without_id(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.shift_remove("id");
    }
    v
}

#[test]
fn types_round_trip_as_json_in_snapshot_and_stream() {
    let pg = Cluster::start();
    pg.psql(SCHEMA);
    pg.psql(&ROW.replace("ID", "1"));
    pg.psql("CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "");
    let running = wb.start();
    wb.wait_for_lines(1, WAIT);
    pg.psql(&ROW.replace("ID", "2"));
    let lines = wb.wait_for_lines(2, WAIT);
    assert!(running.stop(WAIT).success());
    assert_eq!(lines[0]["op"], "r");
    assert_eq!(lines[1]["op"], "c");
    // Exactly the same text from the snapshot and the stream.
    assert_eq!(
        without_id(lines[0]["after"].clone()),
        without_id(lines[1]["after"].clone())
    );
    assert_same(&without_id(lines[1]["after"].clone()), &expected(), "after");
    // Numbers keep PostgreSQL's digits.
    assert_eq!(lines[1]["after"]["i8"].to_string(), "9223372036854775807");
    assert_eq!(lines[1]["after"]["f4"].to_string(), "0.1");
    assert_eq!(
        lines[1]["after"]["jsb"].to_string(),
        r#"{"a":[1,2.50],"b":1}"#
    );
}

#[test]
fn binary_mode_gives_the_same_values_where_json_can_tell() {
    let pg = Cluster::start();
    pg.psql(SCHEMA);
    pg.psql("CREATE PUBLICATION pub FOR TABLE t");
    let wb = Deployment::new();
    wb.configure(&pg, "postgres", "pub", "binary = true");
    let running = wb.start();
    pg.wait_for_streaming(WAIT);
    pg.psql(&ROW.replace("ID", "1"));
    let lines = wb.wait_for_lines(1, WAIT);
    assert!(running.stop(WAIT).success());
    let after = &lines[0]["after"];
    let expected = expected();
    for column in [
        "i2", "i4", "i8", "num", "num_nan", "f4", "f8", "f_nan", "f_inf", "f_ninf", "txt", "vc",
        "raw", "flag", "d", "ts", "u", "js", "jsb", "m", "dom", "iv", "ints", "texts", "moods",
    ] {
        assert_same(&after[column], &expected[column], column);
    }
    // Timestamps with time zone are UTC in both forms.
    assert_eq!(after["tstz"], "2024-02-29T11:14:15.5Z");
}
