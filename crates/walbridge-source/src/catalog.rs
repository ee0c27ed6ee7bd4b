//! Catalog lookups over an ordinary SQL connection: type classification,
//! table descriptions for the snapshot, and the tables a publication covers.

use std::collections::HashMap;

use tokio_postgres::{Client, Row};
use walbridge_core::{Column, Oid, Relation, ReplicaIdentity, TableName, TypeKind, ValueKind};

use crate::pgoutput::RelationBody;

/// A catalog query failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The query failed.
    #[error("catalog query failed ({what}): {}", crate::wire::describe_pg_error(.source))]
    Query {
        /// What was being looked up.
        what: String,
        /// Cause.
        source: tokio_postgres::Error,
    },
    /// A published table disappeared.
    #[error("table with OID {0} no longer exists")]
    MissingTable(Oid),
}

fn query_error(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> CatalogError {
    let what = what.into();
    move |source| CatalogError::Query { what, source }
}

#[derive(Debug, Clone)]
struct TypeRow {
    schema: String,
    name: String,
    kind: TypeKind,
    category: u8,
    element: Oid,
    base: Oid,
    delimiter: u8,
}

/// Resolves type OIDs to names and [`ValueKind`]s, caching what it learned.
#[derive(Clone, Debug, Default)]
pub struct TypeCatalog {
    rows: HashMap<Oid, TypeRow>,
}

impl TypeCatalog {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    async fn load(
        &mut self,
        client: &Client,
        oids: impl IntoIterator<Item = Oid>,
    ) -> Result<(), CatalogError> {
        let mut wanted: Vec<Oid> = oids
            .into_iter()
            .filter(|o| !self.rows.contains_key(o))
            .collect();
        // Arrays need their elements and domains their base types: follow them.
        while !wanted.is_empty() {
            wanted.sort_unstable();
            wanted.dedup();
            let rows = client
                .query(
                    "SELECT t.oid, n.nspname, t.typname, t.typtype::text, t.typcategory::text, t.typelem, t.typbasetype, t.typdelim::text \
                     FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = ANY($1)",
                    &[&wanted],
                )
                .await
                .map_err(query_error("pg_type"))?;
            let mut next = Vec::new();
            for row in rows {
                let oid: Oid = row.get(0);
                let byte = |i: usize| row.get::<_, String>(i).bytes().next().unwrap_or(b'?');
                let t = TypeRow {
                    schema: row.get(1),
                    name: row.get(2),
                    kind: TypeKind::from_typtype(byte(3)).unwrap_or(TypeKind::Base),
                    category: byte(4),
                    element: row.get(5),
                    base: row.get(6),
                    delimiter: byte(7),
                };
                for dep in [t.element, t.base] {
                    if dep != 0 && !self.rows.contains_key(&dep) {
                        next.push(dep);
                    }
                }
                self.rows.insert(oid, t);
            }
            // Types that vanished resolve to `Other`; do not ask again.
            for oid in &wanted {
                self.rows.entry(*oid).or_insert(TypeRow {
                    schema: "pg_catalog".into(),
                    name: format!("oid:{oid}"),
                    kind: TypeKind::Base,
                    category: b'X',
                    element: 0,
                    base: 0,
                    delimiter: b',',
                });
            }
            next.retain(|o| !self.rows.contains_key(o));
            wanted = next;
        }
        Ok(())
    }

    /// The display name of a loaded type: schema-qualified outside `pg_catalog`.
    fn name(&self, oid: Oid) -> String {
        match self.rows.get(&oid) {
            Some(t) if t.schema == "pg_catalog" => t.name.clone(),
            Some(t) => format!("{}.{}", t.schema, t.name),
            None => format!("oid:{oid}"),
        }
    }

    fn kind(&self, oid: Oid, depth: u8) -> ValueKind {
        if let Some(k) = ValueKind::builtin(oid) {
            return k;
        }
        let Some(t) = self.rows.get(&oid) else {
            return ValueKind::Other;
        };
        if depth > 16 {
            return ValueKind::Other;
        }
        match t.kind {
            TypeKind::Domain => self.kind(t.base, depth + 1),
            TypeKind::Enum => ValueKind::Enum,
            TypeKind::Composite => ValueKind::Composite,
            TypeKind::Range | TypeKind::Multirange => ValueKind::Range,
            TypeKind::Base if t.category == b'A' && t.element != 0 => ValueKind::Array {
                element: Box::new(self.kind(t.element, depth + 1)),
                delimiter: self.rows.get(&t.element).map_or(b',', |e| e.delimiter),
            },
            TypeKind::Base if t.category == b'S' => ValueKind::Text,
            _ => ValueKind::Other,
        }
    }

    /// Turns a Relation message into a descriptor with resolved types.
    pub async fn describe(
        &mut self,
        client: &Client,
        body: RelationBody,
    ) -> Result<Relation, CatalogError> {
        let table = [body.id];
        // Sent together: one round trip on the connection, not four, while
        // the stream waits (a table's first change after every start).
        let ((), attributes, mut keys, mut roots) = tokio::try_join!(
            self.load(client, body.columns.iter().map(|c| c.type_oid)),
            attributes(client, &table),
            primary_keys(client, &table),
            partition_roots(client, &table),
        )?;
        let attributes = attributes.get(&body.id).map_or(&[][..], Vec::as_slice);
        let columns: Vec<Column> = body
            .columns
            .into_iter()
            .map(|c| {
                // What pgoutput does not send, looked up by name in the
                // catalog as it is now, which may be past later DDL: a
                // column gone by then keeps 0, false and `None`.
                let now = attributes.iter().find(|a| a.name == c.name);
                Column {
                    type_name: self.name(c.type_oid),
                    kind: self.kind(c.type_oid, 0),
                    type_oid: c.type_oid,
                    type_modifier: c.type_modifier,
                    is_key: c.is_key,
                    attnum: now.map_or(0, |a| a.attnum),
                    not_null: now.is_some_and(|a| a.not_null),
                    missing_value: now.and_then(|a| a.missing_value.clone()),
                    name: c.name,
                }
            })
            .collect();
        Ok(Relation {
            partition_root: roots.remove(&body.id),
            primary_key: key_positions(keys.remove(&body.id).as_ref(), &columns),
            id: body.id,
            schema: body.schema,
            name: body.name,
            replica_identity: body.replica_identity,
            columns,
        })
    }
}

/// One attribute of a table as the catalog has it now.
#[derive(Debug, Clone)]
struct Attribute {
    name: String,
    type_oid: Oid,
    type_modifier: i32,
    attnum: i16,
    not_null: bool,
    /// The value older rows read in a column added with a constant default.
    missing_value: Option<String>,
    /// A generated column: pgoutput does not publish it.
    generated: bool,
    /// Part of the replica identity (the primary key, or the identity index).
    in_identity: bool,
}

/// The attributes of `tables` (neither dropped nor system), in attribute
/// order, with one query.
async fn attributes(
    client: &Client,
    tables: &[Oid],
) -> Result<HashMap<Oid, Vec<Attribute>>, CatalogError> {
    // attmissingval is an anyarray of one element: its text form read back
    // as text[] gives the element's own text form.
    let rows = query_tables(
        client,
        "SELECT a.attrelid, a.attname::text, a.atttypid, a.atttypmod, a.attnum, a.attnotnull, \
                CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END, \
                a.attgenerated <> '', \
                EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND a.attnum = ANY(i.indkey) \
                    AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END) \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         WHERE a.attrelid = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attrelid, a.attnum",
        tables,
        "columns",
    )
    .await?;
    let mut by_table: HashMap<Oid, Vec<Attribute>> = HashMap::new();
    for row in rows {
        by_table.entry(row.get(0)).or_default().push(Attribute {
            name: row.get(1),
            type_oid: row.get(2),
            type_modifier: row.get(3),
            attnum: row.get(4),
            not_null: row.get(5),
            missing_value: row.get(6),
            generated: row.get(7),
            in_identity: row.get(8),
        });
    }
    Ok(by_table)
}

/// The primary keys of `tables` (those that have one), their columns'
/// names in key order, with one query.
async fn primary_keys(
    client: &Client,
    tables: &[Oid],
) -> Result<HashMap<Oid, Vec<String>>, CatalogError> {
    let rows = query_tables(
        client,
        "SELECT i.indrelid, a.attname::text FROM pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = ANY($1) AND i.indisprimary ORDER BY i.indrelid, k.position",
        tables,
        "primary keys",
    )
    .await?;
    let mut by_table: HashMap<Oid, Vec<String>> = HashMap::new();
    for row in rows {
        by_table.entry(row.get(0)).or_default().push(row.get(1));
    }
    Ok(by_table)
}

/// Indexes in `columns` of a primary key's columns (`key`), in key order;
/// empty when there is none or a key column is not among `columns`.
fn key_positions(key: Option<&Vec<String>>, columns: &[Column]) -> Vec<usize> {
    key.map(|names| {
        names
            .iter()
            .map(|name| columns.iter().position(|c| &c.name == name))
            .collect::<Option<Vec<usize>>>()
            .unwrap_or_default()
    })
    .unwrap_or_default()
}

/// The roots of the partition trees those of `tables` that are partitions
/// belong to, with one query.
async fn partition_roots(
    client: &Client,
    tables: &[Oid],
) -> Result<HashMap<Oid, TableName>, CatalogError> {
    let rows = query_tables(
        client,
        "SELECT c.oid, n.nspname::text, r.relname::text FROM pg_class c \
             JOIN pg_class r ON r.oid = pg_partition_root(c.oid::regclass) \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE c.oid = ANY($1) AND c.relispartition AND r.oid <> c.oid",
        tables,
        "partition roots",
    )
    .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let root = TableName {
                schema: row.get(1),
                name: row.get(2),
            };
            (row.get(0), root)
        })
        .collect())
}

