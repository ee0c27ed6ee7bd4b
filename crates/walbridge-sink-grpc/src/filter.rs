//! Filters a subscriber asks for, evaluated on the server.

use walbridge_core::Relation;

use crate::error::FeedError;
use crate::pb;

/// A `schema.table` pattern: `*` matches any run of characters.
#[derive(Debug, Clone)]
struct Pattern(Vec<String>);

impl Pattern {
    fn new(text: &str) -> Pattern {
        Pattern(text.split('*').map(str::to_owned).collect())
    }

    fn matches(&self, text: &str) -> bool {
        let parts = &self.0;
        let (first, rest) = match parts.split_first() {
            Some(split) => split,
            None => return text.is_empty(),
        };
        let Some(mut remaining) = text.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return remaining.is_empty();
        };
        for part in middle {
            match remaining.find(part.as_str()) {
                Some(at) => remaining = &remaining[at + part.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

/// A subscription's filter.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    tables: Vec<Pattern>,
    operations: Vec<pb::Operation>,
    columns: Vec<(Pattern, Vec<String>)>,
    message_prefixes: Vec<String>,
}

impl Filter {
    /// Reads a subscriber's filter; the error names the field at fault.
    pub fn new(filter: Option<pb::Filter>) -> Result<Filter, FeedError> {
        let Some(filter) = filter else {
            return Ok(Filter::default());
        };
        let patterns = filter.columns.iter().map(|c| &c.table);
        if let Some(bare) = filter
            .tables
            .iter()
            .chain(patterns)
            .find(|t| !t.contains('.') && *t != "*")
        {
            return Err(FeedError::Invalid(format!(
                "filter: table pattern `{bare}` names no schema: write `schema.table` (`public.{bare}`, or `*.{bare}` for any schema)"
            )));
        }
        let operations = filter
            .operations
            .iter()
            .map(|&o| match pb::Operation::try_from(o) {
                Ok(pb::Operation::Unspecified) | Err(_) => Err(FeedError::Invalid(format!(
                    "filter.operations: {o} is not an operation (INSERT, UPDATE, DELETE, TRUNCATE, READ or MESSAGE)"
                ))),
                Ok(op) => Ok(op),
            })
            .collect::<Result<_, _>>()?;
        let columns = filter
            .columns
            .into_iter()
            .map(|c| {
                if c.table.is_empty() || c.columns.is_empty() {
                    Err(FeedError::Invalid(
                        "filter.columns: each entry needs a table pattern and at least one column"
                            .into(),
                    ))
                } else {
                    Ok((Pattern::new(&c.table), c.columns))
                }
            })
            .collect::<Result<_, _>>()?;
        // `filter.sources` chooses the session's sources (see the server).
        Ok(Filter {
            tables: filter.tables.iter().map(|t| Pattern::new(t)).collect(),
            operations,
            columns,
            message_prefixes: filter.message_prefixes,
        })
    }

    /// Whether changes of `relation` pass.
    pub fn table(&self, relation: &Relation) -> bool {
        self.tables.is_empty() || {
            let name = format!("{}.{}", relation.schema, relation.name);
            self.tables.iter().any(|p| p.matches(&name))
        }
    }

    /// Whether changes of kind `operation` pass.
    pub fn operation(&self, operation: pb::Operation) -> bool {
        self.operations.is_empty() || self.operations.contains(&operation)
    }

    /// Whether a logical decoding message with `prefix` passes.
    pub fn message(&self, prefix: &str) -> bool {
        self.operation(pb::Operation::Message)
            && self
                .message_prefixes
                .iter()
                .any(|p| p == "*" || p == prefix)
    }

    /// The indexes of `relation`'s columns to send, in order.
    pub fn columns(&self, relation: &Relation) -> Vec<usize> {
        let name = format!("{}.{}", relation.schema, relation.name);
        let wanted: Vec<&String> = self
            .columns
            .iter()
            .filter(|(pattern, _)| pattern.matches(&name))
            .flat_map(|(_, columns)| columns)
            .collect();
        let keys: Vec<usize> = relation.key_columns().collect();
        relation
            .columns
            .iter()
            .enumerate()
            .filter(|(i, c)| wanted.is_empty() || keys.contains(i) || wanted.contains(&&c.name))
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_globs() {
        let cases = [
            ("public.*", "public.orders", true),
            ("public.*", "sales.orders", false),
            ("*.orders", "sales.orders", true),
            ("*.orders", "sales.orders_old", false),
            ("public.orders", "public.orders", true),
            ("public.orders", "public.orders2", false),
            ("p*c.*rd*", "public.orders", true),
            ("*", "anything.at_all", true),
            ("a*a", "a", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                Pattern::new(pattern).matches(text),
                expected,
                "{pattern} ~ {text}"
            );
        }
    }
}
