//! Small file systems for tests of what walbridge does when a disk is full
//! or read-only: a tmpfs mounted over a directory, resized or remounted
//! while walbridge runs. Mounting needs root, as the test machines run.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a directory; unmounted when dropped.
pub struct Tmpfs {
    path: PathBuf,
}

fn mount(args: &[&str], path: &Path) {
    assert!(
        crate::is_root(),
        "this test mounts a tmpfs, which needs root: run the suite as root (as CI does)"
    );
    crate::succeeds(Command::new("mount").args(args).arg(path));
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`"4m"`) at `path`, created if missing;
    /// `read_only` mounts it read-only.
    pub fn mount(path: &Path, size: &str, read_only: bool) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let mode = if read_only { "ro" } else { "rw" };
        mount(
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755,{mode}"),
                "tmpfs",
            ],
            path,
        );
        Tmpfs {
            path: path.to_owned(),
        }
    }

    /// Gives the file system a new size; files stay.
    pub fn resize(&self, size: &str) {
        mount(&["-o", &format!("remount,size={size}")], &self.path);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a process of the test may still have files open there.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
