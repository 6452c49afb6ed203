//! The launcher ⇄ agent protocol, carried over the agent's SSH stdin/stdout.
//!
//! Every message is one frame: a little-endian `u32` length, then that many bytes of JSON
//! (serde_json) encoding one [`Msg`]. The length is checked against [`MAX_FRAME`] before
//! anything is allocated, and decoding never panics: a malformed frame is an error that ends
//! the connection (and so the job).
//!
//! Before the first frame the agent writes [`MAGIC`] + `\n` on its stdout, so the launcher can
//! skip whatever a remote login shell printed before (a chatty `.bashrc`), instead of reading it
//! as a frame length.
//!
//! Byte strings (output lines, stdin data, store frames) travel base64-encoded.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::sync::Mutex;

/// Written by the agent before the first frame.
pub const MAGIC: &[u8] = b"RAILRUN-AGENT-1";

/// The largest frame accepted: room for the largest bootstrap-store frame
/// (`railring::store::wire::MAX_FRAME`, 64 MiB) after base64 and JSON overhead.
pub const MAX_FRAME: usize = (railring::store::wire::MAX_FRAME / 3 + 1) * 4 + 64 * 1024;

/// Longest bytes of output forwarded as one line: a longer line is forwarded in pieces of this size.
pub const MAX_LINE: usize = 1 << 20;

/// Which output stream of a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One rank as the agent must start it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSpec {
    pub rank: u32,
    /// Per-rank environment (RAILRING_RANK, RANK, ...), applied over the job environment.
    /// `RAILRING_STORE_ADDR` is added by the agent (its relay's address).
    pub env: Vec<(String, String)>,
    /// This rank reads railrun's stdin (rank 0); all others get /dev/null.
    pub stdin: bool,
    /// Its index among its node's ranks, and their number (the binding is computed for them).
    #[serde(default)]
    pub local_rank: u32,
    #[serde(default)]
    pub local_size: u32,
}

/// What one node must run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Absolute path of the program (resolved by the launcher; shared filesystem assumed).
    pub program: String,
    pub args: Vec<String>,
    /// Working directory; the agent falls back to `$HOME` (with a warning) when it is missing.
    pub cwd: String,
    /// Environment added for every rank over the node's own environment (`-x` variables and
    /// job-wide names).
    pub env: Vec<(String, String)>,
    /// The job secret (`RAILRING_JOB_SECRET`; also guards the agent's relay).
    pub secret: String,
    /// Grace between SIGTERM and SIGKILL when the agent kills its ranks on its own.
    pub kill_grace_ms: u64,
    pub ranks: Vec<RankSpec>,
    /// The job's id and number of ranks (the node's PMI-1 server names and sizes the job).
    #[serde(default)]
    pub job_id: String,
    #[serde(default)]
    pub world_size: u32,
    /// `--report-bindings`: the agent prints its ranks' bindings (on its stderr, which railrun
    /// forwards).
    #[serde(default)]
    pub report_bindings: bool,
}

/// How a rank ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitKind {
    Code(i32),
    Signal(i32),
}

impl ExitKind {
    pub fn from_status(st: std::process::ExitStatus) -> ExitKind {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(c), _) => ExitKind::Code(c),
            (None, Some(s)) => ExitKind::Signal(s),
            // Stopped/continued are never reported by wait(); treat as failure.
            (None, None) => ExitKind::Code(1),
        }
    }

    pub fn success(&self) -> bool {
        matches!(self, ExitKind::Code(0))
    }

    /// The exit code railrun reports for this: the code, or 128 + signal.
    pub fn exit_code(&self) -> i32 {
        match *self {
            ExitKind::Code(c) => c & 0xff,
            ExitKind::Signal(s) => 128 + (s & 0x7f),
        }
    }

    /// "exited with code 3" / "killed by signal 9 (SIGKILL)".
    pub fn describe(&self) -> String {
        match *self {
            ExitKind::Code(c) => format!("exited with code {c}"),
            ExitKind::Signal(s) => format!("killed by signal {s} ({})", signal_name(s)),
        }
    }
}

/// "SIGKILL" for 9, "signal 99" for an unknown number.
pub fn signal_name(s: i32) -> String {
    match nix::sys::signal::Signal::try_from(s) {
        Ok(sig) => sig.as_str().to_string(),
        Err(_) => format!("signal {s}"),
    }
}

