//! What the sink knows about the target database's tables, looked up on a
//! connection of its own (so a lookup never runs inside, or aborts, the
//! apply transaction) — but right after a schema change, which only the
//! apply transaction that made it can see.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_postgres::Client;
use walbridge_core::Oid;
use walbridge_pg::{quote_ident, quote_qualified};

use crate::error::{SinkError, failed};

/// A column of a target table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetColumn {
    /// Column name.
    pub name: String,
    /// Type OID on the target.
    pub type_oid: Oid,
    /// `atttypmod` (-1 when the type has none).
    pub type_modifier: i32,
    /// The type as SQL writes it, with its modifier (`character varying(5)`).
    pub type_sql: String,
    /// The type itself, without modifier (`pg_catalog."varchar"`): what
    /// values are cast to, so that assigning them still checks the
    /// modifier (an explicit cast to `varchar(5)` would silently truncate,
    /// and SQL's `character` alone means `char(1)`).
    pub type_name: String,
    /// The domain's base type for a domain, else the type itself.
    pub base_oid: Oid,
    /// The type is an enum.
    pub is_enum: bool,
    /// The type's array type (0 when it has none).
    pub array_oid: Oid,
    /// For an array: its element type, and whether that is an enum.
    pub element: Option<(Oid, bool)>,
    /// `attgenerated` is set: the column cannot be written.
    pub generated: bool,
    /// Values can be compared with `IS NOT DISTINCT FROM` (the type, or
    /// its array element, has an equality operator); otherwise rows are
    /// found by comparing text forms.
    pub comparable: bool,
}

/// A table (or partitioned table) on the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetTable {
    /// Its OID.
    pub oid: Oid,
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub name: String,
    /// `relkind = 'p'`.
    pub partitioned: bool,
    /// Columns in attribute order, without dropped and system columns.
    pub columns: Vec<TargetColumn>,
    /// Column sets of the primary key (first, when there is one) and of
    /// every other plain unique index: the arbiters `ON CONFLICT` can name.
    pub unique_keys: Vec<Vec<String>>,
    /// True when `unique_keys[0]` is the primary key.
    pub has_primary_key: bool,
    /// Row or statement triggers fire while applying (`ENABLE REPLICA` or
    /// `ENABLE ALWAYS`): its changes are applied one by one, in order.
    pub has_apply_triggers: bool,
    /// A column is `GENERATED ALWAYS AS IDENTITY`: inserts say `OVERRIDING
    /// SYSTEM VALUE` to write the publisher's values into it (as a native
    /// apply worker does).
    pub has_always_identity: bool,
}

impl TargetTable {
    /// `"schema"."name"`.
    pub fn quoted(&self) -> String {
        quote_qualified(&self.schema, &self.name)
    }

    /// `schema.name` for messages.
    pub fn display(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// What an INSERT says after its column list: `OVERRIDING SYSTEM
    /// VALUE` for a table with a `GENERATED ALWAYS` identity column.
    pub fn overriding(&self) -> &'static str {
        if self.has_always_identity {
            " OVERRIDING SYSTEM VALUE"
        } else {
            ""
        }
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&TargetColumn> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// Looks up target tables by name, caching what it found.
pub struct TargetCatalog {
    /// The catalog's own connection; also for probes that may fail
    /// (never run in an apply transaction, which a failure would abort).
    client: Arc<Client>,
    /// Where tables are looked up: the own connection, but while
    /// [`TargetCatalog::refresh`] runs.
    lookup: Arc<Client>,
    tables: HashMap<(Option<String>, String), Arc<TargetTable>>,
    comparable: HashMap<Oid, bool>,
}

impl TargetCatalog {
    /// A catalog reading through `client`.
    pub fn new(client: Client) -> Self {
        let client = Arc::new(client);
        TargetCatalog {
            lookup: client.clone(),
            client,
            tables: HashMap::new(),
            comparable: HashMap::new(),
        }
    }

    /// The connection used for lookups.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Forgets every cached table (after the target's schema may have changed).
    pub fn clear(&mut self) {
        self.tables.clear();
    }

    /// Looks `schema.name` up again through `via`: the connection whose
    /// open transaction just altered or created it (a lookup on the
    /// catalog's own connection would not see that before the commit).
    pub async fn refresh(
        &mut self,
        via: &Arc<Client>,
        schema: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<TargetTable>>, SinkError> {
        self.tables
            .remove(&(schema.map(str::to_owned), name.to_owned()));
        self.lookup = via.clone();
        let table = self.table(schema, name).await;
        self.lookup = self.client.clone();
        table
    }

    /// The table `schema.name` (or `name` on the search path when `schema`
    /// is `None`), or `None` when no such table exists. Views and other
    /// relation kinds are an error: only tables can be replicated into.
    pub async fn table(
        &mut self,
        schema: Option<&str>,
        name: &str,
    ) -> Result<Option<Arc<TargetTable>>, SinkError> {
        let key = (schema.map(str::to_owned), name.to_owned());
        if let Some(t) = self.tables.get(&key) {
            return Ok(Some(t.clone()));
        }
        let quoted = match schema {
            Some(s) => quote_qualified(s, name),
            None => quote_ident(name),
        };
        let display = match schema {
            Some(s) => format!("{s}.{name}"),
            None => name.to_owned(),
        };
        let row = self
            .lookup
            .query_opt(
                "SELECT c.oid, n.nspname::text, c.relname::text, c.relkind::text \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = to_regclass($1)",
                &[&quoted],
            )
            .await
            .map_err(failed(format!("looking up table {display}")))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let oid: Oid = row.get(0);
        let relkind: String = row.get(3);
        if relkind != "r" && relkind != "p" {
            return Err(SinkError::NotATable {
                table: display,
                kind: match relkind.as_str() {
                    "v" => "a view",
                    "m" => "a materialized view",
                    "f" => "a foreign table",
                    "S" => "a sequence",
                    _ => "not a table",
                },
            });
        }
        let columns = self.columns(oid, &display).await?;
        let (unique_keys, has_primary_key) = self.unique_keys(oid, &display).await?;
        let flags = self
            .lookup
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1 AND NOT tgisinternal AND tgenabled IN ('R', 'A')), \
                        EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attidentity = 'a')",
                &[&oid],
            )
            .await
            .map_err(failed(format!(
                "reading the triggers and identity columns of {display}"
            )))?;
        let (has_apply_triggers, has_always_identity): (bool, bool) = (flags.get(0), flags.get(1));
        let table = Arc::new(TargetTable {
            oid,
            schema: row.get(1),
            name: row.get(2),
            partitioned: relkind == "p",
            columns,
            unique_keys,
            has_primary_key,
            has_apply_triggers,
            has_always_identity,
        });
        self.tables.insert(key, table.clone());
        Ok(Some(table))
    }

