//! Debezium's own tooling on the kafka sink's topics: Kafka Connect's
//! `JsonConverter` and Debezium's `ExtractNewRecordState`, in a small Java
//! program (`tests/kafka/connect-check`, built with Maven once per test
//! process).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};

/// The program's directory.
fn project() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/connect-check")
}

/// The classpath to run it with, after building it.
fn classpath() -> String {
    static CLASSPATH: OnceLock<String> = OnceLock::new();
    CLASSPATH
        .get_or_init(|| {
            let dir = project();
            let listed = dir.join("target/classpath.txt");
            crate::succeeds(
                Command::new("mvn")
                    .args(["-q", "-B", "-f"])
                    .arg(dir.join("pom.xml"))
                    .args(["package", "dependency:build-classpath"])
                    .arg(format!("-Dmdep.outputFile={}", listed.display())),
            );
            let dependencies = std::fs::read_to_string(&listed)
                .unwrap_or_else(|e| panic!("{}: {e}", listed.display()));
            format!(
                "{}:{}",
                dir.join("target/connect-check-1.jar").display(),
                dependencies.trim()
            )
        })
        .clone()
}

/// Runs `messages` (topic, key, value as the sink wrote them) through
/// `JsonConverter` and `ExtractNewRecordState`. Returns, per message, the
/// Connect JSON of the key and of the flattened value (`{"schema", "payload"}`,
/// null for a delete or tombstone), or the program's complaint when a
/// message is not a Debezium envelope.
pub fn read_with_connect(messages: &[(String, Value, Value)]) -> Result<Vec<Value>, String> {
    let mut child = Command::new("java")
        .arg("-cp")
        .arg(classpath())
        .arg("walbridge.tests.ConnectCheck")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run java: {e}"));
    let input: String = messages
        .iter()
        .map(|(topic, key, value)| {
            json!({"topic": topic, "key": key, "value": value}).to_string() + "\n"
        })
        .collect();
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .unwrap_or_else(|e| panic!("writing to the Connect check: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("the Connect check: {e}"));
    if !out.status.success() {
        return Err(format!(
            "{} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect())
}