/// Every message between launcher and agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Msg {
    /// agent → launcher, first frame. `free_port`: a TCP port that was free on the agent's node
    /// (found by binding port 0), used as MASTER_PORT when this node is node 0.
    Hello {
        hostname: String,
        pid: u32,
        free_port: u16,
        version: String,
    },
    /// launcher → agent: start these ranks.
    Spawn(JobSpec),
    /// agent → launcher: every rank of the Spawn is running (rank, pid).
    Started { pids: Vec<(u32, u32)> },
    /// agent → launcher: a rank ended (after all its output was sent).
    RankExited { rank: u32, exit: ExitKind },
    /// agent → launcher: a rank could not be started.
    SpawnFailed { rank: u32, error: String },
    /// agent → launcher: one line of a rank's output, with its `\n` (a last line without one
    /// comes without one; a line longer than [`MAX_LINE`] comes in pieces of that size).
    Output {
        rank: u32,
        stream: Stream,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// launcher → agent: bytes for rank 0's stdin.
    Stdin {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// launcher → agent: rank 0's stdin reached its end.
    StdinEof,
    /// agent → launcher: a bootstrap-store request (`railring::store::wire` encoding) from
    /// one of the agent's ranks; `conn` names the relay connection, `id` the request.
    StoreReq {
        conn: u64,
        id: u64,
        #[serde(with = "b64")]
        frame: Vec<u8>,
    },
    /// launcher → agent: the store's answer to StoreReq `id`.
    StoreResp {
        conn: u64,
        id: u64,
        #[serde(with = "b64")]
        frame: Vec<u8>,
    },
    /// launcher → agent: send `signal` to every rank's process group.
    Kill { signal: i32 },
    /// launcher → agent: the job is over; kill and reap what is left and exit.
    /// agent → launcher: done; nothing of the job is left on this node.
    Bye,
    /// Both ways, every [`HEARTBEAT_INTERVAL`]: "I am alive". A side that hears no frame at all
    /// for `timeout_ms` declares the other lost (the launcher names the host and ends the job;
    /// the agent kills its ranks). The launcher's pings carry its limit, so both sides use the
    /// same one (`RAILRUN_HEARTBEAT`); the agent's carry 0.
    Ping {
        #[serde(default)]
        timeout_ms: u64,
    },
}

/// How often each side of a launcher–agent channel sends a [`Msg::Ping`].
pub const HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Default silence after which a side declares the other lost (`RAILRUN_HEARTBEAT`, seconds).
pub const DEFAULT_HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6);

/// The heartbeat limit `RAILRUN_HEARTBEAT` asks for (seconds, 1..=3600; default
/// [`DEFAULT_HEARTBEAT_TIMEOUT`]); `Err` names the variable and the value for a bad one.
pub fn heartbeat_timeout(value: Option<&str>) -> Result<std::time::Duration, String> {
    railring::knobs::knob(railring::knobs::RAILRUN_HEARTBEAT)
        .seconds(value, DEFAULT_HEARTBEAT_TIMEOUT)
        .map_err(String::from)
}

/// When one side of a launcher–agent channel last heard anything from the other (every frame
/// counts, pings included).
pub struct Liveness {
    base: std::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
}

impl Liveness {
    pub fn new() -> std::sync::Arc<Liveness> {
        std::sync::Arc::new(Liveness {
            base: std::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A frame arrived.
    pub fn heard(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the last frame (or since [`Liveness::new`]).
    pub fn silent_for(&self) -> std::time::Duration {
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.base
            .elapsed()
            .saturating_sub(std::time::Duration::from_millis(last))
    }
}

/// Send a [`Msg::Ping`] carrying `timeout_ms` every [`HEARTBEAT_INTERVAL`] on a thread of its
/// own, until a send fails (the channel is closed or abandoned).
pub fn spawn_pinger<W: Write + Send + 'static>(
    writer: std::sync::Arc<FrameWriter<W>>,
    timeout_ms: u64,
) {
    let _ = std::thread::Builder::new()
        .name("rr-ping".into())
        .spawn(move || loop {
            std::thread::sleep(HEARTBEAT_INTERVAL);
            if writer.send(&Msg::Ping { timeout_ms }).is_err() {
                return;
            }
        });
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no railrun agent answered (expected the agent's greeting, got {0:?})")]
    NoMagic(String),
}

/// Encode one message as a frame (length + JSON).
pub fn encode(msg: &Msg) -> Result<Vec<u8>, ProtoError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg)?;
    let n = buf.len() - 4;
    if n > MAX_FRAME {
        return Err(ProtoError::TooLarge(n));
    }
    buf[..4].copy_from_slice(&(n as u32).to_le_bytes());
    Ok(buf)
}

/// Decode one frame payload.
pub fn decode(payload: &[u8]) -> Result<Msg, ProtoError> {
    Ok(serde_json::from_slice(payload)?)
}

/// Read one message; `Ok(None)` on a clean end of stream between frames.
pub fn read_msg<R: Read>(r: &mut R) -> Result<Option<Msg>, ProtoError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtoError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(ProtoError::TooLarge(n));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf)?;
    decode(&buf).map(Some)
}