    async fn columns(&mut self, oid: Oid, display: &str) -> Result<Vec<TargetColumn>, SinkError> {
        let rows = self
            .lookup
            .query(
                "SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), \
                        a.attgenerated <> '', \
                        CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE a.atttypid END, \
                        CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END, \
                        t.typtype = 'e', \
                        CASE WHEN t.typcategory = 'A' THEN t.typelem END, \
                        coalesce(e.typtype = 'e', false), \
                        format('%I.%I', tn.nspname, t.typname), t.typarray, a.atttypmod \
                 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
                 JOIN pg_namespace tn ON tn.oid = t.typnamespace \
                 LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A' \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                 ORDER BY a.attnum",
                &[&oid],
            )
            .await
            .map_err(failed(format!("reading the columns of {display}")))?;
        let mut columns = Vec::with_capacity(rows.len());
        for row in rows {
            let compared_type: Oid = row.get(4);
            let comparable = self.has_equality(compared_type).await?;
            let element: Option<Oid> = row.get(7);
            columns.push(TargetColumn {
                name: row.get(0),
                type_oid: row.get(1),
                type_modifier: row.get(11),
                type_sql: row.get(2),
                type_name: row.get(9),
                base_oid: row.get(5),
                is_enum: row.get(6),
                array_oid: row.get(10),
                element: element.map(|e| (e, row.get(8))),
                generated: row.get(3),
                comparable,
            });
        }
        Ok(columns)
    }

    /// Whether `=` resolves for the type: asked of the server itself, which
    /// knows about coercions, domains and operator classes.
    async fn has_equality(&mut self, type_oid: Oid) -> Result<bool, SinkError> {
        if let Some(&known) = self.comparable.get(&type_oid) {
            return Ok(known);
        }
        let name: String = self
            .client
            .query_one("SELECT format_type($1, NULL)", &[&type_oid])
            .await
            .map_err(failed(format!("type {type_oid}")))?
            .get(0);
        let probe = format!("SELECT NULL::{name} IS NOT DISTINCT FROM NULL::{name}");
        let comparable = match self.client.simple_query(&probe).await {
            Ok(_) => true,
            // 42883: undefined_function (no equality operator).
            Err(e) if e.code().is_some_and(|c| c.code() == "42883") => false,
            Err(e) => return Err(failed(format!("type {name}"))(e)),
        };
        self.comparable.insert(type_oid, comparable);
        Ok(comparable)
    }

    async fn unique_keys(
        &mut self,
        oid: Oid,
        display: &str,
    ) -> Result<(Vec<Vec<String>>, bool), SinkError> {
        let rows = self
            .lookup
            .query(
                "SELECT i.indisprimary, \
                        array(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n) \
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n) \
                 FROM pg_index i \
                 WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL \
                 ORDER BY i.indisprimary DESC, i.indexrelid",
                &[&oid],
            )
            .await
            .map_err(failed(format!("reading the indexes of {display}")))?;
        let has_primary_key = rows.first().is_some_and(|r| r.get::<_, bool>(0));
        Ok((rows.iter().map(|r| r.get(1)).collect(), has_primary_key))
    }
}