/// Runs a catalog query whose one parameter is `tables`' OIDs; `what`
/// it looks up names it in an error.
async fn query_tables(
    client: &Client,
    sql: &str,
    tables: &[Oid],
    what: &str,
) -> Result<Vec<Row>, CatalogError> {
    client
        .query(sql, &[&tables])
        .await
        .map_err(query_error(format!("{what} of {}", table_list(tables))))
}

/// `tables` named for an error: one table's OID, or how many.
fn table_list(tables: &[Oid]) -> String {
    match tables {
        [one] => format!("table {one}"),
        many => format!("{} tables", many.len()),
    }
}

/// A table covered by the source's publications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedTable {
    /// The table's OID.
    pub oid: Oid,
    /// Schema.
    pub schema: String,
    /// Name.
    pub name: String,
    /// Published columns (a column list), or `None` for all columns.
    pub columns: Option<Vec<String>>,
    /// The row filter, when every publication of the table has one.
    pub row_filter: Option<String>,
}

impl PublishedTable {
    /// `"schema"."name"`, quoted for SQL.
    pub fn quoted_name(&self) -> String {
        walbridge_pg::quote_qualified(&self.schema, &self.name)
    }
}

/// The tables `publications` cover, merged across publications as
/// PostgreSQL's own table synchronization does: a column list only if every
/// publication has one (their union), a row filter only if every
/// publication has one (OR-ed).
pub async fn published_tables(
    client: &Client,
    publications: &[String],
    server_version: u32,
) -> Result<Vec<PublishedTable>, CatalogError> {
    let with_lists = server_version >= 150_000;
    let sql = if with_lists {
        "SELECT c.oid, p.schemaname, p.tablename, p.attnames, p.rowfilter, \
                (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '')::int4 \
         FROM pg_publication_tables p \
         JOIN pg_namespace n ON n.nspname = p.schemaname \
         JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
         WHERE p.pubname = ANY($1) ORDER BY 2, 3"
    } else {
        "SELECT c.oid, p.schemaname, p.tablename, NULL::text[], NULL::text, 0::int4 \
         FROM pg_publication_tables p \
         JOIN pg_namespace n ON n.nspname = p.schemaname \
         JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
         WHERE p.pubname = ANY($1) ORDER BY 2, 3"
    };
    let rows = client
        .query(sql, &[&publications])
        .await
        .map_err(query_error("pg_publication_tables"))?;
    let mut out: Vec<PublishedTable> = Vec::new();
    // Where each table is in `out` (a table is listed once per publication).
    let mut index: HashMap<Oid, usize> = HashMap::new();
    // Per table: (all columns published by some publication, filters, some publication unfiltered).
    let mut unfiltered: HashMap<Oid, bool> = HashMap::new();
    let mut all_columns: HashMap<Oid, bool> = HashMap::new();
    for row in rows {
        let oid: Oid = row.get(0);
        let attnames: Option<Vec<String>> = row.get(3);
        let filter: Option<String> = row.get(4);
        let ncols: i32 = row.get(5);
        let full = attnames.as_ref().is_none_or(|a| a.len() as i32 >= ncols);
        *all_columns.entry(oid).or_insert(false) |= full;
        *unfiltered.entry(oid).or_insert(false) |= filter.is_none();
        match index.get(&oid).map(|&i| &mut out[i]) {
            Some(t) => {
                if let (Some(cols), Some(more)) = (&mut t.columns, attnames) {
                    for c in more {
                        if !cols.contains(&c) {
                            cols.push(c);
                        }
                    }
                }
                if let (Some(f), Some(more)) = (&mut t.row_filter, filter) {
                    *f = format!("({f}) OR ({more})");
                }
            }
            None => {
                index.insert(oid, out.len());
                out.push(PublishedTable {
                    oid,
                    schema: row.get(1),
                    name: row.get(2),
                    columns: attnames,
                    row_filter: filter,
                });
            }
        }
    }
    for t in &mut out {
        if all_columns.get(&t.oid).copied().unwrap_or(true) {
            t.columns = None;
        }
        if unfiltered.get(&t.oid).copied().unwrap_or(true) {
            t.row_filter = None;
        }
    }
    Ok(out)
}