/// Skip anything before the agent's [`MAGIC`] line (at most 64 KiB), returning what was skipped.
pub fn read_magic<R: Read>(r: &mut R) -> Result<Vec<u8>, ProtoError> {
    const LIMIT: usize = 64 * 1024;
    let mut seen: Vec<u8> = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) => {
                return Err(ProtoError::NoMagic(
                    String::from_utf8_lossy(&seen).into_owned(),
                ))
            }
            Ok(_) => {
                seen.push(b[0]);
                if b[0] == b'\n'
                    && seen.len() > MAGIC.len()
                    && seen[seen.len() - 1 - MAGIC.len()..seen.len() - 1] == *MAGIC
                {
                    seen.truncate(seen.len() - 1 - MAGIC.len());
                    return Ok(seen);
                }
                if seen.len() > LIMIT {
                    return Err(ProtoError::NoMagic(
                        String::from_utf8_lossy(&seen[..200]).into_owned(),
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A frame writer shared between threads: one frame is written with a single `write_all` under
/// the lock, so frames never interleave.
pub struct FrameWriter<W: Write + Send> {
    w: Mutex<Option<W>>,
    /// Set by [`Self::abandon`]: every later send fails at once, without taking the lock.
    abandoned: std::sync::atomic::AtomicBool,
}

impl<W: Write + Send> FrameWriter<W> {
    pub fn new(w: W) -> Self {
        FrameWriter {
            w: Mutex::new(Some(w)),
            abandoned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The peer is lost: fail every later send at once. A send already blocked in `write` (a
    /// full pipe towards a silent peer) stays blocked, but nobody else waits behind it.
    pub fn abandon(&self) {
        self.abandoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn send(&self, msg: &Msg) -> Result<(), ProtoError> {
        let buf = encode(msg)?;
        self.send_raw(&buf)
    }

    pub fn send_raw(&self, buf: &[u8]) -> Result<(), ProtoError> {
        if self.abandoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ProtoError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "channel abandoned (peer lost)",
            )));
        }
        let mut g = self.w.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(w) => {
                w.write_all(buf)?;
                w.flush()?;
                Ok(())
            }
            None => Err(ProtoError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "channel closed",
            ))),
        }
    }

    /// Close the underlying writer (the peer sees end of stream). After [`Self::abandon`] it
    /// does not wait for a send blocked towards the lost peer: the descriptor then closes when
    /// the process exits.
    pub fn close(&self) {
        let g = if self.abandoned.load(std::sync::atomic::Ordering::SeqCst) {
            match self.w.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
        } else {
            self.w.lock().unwrap_or_else(|e| e.into_inner())
        };
        let mut g = g;
        *g = None;
    }
}

/// Minimal standard base64 (with padding) for byte strings inside JSON.
pub mod b64 {
    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHA: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(b: &[u8]) -> String {
        let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
        for ch in b.chunks(3) {
            let v = (ch[0] as u32) << 16
                | (*ch.get(1).unwrap_or(&0) as u32) << 8
                | *ch.get(2).unwrap_or(&0) as u32;
            out.push(ALPHA[(v >> 18) as usize & 63] as char);
            out.push(ALPHA[(v >> 12) as usize & 63] as char);
            out.push(if ch.len() > 1 {
                ALPHA[(v >> 6) as usize & 63] as char
            } else {
                '='
            });
            out.push(if ch.len() > 2 {
                ALPHA[v as usize & 63] as char
            } else {
                '='
            });
        }
        out
    }

    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, &'static str> {
        let b = s.as_bytes();
        if !b.len().is_multiple_of(4) {
            return Err("base64 length is not a multiple of 4");
        }
        let mut out = Vec::with_capacity(b.len() / 4 * 3);
        let n = b.len() / 4;
        for (i, q) in b.chunks(4).enumerate() {
            let last = i + 1 == n;
            let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && !last) {
                return Err("bad base64 padding");
            }
            let mut v = 0u32;
            for &c in &q[..4 - pad] {
                v = v << 6 | val(c).ok_or("bad base64 character")?;
            }
            v <<= 6 * pad as u32;
            out.push((v >> 16) as u8);
            if pad < 2 {
                out.push((v >> 8) as u8);
            }
            if pad < 1 {
                out.push(v as u8);
            }
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        decode(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip() {
        for n in 0..70 {
            let v: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(b64::decode(&b64::encode(&v)).unwrap(), v);
        }
        assert_eq!(b64::encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64::encode(b"fo"), "Zm8=");
        for bad in ["A", "A===", "Zm8=Zm8=", "Zm!v", "===="] {
            assert!(b64::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn frames_round_trip() {
        let msgs = vec![
            Msg::Hello {
                hostname: "n1".into(),
                pid: 7,
                free_port: 4242,
                version: "0.1".into(),
            },
            Msg::Output {
                rank: 3,
                stream: Stream::Stderr,
                data: vec![0, 255, b'\n'],
            },
            Msg::RankExited {
                rank: 1,
                exit: ExitKind::Signal(9),
            },
            Msg::StoreReq {
                conn: 1,
                id: 2,
                frame: vec![1, 2, 3],
            },
            Msg::Kill { signal: 15 },
            Msg::Bye,
            Msg::Ping { timeout_ms: 6000 },
            Msg::StdinEof,
            Msg::Spawn(JobSpec {
                program: "/bin/true".into(),
                args: vec!["a b".into()],
                cwd: "/".into(),
                env: vec![("A".into(), "1".into())],
                secret: "s".into(),
                kill_grace_ms: 3000,
                ranks: vec![RankSpec {
                    rank: 0,
                    env: vec![],
                    stdin: true,
                    local_rank: 0,
                    local_size: 1,
                }],
                job_id: "j".into(),
                world_size: 1,
                report_bindings: true,
            }),
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            buf.extend(encode(m).unwrap());
        }
        let mut r: &[u8] = &buf;
        for m in &msgs {
            assert_eq!(&read_msg(&mut r).unwrap().unwrap(), m);
        }
        assert!(read_msg(&mut r).unwrap().is_none());
    }

    #[test]
    fn hostile_frames_are_errors() {
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0x7f, 1, 2];
        assert!(matches!(read_msg(&mut r), Err(ProtoError::TooLarge(_))));
        let mut r: &[u8] = &[3, 0, 0, 0, b'{', b'}', b'x'];
        assert!(matches!(read_msg(&mut r), Err(ProtoError::Json(_))));
        let mut r: &[u8] = &[3, 0];
        assert!(read_msg(&mut r).is_err());
        let mut f = vec![];
        let p = br#"{"type":"Output","rank":1,"stream":"stdout","data":"!!!!"}"#;
        f.extend((p.len() as u32).to_le_bytes());
        f.extend(p);
        assert!(read_msg(&mut &f[..]).is_err());
        let p = br#"{"type":"RankExited","rank":-1,"exit":{"Code":1}}"#;
        assert!(decode(p).is_err());
    }

    #[test]
    fn magic_skips_shell_noise() {
        let mut data = b"Welcome to node!\nmotd\n".to_vec();
        data.extend(MAGIC);
        data.push(b'\n');
        data.extend(encode(&Msg::Bye).unwrap());
        let mut r: &[u8] = &data;
        let skipped = read_magic(&mut r).unwrap();
        assert_eq!(skipped, b"Welcome to node!\nmotd\n");
        assert_eq!(read_msg(&mut r).unwrap(), Some(Msg::Bye));
        let mut r: &[u8] = b"ssh: nothing";
        assert!(read_magic(&mut r).is_err());
    }

    #[test]
    fn heartbeat_knob() {
        use std::time::Duration;
        assert_eq!(heartbeat_timeout(None), Ok(DEFAULT_HEARTBEAT_TIMEOUT));
        let declared = railring::knobs::knob(railring::knobs::RAILRUN_HEARTBEAT).default_seconds();
        assert_eq!(
            DEFAULT_HEARTBEAT_TIMEOUT, declared,
            "the agent's default is the declared one"
        );
        assert_eq!(heartbeat_timeout(Some(" ")), Ok(DEFAULT_HEARTBEAT_TIMEOUT));
        assert_eq!(
            heartbeat_timeout(Some("2.5")),
            Ok(Duration::from_millis(2500))
        );
        for bad in ["0", "-1", "nan", "inf", "1e9", "x"] {
            let e = heartbeat_timeout(Some(bad)).unwrap_err();
            assert!(e.contains("RAILRUN_HEARTBEAT") && e.contains(bad), "{e}");
        }
        // an old agent's ping without the field still decodes
        assert_eq!(
            decode(br#"{"type":"Ping"}"#).unwrap(),
            Msg::Ping { timeout_ms: 0 }
        );
    }

    #[test]
    fn abandoned_writer_fails_at_once() {
        let w = FrameWriter::new(Vec::new());
        assert!(w.send(&Msg::Bye).is_ok());
        w.abandon();
        assert!(w.send(&Msg::Bye).is_err());
    }

    #[test]
    fn exit_kinds() {
        assert_eq!(ExitKind::Signal(9).exit_code(), 137);
        assert_eq!(ExitKind::Code(3).exit_code(), 3);
        assert_eq!(
            ExitKind::Signal(15).describe(),
            "killed by signal 15 (SIGTERM)"
        );
        assert_eq!(signal_name(200), "signal 200");
    }
}
