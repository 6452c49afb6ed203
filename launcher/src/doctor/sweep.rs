//! One pairwise test between two nodes on one rail, and who tests whom.
//!
//! Each node leader listens on the address of every rail interface it has. A test connects
//! from the sender's address on the rail to the receiver's (so the bytes cross that rail),
//! proves the job secret (the store's HMAC handshake, purpose `doctor`), measures 20 one-byte
//! round trips (latency: half the median), then streams for the test duration with a small
//! send buffer; the receiver times the bytes from the first to the last and answers with the
//! count and the nanoseconds. The schedule is a shifted ring: in round k every node i sends to
//! node (i + s_k) mod n at once, so each round loads every node with one outgoing and one
//! incoming stream, and n − 1 shifts cover every ordered pair; above `max_rounds` the shifts
//! are spread over 1..n−1 (near and far peers).

use railring::store::auth;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const PURPOSE: &str = "doctor";
const PINGS: usize = 21;

/// The shifts of the sweep for `n` nodes, at most `max_rounds` of them.
pub fn shifts(n: usize, max_rounds: usize) -> Vec<usize> {
    if n < 2 || max_rounds == 0 {
        return Vec::new();
    }
    let all = n - 1;
    if all <= max_rounds {
        return (1..n).collect();
    }
    let mut v: Vec<usize> = (0..max_rounds).map(|i| 1 + i * all / max_rounds).collect();
    v.dedup();
    v
}

/// Listen on `ip` (port chosen by the kernel) and serve tests in the background; returns the
/// address.
pub fn listen(ip: Ipv4Addr, secret: Vec<u8>) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(SocketAddr::new(ip.into(), 0))?;
    let addr = l.local_addr()?;
    std::thread::Builder::new()
        .name("doctor-listen".into())
        .spawn(move || {
            for s in l.incoming().flatten() {
                let secret = secret.clone();
                let _ = std::thread::Builder::new()
                    .name("doctor-serve".into())
                    .spawn(move || {
                        let _ = serve(s, &secret);
                    });
            }
        })?;
    Ok(addr)
}

fn serve(mut s: TcpStream, secret: &[u8]) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    auth::server_handshake(&mut s, secret, Some(PURPOSE))
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
    let mut b = [0u8; 1];
    loop {
        s.read_exact(&mut b)?;
        match b[0] {
            b'P' => s.write_all(b"P")?,
            b'B' => break,
            x => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown request {x}"),
                ))
            }
        }
    }
    let mut buf = vec![0u8; 1 << 16];
    let (mut bytes, mut first, mut last) = (0u64, None, Instant::now());
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        bytes += n as u64;
    }
    let ns = first
        .map(|f| last.duration_since(f).as_nanos() as u64)
        .unwrap_or(0);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&bytes.to_le_bytes());
    out[8..].copy_from_slice(&ns.to_le_bytes());
    s.write_all(&out)
}

/// Test from `from` (an address of this node on the rail) to `to` for `duration`: (bits per
/// second received, latency in µs) or why not.
pub fn test(
    from: Ipv4Addr,
    to: SocketAddr,
    secret: &[u8],
    duration: Duration,
) -> Result<(f64, f64), String> {
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| format!("socket: {e}"))?;
    sock.bind(&SockAddr::from(SocketAddr::new(from.into(), 0)))
        .map_err(|e| format!("bind {from}: {e}"))?;
    // a small send buffer: the receiver's count ends soon after the sender stops
    let _ = sock.set_send_buffer_size(256 << 10);
    sock.connect_timeout(&SockAddr::from(to), Duration::from_secs(2))
        .map_err(|e| format!("connect {from} -> {to}: {e}"))?;
    let mut s = TcpStream::from(sock);
    let io = |what: &str, e: io::Error| format!("{what} {from} -> {to}: {e}");
    s.set_nodelay(true).map_err(|e| io("setup", e))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| io("setup", e))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| io("setup", e))?;
    auth::client_handshake(&mut s, secret, PURPOSE)
        .map_err(|e| format!("handshake {from} -> {to}: {e}"))?;
    let mut rtts = Vec::with_capacity(PINGS);
    let mut b = [0u8; 1];
    for _ in 0..PINGS {
        let t = Instant::now();
        s.write_all(b"P").map_err(|e| io("ping", e))?;
        s.read_exact(&mut b).map_err(|e| io("ping", e))?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    rtts.sort_by(|a, b| a.total_cmp(b));
    let lat = rtts[rtts.len() / 2] / 2.0;
    s.write_all(b"B").map_err(|e| io("bulk", e))?;
    let chunk = vec![0x5au8; 1 << 16];
    let t = Instant::now();
    while t.elapsed() < duration {
        s.write_all(&chunk).map_err(|e| io("bulk", e))?;
    }
    s.shutdown(Shutdown::Write).map_err(|e| io("bulk", e))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| io("bulk", e))?;
    let mut out = [0u8; 16];
    s.read_exact(&mut out).map_err(|e| io("result", e))?;
    let bytes = u64::from_le_bytes(out[..8].try_into().unwrap_or_default());
    let ns = u64::from_le_bytes(out[8..].try_into().unwrap_or_default());
    if ns == 0 || bytes == 0 {
        return Err(format!("{from} -> {to}: nothing received"));
    }
    Ok((bytes as f64 * 8.0 / (ns as f64 / 1e9), lat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_cover_every_peer_or_spread_over_them() {
        assert_eq!(shifts(4, 16), vec![1, 2, 3]);
        assert_eq!(shifts(1, 16), Vec::<usize>::new());
        let s = shifts(64, 16);
        assert_eq!(s.len(), 16);
        assert_eq!((s[0], *s.last().unwrap()), (1, 60));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_test_over_loopback_measures_and_a_wrong_secret_is_refused() {
        let addr = listen(Ipv4Addr::LOCALHOST, b"s3cret".to_vec()).unwrap();
        let (bps, lat) = test(
            Ipv4Addr::LOCALHOST,
            addr,
            b"s3cret",
            Duration::from_millis(50),
        )
        .unwrap();
        assert!(bps > 1e6 && lat > 0.0, "{bps} {lat}");
        assert!(test(
            Ipv4Addr::LOCALHOST,
            addr,
            b"other",
            Duration::from_millis(10)
        )
        .is_err());
        // nobody listening: named with both ends
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let e = test(
            Ipv4Addr::LOCALHOST,
            dead,
            b"s3cret",
            Duration::from_millis(10),
        )
        .unwrap_err();
        assert!(e.contains("connect 127.0.0.1 -> 127.0.0.1"), "{e}");
    }
}
