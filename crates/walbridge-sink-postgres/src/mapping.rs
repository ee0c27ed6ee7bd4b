//! From a source table to a target table: the name template, columns
//! matched by name, the identity that finds a row, the upsert arbiter.
//!
//! A mapping is made per relation descriptor, so a change is always applied
//! with the columns the publisher described when it made the change (a
//! column dropped on the publisher mid-stream simply stops being written;
//! the target keeps its column, which new rows fill with its default).

use std::collections::HashMap;
use std::sync::Arc;

use tokio_postgres::types::Type;
use walbridge_core::template::{Template, TemplatePart, TemplateValues};
use walbridge_core::{Oid, Relation, ReplicaIdentity, ValueKind};
use walbridge_pg::{quote_ident, quote_literal};

use crate::config::{OnConflict, PostgresSinkConfig};
use crate::error::SinkError;
use crate::target::{TargetCatalog, TargetTable};

/// Object identifiers below this are built into PostgreSQL and equal on
/// every server; user-defined types get different OIDs on every database.
pub(crate) const FIRST_NORMAL_OBJECT_ID: Oid = 16384;

/// The `table` template: target names made of `{source}`, `{schema}`,
/// `{table}` and literal text. The first `.` outside a placeholder
/// separates the schema from the table name, so names that themselves
/// contain dots still map correctly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameTemplate {
    schema: Option<Template>,
    table: Template,
}

impl NameTemplate {
    /// Parses a template; unknown placeholders and empty names are errors.
    pub fn parse(text: &str) -> Result<Self, String> {
        let whole = Template::parse(text).map_err(|e| e.to_string())?;
        let mut schema = None;
        let mut current = Vec::new();
        for part in whole.parts() {
            match part {
                TemplatePart::Literal(l) if schema.is_none() && l.contains('.') => {
                    let (before, after) = l.split_at(l.find('.').unwrap_or(l.len()));
                    if !before.is_empty() {
                        current.push(TemplatePart::Literal(before.to_owned()));
                    }
                    schema = Some(Template::from_parts(std::mem::take(&mut current)));
                    if after.len() > 1 {
                        current.push(TemplatePart::Literal(after[1..].to_owned()));
                    }
                }
                other => current.push(other.clone()),
            }
        }
        let table = Template::from_parts(current);
        if table.is_empty() || schema.as_ref().is_some_and(Template::is_empty) {
            return Err(format!(
                "`{text}`: needs a table name, optionally with a schema: e.g. \"{{schema}}.{{table}}\" or \"analytics.{{source}}_{{table}}\""
            ));
        }
        Ok(NameTemplate { schema, table })
    }

    /// The target schema (`None`: the search path) and table name.
    pub fn render(&self, source: &str, schema: &str, table: &str) -> (Option<String>, String) {
        let values = TemplateValues {
            source,
            schema,
            table,
        };
        (
            self.schema.as_ref().map(|s| s.render(values)),
            self.table.render(values),
        )
    }
}

/// One published column and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedColumn {
    /// The target column's quoted name.
    pub quoted: String,
    /// The target column's type as SQL writes it.
    pub target_type: String,
    /// The target column's type without modifier, for casts.
    pub cast_type: String,
    /// The publisher's type name.
    pub source_type: String,
    /// Rows can be found by `=` on this column (else by its text form).
    pub comparable: bool,
    /// What binary values (`binary = true` on the source) need.
    pub binary: BinaryForm,
    /// The target column holds integers (`int2`, `int4`, `int8`, `oid`, or
    /// a domain over one), ordered as numbers, not as their text.
    pub integer: bool,
    /// The array type batches bind this column's values as, when it is the
    /// array of the column's own built-in type: the values are then read
    /// by the type's input function as the array is parsed, instead of
    /// becoming `text` first and being cast. `None`: `text[]` and a cast.
    pub batch_array: Option<Type>,
}

/// Whether a column's binary (`typsend`) values from the publisher can be
/// given to the target column's `typreceive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryForm {
    /// As they are: the same built-in type (or a domain over it), or an
    /// enum (whose binary form is its label).
    AsIs,
    /// An array of such elements: the element type OID in the array header
    /// is the publisher's and is replaced by the target's.
    ArrayOf(Oid),
    /// Not at all (composites and other user-defined types embed the
    /// publisher's type OIDs or formats).
    Refused,
}

