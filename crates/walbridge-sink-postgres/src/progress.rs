//! Where the target remembers how far each source has been applied.
//!
//! The position is written in the same transaction as the data it covers,
//! so after any crash — of walbridge or of the target — the target's
//! stored position and its data agree, and the sink resumes right after
//! the last transaction the target kept: exactly once.
//!
//! * **Replication origin** (as a native subscriber): the apply session is
//!   bound to an origin `walbridge_<sink>_<source>` and each transaction
//!   records the source position with `pg_replication_origin_xact_setup`,
//!   in the commit record itself. Changes applied this way carry the
//!   origin, so a walbridge source or native subscription reading the
//!   target with `origin = none` skips them (cascades without loops).
//! * **Progress table**, for roles that may not use origins: an upsert of
//!   the row `(sink, source)` in the same transaction. Loops cannot be
//!   broken this way.

use tokio_postgres::Client;
use walbridge_core::{Lsn, PgTimestamp};
use walbridge_pg::{quote_ident, quote_literal, quote_qualified};

use walbridge_sink::Forgotten;

use crate::config::ProgressMode;
use crate::deferred::DeferredIndexes;
use crate::error::{SinkError, failed};

/// Splits `schema.table` (both parts required).
pub fn split_qualified(name: &str) -> Result<(&str, &str), String> {
    match name.split_once('.') {
        Some((s, t)) if !s.is_empty() && !t.is_empty() => Ok((s, t)),
        _ => Err(format!("`{name}`: write it as schema.table")),
    }
}

/// The functions a role must be able to execute to track progress with an origin.
const ORIGIN_FUNCTIONS: [&str; 5] = [
    "pg_replication_origin_create(text)",
    "pg_replication_origin_session_setup(text)",
    "pg_replication_origin_xact_setup(pg_lsn, timestamp with time zone)",
    "pg_replication_origin_progress(text, boolean)",
    "pg_replication_origin_advance(text, pg_lsn)",
];

/// One source's stored position on the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgressStore {
    /// A replication origin.
    Origin {
        /// Its name.
        name: String,
    },
    /// A row of the progress table.
    Table {
        /// The quoted table name.
        table: String,
        /// The sink's name (first key column).
        sink: String,
        /// The source's name (second key column).
        source: String,
    },
}

impl std::fmt::Display for ProgressStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgressStore::Origin { name } => write!(f, "replication origin {name}"),
            ProgressStore::Table { table, .. } => write!(f, "table {table}"),
        }
    }
}

impl ProgressStore {
    /// The origin name of `sink` for `source`.
    pub fn origin_name(sink: &str, source: &str) -> String {
        format!("walbridge_{sink}_{source}")
    }

