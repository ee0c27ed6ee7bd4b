//! The replication connection and SQL connections against real servers:
//! TCP and Unix sockets, every password method, every sslmode.

use walbridge_core::PgTimestamp;
use walbridge_source::wire::batching::{BACKLOG, is_backlog};
use walbridge_source::wire::copyboth::ServerMessage;
use walbridge_source::wire::{
    ConnParams, ConnectionError, CopyMessage, ReplicationConnection, connect_sql,
};
use walbridge_tests::Cluster;

fn params(text: &str) -> ConnParams {
    ConnParams::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// Connects in replication mode and returns whether the session uses TLS.
async fn replication_ssl(conn_text: &str) -> Result<bool, ConnectionError> {
    let p = params(conn_text);
    let mut conn = ReplicationConnection::connect(&p, "walbridge-test").await?;
    let system = conn.simple_query("IDENTIFY_SYSTEM").await?;
    assert!(system[0].get(0, "xlogpos").is_some_and(|l| l.contains('/')));
    let ssl = conn
        .simple_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .await?;
    let on = ssl[0].get(0, "ssl") == Some("t");
    conn.close().await;
    Ok(on)
}

async fn sql_ok(conn_text: &str) -> Result<(), ConnectionError> {
    let client = connect_sql(&params(conn_text), "walbridge-test").await?;
    let row = client
        .query_one("SELECT current_setting('IntervalStyle')", &[])
        .await?;
    assert_eq!(
        row.get::<_, String>(0),
        "iso_8601",
        "session settings are applied"
    );
    Ok(())
}

/// A server with TLS that accepts TCP connections only over TLS.
fn tls_only_cluster() -> Cluster {
    Cluster::builder()
        .ssl()
        .hba(&[
            "local all all trust",
            "hostssl all all 127.0.0.1/32 trust",
            "hostssl replication all 127.0.0.1/32 trust",
        ])
        .start()
}

#[tokio::test]
async fn tcp_and_unix_socket_with_trust() {
    let pg = Cluster::start();
    let tcp = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
        pg.port()
    );
    assert!(
        !replication_ssl(&tcp)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    sql_ok(&tcp).await.unwrap_or_else(|e| panic!("{e}"));
    let unix = format!(
        "postgresql://postgres@/postgres?host={}&port={}",
        pg.socket_dir().display(),
        pg.port()
    );
    assert!(
        !replication_ssl(&unix)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
    sql_ok(&unix).await.unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn password_md5_and_scram() {
    let pg = Cluster::start();
    pg.psql("SET password_encryption = 'md5'; CREATE ROLE md5_user LOGIN REPLICATION PASSWORD 'md5 secret'");
    pg.psql("SET password_encryption = 'scram-sha-256'; CREATE ROLE scram_user LOGIN REPLICATION PASSWORD 'scram secret'");
    pg.psql("CREATE ROLE clear_user LOGIN REPLICATION PASSWORD 'clear secret'");
    pg.set_hba(&[
        "local all all trust",
        "host all md5_user 127.0.0.1/32 md5",
        "host replication md5_user 127.0.0.1/32 md5",
        "host all scram_user 127.0.0.1/32 scram-sha-256",
        "host replication scram_user 127.0.0.1/32 scram-sha-256",
        "host all clear_user 127.0.0.1/32 password",
        "host replication clear_user 127.0.0.1/32 password",
        "host all postgres 127.0.0.1/32 trust",
    ]);
    let conn = |user: &str, password: &str| {
        format!(
            "host=127.0.0.1 port={} user={user} password='{password}' dbname=postgres sslmode=disable",
            pg.port()
        )
    };
    for (user, password) in [
        ("md5_user", "md5 secret"),
        ("scram_user", "scram secret"),
        ("clear_user", "clear secret"),
    ] {
        replication_ssl(&conn(user, password))
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));
        sql_ok(&conn(user, password))
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));
        let wrong = replication_ssl(&conn(user, "wrong")).await;
        assert_eq!(
            wrong.as_ref().err().and_then(|e| e.sqlstate()),
            Some("28P01"),
            "{user}: {wrong:?}"
        );
    }
    let missing = format!(
        "host=127.0.0.1 port={} user=scram_user dbname=postgres sslmode=disable",
        pg.port()
    );
    assert!(matches!(
        replication_ssl(&missing).await,
        Err(ConnectionError::PasswordRequired { .. })
    ));
}

