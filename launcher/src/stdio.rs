//! Rank output: splitting a stream into lines, and writing lines to the terminal (optionally
//! tagged) or to one file per rank, never splitting or interleaving a line.
//!
//! When railrun's stdout or stderr is closed by its reader (`railrun ... | head`: EPIPE), the
//! sink remembers it ([`Sink::closed`]); the job then ends, as mpirun ends on SIGPIPE.

use crate::proto::{Stream, MAX_LINE};
use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Read `r` to its end, calling `emit` with every line (with its `\n`); a last line without a
/// newline is emitted as is, and a line longer than [`MAX_LINE`] in pieces of that size.
/// Returns when `r` ends or fails, or when `emit` returns false.
pub fn for_each_line<R: Read>(mut r: R, mut emit: impl FnMut(&[u8]) -> bool) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n') {
            if !emit(&buf[start..start + pos + 1]) {
                return;
            }
            start += pos + 1;
        }
        while buf.len() - start >= MAX_LINE {
            if !emit(&buf[start..start + MAX_LINE]) {
                return;
            }
            start += MAX_LINE;
        }
        buf.drain(..start);
    }
    if !buf.is_empty() {
        emit(&buf);
    }
}

/// A raw, unbuffered handle on fd 1 or 2 (one `write` per line, no std buffering in between).
fn raw_fd(fd: i32) -> ManuallyDrop<File> {
    // SAFETY: fds 1 and 2 stay open for the life of the process (a test's pipe for as long as
    // its sink); ManuallyDrop never closes them.
    ManuallyDrop::new(unsafe { File::from_raw_fd(fd) })
}

enum Target {
    Terminal,
    Dir {
        dir: PathBuf,
        files: Vec<Mutex<Option<File>>>,
    },
}

/// Where rank output goes. Shared by every thread that forwards output.
pub struct Sink {
    target: Target,
    tag: bool,
    /// Serialises every write to the terminal (rank lines on stdout and stderr, and railrun's own
    /// messages), so no line is ever interleaved with another.
    term: Mutex<()>,
    stdout_broken: AtomicBool,
    stderr_broken: AtomicBool,
    /// `--merge-stderr-to-stdout`: rank stderr lines go to fd 1.
    merge: bool,
    /// The descriptors standing for stdout and stderr (1 and 2; tests use pipes).
    fds: (i32, i32),
}

impl Sink {
    /// Lines go to railrun's stdout/stderr.
    pub fn terminal(tag: bool) -> Sink {
        Sink {
            target: Target::Terminal,
            tag,
            term: Mutex::new(()),
            stdout_broken: AtomicBool::new(false),
            stderr_broken: AtomicBool::new(false),
            merge: false,
            fds: (1, 2),
        }
    }

    /// `--merge-stderr-to-stdout`: rank stderr lines go to railrun's stdout (terminal only;
    /// `--output-dir` files hold both streams anyway).
    pub fn merging_stderr(mut self, merge: bool) -> Sink {
        self.merge = merge;
        self
    }

