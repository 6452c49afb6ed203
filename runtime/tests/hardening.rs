//! Strangers at the bootstrap store and at a rank's data port: garbage, a huge length prefix, a
//! replayed handshake, nothing at all (slow loris), 1 000 connections. None may crash the
//! listener, hold more than the gate's threads, stall or slow a real peer, or inject data.
//! Everything runs on 127.0.0.1.

use railring::store::{self, auth, gate, Store, StoreClient};
use railring::transport::tcp::{Rail, TcpNet};
use railring::transport::{Link, LinkId};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn store_server() -> (store::ServerHandle, std::sync::Arc<Store>) {
    let st = Store::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    (store::serve(l, "s3cret", st.clone()).unwrap(), st)
}

/// A real client still gets in and gets its answers quickly.
fn store_works(addr: SocketAddr, key: &str) -> Duration {
    let t = Instant::now();
    let c = StoreClient::connect(&addr.to_string(), "s3cret", Duration::from_secs(5))
        .expect("a real client gets in");
    c.set(key, b"v").unwrap();
    assert_eq!(c.get(key, Duration::from_secs(5)).unwrap(), b"v");
    t.elapsed()
}

/// Send `bytes` on a fresh connection and read what comes back until the server closes it (or
/// 3 s pass).
fn poke(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn store_survives_garbage_huge_lengths_and_replays() {
    let (h, st) = store_server();
    // garbage, a "frame" with a 4 GiB length before any handshake, an empty connection
    for junk in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0xff, 0xff, 0xff, 0xff, 1, 2, 3][..],
        &[0u8; 200][..],
        &[][..],
    ] {
        let back = poke(h.addr, junk);
        // the server's challenge, nothing else: no data, no answers
        assert!(back.len() <= 8 + 16, "{back:?}");
    }
    // A replayed handshake: record a real client's bytes, play them again.
    let mut rec = TcpStream::connect(h.addr).unwrap();
    let mut hello = [0u8; 24];
    rec.read_exact(&mut hello).unwrap();
    let mut proxy_a = Vec::new();
    {
        // a real client talking through us, so we see its proof
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let la = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut c = TcpStream::connect(la).unwrap();
            auth::client_handshake(&mut c, b"s3cret", "store").is_ok()
        });
        let (mut p, _) = l.accept().unwrap();
        p.write_all(&hello).unwrap();
        let mut proof = vec![0u8; 16 + 32 + 1 + 5];
        p.read_exact(&mut proof).unwrap();
        proxy_a.extend_from_slice(&proof);
        rec.write_all(&proof).unwrap();
        let mut st_tag = [0u8; 32];
        rec.read_exact(&mut st_tag).unwrap();
        p.write_all(&st_tag).unwrap();
        assert!(t.join().unwrap(), "the recorded handshake itself is valid");
    }
    // replay the recorded proof on a new connection (new server nonce): refused
    let mut r = TcpStream::connect(h.addr).unwrap();
    let mut hello2 = [0u8; 24];
    r.read_exact(&mut hello2).unwrap();
    r.write_all(&proxy_a).unwrap();
    let mut frame = Vec::new();
    frame.extend((9u32 + 4).to_le_bytes());
    frame.extend(b"injected-data");
    let _ = r.write_all(&frame);
    r.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut back = Vec::new();
    let _ = r.read_to_end(&mut back);
    assert!(back.is_empty(), "a replayed proof got an answer: {back:?}");
    assert!(store_works(h.addr, "k") < Duration::from_secs(2));
    // nothing but the real client's key is in the store
    let c = StoreClient::connect(&h.addr.to_string(), "s3cret", Duration::from_secs(2)).unwrap();
    assert_eq!(
        c.check(&["k".into(), "injected-data".into()]).unwrap(),
        vec![true, false]
    );
    drop(st);
}

#[test]
fn store_and_data_port_survive_a_thousand_slow_loris_connections() {
    let (h, _st) = store_server();
    let lo = vec![Rail::new("lo", Ipv4Addr::LOCALHOST, 8)];
    let a = TcpNet::start(lo.clone(), "k").unwrap();
    let b = TcpNet::start(lo, "k").unwrap();
    let data_port = SocketAddr::new(b.addrs[0].rail.ip.into(), b.addrs[0].port);
    let before = threads();
    // 1 000 connections to each, each sending one byte now and then
    let mut conns = Vec::new();
    for i in 0..1000 {
        for addr in [h.addr, data_port] {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(&[i as u8]);
                conns.push(s);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let during = threads();
    // the store answers a real client quickly
    let took = store_works(h.addr, "real");
    assert!(
        took < Duration::from_secs(3),
        "store slowed to {took:?} by a flood"
    );
    // and a real data link still connects and moves bytes
    let t = Instant::now();
    let mut l1 = a
        .connect(
            LinkId {
                comm: 1,
                me: 0,
                peer: 1,
                chan: 0,
            },
            &[0],
            &b.addrs,
            Duration::from_secs(5),
            1,
        )
        .expect("a real peer connects during the flood");
    let mut l2 = b
        .accept(1, 0, 0, Duration::from_secs(5))
        .unwrap()
        .expect("and is accepted");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "data link took {:?}",
        t.elapsed()
    );
    let msg = [42u8; 1000];
    let mut sent = 0;
    let mut got = vec![0u8; 1000];
    let mut n = 0;
    while n < got.len() && t.elapsed() < Duration::from_secs(10) {
        if sent < msg.len() {
            sent += l1.try_send(&msg[sent..]).unwrap();
        }
        n += l2.try_recv(&mut got[n..]).unwrap();
    }
    assert_eq!(got, msg.to_vec());
    // the listeners held at most their gates' handshakes (two gates here: store, data port)
    assert!(
        during <= before + 2 * gate::MAX_PENDING + 16,
        "{before} threads before the flood, {during} during"
    );
    // keep trickling: none of the flood is ever accepted as a link
    for s in conns.iter_mut().take(50) {
        let _ = s.write_all(&[0u8; 64]);
    }
    assert!(b
        .accept(1, 0, 1, Duration::from_millis(300))
        .unwrap()
        .is_none());
    drop(conns);
}

#[test]
fn a_silent_connection_is_cut_at_the_handshake_deadline() {
    // The gate's deadline holds for the whole handshake, whatever the peer trickles.
    let g = gate::Gate::with_limits("test", 4, Duration::from_millis(400));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let ticket = g.admit(&s).unwrap();
    let feeder = std::thread::spawn(move || {
        for _ in 0..30 {
            if c.write_all(b"z").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let t = Instant::now();
    let mut d = gate::Deadlined {
        s: &mut s,
        deadline: ticket.deadline,
    };
    let r = auth::server_handshake(&mut d, b"k", Some("store"));
    assert!(r.is_err());
    assert!(
        t.elapsed() < Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
    drop(s);
    let _ = feeder.join();
}
