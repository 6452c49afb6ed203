//! The PMI-1 wire protocol, as MPICH's Hydra serves it and MPICH's simple PMI client speaks it
//! (documented in Flux RFC 13): one message per line, space-separated `key=value` tuples, the
//! first being `cmd=NAME` (`mcmd=spawn` starts a multi-line spawn request, ended by `endcmd`).
//! The client sends a request and waits for the one response; an `rc` other than 0 in a
//! response is an error, explained by `msg`.
//!
//! This file is the codec both ends share: railrun's PMI server (`launcher/src/pmi.rs`) and
//! railring's own client ([`super`]). Lines are bounded ([`MAX_LINE`]) before anything is
//! kept, and nothing here panics on what it reads.

use std::fmt;
use std::io::{self, BufRead, Read};

/// The protocol version both ends speak: PMI 1.1.
pub const VERSION: u32 = 1;
pub const SUBVERSION: u32 = 1;
/// The longest line accepted, `\n` included.
pub const MAX_LINE: usize = 16 << 10;
/// The limits railrun announces in `maxes` (Hydra's values): a KVS name, a key, a value.
pub const KVSNAME_MAX: usize = 256;
pub const KEYLEN_MAX: usize = 64;
pub const VALLEN_MAX: usize = 1024;

/// Why a line is not a PMI-1 message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("a line longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("bytes that are not printable ASCII")]
    NotText,
    #[error("a line without cmd= or mcmd= first: {0:?}")]
    NoCmd(String),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

/// One message: its command (`cmd=` or, for `multi`, `mcmd=`) and the other tuples in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub cmd: String,
    /// `mcmd=`: the first line of a multi-line request.
    pub multi: bool,
    pub attrs: Vec<(String, String)>,
}

impl Message {
    pub fn new(cmd: &str) -> Message {
        Message {
            cmd: cmd.to_string(),
            multi: false,
            attrs: Vec::new(),
        }
    }

    /// This message with `key=value` added.
    pub fn with(mut self, key: &str, value: impl fmt::Display) -> Message {
        self.attrs.push((key.to_string(), value.to_string()));
        self
    }

    /// The value of `key` (the first one, when repeated).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The response's `rc`: absent is 0; anything that is not an integer is -1.
    pub fn rc(&self) -> i64 {
        match self.get("rc") {
            None => 0,
            Some(v) => v.trim().parse().unwrap_or(-1),
        }
    }

    /// The line, `\n` included.
    pub fn encode(&self) -> String {
        let mut s = format!("{}={}", if self.multi { "mcmd" } else { "cmd" }, self.cmd);
        for (k, v) in &self.attrs {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s.push('\n');
        s
    }

    /// Parse one line (without or with its `\n`). Tuples may come in any order after the
    /// command; a word without `=` continues the previous value (a message with spaces).
    pub fn parse(line: &[u8]) -> Result<Message, WireError> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() >= MAX_LINE {
            return Err(WireError::TooLong);
        }
        if line
            .iter()
            .any(|&b| !(b == b' ' || b == b'\t' || (33..=126).contains(&b)))
        {
            return Err(WireError::NotText);
        }
        // Printable ASCII: valid UTF-8.
        let text = std::str::from_utf8(line).map_err(|_| WireError::NotText)?;
        let mut words = text.split_ascii_whitespace();
        let first = words.next().unwrap_or("");
        let (multi, cmd) = match first.split_once('=') {
            Some(("cmd", c)) => (false, c),
            Some(("mcmd", c)) => (true, c),
            _ => return Err(WireError::NoCmd(text.chars().take(80).collect())),
        };
        let mut attrs: Vec<(String, String)> = Vec::new();
        for w in words {
            match w.split_once('=') {
                Some((k, v)) if !k.is_empty() => attrs.push((k.to_string(), v.to_string())),
                _ => match attrs.last_mut() {
                    Some((_, v)) => {
                        v.push(' ');
                        v.push_str(w);
                    }
                    None => attrs.push((w.to_string(), String::new())),
                },
            }
        }
        Ok(Message {
            cmd: cmd.to_string(),
            multi,
            attrs,
        })
    }
}