/// How the binary form of a source column of `kind` (type `source_oid`)
/// reaches `target`.
fn binary_form(
    source_oid: Oid,
    kind: &ValueKind,
    target: &crate::target::TargetColumn,
) -> BinaryForm {
    let scalar_matches = |kind: &ValueKind, oid: Oid, is_enum: bool| match kind {
        ValueKind::Enum => is_enum,
        ValueKind::Array { .. } | ValueKind::Composite | ValueKind::Range | ValueKind::Other => {
            false
        }
        // Text-like types share one binary form (the bytes), so any of them will do.
        ValueKind::Text => ValueKind::builtin(oid) == Some(ValueKind::Text),
        scalar => ValueKind::builtin(oid).as_ref() == Some(scalar),
    };
    if source_oid == target.type_oid && source_oid < FIRST_NORMAL_OBJECT_ID {
        return BinaryForm::AsIs;
    }
    match (kind, target.element) {
        (ValueKind::Array { element, .. }, Some((target_element, element_is_enum)))
            if scalar_matches(element, target_element, element_is_enum) =>
        {
            BinaryForm::ArrayOf(target_element)
        }
        (ValueKind::Array { .. }, _) => BinaryForm::Refused,
        (kind, _) if scalar_matches(kind, target.base_oid, target.is_enum) => BinaryForm::AsIs,
        _ => BinaryForm::Refused,
    }
}

/// How one source table is applied into one target table.
#[derive(Debug)]
pub struct TableMap {
    /// Distinguishes mappings in statement caches.
    pub id: usize,
    /// `schema.table` on the publisher.
    pub source_table: String,
    /// The target table.
    pub target: Arc<TargetTable>,
    /// Per published column, in the relation's order.
    pub columns: Vec<MappedColumn>,
    /// The published columns that identify a row: the key columns, or
    /// every column for REPLICA IDENTITY FULL; empty for NOTHING.
    pub identity: Vec<usize>,
    /// REPLICA IDENTITY FULL: rows are found by comparing every column,
    /// and exactly one of several equal rows is changed.
    pub full_identity: bool,
    /// With `source_column`: its quoted name and the quoted source name.
    pub source_tag: Option<(String, String)>,
    /// The quoted arbiter columns of an upsert, when the target has a
    /// fitting unique index (always, with `on_conflict = "upsert"`).
    pub upsert_key: Option<Vec<String>>,
    /// The source table is a partition whose rows go into the table of
    /// its partition root (which also holds the other partitions' rows).
    pub routed_partition: bool,
}

impl TableMap {
    /// The target's quoted name.
    pub fn quoted(&self) -> String {
        self.target.quoted()
    }
}

/// Where a source table's rows go.
pub struct TargetOf {
    /// The target schema (`None`: the search path).
    pub schema: Option<String>,
    /// The target table's name.
    pub name: String,
    /// The table, when it exists.
    pub table: Option<Arc<TargetTable>>,
    /// It is the table of the source table's partition root.
    pub routed: bool,
}

/// Finds and caches the mapping of each relation descriptor.
pub struct Mapper {
    source: String,
    template: NameTemplate,
    source_column: Option<String>,
    on_conflict: OnConflict,
    next_id: usize,
    /// By the descriptor's address (the `Arc` in the value keeps it from
    /// being reused), then by content for descriptors decoded again.
    by_address: HashMap<usize, (Arc<Relation>, Arc<TableMap>), foldhash::fast::RandomState>,
    by_content: Vec<(Arc<Relation>, Arc<TableMap>)>,
}

impl Mapper {
    /// Mappings of `source`'s tables under `config`.
    pub fn new(config: &PostgresSinkConfig, source: &str) -> Result<Self, String> {
        Ok(Mapper {
            source: source.to_owned(),
            template: NameTemplate::parse(&config.table)?,
            source_column: config.source_column.clone(),
            on_conflict: config.on_conflict,
            next_id: 0,
            by_address: HashMap::default(),
            by_content: Vec::new(),
        })
    }

    /// The template target names are made with (sequences' too).
    pub fn template(&self) -> &NameTemplate {
        &self.template
    }

