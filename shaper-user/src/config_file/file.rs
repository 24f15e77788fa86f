//! Reading the configuration file, as `apply`, `apply --check` and the daemon all do:
//! only a file that no one but its owner (root, or the user running shaper) can write,
//! as sshd's StrictModes asks of its files, only a regular file (a FIFO would hang the
//! daemon, a device never end), and no larger than [`MAX_FILE_BYTES`]. The file itself is
//! checked, through any symlinks; the directories above it are not.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _},
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::Path,
};

/// The largest file read: 64 MiB, over ten interfaces' worth of full policy tables
/// (16,384 policies each, every field given) and far more than any file in practice.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The file could not be read, or is refused; one line naming the file.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {error}")]
pub struct ReadError {
    pub path: String,
    pub error: io::Error,
}

/// The file's text (UTF-8), after the checks of this module.
pub fn read(path: &Path) -> Result<String, ReadError> {
    let fail = |error| ReadError {
        path: path.display().to_string(),
        error,
    };
    let bytes = read_bytes(path).map_err(fail)?;
    String::from_utf8(bytes)
        .map_err(|_| fail(refused(io::ErrorKind::InvalidData, "it is not UTF-8")))
}

/// The file's bytes, after the checks of this module; the error says what is wrong.
pub fn read_bytes(path: &Path) -> io::Result<Vec<u8>> {
    // Non-blocking, so that opening a FIFO returns (and is then refused) rather than
    // waiting for a writer.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    check(&file)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

fn refused(kind: io::ErrorKind, why: impl Into<String>) -> io::Error {
    io::Error::new(kind, why.into())
}

fn too_large() -> io::Error {
    refused(
        io::ErrorKind::FileTooLarge,
        format!("it is larger than {} MiB", MAX_FILE_BYTES >> 20),
    )
}

/// Refuses what the open file is not: regular, its owner's (root's or ours) to write
/// alone, within the size.
fn check(file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    let kind = meta.file_type();
    let what = [
        (kind.is_dir(), "a directory"),
        (kind.is_fifo(), "a FIFO"),
        (kind.is_socket(), "a socket"),
        (kind.is_char_device(), "a character device"),
        (kind.is_block_device(), "a block device"),
    ];
    if !meta.is_file() {
        let name = what
            .iter()
            .find(|(is, _)| *is)
            .map_or("special", |(_, n)| n);
        return Err(refused(
            io::ErrorKind::InvalidInput,
            format!("it is not a regular file ({name})"),
        ));
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(refused(
            io::ErrorKind::PermissionDenied,
            format!(
                "it is owned by uid {}, not root or the user running shaper (chown root it)",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refused(
            io::ErrorKind::PermissionDenied,
            format!("it is writable by group or others (mode {mode:04o}; chmod go-w it)"),
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _};

    use super::*;

    #[test]
    fn only_a_regular_file_its_owner_alone_writes_is_read() {
        let dir = std::env::temp_dir().join(format!("shaper-file-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let file = dir.join("shaper.toml");
        fs::write(&file, "x = 1\n").unwrap();
        let chmod = |mode| fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        chmod(0o644);
        assert_eq!(read(&file).unwrap(), "x = 1\n");
        chmod(0o666);
        let e = read(&file).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 0666"), "{e}");
        assert!(e.contains(&*file.to_string_lossy()), "{e}");
        chmod(0o664);
        assert!(read(&file).is_err());
        let e = read(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file (a directory)"), "{e}");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file (a FIFO)"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
