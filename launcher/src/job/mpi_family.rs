//! Which MPI a program is built for, read from its ELF file before the job starts: railrun
//! serves PMI-1, so MPICH-family programs run under it ([`crate::pmi`]); Open MPI programs need
//! Open MPI's own launcher (its PMIx server) and would each be a world of one, so railrun
//! refuses them with a message that says what to do. A railring program that links Open MPI
//! (built with the `mpi` feature) is not refused: under railrun it bootstraps from railrun's
//! store; it carries [`railring::bootstrap::launch::PROGRAM_MARKER`].
//!
//! Only the program's own `DT_NEEDED` entries are read (not what its libraries need, and not
//! what an interpreter loads later: a Python script using Open MPI's mpi4py is caught at run
//! time instead, see `OMPI_MCA_orte_server` in docs/mpi.md). Reading is bounded and never
//! panics; anything that is not a readable little-endian ELF file is "unknown".

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// What the program links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Family {
    /// Open MPI (or its PMIx): the library that says so.
    OpenMpi(String),
    /// Anything else (MPICH, no MPI, not ELF).
    Other,
}

/// Largest section read (the dynamic section and its string table).
const MAX_SECTION: u64 = 16 << 20;
/// Most bytes scanned for the railring marker.
const MAX_SCAN: u64 = 4 << 30;

/// Is `lib` (a `DT_NEEDED` name) one of Open MPI's?
fn is_open_mpi(lib: &str) -> bool {
    (lib.starts_with("libmpi") && lib.contains(".so.40"))
        || lib.starts_with("libopen-rte.so")
        || lib.starts_with("libopen-pal.so")
        || lib.starts_with("libpmix.so")
}

/// The MPI family of `path` (see the module docs).
pub fn family(path: &Path) -> Family {
    let Ok(Some(needed)) = needed(path) else {
        return Family::Other;
    };
    match needed.into_iter().find(|l| is_open_mpi(l)) {
        Some(lib) => Family::OpenMpi(lib),
        None => Family::Other,
    }
}

/// Does `path` contain the railring program marker (is it a railring program)?
pub fn is_railring_program(path: &Path) -> bool {
    let marker = railring::bootstrap::launch::PROGRAM_MARKER.as_bytes();
    let Ok(f) = File::open(path) else {
        return false;
    };
    let mut r = f.take(MAX_SCAN);
    let mut buf = vec![0u8; 1 << 20];
    let mut keep = 0usize; // bytes carried over from the last chunk
    loop {
        let n = match r.read(&mut buf[keep..]) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        let have = keep + n;
        if buf[..have].windows(marker.len()).any(|w| w == marker) {
            return true;
        }
        keep = (marker.len() - 1).min(have);
        buf.copy_within(have - keep..have, 0);
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn read_at(f: &mut File, off: u64, len: u64) -> Option<Vec<u8>> {
    if len > MAX_SECTION {
        return None;
    }
    f.seek(SeekFrom::Start(off)).ok()?;
    let mut v = vec![0u8; len as usize];
    f.read_exact(&mut v).ok()?;
    Some(v)
}

/// The `DT_NEEDED` names of an ELF file (32 or 64 bit, little-endian); `Ok(None)` when it is
/// not one (a script, big-endian, no dynamic section).
pub fn needed(path: &Path) -> io::Result<Option<Vec<String>>> {
    let mut f = File::open(path)?;
    let mut h = [0u8; 64];
    let mut got = 0;
    while got < h.len() {
        match f.read(&mut h[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(parse(&mut f, &h[..got]))
}

fn parse(f: &mut File, h: &[u8]) -> Option<Vec<String>> {
    if h.get(..4) != Some(b"\x7fELF") || h.get(5) != Some(&1) {
        return None;
    }
    let wide = match h.get(4)? {
        2 => true,
        1 => false,
        _ => return None,
    };
    // Section header table: offset, entry size, count.
    let (shoff, shentsize, shnum) = if wide {
        (u64_at(h, 0x28)?, u16_at(h, 0x3A)?, u16_at(h, 0x3C)?)
    } else {
        (u32_at(h, 0x20)? as u64, u16_at(h, 0x2E)?, u16_at(h, 0x30)?)
    };
    if shoff == 0 || shnum == 0 || shentsize < if wide { 64 } else { 40 } {
        return None;
    }
    let table = read_at(f, shoff, shentsize as u64 * shnum as u64)?;
    // (type, link, offset, size) of section i.
    let section = |i: usize| -> Option<(u32, u32, u64, u64)> {
        let b = table.get(i * shentsize as usize..(i + 1) * shentsize as usize)?;
        if wide {
            Some((
                u32_at(b, 4)?,
                u32_at(b, 40)?,
                u64_at(b, 24)?,
                u64_at(b, 32)?,
            ))
        } else {
            Some((
                u32_at(b, 4)?,
                u32_at(b, 24)?,
                u32_at(b, 16)? as u64,
                u32_at(b, 20)? as u64,
            ))
        }
    };
    const SHT_DYNAMIC: u32 = 6;
    const DT_NEEDED: u64 = 1;
    let (_, link, off, size) = (0..shnum as usize)
        .filter_map(section)
        .find(|s| s.0 == SHT_DYNAMIC)?;
    let dynamic = read_at(f, off, size)?;
    let (_, _, str_off, str_size) = section(link as usize)?;
    let strtab = read_at(f, str_off, str_size)?;
    let entry = if wide { 16 } else { 8 };
    let mut out = Vec::new();
    for e in dynamic.chunks_exact(entry) {
        let (tag, val) = if wide {
            (u64_at(e, 0)?, u64_at(e, 8)?)
        } else {
            (u32_at(e, 0)? as u64, u32_at(e, 4)? as u64)
        };
        if tag == 0 {
            break;
        }
        if tag == DT_NEEDED {
            let s = strtab.get(val as usize..)?;
            let end = s.iter().position(|&b| b == 0)?;
            out.push(String::from_utf8_lossy(&s[..end]).into_owned());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_needed_of_real_binaries_and_refuses_junk() {
        // /bin/sh links libc; this test binary is a railring program (it links the runtime).
        let sh = needed(Path::new("/bin/sh")).unwrap().unwrap();
        assert!(sh.iter().any(|l| l.starts_with("libc.so")), "{sh:?}");
        assert_eq!(family(Path::new("/bin/sh")), Family::Other);
        let me = std::env::current_exe().unwrap();
        assert!(needed(&me).unwrap().is_some());
        assert!(is_railring_program(&me));
        assert!(!is_railring_program(Path::new("/bin/sh")));
        // Not ELF, empty, truncated: unknown, no panic.
        let dir = std::env::temp_dir().join(format!("rr-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in [
            ("script", b"#!/bin/sh\necho hi\n".to_vec()),
            ("empty", Vec::new()),
            ("short", b"\x7fELF\x02\x01".to_vec()),
            ("wild", {
                let mut v = std::fs::read("/bin/sh").unwrap();
                v.truncate(200);
                v[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
                v
            }),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            assert_eq!(needed(&p).unwrap(), None, "{name}");
            assert_eq!(family(&p), Family::Other);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn open_mpi_library_names() {
        for l in [
            "libmpi.so.40",
            "libmpi_cxx.so.40",
            "libopen-pal.so.40",
            "libpmix.so.2",
        ] {
            assert!(is_open_mpi(l), "{l}");
        }
        for l in [
            "libmpich.so.12",
            "libmpi.so.12",
            "libc.so.6",
            "libmpifort.so.12",
        ] {
            assert!(!is_open_mpi(l), "{l}");
        }
    }
}