    /// The mapping of `relation` when it was made before.
    pub fn known(&mut self, relation: &Arc<Relation>) -> Option<Arc<TableMap>> {
        let address = Arc::as_ptr(relation) as usize;
        if let Some((_, map)) = self.by_address.get(&address) {
            return Some(map.clone());
        }
        let map = self
            .by_content
            .iter()
            .find(|(r, _)| **r == **relation)
            .map(|(_, m)| m.clone())?;
        self.remember(address, relation, &map);
        Some(map)
    }

    /// The mapping of `relation`, looked up on the target the first time.
    pub async fn map(
        &mut self,
        catalog: &mut TargetCatalog,
        relation: &Arc<Relation>,
    ) -> Result<Arc<TableMap>, SinkError> {
        if let Some(map) = self.known(relation) {
            return Ok(map);
        }
        let map = Arc::new(self.build(catalog, relation).await?);
        self.by_content.push((relation.clone(), map.clone()));
        self.remember(Arc::as_ptr(relation) as usize, relation, &map);
        Ok(map)
    }

    fn remember(&mut self, address: usize, relation: &Arc<Relation>, map: &Arc<TableMap>) {
        // Bounded: decoders share descriptors, so this only grows with schema changes.
        if self.by_address.len() > 4096 {
            self.by_address.clear();
        }
        self.by_address
            .insert(address, (relation.clone(), map.clone()));
    }

    /// The target table that receives `relation` (for TRUNCATE, which needs no columns).
    pub async fn target(
        &mut self,
        catalog: &mut TargetCatalog,
        relation: &Arc<Relation>,
    ) -> Result<Arc<TargetTable>, SinkError> {
        Ok(self.map(catalog, relation).await?.target.clone())
    }

    /// The target table that receives `relation`: its own by the
    /// template, else (a partition) its root's, else none.
    pub async fn target_of(
        &self,
        catalog: &mut TargetCatalog,
        relation: &Relation,
    ) -> Result<TargetOf, SinkError> {
        let (schema, name) = self
            .template
            .render(&self.source, &relation.schema, &relation.name);
        if let Some(table) = catalog.table(schema.as_deref(), &name).await? {
            return Ok(TargetOf {
                schema,
                name,
                table: Some(table),
                routed: false,
            });
        }
        if let Some(root) = &relation.partition_root {
            // A partition without a counterpart: its rows go to the root's table.
            let (root_schema, root_name) =
                self.template.render(&self.source, &root.schema, &root.name);
            if let Some(table) = catalog.table(root_schema.as_deref(), &root_name).await? {
                return Ok(TargetOf {
                    schema: root_schema,
                    name: root_name,
                    table: Some(table),
                    routed: true,
                });
            }
        }
        Ok(TargetOf {
            schema,
            name,
            table: None,
            routed: false,
        })
    }

