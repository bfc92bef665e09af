//! The mirror's root must be Wisp's own: a local user who creates it first (or a symbolic link
//! in its place) under a shared directory such as `/tmp` must not get their files served.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use wisp_core::{Error, Result};

/// Creates `root` (and missing parents) with mode 0700, then checks that it and its parent
/// are what Wisp may trust: real directories (never followed through a link), owned by this
/// process's user (the parent may also be root's), and writable by nobody else — a
/// directory others may write into can have its entries replaced under us.
pub fn own_dir(root: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| untrusted(root, &format!("cannot create it: {e}")))?;
    #[expect(
        unsafe_code,
        reason = "geteuid reads the process's user and cannot fail"
    )]
    // SAFETY: no arguments, no memory.
    let me = unsafe { libc::geteuid() };
    check(root, me, false)?;
    if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
        check(parent, me, true)?;
    }
    Ok(())
}

fn check(dir: &Path, me: u32, parent: bool) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| untrusted(dir, &e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(untrusted(dir, "it is a symbolic link"));
    }
    if !meta.is_dir() {
        return Err(untrusted(dir, "it is not a directory"));
    }
    let owner_ok = meta.uid() == me || (parent && meta.uid() == 0);
    if !owner_ok {
        return Err(untrusted(
            dir,
            &format!(
                "it belongs to user {}, not to this server's user {me}",
                meta.uid()
            ),
        ));
    }
    let mode = meta.permissions().mode();
    // A shared parent such as /tmp is fine when sticky (others cannot replace our entries).
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(parent && sticky) {
        return Err(untrusted(
            dir,
            &format!("others may write into it (mode {:o})", mode & 0o7777),
        ));
    }
    if !parent && mode & 0o077 != 0 {
        // Ours, and nobody else could write into it: an earlier version made it 0755.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| untrusted(dir, &format!("cannot make it 0700: {e}")))?;
    }
    Ok(())
}

fn untrusted(dir: &Path, why: &str) -> Error {
    Error::invalid(format!(
        "the object-store mirror directory {} is not this server's own: {why}; remove it, or choose another with --repository-cache-dir",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_root_is_made_0700_and_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let root = tmp.path().join("wisp").join("repos");
        own_dir(&root).unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        own_dir(&root).unwrap();
        // One an earlier version left readable by others is ours: tightened, not refused.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        own_dir(&root).unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_link_or_an_open_directory_in_its_place_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let elsewhere = tmp.path().join("theirs");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = tmp.path().join("repos");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let e = own_dir(&link).unwrap_err();
        assert!(e.message().contains("symbolic link"), "{e}");

        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = own_dir(&open).unwrap_err();
        assert!(e.message().contains("others may write"), "{e}");
        // Under a parent others may write into (and not sticky), even a fresh root is refused.
        let e = own_dir(&open.join("repos")).unwrap_err();
        assert!(e.message().contains("others may write"), "{e}");
    }
}
