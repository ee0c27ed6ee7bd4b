//! Requests to re-synchronize a table (`walbridge resync`, the admin
//! endpoint): a file per request under the source's state directory, so
//! they need no running process and outlive restarts. The stream takes
//! them at its start and at every refresh of the publications.

use std::path::{Path, PathBuf};

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("resync")
}

/// Asks for table `schema.name` to be re-synchronized.
pub fn request_resync(state_dir: &Path, table: &str) -> std::io::Result<()> {
    let dir = dir(state_dir);
    std::fs::create_dir_all(&dir)?;
    // One file per table: asking twice before it is taken is one request.
    let name: String = table.bytes().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, table)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// The tables asked for, with the file to remove once each is taken.
pub fn requests(state_dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
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
        out.push((std::fs::read_to_string(&path)?, path));
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
        request_resync(dir.path(), "public.t").unwrap_or_else(|e| panic!("{e}"));
        request_resync(dir.path(), "public.t").unwrap_or_else(|e| panic!("{e}"));
        request_resync(dir.path(), "s.\"odd name\"").unwrap_or_else(|e| panic!("{e}"));
        let found = requests(dir.path()).unwrap_or_default();
        let tables: Vec<&str> = found.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tables, vec!["public.t", "s.\"odd name\""]);
        std::fs::remove_file(&found[0].1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(requests(dir.path()).unwrap_or_default().len(), 1);
    }
}
