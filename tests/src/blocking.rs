//! A blocking SQL client for test threads that write to a publisher in a
//! loop (a `psql` process per statement would be the bottleneck).

/// One connection, driven by a runtime of its own.
pub struct Blocking {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Blocking {
    /// Connects to `connstr`; panics when it cannot.
    pub fn connect(connstr: &str) -> Blocking {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let client = runtime.block_on(async {
            let (client, conn) = tokio_postgres::connect(connstr, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            tokio::spawn(conn);
            client
        });
        Blocking { runtime, client }
    }

    /// Runs `sql` (one or more statements); panics naming it when it fails.
    pub fn execute(&self, sql: &str) {
        self.runtime
            .block_on(self.client.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}