    /// Chooses how progress is stored (for `auto`: an origin when the role
    /// may use one) and creates the origin or table when missing.
    pub async fn open(
        client: &Client,
        mode: ProgressMode,
        progress_table: &str,
        sink: &str,
        source: &str,
    ) -> Result<Self, SinkError> {
        let use_origin = uses_origin(client, mode).await?;
        if use_origin {
            let store = ProgressStore::Origin {
                name: Self::origin_name(sink, source),
            };
            store.create_origin(client).await?;
            return Ok(store);
        }
        let (schema, table) = split_qualified(progress_table).map_err(SinkError::Mapping)?;
        let table = quote_qualified(schema, table);
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                   sink text NOT NULL, source text NOT NULL, lsn pg_lsn NOT NULL, \
                   commit_time timestamptz, updated_at timestamptz NOT NULL DEFAULT now(), \
                   PRIMARY KEY (sink, source))"
            ))
            .await
            .map_err(failed(format!(
                "creating the progress table {progress_table} (set `progress_table` to a schema the role may create tables in)"
            )))?;
        Ok(ProgressStore::Table {
            table,
            sink: sink.to_owned(),
            source: source.to_owned(),
        })
    }

    async fn create_origin(&self, client: &Client) -> Result<(), SinkError> {
        if let ProgressStore::Origin { name } = self {
            client
                .execute(
                    "SELECT pg_replication_origin_create($1) WHERE pg_replication_origin_oid($1) IS NULL",
                    &[name],
                )
                .await
                .map_err(failed(format!("creating replication origin {name}")))?;
        }
        Ok(())
    }

    /// Where lane `lane` of `lanes` of the initial copy marks that it
    /// committed (see [`crate::apply`]'s copy lanes): an origin
    /// `<origin>_copy_<lane>_of_<lanes>`, or the progress table row
    /// `<source>/copy <lane> of <lanes>`. Created when missing.
    pub async fn open_copy_lane(
        &self,
        client: &Client,
        lane: usize,
        lanes: usize,
    ) -> Result<ProgressStore, SinkError> {
        let store = match self {
            ProgressStore::Origin { name } => ProgressStore::Origin {
                name: format!("{name}_copy_{lane}_of_{lanes}"),
            },
            ProgressStore::Table {
                table,
                sink,
                source,
            } => ProgressStore::Table {
                table: table.clone(),
                sink: sink.clone(),
                source: format!("{source}/copy {lane} of {lanes}"),
            },
        };
        store.create_origin(client).await?;
        Ok(store)
    }

    /// The copy lanes whose markers say they committed the initial copy
    /// taken at `consistent_point`: how many lanes that copy had and which
    /// committed. Markers of other copies (an earlier slot) do not count.
    pub async fn copy_lanes_done(
        &self,
        client: &Client,
        consistent_point: Lsn,
    ) -> Result<Option<(usize, Vec<usize>)>, SinkError> {
        let markers: Vec<(String, Option<String>)> = match self {
            ProgressStore::Origin { name } => client
                .query(
                    "SELECT substr(roname, length($1) + 1), pg_replication_origin_progress(roname, false)::text \
                     FROM pg_replication_origin WHERE starts_with(roname, $1)",
                    &[&format!("{name}_copy_")],
                )
                .await
                .map_err(failed("reading the initial copy's lane origins"))?,
            ProgressStore::Table {
                table,
                sink,
                source,
            } => client
                .query(
                    &format!(
                        "SELECT substr(source, length($2) + 1), lsn::text FROM {table} \
                         WHERE sink = $1 AND starts_with(source, $2)"
                    ),
                    &[sink, &format!("{source}/copy ")],
                )
                .await
                .map_err(failed(format!("reading the initial copy's lanes from {table}")))?,
        }
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
        let mut found = None;
        let mut done = Vec::new();
        for (rest, position) in markers {
            let Some((lane, lanes)) = parse_lane(&rest) else {
                continue;
            };
            if position.and_then(|p| p.parse::<Lsn>().ok()) != Some(consistent_point) {
                continue;
            }
            if *found.get_or_insert(lanes) == lanes {
                done.push(lane);
            }
        }
        Ok(found.map(|lanes| (lanes, done)))
    }

    /// Removes every copy lane marker of this source (after the source's
    /// own position covers the copy). An origin still bound elsewhere, or
    /// one the role may not drop, stays: markers only count for the copy
    /// they were written for.
    pub async fn drop_copy_lanes(&self, client: &Client) -> Result<(), SinkError> {
        match self {
            ProgressStore::Origin { name } => client
                .batch_execute(&format!(
                    "DO $$ DECLARE o text; BEGIN \
                       FOR o IN SELECT roname FROM pg_replication_origin WHERE starts_with(roname, {}) LOOP \
                         PERFORM pg_replication_origin_drop(o); \
                       END LOOP; END $$",
                    quote_literal(&format!("{name}_copy_"))
                ))
                .await
                .map_err(failed("dropping the initial copy's lane origins")),
            ProgressStore::Table {
                table,
                sink,
                source,
            } => client
                .execute(
                    &format!("DELETE FROM {table} WHERE sink = $1 AND starts_with(source, $2)"),
                    &[sink, &format!("{source}/copy ")],
                )
                .await
                .map(|_| ())
                .map_err(failed(format!("removing the initial copy's lanes from {table}"))),
        }
    }

    /// The message that ends a transaction recording `lsn`: one simple
    /// query, so that nothing can fail or wait between setting the position
    /// and COMMIT (PostgreSQL records the session's origin position in an
    /// abort record too, so walbridge dying in between would abort the
    /// transaction and still move the origin past its changes). Deferred
    /// constraints are checked first, while an error still rolls back
    /// without touching the position; an earlier error in the transaction
    /// makes every statement here fail the same way.
    pub fn commit_sql(&self, lsn: Lsn, commit_time: PgTimestamp) -> String {
        // With an origin, the commit record carries the position only if
        // the transaction has an id.
        let xid = match self {
            ProgressStore::Origin { .. } => "SELECT pg_current_xact_id(); ",
            ProgressStore::Table { .. } => "",
        };
        format!(
            "SET CONSTRAINTS ALL IMMEDIATE; {xid}{}; COMMIT",
            self.record_sql(lsn, commit_time)
        )
    }

    /// Binds the apply session to the origin, so its commits carry it.
    pub async fn bind_session(&self, client: &Client) -> Result<(), SinkError> {
        if let ProgressStore::Origin { name } = self {
            client
                .execute("SELECT pg_replication_origin_session_setup($1)", &[name])
                .await
                .map_err(|source| match source.code().map(|c| c.code()) {
                    // 55006 object_in_use: another session holds the origin.
                    Some("55006") => SinkError::Privilege {
                        what: format!("replication origin {name} is in use by another session"),
                        fix: "another walbridge (or `walbridge skip`) is applying with this sink name; stop it, or give this sink another name".into(),
                    },
                    // 53400 configuration_limit_exceeded: no free origin state.
                    Some("53400") => SinkError::Privilege {
                        what: format!("no free replication origin slot on the target for {name}"),
                        fix: "raise max_replication_slots on the target (each source of a postgres sink holds one origin, and 1 + copy_connections during its initial copy), or lower copy_connections".into(),
                    },
                    _ => SinkError::Target {
                        what: format!("binding the session to replication origin {name}"),
                        source,
                    },
                })?;
        }
        Ok(())
    }

    /// The position last committed, `None` before the first transaction.
    pub async fn applied(&self, client: &Client) -> Result<Option<Lsn>, SinkError> {
        let text: Option<String> = match self {
            ProgressStore::Origin { name } => client
                .query_one(
                    "SELECT pg_replication_origin_progress($1, false)::text",
                    &[name],
                )
                .await
                .map_err(failed(format!("reading replication origin {name}")))?
                .get(0),
            ProgressStore::Table {
                table,
                sink,
                source,
            } => client
                .query_opt(
                    &format!("SELECT lsn::text FROM {table} WHERE sink = $1 AND source = $2"),
                    &[sink, source],
                )
                .await
                .map_err(failed(format!("reading {table}")))?
                .map(|r| r.get(0)),
        };
        Ok(text
            .and_then(|t| t.parse::<Lsn>().ok())
            .filter(|l| !l.is_zero()))
    }

    /// The statement, run in the applying transaction just before COMMIT,
    /// that records `lsn` as applied.
    pub fn record_sql(&self, lsn: Lsn, commit_time: PgTimestamp) -> String {
        let lsn = quote_literal(&lsn.to_string());
        let time = format!(
            "to_timestamp({}::float8 / 1000000)",
            commit_time.unix_micros()
        );
        match self {
            ProgressStore::Origin { .. } => {
                format!("SELECT pg_replication_origin_xact_setup({lsn}, {time})")
            }
            ProgressStore::Table {
                table,
                sink,
                source,
            } => format!(
                "INSERT INTO {table} (sink, source, lsn, commit_time) VALUES ({}, {}, {lsn}, {time}) \
                 ON CONFLICT (sink, source) DO UPDATE SET lsn = EXCLUDED.lsn, commit_time = EXCLUDED.commit_time, updated_at = now()",
                quote_literal(sink),
                quote_literal(source)
            ),
        }
    }

    /// Moves the stored position to `to`, outside the apply session (for
    /// `walbridge skip`); fails if the position is not `from` any more.
    pub async fn advance(
        &self,
        client: &Client,
        from: Option<Lsn>,
        to: Lsn,
    ) -> Result<(), SinkError> {
        if self.applied(client).await? != from {
            return Err(SinkError::Mapping(
                "the sink's position changed meanwhile; run the command again".into(),
            ));
        }
        match self {
            ProgressStore::Origin { name } => client
                .execute(
                    "SELECT pg_replication_origin_advance($1, $2::text::pg_lsn)",
                    &[name, &to.to_string()],
                )
                .await
                .map(|_| ())
                .map_err(|source| match source.code().map(|c| c.code()) {
                    Some("55006") => SinkError::Privilege {
                        what: format!("replication origin {name} is in use"),
                        fix: "the sink is applying right now; wait until it reports the conflict again and retry".into(),
                    },
                    _ => SinkError::Target {
                        what: format!("advancing replication origin {name}"),
                        source,
                    },
                }),
            ProgressStore::Table { .. } => client
                .batch_execute(&self.record_sql(to, PgTimestamp::now()))
                .await
                .map_err(failed("advancing the progress table")),
        }
    }
}

