//! Files and directories only root can touch.
//!
//! The lock files and the journal are made 0600, opened without following a symlink, and
//! one found looser (made by an earlier build, under a root shell's umask) is set to 0600;
//! one owned by another user is refused. A directory shaper pins in must be a directory
//! (not a symlink to one), owned by root, that no one else can write: whoever can write a
//! directory can remove or replace what is in it. "Root" here is uid 0 or the user shaper
//! runs as (a service given the capabilities without uid 0).

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
};

/// What is wrong with a directory shaper would pin in.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("is a symbolic link")]
    Symlink,
    #[error("is not a directory")]
    NotDirectory,
    #[error("is owned by uid {0}, not root")]
    Owner(u32),
    #[error("is writable by group or others (mode {0:04o})")]
    Writable(u32),
    #[error("is writable by others without the sticky bit (mode {0:04o})")]
    NotSticky(u32),
    #[error("cannot be examined: {0}")]
    Io(io::Error),
    #[error("is not a path of names below the pin root ('.' or '..' in it)")]
    NotNames,
}

/// A directory that is not root's alone, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path} {problem}")]
pub struct Untrusted {
    pub path: String,
    pub problem: Problem,
}

/// Whether `uid` may own what shaper trusts: root, or the user shaper runs as.
fn trusted_owner(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

/// How others may share a directory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// No one but its owner writes it.
    None,
    /// Others may write it if the sticky bit is set (bpffs's own root, 1777 by default):
    /// then they can add entries of their own but not remove or rename root's.
    Sticky,
}

/// Checks the directory at `path` without following a symlink: `None` if there is none.
pub fn check_dir(path: &Path, sharing: Sharing) -> Result<Option<fs::Metadata>, Untrusted> {
    let untrusted = |problem| Untrusted {
        path: path.display().to_string(),
        problem,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(untrusted(Problem::Io(e))),
    };
    let mode = meta.mode() & 0o7777;
    if meta.file_type().is_symlink() {
        return Err(untrusted(Problem::Symlink));
    }
    if !meta.is_dir() {
        return Err(untrusted(Problem::NotDirectory));
    }
    if !trusted_owner(meta.uid()) {
        return Err(untrusted(Problem::Owner(meta.uid())));
    }
    let sticky = mode & libc::S_ISVTX != 0;
    match sharing {
        _ if mode & 0o022 == 0 => Ok(Some(meta)),
        Sharing::Sticky if sticky => Ok(Some(meta)),
        Sharing::Sticky => Err(untrusted(Problem::NotSticky(mode))),
        Sharing::None => Err(untrusted(Problem::Writable(mode))),
    }
}

/// Sets the directory at `path` (checked: root's, not a symlink) to `mode`, through a
/// descriptor opened without following a symlink.
pub fn set_dir_mode(path: &Path, mode: u32) -> io::Result<()> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    dir.set_permissions(fs::Permissions::from_mode(mode))
}

/// Opens the file at `path` to read and write, made empty with mode 0600 if absent, never
/// through a symlink; one found with a looser mode is set to 0600, one owned by another
/// user refused. For the lock files, which `flock` locks through any descriptor.
pub fn open_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    make_private(&file)?;
    Ok(file)
}

/// Opens the file at `path` to read it, never through a symlink, after the same checks as
/// [`open_private`] (a file left by an earlier build is set to 0600 first).
pub fn open_private_to_read(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    make_private(&file)?;
    Ok(file)
}

/// Makes the file at `path` anew (whatever was there removed first), mode 0600, ours.
pub fn create_private(path: &Path) -> io::Result<File> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Refuses an open file another user owns; sets one of ours that others may read or
/// write to 0600.
pub(crate) fn make_private(file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    if !trusted_owner(meta.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("it is owned by uid {}, not root (remove it)", meta.uid()),
        ));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not a regular file (remove it)",
        ));
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("shaper-owned-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn a_loose_file_is_made_private_and_a_symlink_is_not_followed() {
        let dir = scratch("file");
        let path = dir.join("lock");
        fs::write(&path, "").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        open_private(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(open_private(&link).is_err());
        assert!(open_private_to_read(&link).is_err());
        let fresh = dir.join("fresh");
        drop(create_private(&fresh).unwrap());
        assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o7777, 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directories_others_can_write_are_refused() {
        let dir = scratch("dir");
        let sub = dir.join("sub");
        fs::create_dir(&sub).unwrap();
        let check = |mode: u32, sharing| {
            fs::set_permissions(&sub, fs::Permissions::from_mode(mode)).unwrap();
            check_dir(&sub, sharing).map(|m| m.is_some())
        };
        assert!(check(0o700, Sharing::None).unwrap());
        assert!(check(0o755, Sharing::None).unwrap());
        assert!(matches!(
            check(0o775, Sharing::None).unwrap_err().problem,
            Problem::Writable(0o775)
        ));
        assert!(matches!(
            check(0o1777, Sharing::None).unwrap_err().problem,
            Problem::Writable(_)
        ));
        assert!(check(0o1777, Sharing::Sticky).unwrap());
        assert!(matches!(
            check(0o777, Sharing::Sticky).unwrap_err().problem,
            Problem::NotSticky(0o777)
        ));
        let link = dir.join("link");
        std::os::unix::fs::symlink(&sub, &link).unwrap();
        assert!(matches!(
            check_dir(&link, Sharing::None).unwrap_err().problem,
            Problem::Symlink
        ));
        assert!(
            check_dir(&dir.join("absent"), Sharing::None)
                .unwrap()
                .is_none()
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
