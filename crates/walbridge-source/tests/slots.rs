//! Slot commands against a real server: both syntaxes, permanent and
//! temporary, every snapshot action; dropping; looking slots up.

use walbridge_source::slot::{
    self, SlotOptions, SlotPersistence, SnapshotAction, create_slot_command,
};
use walbridge_source::wire::{ConnParams, ReplicationConnection};
use walbridge_tests::Cluster;

async fn connect(pg: &Cluster) -> ReplicationConnection {
    let params = ConnParams::parse(&pg.superuser()).unwrap_or_else(|e| panic!("{e}"));
    ReplicationConnection::connect(&params, "slot-test")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn create_use_and_drop_slots_in_both_syntaxes() {
    let pg = Cluster::start();
    let mut conn = connect(&pg).await;
    let version = conn.server_version_num();

    // Exported snapshot, current syntax: another session can import it.
    let exported = slot::create_slot(
        &mut conn,
        "exported",
        SlotPersistence::Permanent,
        SnapshotAction::Export,
        SlotOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let name = exported
        .snapshot_name
        .clone()
        .unwrap_or_else(|| panic!("no snapshot name"));
    let imported = pg.psql(&format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '{name}'; SELECT 'imported'; COMMIT"
    ));
    assert_eq!(imported, "imported");
    let info = slot::slot_info(&mut conn, "exported")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("slot missing"));
    assert_eq!(info.plugin.as_deref(), Some("pgoutput"));
    assert!(!info.two_phase);

    // The keyword syntax of older servers is still accepted by newer ones.
    for (slot_name, persistence, action) in [
        (
            "old_nothing",
            SlotPersistence::Permanent,
            SnapshotAction::Nothing,
        ),
        (
            "old_temp",
            SlotPersistence::Temporary,
            SnapshotAction::Nothing,
        ),
    ] {
        let command = create_slot_command(
            slot_name,
            persistence,
            action,
            SlotOptions::default(),
            140_000,
        );
        conn.simple_query(&command)
            .await
            .unwrap_or_else(|e| panic!("{command}: {e}"));
    }
    assert_eq!(
        pg.psql("SELECT temporary FROM pg_replication_slots WHERE slot_name = 'old_temp'"),
        "t"
    );

    // USE: the replication connection's own transaction sees the slot's snapshot.
    conn.simple_query("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    slot::create_slot(
        &mut conn,
        "used",
        SlotPersistence::Temporary,
        SnapshotAction::Use,
        SlotOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let rows = conn
        .simple_query("SELECT count(*) AS n FROM pg_class")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(rows[0].get(0, "n").is_some());
    conn.simple_query("COMMIT")
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    if version >= 150_000 {
        slot::create_slot(
            &mut conn,
            "twophase",
            SlotPersistence::Permanent,
            SnapshotAction::Nothing,
            SlotOptions {
                two_phase: true,
                failover: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            pg.psql("SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'twophase'"),
            "t"
        );
    }
    if version >= 170_000 {
        // Failover: at creation, or set on an existing slot.
        slot::create_slot(
            &mut conn,
            "failing_over",
            SlotPersistence::Permanent,
            SnapshotAction::Nothing,
            SlotOptions {
                two_phase: false,
                failover: true,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        slot::set_failover(&mut conn, "twophase")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for name in ["failing_over", "twophase"] {
            let info = slot::slot_info(&mut conn, name)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(info.is_some_and(|i| i.failover), "{name}");
        }
    }
    for name in ["exported", "old_nothing"] {
        slot::drop_slot(&mut conn, name, false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        slot::slot_info(&mut conn, "exported")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
    conn.close().await;
    // Temporary slots go with their connection.
    assert_eq!(
        pg.wait_for(
            "SELECT count(*) FROM pg_replication_slots WHERE temporary",
            "0",
            std::time::Duration::from_secs(10)
        ),
        "0"
    );
}