    async fn build(
        &mut self,
        catalog: &mut TargetCatalog,
        relation: &Relation,
    ) -> Result<TableMap, SinkError> {
        let source_table = format!("{}.{}", relation.schema, relation.name);
        let found = self.target_of(catalog, relation).await?;
        let routed = found.routed;
        let target = found.table.ok_or_else(|| SinkError::MissingTable {
            target: found
                .schema
                .as_deref()
                .map_or(found.name.clone(), |s| format!("{s}.{}", found.name)),
            source_table: source_table.clone(),
        })?;
        let mut columns = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let target_column =
                target
                    .column(&column.name)
                    .ok_or_else(|| SinkError::MissingColumn {
                        table: target.display(),
                        column: column.name.clone(),
                        source_type: column.type_display(),
                        source_table: source_table.clone(),
                    })?;
            if target_column.generated {
                return Err(SinkError::GeneratedColumn {
                    table: target.display(),
                    column: column.name.clone(),
                    source_table,
                });
            }
            columns.push(MappedColumn {
                quoted: quote_ident(&column.name),
                target_type: target_column.type_sql.clone(),
                cast_type: target_column.type_name.clone(),
                source_type: column.type_display(),
                comparable: target_column.comparable,
                binary: binary_form(column.type_oid, &column.kind, target_column),
                integer: matches!(
                    ValueKind::builtin(target_column.base_oid),
                    Some(ValueKind::Int2 | ValueKind::Int4 | ValueKind::Int8 | ValueKind::Oid)
                ),
                // Built-in types all write their arrays with `,` between elements.
                batch_array: ValueKind::builtin(target_column.type_oid)
                    .and_then(|_| Type::from_oid(target_column.array_oid)),
            });
        }
        let source_tag = match &self.source_column {
            Some(name) => {
                let c = target
                    .column(name)
                    .ok_or_else(|| SinkError::MissingColumn {
                        table: target.display(),
                        column: name.clone(),
                        source_type: "the source name (`source_column`)".into(),
                        source_table: source_table.clone(),
                    })?;
                if relation.columns.iter().any(|rc| rc.name == *name) {
                    return Err(SinkError::Mapping(format!(
                        "source table {source_table} itself has a column \"{name}\", which is also the sink's `source_column`: choose another source_column name"
                    )));
                }
                Some((quote_ident(&c.name), quote_literal(&self.source)))
            }
            None => None,
        };
        let full_identity = relation.replica_identity == ReplicaIdentity::Full;
        let identity: Vec<usize> = match relation.replica_identity {
            ReplicaIdentity::Full => (0..relation.columns.len()).collect(),
            ReplicaIdentity::Nothing => Vec::new(),
            ReplicaIdentity::Default | ReplicaIdentity::Index => relation.key_columns().collect(),
        };
        let upsert_key = upsert_key(
            relation,
            &target,
            &identity,
            full_identity,
            self.source_column.as_deref(),
            &source_table,
        );
        // Upserting every insert needs the key now; otherwise only rows
        // read while streaming do, and they say so when one comes.
        let upsert_key = if self.on_conflict == OnConflict::Upsert {
            Some(upsert_key?)
        } else {
            upsert_key.ok()
        };
        self.next_id += 1;
        Ok(TableMap {
            id: self.next_id,
            source_table,
            target,
            columns,
            identity,
            full_identity,
            source_tag,
            upsert_key,
            routed_partition: routed,
        })
    }
}

/// The unique index `INSERT … ON CONFLICT` names: one on exactly the
/// identity columns (plus `source_column`), else the primary key when all
/// its columns are published.
fn upsert_key(
    relation: &Relation,
    target: &TargetTable,
    identity: &[usize],
    full_identity: bool,
    source_column: Option<&str>,
    source_table: &str,
) -> Result<Vec<String>, SinkError> {
    let mut wanted: Vec<String> = if full_identity {
        Vec::new()
    } else {
        identity
            .iter()
            .map(|&i| relation.columns[i].name.clone())
            .collect()
    };
    wanted.extend(source_column.map(str::to_owned));
    let same_set =
        |key: &Vec<String>| key.len() == wanted.len() && key.iter().all(|k| wanted.contains(k));
    let published = |key: &Vec<String>| {
        key.iter().all(|k| {
            relation.columns.iter().any(|c| c.name == *k) || Some(k.as_str()) == source_column
        })
    };
    let chosen = (!identity.is_empty() && !full_identity)
        .then(|| target.unique_keys.iter().find(|k| same_set(k)))
        .flatten()
        .or_else(|| {
            target
                .has_primary_key
                .then(|| &target.unique_keys[0])
                .filter(|k| published(k))
        });
    match chosen {
        Some(key) => Ok(key.iter().map(|k| quote_ident(k)).collect()),
        None => Err(SinkError::NoUpsertKey {
            table: target.display(),
            columns: if wanted.is_empty() {
                "the published columns".into()
            } else {
                wanted.join(", ")
            },
            source_table: source_table.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_schema_and_table() {
        let t = |text: &str| NameTemplate::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t("{schema}.{table}").render("shop", "public", "orders"),
            (Some("public".into()), "orders".into())
        );
        assert_eq!(
            t("{source}_{schema}.{table}").render("shop", "public", "orders"),
            (Some("shop_public".into()), "orders".into())
        );
        assert_eq!(
            t("analytics.{source}_{table}").render("shop", "s", "o"),
            (Some("analytics".into()), "shop_o".into())
        );
        assert_eq!(
            t("{table}").render("x", "s.with.dots", "t.d"),
            (None, "t.d".into())
        );
        assert_eq!(
            t("{schema}.{table}").render("x", "s.with.dots", "t"),
            (Some("s.with.dots".into()), "t".into())
        );
    }

    #[test]
    fn bad_templates_are_explained() {
        for bad in ["{schema}.", ".{table}", "{nope}", "{table", ""] {
            assert!(NameTemplate::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