/// `<lane>_of_<lanes>` or `<lane> of <lanes>`, lane below lanes.
fn parse_lane(text: &str) -> Option<(usize, usize)> {
    let (lane, lanes) = text
        .split_once("_of_")
        .or_else(|| text.split_once(" of "))?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(lane) || !digits(lanes) {
        return None;
    }
    let (lane, lanes) = (lane.parse().ok()?, lanes.parse().ok()?);
    (lane < lanes).then_some((lane, lanes))
}

/// Superusers may; others need EXECUTE on every origin function.
/// Whether progress goes to an origin (`auto`: when the role may use
/// one); `origin` without the privileges is an error saying what to grant.
async fn uses_origin(client: &Client, mode: ProgressMode) -> Result<bool, SinkError> {
    let may_use_origins = may_use_origins(client).await?;
    match mode {
        ProgressMode::Origin if !may_use_origins => Err(SinkError::Privilege {
            what: "progress = \"origin\" but the role may not use replication origins".into(),
            fix: format!(
                "connect as a superuser, or GRANT EXECUTE ON FUNCTION {} TO the role; or use progress = \"table\"",
                ORIGIN_FUNCTIONS.join(", ")
            ),
        }),
        ProgressMode::Origin => Ok(true),
        ProgressMode::Auto => Ok(may_use_origins),
        ProgressMode::Table => Ok(false),
    }
}

