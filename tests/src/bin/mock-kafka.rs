//! librdkafka's mock Kafka cluster as a process of its own, for tests of
//! transactional delivery (the tansu broker has no transactions): prints
//! its bootstrap servers on stdout, then serves until stdin closes.

use std::io::{BufRead, Write};

fn main() {
    let brokers = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let cluster = match rdkafka::mocking::MockCluster::new(brokers) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("mock-kafka: cannot start the mock cluster: {e}");
            std::process::exit(1);
        }
    };
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{}", cluster.bootstrap_servers());
    let _ = stdout.flush();
    // Serve until whoever started us goes away.
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
}