/// Tables described by one set of queries: a publication of 10,000
/// tables takes five queries, not six per table (0.8 ms a table, 8.4 s for
/// 10,000, 32 at a time). Not fewer: some of the queries scan a whole
/// catalog (`pg_attribute`, 20 to 35 ms with 10,000 tables), once per group.
pub const DESCRIBED_AT_ONCE: usize = 10_000;

/// A published table as the initial copy plans it.
#[derive(Debug, Clone)]
pub struct DescribedTable {
    /// Its descriptor, as pgoutput would send it.
    pub relation: Relation,
    /// The size of its main fork (`pg_relation_size`; 0 for a partitioned table).
    pub bytes: u64,
    /// A partitioned table (its rows are in its partitions).
    pub partitioned: bool,
    /// The planner's estimate of its rows (`reltuples`), when there is one.
    pub estimate: Option<u64>,
}

/// Describes published tables as pgoutput would: published columns in
/// attribute order (generated columns excluded), key flags per replica
/// identity; in `tables`' order, with five queries (four of them sent
/// together) per [`DESCRIBED_AT_ONCE`] tables.
pub async fn describe_tables(
    client: &Client,
    types: &mut TypeCatalog,
    tables: &[PublishedTable],
) -> Result<Vec<DescribedTable>, CatalogError> {
    describe_in_groups(client, types, tables, DESCRIBED_AT_ONCE).await
}

