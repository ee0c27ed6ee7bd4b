//! Catalog lookups over an ordinary SQL connection: type classification,
//! table descriptions for the snapshot, and the tables a publication covers.

use std::collections::HashMap;

use tokio_postgres::Client;
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

    /// Loads the types of every column of `tables` with one query, so
    /// that describing them asks nothing more about types.
    pub async fn load_tables(
        &mut self,
        client: &Client,
        tables: &[Oid],
    ) -> Result<(), CatalogError> {
        let rows = client
            .query(
                "SELECT DISTINCT atttypid FROM pg_attribute \
                 WHERE attrelid = ANY($1) AND attnum > 0 AND NOT attisdropped",
                &[&tables],
            )
            .await
            .map_err(query_error("pg_attribute"))?;
        self.load(client, rows.iter().map(|row| row.get::<_, Oid>(0)))
            .await
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
        self.load(client, body.columns.iter().map(|c| c.type_oid))
            .await?;
        let mut columns: Vec<Column> = body
            .columns
            .into_iter()
            .map(|c| Column {
                type_name: self.name(c.type_oid),
                kind: self.kind(c.type_oid, 0),
                name: c.name,
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
                is_key: c.is_key,
                attnum: 0,
                not_null: false,
                missing_value: None,
            })
            .collect();
        attributes(client, body.id, &mut columns).await?;
        Ok(Relation {
            partition_root: partition_root(client, body.id).await?,
            primary_key: primary_key(client, body.id, &columns).await?,
            id: body.id,
            schema: body.schema,
            name: body.name,
            replica_identity: body.replica_identity,
            columns,
        })
    }
}

/// Fills in what pgoutput does not send about `columns` of `table`: the
/// attribute number, `NOT NULL`, and the value older rows read in a column
/// added with a constant default. Looked up by name in the catalog as it
/// is now, which may be past later DDL: a column gone by then keeps 0,
/// false and `None`.
async fn attributes(
    client: &Client,
    table: Oid,
    columns: &mut [Column],
) -> Result<(), CatalogError> {
    // attmissingval is an anyarray of one element: its text form read back
    // as text[] gives the element's own text form.
    let rows = client
        .query(
            "SELECT attname::text, attnum, attnotnull, \
                    CASE WHEN atthasmissing THEN (attmissingval::text::text[])[1] END \
             FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped",
            &[&table],
        )
        .await
        .map_err(query_error(format!("columns of table {table}")))?;
    for row in rows {
        let name: String = row.get(0);
        if let Some(column) = columns.iter_mut().find(|c| c.name == name) {
            column.attnum = row.get(1);
            column.not_null = row.get(2);
            column.missing_value = row.get(3);
        }
    }
    Ok(())
}

/// Indexes in `columns` of the primary key of `table`, in key order;
/// empty when it has none or a key column is not among `columns`.
async fn primary_key(
    client: &Client,
    table: Oid,
    columns: &[Column],
) -> Result<Vec<usize>, CatalogError> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.position",
            &[&table],
        )
        .await
        .map_err(query_error(format!("primary key of table {table}")))?;
    Ok(rows
        .iter()
        .map(|row| {
            let name: String = row.get(0);
            columns.iter().position(|c| c.name == name)
        })
        .collect::<Option<Vec<usize>>>()
        .unwrap_or_default())
}

/// The root of the partition tree `table` is a partition of, if it is one.
async fn partition_root(client: &Client, table: Oid) -> Result<Option<TableName>, CatalogError> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = pg_partition_root($1::oid::regclass) AND c.oid <> $1",
            &[&table],
        )
        .await
        .map_err(query_error(format!("partition root of table {table}")))?;
    Ok(row.map(|r| TableName {
        schema: r.get(0),
        name: r.get(1),
    }))
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
        match out.iter_mut().find(|t| t.oid == oid) {
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
            None => out.push(PublishedTable {
                oid,
                schema: row.get(1),
                name: row.get(2),
                columns: attnames,
                row_filter: filter,
            }),
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

/// Describes a published table as pgoutput would: published columns in
/// attribute order (generated columns excluded), key flags per replica identity.
pub async fn describe_table(
    client: &Client,
    types: &mut TypeCatalog,
    table: &PublishedTable,
) -> Result<Relation, CatalogError> {
    let what = || format!("columns of {}", table.quoted_name());
    let class = client
        .query_opt(
            "SELECT relreplident::text FROM pg_class WHERE oid = $1",
            &[&table.oid],
        )
        .await
        .map_err(query_error(what()))?
        .ok_or(CatalogError::MissingTable(table.oid))?;
    let identity_text: String = class.get(0);
    let replica_identity = ReplicaIdentity::from_byte(identity_text.bytes().next().unwrap_or(b'd'))
        .unwrap_or(ReplicaIdentity::Default);
    let rows = client
        .query(
            "SELECT a.attname, a.atttypid, a.atttypmod, \
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND a.attnum = ANY(i.indkey) \
                        AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END) \
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            &[&table.oid],
        )
        .await
        .map_err(query_error(what()))?;
    let mut columns = Vec::new();
    let mut oids = Vec::new();
    for row in &rows {
        let name: String = row.get(0);
        if table
            .columns
            .as_ref()
            .is_some_and(|list| !list.contains(&name))
        {
            continue;
        }
        oids.push(row.get::<_, Oid>(1));
        columns.push((
            name,
            row.get::<_, Oid>(1),
            row.get::<_, i32>(2),
            row.get::<_, bool>(3),
        ));
    }
    types.load(client, oids).await?;
    let mut columns: Vec<Column> = columns
        .into_iter()
        .map(|(name, type_oid, type_modifier, in_key)| Column {
            type_name: types.name(type_oid),
            kind: types.kind(type_oid, 0),
            name,
            type_oid,
            type_modifier,
            is_key: in_key || replica_identity == ReplicaIdentity::Full,
            attnum: 0,
            not_null: false,
            missing_value: None,
        })
        .collect();
    attributes(client, table.oid, &mut columns).await?;
    Ok(Relation {
        partition_root: partition_root(client, table.oid).await?,
        primary_key: primary_key(client, table.oid, &columns).await?,
        id: table.oid,
        schema: table.schema.clone(),
        name: table.name.clone(),
        replica_identity,
        columns,
    })
}