    /// Which of railrun's stdout / stderr a reader has closed (a write failed with EPIPE):
    /// `Some("stdout")`, `Some("stderr")` or `None`.
    pub fn closed(&self) -> Option<&'static str> {
        if self.stdout_broken.load(Ordering::Relaxed) {
            Some("stdout")
        } else if self.stderr_broken.load(Ordering::Relaxed) {
            Some("stderr")
        } else {
            None
        }
    }

    /// Write `buf` to fd `fd` unless that fd is known closed; EPIPE marks it closed (other
    /// errors drop the line).
    fn write_fd(&self, fd: i32, buf: &[u8]) {
        let (flag, fd) = if fd == 1 {
            (&self.stdout_broken, self.fds.0)
        } else {
            (&self.stderr_broken, self.fds.1)
        };
        if flag.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = raw_fd(fd).write_all(buf) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                flag.store(true, Ordering::Relaxed);
            }
        }
    }

    /// One file `dir/rank.N.out` per rank (created now, truncated), holding stdout and stderr
    /// lines. `dir` is made (mode 0700) when missing and must otherwise be a directory of this
    /// user, not a link; each file is this user's, mode 0600, never written through a link, a
    /// FIFO or a hard link ([`railring::private_fs`]).
    pub fn dir(dir: &Path, world: usize, tag: bool) -> io::Result<Sink> {
        railring::private_fs::own_dir(dir).map_err(|e| {
            io::Error::new(e.kind(), format!("--output-dir {}: {e}", dir.display()))
        })?;
        let mut files = Vec::with_capacity(world);
        for r in 0..world {
            let p = dir.join(format!("rank.{r}.out"));
            let f = railring::private_fs::create_or_truncate(&p)
                .map_err(|e| io::Error::new(e.kind(), format!("--output-dir: {e}")))?;
            files.push(Mutex::new(Some(f)));
        }
        Ok(Sink {
            target: Target::Dir {
                dir: dir.to_path_buf(),
                files,
            },
            tag,
            term: Mutex::new(()),
            stdout_broken: AtomicBool::new(false),
            stderr_broken: AtomicBool::new(false),
            merge: false,
            fds: (1, 2),
        })
    }

    fn format(&self, rank: u32, line: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(line.len() + 12);
        if self.tag {
            out.extend_from_slice(format!("[{rank}] ").as_bytes());
        }
        out.extend_from_slice(line);
        if out.last() != Some(&b'\n') {
            out.push(b'\n');
        }
        out
    }

    /// Write one line of rank `rank`'s `stream`.
    pub fn line(&self, rank: u32, stream: Stream, line: &[u8]) {
        let buf = self.format(rank, line);
        match &self.target {
            Target::Terminal => {
                let _g = self.term.lock().unwrap_or_else(|e| e.into_inner());
                match stream {
                    Stream::Stdout => self.write_fd(1, &buf),
                    Stream::Stderr if self.merge => self.write_fd(1, &buf),
                    Stream::Stderr => self.write_fd(2, &buf),
                }
            }
            Target::Dir { dir, files } => {
                let Some(slot) = files.get(rank as usize) else {
                    return;
                };
                let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = g.as_mut() {
                    if let Err(e) = f.write_all(&buf) {
                        drop(g.take());
                        self.message(&format!(
                            "railrun: cannot write {}/rank.{rank}.out: {e}; dropping its output",
                            dir.display()
                        ));
                    }
                }
            }
        }
    }

    /// One of railrun's own messages, on stderr (a newline is added when missing).
    pub fn message(&self, msg: &str) {
        let mut buf = msg.as_bytes().to_vec();
        if buf.last() != Some(&b'\n') {
            buf.push(b'\n');
        }
        let _g = self.term.lock().unwrap_or_else(|e| e.into_inner());
        self.write_fd(2, &buf);
    }

    /// Flush per-rank files.
    pub fn flush(&self) {
        if let Target::Dir { files, .. } = &self.target {
            for f in files {
                let mut g = f.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = g.as_mut() {
                    let _ = f.flush();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for_each_line(input, |l| {
            v.push(l.to_vec());
            true
        });
        v
    }

    #[test]
    fn splits_lines() {
        assert_eq!(
            lines(b"a\nbb\n\nc"),
            vec![
                b"a\n".to_vec(),
                b"bb\n".to_vec(),
                b"\n".to_vec(),
                b"c".to_vec()
            ]
        );
        assert!(lines(b"").is_empty());
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let l = lines(&long);
        assert_eq!(l.len(), 3);
        assert_eq!(l[2].len(), 5);
    }

    #[test]
    fn split_reads_make_whole_lines() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || b.is_empty() {
                    return Ok(0);
                }
                b[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let mut v = Vec::new();
        for_each_line(Trickle(b"hello\nworld\n"), |l| {
            v.push(l.to_vec());
            true
        });
        assert_eq!(v, vec![b"hello\n".to_vec(), b"world\n".to_vec()]);
    }

    /// A pipe whose read end is closed: writing to it fails with EPIPE.
    fn closed_pipe() -> std::os::fd::OwnedFd {
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        w
    }

    #[test]
    fn a_closed_stdout_or_stderr_is_noticed() {
        use std::os::fd::AsRawFd;
        let (r, w) = nix::unistd::pipe().unwrap();
        let dead = closed_pipe();
        let mut s = Sink::terminal(false);
        s.fds = (w.as_raw_fd(), dead.as_raw_fd());
        s.line(0, Stream::Stdout, b"kept\n");
        assert_eq!(s.closed(), None);
        s.line(0, Stream::Stderr, b"lost\n");
        assert_eq!(s.closed(), Some("stderr"));
        drop(w);
        let mut got = String::new();
        File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "kept\n");

        let dead = closed_pipe();
        let (r2, w2) = nix::unistd::pipe().unwrap();
        let mut s = Sink::terminal(true).merging_stderr(true);
        s.fds = (dead.as_raw_fd(), w2.as_raw_fd());
        s.line(3, Stream::Stderr, b"to stdout");
        assert_eq!(
            s.closed(),
            Some("stdout"),
            "merged stderr goes to the closed stdout"
        );
        s.message("railrun: still said on stderr");
        drop(w2);
        let mut got = String::new();
        File::from(r2).read_to_string(&mut got).unwrap();
        assert_eq!(got, "railrun: still said on stderr\n");
    }

    #[test]
    fn merged_stderr_lines_go_to_stdout() {
        use std::os::fd::AsRawFd;
        let (r1, w1) = nix::unistd::pipe().unwrap();
        let (r2, w2) = nix::unistd::pipe().unwrap();
        let mut s = Sink::terminal(true).merging_stderr(true);
        s.fds = (w1.as_raw_fd(), w2.as_raw_fd());
        s.line(1, Stream::Stdout, b"out\n");
        s.line(1, Stream::Stderr, b"err\n");
        drop((w1, w2));
        let (mut a, mut b) = (String::new(), String::new());
        File::from(r1).read_to_string(&mut a).unwrap();
        File::from(r2).read_to_string(&mut b).unwrap();
        assert_eq!(a, "[1] out\n[1] err\n");
        assert_eq!(b, "");
        drop(s);
    }

    #[test]
    fn dir_sink_writes_files() {
        let d = std::env::temp_dir().join(format!("railrun-stdio-test-{}", std::process::id()));
        let s = Sink::dir(&d, 2, true).unwrap();
        s.line(1, Stream::Stdout, b"out\n");
        s.line(1, Stream::Stderr, b"err");
        s.line(7, Stream::Stdout, b"nobody\n");
        s.flush();
        assert_eq!(
            std::fs::read_to_string(d.join("rank.1.out")).unwrap(),
            "[1] out\n[1] err\n"
        );
        assert_eq!(std::fs::read_to_string(d.join("rank.0.out")).unwrap(), "");
        let _ = std::fs::remove_dir_all(d);
    }
}