/// [`describe_tables`] with five queries per `group` tables (each query's
/// answer holds a group's columns).
pub async fn describe_in_groups(
    client: &Client,
    types: &mut TypeCatalog,
    tables: &[PublishedTable],
    group: usize,
) -> Result<Vec<DescribedTable>, CatalogError> {
    let mut described = Vec::with_capacity(tables.len());
    for group in tables.chunks(group.max(1)) {
        let oids: Vec<Oid> = group.iter().map(|t| t.oid).collect();
        // Sent together (one round trip), then the types the columns name.
        let (classes, attributes, keys, roots) = tokio::try_join!(
            query_tables(
                client,
                "SELECT oid, relreplident::text, pg_relation_size(oid), relkind = 'p', reltuples::int8 \
                 FROM pg_class WHERE oid = ANY($1)",
                &oids,
                "pg_class",
            ),
            attributes(client, &oids),
            primary_keys(client, &oids),
            partition_roots(client, &oids),
        )?;
        let classes: HashMap<Oid, (String, i64, bool, i64)> = classes
            .iter()
            .map(|row| (row.get(0), (row.get(1), row.get(2), row.get(3), row.get(4))))
            .collect();
        types
            .load(client, attributes.values().flatten().map(|a| a.type_oid))
            .await?;
        for table in group {
            let (identity, bytes, partitioned, reltuples) = classes
                .get(&table.oid)
                .ok_or(CatalogError::MissingTable(table.oid))?;
            let replica_identity =
                ReplicaIdentity::from_byte(identity.bytes().next().unwrap_or(b'd'))
                    .unwrap_or(ReplicaIdentity::Default);
            let columns: Vec<Column> = attributes
                .get(&table.oid)
                .into_iter()
                .flatten()
                .filter(|a| {
                    !a.generated
                        && table
                            .columns
                            .as_ref()
                            .is_none_or(|list| list.contains(&a.name))
                })
                .map(|a| Column {
                    type_name: types.name(a.type_oid),
                    kind: types.kind(a.type_oid, 0),
                    name: a.name.clone(),
                    type_oid: a.type_oid,
                    type_modifier: a.type_modifier,
                    is_key: a.in_identity || replica_identity == ReplicaIdentity::Full,
                    attnum: a.attnum,
                    not_null: a.not_null,
                    missing_value: a.missing_value.clone(),
                })
                .collect();
            described.push(DescribedTable {
                relation: Relation {
                    partition_root: roots.get(&table.oid).cloned(),
                    primary_key: key_positions(keys.get(&table.oid), &columns),
                    id: table.oid,
                    schema: table.schema.clone(),
                    name: table.name.clone(),
                    replica_identity,
                    columns,
                },
                bytes: (*bytes).max(0) as u64,
                partitioned: *partitioned,
                // -1 (never analyzed) or 0 (empty, or never analyzed before 14): no estimate.
                estimate: (*reltuples > 0).then_some(*reltuples as u64),
            });
        }
    }
    Ok(described)
}

/// Describes one published table (see [`describe_tables`]).
pub async fn describe_table(
    client: &Client,
    types: &mut TypeCatalog,
    table: &PublishedTable,
) -> Result<Relation, CatalogError> {
    describe_tables(client, types, std::slice::from_ref(table))
        .await?
        .pop()
        .map(|described| described.relation)
        .ok_or(CatalogError::MissingTable(table.oid))
}