/// Read one line (its `\n` dropped), at most [`MAX_LINE`] bytes: `None` at the end of the
/// stream before any byte; a last line without `\n` counts as a line.
pub fn read_line<R: BufRead>(r: &mut R) -> Result<Option<Vec<u8>>, WireError> {
    let mut buf = Vec::new();
    let n = Read::take(&mut *r, MAX_LINE as u64).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        if buf.len() >= MAX_LINE {
            return Err(WireError::TooLong);
        }
    } else {
        buf.pop();
    }
    Ok(Some(buf))
}

/// A key or KVS name as PMI-1 allows it: 1 to `max` printable ASCII characters other than `=`.
pub fn is_word(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| (33..=126).contains(&b) && b != b'=')
}

/// A value as PMI-1 allows it: at most `max` printable ASCII characters (may be empty).
pub fn is_value(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|b| (33..=126).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_order() {
        let m = Message::new("put")
            .with("kvsname", "kvs_1")
            .with("key", "k")
            .with("value", "a=b");
        assert_eq!(m.encode(), "cmd=put kvsname=kvs_1 key=k value=a=b\n");
        assert_eq!(Message::parse(m.encode().as_bytes()).unwrap(), m);
        let p = Message::parse(b"cmd=get_result  value=v   rc=0").unwrap();
        assert_eq!(
            (p.cmd.as_str(), p.get("value"), p.rc()),
            ("get_result", Some("v"), 0)
        );
        let p = Message::parse(b"cmd=abort exitcode=3 message=it went wrong").unwrap();
        assert_eq!(p.get("message"), Some("it went wrong"));
        assert_eq!(p.get("exitcode"), Some("3"));
        let p = Message::parse(b"mcmd=spawn").unwrap();
        assert!(p.multi && p.cmd == "spawn");
        assert_eq!(Message::parse(b"cmd=x rc=zz").unwrap().rc(), -1);
        assert_eq!(Message::parse(b"cmd=x").unwrap().rc(), 0);
    }

    #[test]
    fn bad_lines_are_errors_not_panics() {
        for bad in [
            &b""[..],
            b"put key=1",
            b"=x",
            b"cmd",
            b"cmd=x \x00",
            b"cmd=x \xff\xfe",
        ] {
            assert!(Message::parse(bad).is_err(), "{bad:?}");
        }
        let long = vec![b'a'; MAX_LINE + 10];
        assert!(matches!(Message::parse(&long), Err(WireError::TooLong)));
        let mut r = std::io::Cursor::new(long);
        assert!(matches!(read_line(&mut r), Err(WireError::TooLong)));
    }

    #[test]
    fn lines_from_a_stream() {
        let mut r = std::io::Cursor::new(b"cmd=a\ncmd=b\r\ncmd=c".to_vec());
        assert_eq!(read_line(&mut r).unwrap().unwrap(), b"cmd=a");
        let b = read_line(&mut r).unwrap().unwrap();
        assert_eq!(Message::parse(&b).unwrap().cmd, "b");
        assert_eq!(read_line(&mut r).unwrap().unwrap(), b"cmd=c");
        assert!(read_line(&mut r).unwrap().is_none());
    }

    #[test]
    fn words_and_values() {
        assert!(is_word("kvs_1", KVSNAME_MAX));
        assert!(!is_word("", 10) && !is_word("a=b", 10) && !is_word("a b", 10));
        assert!(!is_word(&"k".repeat(KEYLEN_MAX + 1), KEYLEN_MAX));
        assert!(is_value("", 4) && is_value("a=b", 4) && !is_value("a b", 4));
        assert!(!is_value(&"v".repeat(VALLEN_MAX + 1), VALLEN_MAX));
    }
}