#[tokio::test]
async fn every_sslmode() {
    let pg = tls_only_cluster();
    let ca = pg.ca_cert();
    let base = |host: &str, extra: &str| {
        format!(
            "host={host} port={} user=postgres dbname=postgres {extra}",
            pg.port()
        )
    };
    for mode in ["prefer", "require"] {
        assert!(
            replication_ssl(&base("127.0.0.1", &format!("sslmode={mode}")))
                .await
                .unwrap_or_else(|e| panic!("{mode}: {e}"))
        );
        sql_ok(&base("127.0.0.1", &format!("sslmode={mode}")))
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
    }
    for (host, mode) in [
        ("127.0.0.1", "verify-ca"),
        ("localhost", "verify-full"),
        ("127.0.0.1", "verify-full"),
    ] {
        let text = base(
            host,
            &format!("sslmode={mode} sslrootcert={}", ca.display()),
        );
        assert!(
            replication_ssl(&text)
                .await
                .unwrap_or_else(|e| panic!("{mode} {host}: {e}"))
        );
        sql_ok(&text)
            .await
            .unwrap_or_else(|e| panic!("{mode} {host}: {e}"));
    }
    // The server certificate names localhost and 127.0.0.1, not 127.0.0.2.
    let wrong_name = base(
        "127.0.0.2",
        &format!("sslmode=verify-full sslrootcert={}", ca.display()),
    );
    assert!(matches!(
        replication_ssl(&wrong_name).await,
        Err(ConnectionError::Connect { .. } | ConnectionError::TlsHandshake { .. })
    ));
    // A root that did not sign the server certificate is refused.
    let other_ca =
        std::env::temp_dir().join(format!("walbridge-other-ca-{}.crt", std::process::id()));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
            "-keyout",
            "/dev/null",
            "-out",
        ])
        .arg(&other_ca)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(status.status.success());
    let untrusted = base(
        "127.0.0.1",
        &format!("sslmode=verify-ca sslrootcert={}", other_ca.display()),
    );
    assert!(matches!(
        replication_ssl(&untrusted).await,
        Err(ConnectionError::TlsHandshake { .. })
    ));
    let _ = std::fs::remove_file(&other_ca);
    // verify-ca needs a root certificate.
    let no_root = format!("{} sslmode=verify-ca", base("127.0.0.1", ""));
    assert!(matches!(
        replication_ssl(&no_root).await,
        Err(ConnectionError::Tls(_))
    ));
    // The server only accepts TLS: disable is rejected by pg_hba.conf.
    let plain = base("127.0.0.1", "sslmode=disable");
    assert_eq!(
        replication_ssl(&plain)
            .await
            .err()
            .and_then(|e| e.sqlstate().map(str::to_owned))
            .as_deref(),
        Some("28000")
    );
}

