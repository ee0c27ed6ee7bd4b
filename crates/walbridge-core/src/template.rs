//! Name templates: text with `{source}`, `{schema}` and `{table}`
//! placeholders, from which sinks make the names of what they write to
//! (target tables, Kafka topics).

use std::fmt;

/// One piece of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplatePart {
    /// Text copied as it is.
    Literal(String),
    /// The source's name.
    Source,
    /// The published table's schema.
    Schema,
    /// The published table's name.
    Table,
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<TemplatePart>,
}

/// Why a template was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("`{0}`: unterminated `{{`")]
    Unterminated(String),
    /// A placeholder other than the three known ones.
    #[error(
        "`{template}`: unknown placeholder `{{{placeholder}}}` (use {{source}}, {{schema}} and {{table}})"
    )]
    UnknownPlaceholder {
        /// The whole template.
        template: String,
        /// What stood between the braces.
        placeholder: String,
    },
}

/// The values a template is rendered with.
#[derive(Clone, Copy, Debug)]
pub struct TemplateValues<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The table's schema.
    pub schema: &'a str,
    /// The table's name.
    pub table: &'a str,
}

impl Template {
    /// Parses `text`; unknown placeholders are errors. Literal runs are
    /// kept whole (adjacent literal characters form one part).
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(start) = rest.find('{') {
            literal.push_str(&rest[..start]);
            let after = &rest[start..];
            let end = after
                .find('}')
                .ok_or_else(|| TemplateError::Unterminated(text.to_owned()))?;
            let part = match &after[1..end] {
                "source" => TemplatePart::Source,
                "schema" => TemplatePart::Schema,
                "table" => TemplatePart::Table,
                other => {
                    return Err(TemplateError::UnknownPlaceholder {
                        template: text.to_owned(),
                        placeholder: other.to_owned(),
                    });
                }
            };
            if !literal.is_empty() {
                parts.push(TemplatePart::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
            rest = &after[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(TemplatePart::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// The template's parts, in order.
    pub fn parts(&self) -> &[TemplatePart] {
        &self.parts
    }

    /// A template made of `parts`.
    pub fn from_parts(parts: Vec<TemplatePart>) -> Self {
        Template { parts }
    }

    /// True when the template has no parts (renders as the empty string).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The template with its placeholders replaced.
    pub fn render(&self, values: TemplateValues<'_>) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                TemplatePart::Literal(l) => l.as_str(),
                TemplatePart::Source => values.source,
                TemplatePart::Schema => values.schema,
                TemplatePart::Table => values.table,
            })
            .collect()
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                TemplatePart::Literal(l) => f.write_str(l)?,
                TemplatePart::Source => f.write_str("{source}")?,
                TemplatePart::Schema => f.write_str("{schema}")?,
                TemplatePart::Table => f.write_str("{table}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: TemplateValues<'static> = TemplateValues {
        source: "shop",
        schema: "public",
        table: "orders",
    };

    #[test]
    fn renders_placeholders_and_literals() {
        let t = |text: &str| Template::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t("{source}.{schema}.{table}").render(VALUES),
            "shop.public.orders"
        );
        assert_eq!(t("cdc-{table}-v1").render(VALUES), "cdc-orders-v1");
        assert_eq!(t("fixed").render(VALUES), "fixed");
        assert_eq!(t("").render(VALUES), "");
        assert_eq!(t("a{table}b").to_string(), "a{table}b");
        assert_eq!(
            t("a.b{table}").parts()[0],
            TemplatePart::Literal("a.b".into())
        );
    }

    #[test]
    fn bad_placeholders_are_explained() {
        assert!(matches!(
            Template::parse("{nope}"),
            Err(TemplateError::UnknownPlaceholder { placeholder, .. }) if placeholder == "nope"
        ));
        assert!(matches!(
            Template::parse("x{table"),
            Err(TemplateError::Unterminated(_))
        ));
    }
}
