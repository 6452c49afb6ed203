//! Files private to the job's user, safe in directories other users can write (`/dev/shm`,
//! `/tmp`): every file railring creates is new (`O_EXCL`), mode 0600 and never reached through a
//! link; every file it opens again is checked, on the open descriptor, to be a regular file of
//! this user before a byte is read or written, and the open never blocks (a FIFO planted under
//! one of our names is refused, not waited on). Names other users could guess come from
//! [`random_hex`]. docs/security.md states the model these functions serve.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// This process's effective user id: the owner of every file it creates.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `n` random bytes from the kernel (`getrandom`), as 2n lowercase hex digits: a name no other
/// user can predict.
pub fn random_hex(n: usize) -> io::Result<String> {
    let mut b = vec![0u8; n];
    let mut got = 0;
    while got < n {
        // SAFETY: writing at most n - got bytes into b's remaining room.
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), n - got, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += r as usize;
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// `name (uid N)` for user `uid`, from `/etc/passwd` (only `uid N` when it has no entry).
pub fn user_name(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|t| {
        t.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
        })
    });
    match name {
        Some(n) => format!("{n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    use std::os::unix::fs::FileTypeExt;
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "file"
    }
}

/// Whether `m` (from `lstat` or `fstat`) is a regular file of this user.
pub fn is_own_file(m: &Metadata) -> bool {
    m.file_type().is_file() && m.uid() == euid()
}

/// Why `path` (whose `lstat` or `fstat` is `m`) is not a file railring may use, for errors.
fn not_ours(path: &Path, m: &Metadata) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is a {} of user {}, not a file of this job's user {}: refusing to use it \
             (another user may have planted it; remove it, or ask its owner to)",
            path.display(),
            kind(m),
            user_name(m.uid()),
            user_name(euid())
        ),
    )
}

/// The error for a name that is taken: who owns what is there.
pub fn taken(path: &Path) -> io::Error {
    let who = match std::fs::symlink_metadata(path) {
        Ok(m) => format!("by a {} of user {}", kind(&m), user_name(m.uid())),
        Err(_) => "already".to_string(),
    };
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} is taken {who}: railring creates only new files of its own; remove it, or ask \
             its owner to",
            path.display()
        ),
    )
}

/// Create `path` new (`O_EXCL`: never an existing file, never through a link), read-write,
/// mode 0600. A name that is taken is an error naming its owner ([`taken`]).
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => taken(path),
            _ => e,
        })
}

/// Open `path` read-write (`write`) or read-only, only when it is a regular file of this user:
/// no link followed, no blocking on a FIFO or device (`O_NONBLOCK`), the type and owner checked
/// on the open descriptor (so a swap between a check and the open cannot fool it).
pub fn open_own(path: &Path, write: bool) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a symbolic link: refusing to follow it",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    let m = f.metadata()?;
    if !is_own_file(&m) {
        return Err(not_ours(path, &m));
    }
    Ok(f)
}

/// Open `path` for writing (creating it, mode 0600, when missing), truncated, as a file of this
/// user with one link only: an existing link, FIFO, other user's file or hard link to
/// some other file under that name is refused, not written through.
pub fn create_or_truncate(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // (in a sticky directory the kernel may say EACCES for another user's link)
            Some(libc::ELOOP) | Some(libc::EACCES)
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a symbolic link: refusing to write through it",
                        path.display()
                    ),
                )
            }
            Some(libc::ENXIO) => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is a FIFO: refusing to write into it", path.display()),
            ),
            _ => e,
        })?;
    let m = f.metadata()?;
    if !is_own_file(&m) {
        return Err(not_ours(path, &m));
    }
    if m.nlink() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} has {} hard links: refusing to overwrite a file that is also elsewhere",
                path.display(),
                m.nlink()
            ),
        ));
    }
    f.set_len(0)?;
    Ok(f)
}

/// Make `dir` (and missing parents, mode 0700) or accept it when it exists as a directory of
/// this user — never a link (the last component) and never another user's directory.
pub fn own_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let m = std::fs::symlink_metadata(dir)?;
    if !m.file_type().is_dir() || m.uid() != euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a {} of user {}, not a directory of this user {}: refusing to write \
                 into it (choose a directory of your own)",
                dir.display(),
                kind(&m),
                user_name(m.uid()),
                user_name(euid())
            ),
        ));
    }
    Ok(())
}

/// A new directory `<parent>/<prefix>XXXXXXXXXXXXXXXX` (random), mode 0700, that nobody else
/// can have prepared (the `mkdtemp` contract).
pub fn temp_dir(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    for _ in 0..16 {
        let p = parent.join(format!("{prefix}{}", random_hex(8)?));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "no free name for a {prefix}* directory in {}",
            parent.display()
        ),
    ))
}

/// Rename `from` to `to` only when `to` does not exist (`RENAME_NOREPLACE`); a taken `to` is an
/// error naming its owner.
pub fn rename_new(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
    };
    let (a, b) = (c(from)?, c(to)?);
    // SAFETY: two valid C strings; renameat2 only reads them.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Err(taken(to)),
        // A file system without RENAME_NOREPLACE: link(2) never replaces either.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => match std::fs::hard_link(from, to) {
            Ok(()) => std::fs::remove_file(from),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(taken(to)),
            Err(e) => Err(e),
        },
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rr-private-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn new_files_are_private_and_never_through_a_link() {
        let d = dir("new");
        let p = d.join("seg");
        let f = create_new(&p).unwrap();
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        let e = create_new(&p).unwrap_err().to_string();
        assert!(e.contains("is taken by a file of user"), "{e}");
        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new(&link).is_err());
        assert!(open_own(&link, true)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        let e = create_or_truncate(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let hard = d.join("hard");
        std::fs::hard_link(&target, &hard).unwrap();
        let e = create_or_truncate(&hard).unwrap_err().to_string();
        assert!(e.contains("hard links"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = dir("fifo");
        let p = d.join("railring-fifo");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = open_own(&p, false).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        assert!(create_or_truncate(&p).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn temp_dirs_are_new_and_private() {
        let d = dir("tmp");
        let a = temp_dir(&d, "x-").unwrap();
        let b = temp_dir(&d, "x-").unwrap();
        assert_ne!(a, b);
        let m = std::fs::metadata(&a).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        own_dir(&a).unwrap();
        let link = d.join("dirlink");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(own_dir(&link).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn rename_never_replaces() {
        let d = dir("rename");
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let e = rename_new(&a, &b).unwrap_err().to_string();
        assert!(e.contains("is taken"), "{e}");
        assert_eq!(std::fs::read(&b).unwrap(), b"b");
        std::fs::remove_file(&b).unwrap();
        rename_new(&a, &b).unwrap();
        assert!(!a.exists() && b.exists());
        assert_eq!(random_hex(8).unwrap().len(), 16);
        assert_ne!(random_hex(8).unwrap(), random_hex(8).unwrap());
        let _ = std::fs::remove_dir_all(&d);
    }
}
