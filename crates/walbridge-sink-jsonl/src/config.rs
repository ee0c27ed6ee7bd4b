use serde::Deserialize;
use walbridge_core::json::DEFAULT_UNCHANGED_PLACEHOLDER;

fn stdout_path() -> String {
    "-".to_owned()
}

fn default_placeholder() -> String {
    DEFAULT_UNCHANGED_PLACEHOLDER.to_owned()
}

/// `type = "jsonl"`: one JSON object per change.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlSinkConfig {
    /// Unique sink name.
    pub name: String,
    /// Sources to read; default every source.
    #[serde(default)]
    pub sources: Option<Vec<String>>,
    /// `-` for standard output (the default), or a file to append to.
    #[serde(default = "stdout_path")]
    pub path: String,
    /// Value written for an unchanged TOASTed column, which the publisher
    /// does not send (default `__debezium_unavailable_value`).
    #[serde(default = "default_placeholder")]
    pub unchanged_toast_placeholder: String,
}
