//! Requests to re-synchronize a table (`walbridge resync`, the admin
//! endpoint): a file per request under the source's state directory, so
//! they need no running process and outlive restarts. The stream takes
//! them at its start and at every refresh of the publications.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("resync")
}

/// A table to copy again, for every sink or one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ResyncRequest {
    /// `schema.name` (or a name on its own: `public`).
    pub table: String,
    /// Only this sink gets the rows; every sink when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
    /// Empty the table on the targets and copy it whole, in one unit
    /// (for a table without a key, which cannot be read in key order).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncate: bool,
}

/// Asks for `request`'s table to be re-synchronized.
pub fn request_resync(state_dir: &Path, request: &ResyncRequest) -> std::io::Result<()> {
    let dir = dir(state_dir);
    std::fs::create_dir_all(&dir)?;
    // One file per table and sink: asking twice before it is taken is one request.
    let name: String = request
        .table
        .bytes()
        .chain(
            request
                .sink
                .iter()
                .flat_map(|s| std::iter::once(0).chain(s.bytes())),
        )
        .map(|b| format!("{b:02x}"))
        .collect();
    let tmp = dir.join(format!("{name}.tmp"));
    let text = serde_json::to_string(request).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// The requests waiting, with the file to remove once each is taken.
pub fn requests(state_dir: &Path) -> std::io::Result<Vec<(ResyncRequest, PathBuf)>> {
    let entries = match std::fs::read_dir(dir(state_dir)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "tmp") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        // An earlier walbridge wrote the table name alone.
        let request = serde_json::from_str(&text).unwrap_or(ResyncRequest {
            table: text,
            sink: None,
            truncate: false,
        });
        out.push((request, path));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_kept_until_taken() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(requests(dir.path()).unwrap_or_default().is_empty());
        let ask = |table: &str, sink: Option<&str>| {
            let request = ResyncRequest {
                table: table.into(),
                sink: sink.map(Into::into),
                truncate: false,
            };
            request_resync(dir.path(), &request).unwrap_or_else(|e| panic!("{e}"));
        };
        ask("public.t", None);
        ask("public.t", None);
        ask("public.t", Some("replica"));
        ask("s.\"odd name\"", None);
        std::fs::write(dir.path().join("resync/old"), "public.older")
            .unwrap_or_else(|e| panic!("{e}"));
        let found = requests(dir.path()).unwrap_or_default();
        let asked: Vec<(&str, Option<&str>)> = found
            .iter()
            .map(|(r, _)| (r.table.as_str(), r.sink.as_deref()))
            .collect();
        assert_eq!(
            asked,
            vec![
                ("public.older", None),
                ("public.t", None),
                ("public.t", Some("replica")),
                ("s.\"odd name\"", None)
            ]
        );
        std::fs::remove_file(&found[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(requests(dir.path()).unwrap_or_default().len(), 3);
    }
}
