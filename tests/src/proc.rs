//! Child processes in integration tests: read their output while they run (a child printing
//! more than a pipe buffer would otherwise block), wait with a limit, and give a run its own
//! scratch directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Reads `r` to its end on a thread; the thread returns everything read (also after an error).
pub fn read_all(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        b
    })
}

/// Like [`read_all`], as text (invalid UTF-8 replaced).
pub fn read_text(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// Takes the child's piped stdout and stderr and reads both as text on threads:
/// (stdout, stderr).
pub fn collect(child: &mut Child) -> (JoinHandle<String>, JoinHandle<String>) {
    let o = child.stdout.take().expect("piped stdout");
    let e = child.stderr.take().expect("piped stderr");
    (read_text(o), read_text(e))
}

/// Waits for `child` at most `limit` (polling every 20 ms); None when it is still running.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh directory under the system temp dir, removed (with its content) on drop — e.g. one
/// per mpirun, so that concurrent runs never share Open MPI's session directory.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `<temp>/<prefix>-<pid>-<n>`, created empty.
    pub fn new(prefix: &str) -> ScratchDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        ScratchDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