#[tokio::test]
async fn require_against_a_server_without_tls_fails_and_prefer_falls_back() {
    let pg = Cluster::start();
    let base = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        pg.port()
    );
    assert!(matches!(
        replication_ssl(&format!("{base} sslmode=require")).await,
        Err(ConnectionError::TlsRefused { .. })
    ));
    assert!(
        !replication_ssl(&format!("{base} sslmode=prefer"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
}

/// The first column of a pgoutput insert (`I`, relation, `N`, column
/// count, then `t`, length, text), as an integer.
fn inserted_id(insert: &[u8]) -> i64 {
    let length = u32::from_be_bytes(insert[9..13].try_into().unwrap_or_default()) as usize;
    let text = std::str::from_utf8(&insert[13..13 + length]).unwrap_or_default();
    text.parse().unwrap_or_else(|e| panic!("id {text:?}: {e}"))
}

/// Reads CopyBoth messages until `commits` pgoutput commits have arrived,
/// telling the connection at each `Begin` whether the walsender is behind,
/// as the source does; returns the ids inserted, in the order received, and
/// whether the connection read in batches meanwhile. Fails after `limit`
/// without them.
async fn read_commits(
    conn: &mut ReplicationConnection,
    commits: usize,
    limit: std::time::Duration,
) -> (Vec<i64>, bool) {
    let (mut ids, mut seen, mut batched) = (Vec::new(), 0, false);
    let read = async {
        while seen < commits {
            let message = conn.recv_copy().await.unwrap_or_else(|e| panic!("{e}"));
            let CopyMessage::Data(payload) = message else {
                panic!("the stream ended")
            };
            if let Ok(ServerMessage::XLogData {
                data, send_time, ..
            }) = ServerMessage::parse(payload)
            {
                match data.first() {
                    // `B`, the commit record's LSN, then the commit time.
                    Some(b'B') => {
                        let commit_time =
                            i64::from_be_bytes(data[9..17].try_into().unwrap_or_default());
                        conn.set_behind(is_backlog(send_time, PgTimestamp(commit_time)))
                            .unwrap_or_else(|e| panic!("{e}"));
                    }
                    Some(b'I') => ids.push(inserted_id(&data)),
                    Some(b'C') => seen += 1,
                    _ => {}
                }
            }
            batched |= conn.reads_in_batches();
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .unwrap_or_else(|_| panic!("{seen} of {commits} commits within {limit:?}"));
    (ids, batched)
}

/// A 3 MB backlog, then a transaction smaller than a batch once the
/// backlog has been read: every change arrives in order, the backlog is
/// read in batches, and the reader does not keep waiting for a batch that
/// never fills; transactions sent as they commit are read eagerly.
async fn backlog_then_quiet_tail(pg: &Cluster, sslmode: &str) {
    // One psql call runs as one transaction: the slot needs its own.
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION p FOR TABLE t");
    pg.psql("SELECT pg_create_logical_replication_slot('s', 'pgoutput')");
    pg.psql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g");
    pg.psql("INSERT INTO t VALUES (-1, 'small')");
    // Both older than a backlog's threshold when they are sent.
    std::thread::sleep(BACKLOG * 2);
    let p = params(&format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode={sslmode}",
        pg.port()
    ));
    let mut conn = ReplicationConnection::connect(&p, "walbridge-test")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    conn.start_copy_both(
        "START_REPLICATION SLOT s LOGICAL 0/0 (proto_version '1', publication_names 'p')",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let limit = std::time::Duration::from_secs(30);
    let (ids, batched) = read_commits(&mut conn, 2, limit).await;
    let expected: Vec<i64> = (1..=20000).chain([-1]).collect();
    assert!(ids == expected, "every change of the backlog, in order");
    assert!(batched, "the backlog is read in batches");
    pg.psql("INSERT INTO t VALUES (-2, 'tail')");
    let (ids, _) = read_commits(&mut conn, 1, limit).await;
    assert_eq!(ids, [-2]);
    for id in 1..=3 {
        // Flushed as it commits (the test cluster's commits are
        // asynchronous: the WAL writer would send it up to 200 ms late).
        pg.psql(&format!(
            "SET synchronous_commit = on; INSERT INTO t VALUES (-2 - {id}, 'caught up')"
        ));
        let (ids, _) = read_commits(&mut conn, 1, limit).await;
        assert_eq!(ids, [-2 - id]);
        assert!(
            !conn.reads_in_batches(),
            "after a transaction sent as it commits, reads are eager"
        );
    }
    conn.finish_copy_both()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    conn.close().await;
}

#[tokio::test]
async fn a_backlog_is_read_in_batches_and_a_quiet_tail_still_arrives() {
    backlog_then_quiet_tail(&Cluster::start(), "disable").await;
}

#[tokio::test]
async fn batched_reads_through_tls() {
    backlog_then_quiet_tail(&tls_only_cluster(), "require").await;
}
