//! The harness itself works: clusters start with logical WAL and answer.

use walbridge_tests::Cluster;

#[test]
fn cluster_starts_with_logical_wal() {
    let pg = Cluster::start();
    assert_eq!(pg.psql("SHOW wal_level"), "logical");
    assert!(pg.major() >= 14, "server {} too old", pg.version_num());
    let data = pg.data_dir();
    drop(pg);
    assert!(!data.exists(), "data directory is removed on drop");
}
