//! Coverage-guided fuzzing of railring's parsers of untrusted input with libFuzzer, on stable
//! Rust. The targets are those of the mutational harness, `tests/fuzz/targets.rs`, included
//! here as a module: one definition of each. `scripts/fuzz-cov` builds this binary with
//! sanitizer coverage and runs every target; see it for the flags.
//!
//! The environment picks what the binary does (libFuzzer owns the command line):
//! * `RAILRING_FUZZ_TARGET=<name>`: fuzz that target (libFuzzer's flags and corpus folders as
//!   arguments); `list` (or no name, or an unknown one) prints the names instead.
//! * `RAILRING_FUZZ_EXPORT=<dir>` as well: write the target's seeds and saved regressions into
//!   `<dir>/seeds/` and its dictionary as a libFuzzer `-dict` file `<dir>/dict`, then exit.
//!
//! Bounded memory: libFuzzer's `-malloc_limit_mb` needs a sanitizer's malloc hooks, so this
//! binary's allocator enforces the limit itself: a single allocation over
//! `RAILRING_FUZZ_MALLOC_LIMIT_MB` (default 256) MiB — a size taken from the input before it
//! was checked — prints `railring-fuzz-lf: malloc(N) over the limit` and aborts, which
//! libFuzzer reports as a crash and saves the input.

#![no_main]

#[path = "../fuzz/targets.rs"]
mod targets;

use libfuzzer_sys::fuzz_target;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The largest single allocation allowed; `usize::MAX` until `init` reads the limit.
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

struct Limited;

impl Limited {
    #[inline]
    fn check(size: usize) {
        if size > LIMIT.load(Ordering::Relaxed) {
            over_limit(size);
        }
    }
}

/// Report an oversized allocation without allocating, then abort (libFuzzer's SIGABRT handler
/// saves the input as `crash-<sha1>`).
#[cold]
fn over_limit(size: usize) -> ! {
    let mut buf = [0u8; 96];
    let mut n = 0;
    for b in b"\n==railring-fuzz-lf: malloc(" {
        buf[n] = *b;
        n += 1;
    }
    let mut digits = [0u8; 20];
    let (mut d, mut v) = (0, size);
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        buf[n] = digits[d];
        n += 1;
    }
    for b in b") over the limit: a size from unchecked input\n" {
        if n < buf.len() {
            buf[n] = *b;
            n += 1;
        }
    }
    // SAFETY: writes a stack buffer to stderr.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
    std::process::abort()
}

// SAFETY: forwards to the system allocator; only checks sizes.
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        Self::check(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        Self::check(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        Self::check(n);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Limited = Limited;

/// The target this process fuzzes, chosen once.
static EXEC: OnceLock<fn(&[u8])> = OnceLock::new();

/// A dictionary entry as libFuzzer reads it: `"..."` with `\\`, `\"` and `\xNN` escapes.
fn dict_line(token: &str) -> String {
    let mut s = String::from("\"");
    for &b in token.as_bytes() {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02X}")),
        }
    }
    s.push_str("\"\n");
    s
}

fn export(t: &targets::Target, dir: &std::path::Path) -> std::io::Result<()> {
    let seeds = dir.join("seeds");
    std::fs::create_dir_all(&seeds)?;
    let regressions = targets::regressions(t.name);
    for (i, s) in regressions.iter().enumerate() {
        std::fs::write(seeds.join(format!("regression-{i}")), s)?;
    }
    for (i, s) in t.seeds.iter().enumerate() {
        std::fs::write(seeds.join(format!("seed-{i}")), s)?;
    }
    let dict: String = t.dict.iter().map(|d| dict_line(d)).collect();
    std::fs::write(dir.join("dict"), dict)
}

fn init() {
    let name = std::env::var("RAILRING_FUZZ_TARGET").unwrap_or_default();
    let all = targets::all();
    let Some(t) = all.into_iter().find(|t| t.name == name) else {
        let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
        if name.is_empty() || name == "list" {
            println!("{}", names.join("\n"));
            std::process::exit(0);
        }
        eprintln!(
            "railring-fuzz-lf: RAILRING_FUZZ_TARGET={name:?} is not a target; the targets: {}",
            names.join(", ")
        );
        std::process::exit(2);
    };
    if let Ok(dir) = std::env::var("RAILRING_FUZZ_EXPORT") {
        if let Err(e) = export(&t, std::path::Path::new(&dir)) {
            eprintln!("railring-fuzz-lf: writing {dir}: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let mb: usize = std::env::var("RAILRING_FUZZ_MALLOC_LIMIT_MB")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256);
    LIMIT.store(mb.saturating_mul(1 << 20), Ordering::Relaxed);
    let _ = EXEC.set(t.exec);
}

fuzz_target!(init: init(), |data: &[u8]| {
    if let Some(exec) = EXEC.get() {
        exec(data);
    }
});
