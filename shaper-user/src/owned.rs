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
    io::{self, Write as _},
    os::unix::fs::{
        DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
    },
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

/// Whether the directory of the file at `path` is there: `false` if it is not, an error if
/// it is not root's alone (or a symlink).
pub fn check_dir_of(path: &Path) -> io::Result<bool> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("no directory"))?;
    match check_dir(dir, Sharing::None) {
        Ok(meta) => Ok(meta.is_some()),
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// Makes the directory of the file at `path` (and its parents) root-only unless it is
/// there; refuses one that is not root's alone.
pub fn make_dir_of(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir)?;
    }
    match check_dir_of(path)? {
        true => Ok(()),
        false => Err(io::ErrorKind::NotFound.into()),
    }
}

/// Opens the file at `path`, which must be there, to read and write, never through a
/// symlink, in a directory root's alone, after [`open_private`]'s checks.
pub fn open_private_existing(path: &Path) -> io::Result<File> {
    if !check_dir_of(path)? {
        return Err(io::ErrorKind::NotFound.into());
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    make_private(&file)?;
    Ok(file)
}

/// Saves `bytes` as the file at `path`, root-only in a root-only directory: written
/// beside, then renamed over it, so that a reader finds the old file or the new one whole.
pub fn save_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    make_dir_of(path)?;
    let mut beside = path.as_os_str().to_owned();
    beside.push(".new");
    let mut f = create_private(beside.as_ref())?;
    f.write_all(bytes)?;
    drop(f);
    fs::rename(&beside, path)
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

    #[test]
    fn files_kept_beside_the_lock_live_in_a_root_only_directory() {
        let dir = scratch("beside");
        let path = dir.join("made/deeper/routes");
        save_private(&path, b"one").unwrap();
        save_private(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert!(!dir.join("made/deeper/routes.new").exists());
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.join("made/deeper")), 0o700);
        // A looser file is made private when opened; a directory others write refused,
        // to open, to save and to make in; an absent file is not made.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private_existing(&path).unwrap());
        assert_eq!(mode(&path), 0o600);
        let absent = dir.join("made/deeper/absent");
        let kind = open_private_existing(&absent).unwrap_err().kind();
        assert_eq!(kind, io::ErrorKind::NotFound);
        assert!(!absent.exists());
        fs::set_permissions(dir.join("made/deeper"), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(open_private_existing(&path).is_err());
        assert!(save_private(&path, b"three").is_err());
        assert!(make_dir_of(&path).is_err());
        assert!(!check_dir_of(&dir.join("none/x")).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        fs::remove_dir_all(&dir).unwrap();
    }
}