/// Checks, without creating anything, that the role can store progress
/// the way [`ProgressStore::open`] will: replication origins, or the
/// progress table (read and written if it exists, else created, which
/// needs CREATE on its schema — PostgreSQL 15 took that right on `public`
/// away from ordinary roles).
pub async fn check_privileges(
    client: &Client,
    mode: ProgressMode,
    progress_table: &str,
) -> Result<(), SinkError> {
    if uses_origin(client, mode).await? {
        return Ok(());
    }
    let (schema, table) = split_qualified(progress_table).map_err(SinkError::Mapping)?;
    let row = client
        .query_one(
            "SELECT current_user::text, n.oid IS NOT NULL,                     coalesce(has_schema_privilege(n.oid, 'USAGE'), false),                     coalesce(has_schema_privilege(n.oid, 'CREATE'), false),                     c.oid IS NOT NULL,                     coalesce(has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE'), false)              FROM (SELECT 1) one              LEFT JOIN pg_namespace n ON n.nspname = $1              LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $2",
            &[&schema, &table],
        )
        .await
        .map_err(failed("checking the role's privileges on the progress table"))?;
    let (user, schema_exists, usage, create, table_exists, writable): (
        String,
        bool,
        bool,
        bool,
        bool,
        bool,
    ) = (
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
    );
    let user = quote_ident(&user);
    let schema_name = quote_ident(schema);
    let quoted = quote_qualified(schema, table);
    let what = format!(
        "the role cannot store its progress in {quoted} (progress = \"table\", or \"auto\" without replication origins)"
    );
    let fix = if !schema_exists {
        format!(
            "CREATE SCHEMA {schema_name} AUTHORIZATION {user} on the target, or set `progress_table` to a table in an existing schema"
        )
    } else if !usage {
        format!("GRANT USAGE ON SCHEMA {schema_name} TO {user}")
    } else if table_exists && !writable {
        format!("GRANT SELECT, INSERT, UPDATE ON {quoted} TO {user}")
    } else if !table_exists && !create {
        format!(
            "GRANT CREATE ON SCHEMA {schema_name} TO {user} (it creates {quoted}), or set `progress_table` to a schema the role may create tables in"
        )
    } else {
        return Ok(());
    };
    Err(SinkError::Privilege { what, fix })
}

async fn may_use_origins(client: &Client) -> Result<bool, SinkError> {
    let row = client
        .query_one(
            "SELECT rolsuper OR ( \
                 has_function_privilege($1, 'EXECUTE') AND has_function_privilege($2, 'EXECUTE') AND \
                 has_function_privilege($3, 'EXECUTE') AND has_function_privilege($4, 'EXECUTE') AND \
                 has_function_privilege($5, 'EXECUTE')) \
             FROM pg_roles WHERE rolname = current_user",
            &[
                &ORIGIN_FUNCTIONS[0],
                &ORIGIN_FUNCTIONS[1],
                &ORIGIN_FUNCTIONS[2],
                &ORIGIN_FUNCTIONS[3],
                &ORIGIN_FUNCTIONS[4],
            ],
        )
        .await
        .map_err(failed("checking the role's privileges"))?;
    Ok(row.get(0))
}

