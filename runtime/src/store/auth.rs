//! Job secrets and the mutual challenge–response handshake every control-plane (store) and
//! data-plane (TCP) connection runs before anything else flows. The secret itself never crosses
//! the wire: each side proves it knows it with HMAC-SHA256 over both sides' fresh nonces.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::io::{Read, Write};

type HmacSha256 = Hmac<Sha256>;

const MAGIC: &[u8; 8] = b"RAILRNG1";
const NONCE: usize = 16;
const TAG: usize = 32;

/// Fill `buf` with random bytes from the kernel.
pub fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    f.read_exact(buf)
}

/// A fresh 256-bit job secret, hex encoded (what travels in `RAILRING_JOB_SECRET`).
pub fn new_secret() -> std::io::Result<String> {
    let mut b = [0u8; 32];
    random_bytes(&mut b)?;
    Ok(hex(&b))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn tag(secret: &[u8], role: &[u8], purpose: &[u8], a: &[u8], b: &[u8]) -> [u8; TAG] {
    // Key length is never rejected by HMAC; fall back to an empty MAC only in theory.
    let mut m = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return [0u8; TAG],
    };
    m.update(role);
    m.update(&[purpose.len() as u8]);
    m.update(purpose);
    m.update(a);
    m.update(b);
    m.finalize().into_bytes().into()
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("peer did not speak the railring protocol (bad magic)")]
    BadMagic,
    #[error("peer failed to prove the job secret (wrong or missing RAILRING_JOB_SECRET, or a connection from another job)")]
    BadProof,
    #[error("peer closed the connection on our proof of the job secret: our RAILRING_JOB_SECRET is most likely not its (every rank of a job needs the same one), or it belongs to another job")]
    Refused,
    #[error("peer is for purpose '{got}', expected '{want}'")]
    WrongPurpose { got: String, want: String },
    #[error("i/o during handshake: {0}")]
    Io(#[from] std::io::Error),
}

/// Client side: connect-er proves first, then checks the server's proof. `purpose` binds the
/// handshake to a use (e.g. "store" or "data:3->5") so a proof cannot be replayed elsewhere.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    purpose: &str,
) -> Result<(), AuthError> {
    let mut hello = [0u8; 8 + NONCE];
    s.read_exact(&mut hello)?;
    if &hello[..8] != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let ns = &hello[8..];
    let mut nc = [0u8; NONCE];
    random_bytes(&mut nc)?;
    let p = purpose.as_bytes();
    if p.len() > 255 {
        return Err(AuthError::WrongPurpose {
            got: purpose.into(),
            want: "<=255 bytes".into(),
        });
    }
    let t = tag(secret, b"client", p, ns, &nc);
    let mut msg = Vec::with_capacity(NONCE + TAG + 1 + p.len());
    msg.extend_from_slice(&nc);
    msg.extend_from_slice(&t);
    msg.push(p.len() as u8);
    msg.extend_from_slice(p);
    s.write_all(&msg)?;
    s.flush()?;
    let mut st = [0u8; TAG];
    // A server that does not accept our proof hangs up instead of answering (it never says why
    // to a stranger): say what that most likely means rather than "failed to fill whole buffer".
    s.read_exact(&mut st).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted => AuthError::Refused,
        _ => AuthError::Io(e),
    })?;
    if !ct_eq(&st, &tag(secret, b"server", p, ns, &nc)) {
        return Err(AuthError::BadProof);
    }
    Ok(())
}

/// Server side. Returns the purpose string the client proved (checked against `want` when given).
pub fn server_handshake<S: Read + Write>(
    s: &mut S,
    secret: &[u8],
    want: Option<&str>,
) -> Result<String, AuthError> {
    let mut ns = [0u8; NONCE];
    random_bytes(&mut ns)?;
    let mut hello = Vec::with_capacity(8 + NONCE);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&ns);
    s.write_all(&hello)?;
    s.flush()?;
    let mut head = [0u8; NONCE + TAG + 1];
    s.read_exact(&mut head)?;
    let nc = &head[..NONCE];
    let t = &head[NONCE..NONCE + TAG];
    let plen = head[NONCE + TAG] as usize;
    let mut p = vec![0u8; plen];
    s.read_exact(&mut p)?;
    if !ct_eq(t, &tag(secret, b"client", &p, &ns, nc)) {
        return Err(AuthError::BadProof);
    }
    let purpose = String::from_utf8_lossy(&p).into_owned();
    if let Some(w) = want {
        if w != purpose {
            return Err(AuthError::WrongPurpose {
                got: purpose,
                want: w.into(),
            });
        }
    }
    s.write_all(&tag(secret, b"server", &p, &ns, nc))?;
    s.flush()?;
    Ok(purpose)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(
        cs: &'static str,
        ss: &'static str,
    ) -> (Result<(), AuthError>, Result<String, AuthError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server_handshake(&mut s, ss.as_bytes(), Some("store"))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let r = client_handshake(&mut c, cs.as_bytes(), "store");
        drop(c);
        (r, t.join().unwrap())
    }

    #[test]
    fn same_secret_passes_wrong_secret_fails() {
        let (c, s) = pair("abc", "abc");
        assert!(c.is_ok());
        assert_eq!(s.unwrap(), "store");
        let (c, s) = pair("abc", "abd");
        assert!(matches!(s, Err(AuthError::BadProof)));
        // The client with the other secret is told what the hang-up most likely means.
        let c = c.unwrap_err();
        assert!(matches!(c, AuthError::Refused), "{c:?}");
        assert!(c.to_string().contains("RAILRING_JOB_SECRET"), "{c}");
    }

    #[test]
    fn secrets_are_random_hex() {
        let a = new_secret().unwrap();
        let b = new_secret().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
