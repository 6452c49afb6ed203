//! The bootstrap store's wire format. Every message is one frame: a little-endian `u32` length
//! followed by that many bytes. Lengths are checked against [`MAX_FRAME`] before anything is
//! allocated, and every field inside a frame is bounds-checked while decoding, so no frame can
//! make a reader panic or allocate without limit.

use std::io::{self, Read, Write};
use std::time::Duration;

/// The largest frame accepted (64 MiB + headroom for the request header).
pub const MAX_FRAME: usize = (64 << 20) + 4096;
/// The largest key.
pub const MAX_KEY: usize = 4096;
/// The most keys in one `Wait`.
pub const MAX_KEYS: usize = 65536;

pub fn write_frame<W: Write>(w: &mut W, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "frame too large",
        ));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame; `Ok(None)` on a clean end of stream before the first byte.
pub fn read_frame<R: Read>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    read_frame_bounded(r, MAX_FRAME)
}

pub fn read_frame_bounded<R: Read>(r: &mut R, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {n} bytes exceeds the limit of {max}"),
        ));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// A request to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Wait (up to `timeout`) until `key` exists, then return its value.
    Get {
        key: Vec<u8>,
        timeout: Duration,
    },
    /// Wait (up to `timeout`) until every key exists.
    Wait {
        keys: Vec<Vec<u8>>,
        timeout: Duration,
    },
    /// Add `delta` to the integer stored at `key` (absent = 0) and return the new value.
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    /// Which of these keys exist now (no waiting).
    Check {
        keys: Vec<Vec<u8>>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Ok,
    Value(Vec<u8>),
    Int(i64),
    Present(Vec<bool>),
    /// The wait ran out; the keys still missing.
    Timeout(Vec<Vec<u8>>),
    Error(String),
}

#[derive(Debug, thiserror::Error)]
#[error("malformed store frame: {0}")]
pub struct DecodeError(pub &'static str);

struct Cur<'a> {
    b: &'a [u8],
}
impl<'a> Cur<'a> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&x, rest) = self.b.split_first().ok_or(DecodeError("truncated"))?;
        self.b = rest;
        Ok(x)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?
                .try_into()
                .map_err(|_| DecodeError("truncated"))?,
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?
                .try_into()
                .map_err(|_| DecodeError("truncated"))?,
        ))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError("field too long"));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn keys(&mut self) -> Result<Vec<Vec<u8>>, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_KEYS {
            return Err(DecodeError("too many keys"));
        }
        // Each key takes at least 4 bytes on the wire: bound the allocation by what is there.
        if n > self.b.len() / 4 {
            return Err(DecodeError("truncated"));
        }
        (0..n).map(|_| self.bytes(MAX_KEY)).collect()
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}
fn put_keys(out: &mut Vec<u8>, keys: &[Vec<u8>]) {
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        put_bytes(out, k);
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Request::Set { key, value } => {
                o.push(1);
                put_bytes(&mut o, key);
                put_bytes(&mut o, value);
            }
            Request::Get { key, timeout } => {
                o.push(2);
                put_bytes(&mut o, key);
                o.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
            }
            Request::Wait { keys, timeout } => {
                o.push(3);
                put_keys(&mut o, keys);
                o.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
            }
            Request::Add { key, delta } => {
                o.push(4);
                put_bytes(&mut o, key);
                o.extend_from_slice(&delta.to_le_bytes());
            }
            Request::Check { keys } => {
                o.push(5);
                put_keys(&mut o, keys);
            }
        }
        o
    }

    pub fn decode(b: &[u8]) -> Result<Request, DecodeError> {
        let mut c = Cur { b };
        let r = match c.u8()? {
            1 => Request::Set {
                key: c.bytes(MAX_KEY)?,
                value: c.bytes(MAX_FRAME)?,
            },
            2 => Request::Get {
                key: c.bytes(MAX_KEY)?,
                timeout: Duration::from_millis(c.u64()?),
            },
            3 => Request::Wait {
                keys: c.keys()?,
                timeout: Duration::from_millis(c.u64()?),
            },
            4 => Request::Add {
                key: c.bytes(MAX_KEY)?,
                delta: c.u64()? as i64,
            },
            5 => Request::Check { keys: c.keys()? },
            _ => return Err(DecodeError("unknown request")),
        };
        c.end()?;
        Ok(r)
    }
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Response::Ok => o.push(1),
            Response::Value(v) => {
                o.push(2);
                put_bytes(&mut o, v);
            }
            Response::Int(i) => {
                o.push(3);
                o.extend_from_slice(&i.to_le_bytes());
            }
            Response::Present(p) => {
                o.push(4);
                o.extend_from_slice(&(p.len() as u32).to_le_bytes());
                o.extend(p.iter().map(|&x| x as u8));
            }
            Response::Timeout(keys) => {
                o.push(5);
                put_keys(&mut o, keys);
            }
            Response::Error(e) => {
                o.push(6);
                put_bytes(&mut o, e.as_bytes());
            }
        }
        o
    }

    pub fn decode(b: &[u8]) -> Result<Response, DecodeError> {
        let mut c = Cur { b };
        let r = match c.u8()? {
            1 => Response::Ok,
            2 => Response::Value(c.bytes(MAX_FRAME)?),
            3 => Response::Int(c.u64()? as i64),
            4 => {
                let n = c.u32()? as usize;
                Response::Present(c.take(n)?.iter().map(|&x| x != 0).collect())
            }
            5 => Response::Timeout(c.keys()?),
            6 => Response::Error(String::from_utf8_lossy(&c.bytes(MAX_FRAME)?).into_owned()),
            _ => return Err(DecodeError("unknown response")),
        };
        c.end()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let reqs = vec![
            Request::Set {
                key: b"k".to_vec(),
                value: vec![1, 2, 3],
            },
            Request::Get {
                key: b"a/b".to_vec(),
                timeout: Duration::from_millis(1500),
            },
            Request::Wait {
                keys: vec![b"x".to_vec(), b"y".to_vec()],
                timeout: Duration::from_secs(3),
            },
            Request::Add {
                key: b"n".to_vec(),
                delta: -7,
            },
            Request::Check { keys: vec![] },
        ];
        for r in reqs {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let resps = vec![
            Response::Ok,
            Response::Value(b"v".to_vec()),
            Response::Int(-3),
            Response::Present(vec![true, false]),
            Response::Timeout(vec![b"z".to_vec()]),
            Response::Error("no".into()),
        ];
        for r in resps {
            assert_eq!(Response::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn hostile_frames_are_errors_not_panics() {
        // length prefix far beyond the limit: rejected before allocation
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0];
        assert!(read_frame(&mut r).is_err());
        // a key count claiming millions of keys in a tiny frame
        let mut b = vec![3u8];
        b.extend_from_slice(&(60000u32).to_le_bytes());
        assert!(Request::decode(&b).is_err());
        // truncated, unknown, trailing
        assert!(Request::decode(&[1, 5, 0, 0, 0, b'a']).is_err());
        assert!(Request::decode(&[99]).is_err());
        assert!(Request::decode(&[]).is_err());
        let mut ok = Request::Add {
            key: b"n".to_vec(),
            delta: 1,
        }
        .encode();
        ok.push(0);
        assert!(Request::decode(&ok).is_err());
        // every prefix of a valid frame fails cleanly
        let full = Request::Wait {
            keys: vec![b"abc".to_vec()],
            timeout: Duration::from_secs(1),
        }
        .encode();
        for i in 0..full.len() {
            assert!(Request::decode(&full[..i]).is_err());
        }
    }
}