/// What `walbridge drop` of `source` removes from the target of `sink`:
/// its replication origins (the source's, and its copy lanes') and its
/// rows of the progress table, whichever exist; and it builds the indexes
/// an unfinished initial copy dropped. What the role may not remove is
/// left, said with the statement that removes it.
pub async fn forget(client: &Client, progress_table: &str, sink: &str, source: &str) -> Forgotten {
    let mut forgotten = Forgotten::default();
    let origin = ProgressStore::origin_name(sink, source);
    // The names first: a role without EXECUTE on the drop function may
    // still have nothing to drop.
    match client
        .query(
            "SELECT roname FROM pg_replication_origin \
             WHERE roname = $1 OR starts_with(roname, $1 || '_copy_') ORDER BY roname",
            &[&origin],
        )
        .await
    {
        Ok(rows) => {
            for row in rows {
                let name: String = row.get(0);
                match client
                    .execute("SELECT pg_replication_origin_drop($1)", &[&name])
                    .await
                {
                    Ok(_) => forgotten
                        .removed
                        .push(format!("dropped replication origin {name}")),
                    Err(e) => forgotten.left.push(format!(
                        "replication origin {name} ({}): SELECT pg_replication_origin_drop({});",
                        failed(format!("dropping {name}"))(e),
                        quote_literal(&name)
                    )),
                }
            }
        }
        Err(e) => forgotten.left.push(format!(
            "{} ({})",
            forget_by_hand(ProgressMode::Origin, progress_table, sink, source).concat(),
            failed("listing replication origins")(e)
        )),
    }
    let rows_by_hand =
        || forget_by_hand(ProgressMode::Table, progress_table, sink, source).concat();
    let Ok((schema, table)) = split_qualified(progress_table) else {
        return forgotten;
    };
    let table = quote_qualified(schema, table);
    let deleted = async {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await?
            .get(0);
        if !exists {
            return Ok(0);
        }
        client
            .execute(
                &format!(
                    "DELETE FROM {table} WHERE sink = $1 AND (source = $2 OR starts_with(source, $2 || '/copy '))"
                ),
                &[&sink, &source],
            )
            .await
    };
    match deleted.await {
        Ok(0) => {}
        Ok(n) => forgotten
            .removed
            .push(format!("deleted {n} row(s) from {progress_table}")),
        Err(e) => forgotten.left.push(format!(
            "{} ({})",
            rows_by_hand(),
            failed(format!("deleting from {progress_table}"))(e)
        )),
    }
    build_deferred(client, progress_table, sink, source, &mut forgotten).await;
    forgotten
}

/// Builds the indexes an initial copy of `source` that never finished
/// dropped (see [`crate::deferred`]): the target keeps its indexes
/// whatever becomes of the copy.
async fn build_deferred(
    client: &Client,
    progress_table: &str,
    sink: &str,
    source: &str,
    forgotten: &mut Forgotten,
) {
    let Ok(deferred) = DeferredIndexes::new(progress_table, sink, source) else {
        return;
    };
    let pending = match deferred.pending(client).await {
        Ok(pending) => pending,
        Err(e) => {
            forgotten.left.push(format!("{} ({e})", deferred.by_hand()));
            return;
        }
    };
    for index in pending {
        match deferred.build(client, &index).await {
            Ok(()) => forgotten.removed.push(format!(
                "built index {} of {} again (an initial copy that did not finish had dropped it)",
                index.index, index.table
            )),
            Err(e) => forgotten.left.push(e.to_string()),
        }
    }
}

/// What [`forget`] would remove, as statements to run on the target by
/// hand: for `mode` auto, both kinds of store.
pub fn forget_by_hand(
    mode: ProgressMode,
    progress_table: &str,
    sink: &str,
    source: &str,
) -> Vec<String> {
    let origin = ProgressStore::origin_name(sink, source);
    let mut left = Vec::new();
    if mode != ProgressMode::Table {
        left.push(format!(
            "replication origin {origin} (and its copy lanes), if it exists: \
             SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname = {0} OR starts_with(roname, {0} || '_copy_');",
            quote_literal(&origin)
        ));
    }
    if mode != ProgressMode::Origin {
        left.push(format!(
            "the rows of source `{source}` in {progress_table}, if any: \
             DELETE FROM {progress_table} WHERE sink = {} AND (source = {1} OR starts_with(source, {1} || '/copy '));",
            quote_literal(sink),
            quote_literal(source)
        ));
    }
    left
}
