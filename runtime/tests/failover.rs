//! Links that move rails in the middle of transfers (`transport::failover`), through the real
//! executor over real TCP on loopback: two ranks as threads, two "rails" (127.0.0.1 and
//! 127.0.0.2). A test hook gives a link's connection up while the executor waits on it — the
//! same path a lost rail takes — and every transfer, every reduced element and every byte order
//! is checked exactly: nothing lost, nothing taken twice.

use railring::executor::{Bufs, CallDesc, Executor, Links};
use railring::transport::failover::{RailCtx, RailLink};
use railring::transport::tcp::{Rail, TcpNet};
use railring::transport::{Link, LinkId};
use railring_collectives::build::build_plan;
use railring_collectives::plan::{Algo, CollKind, Layout};
use railring_collectives::{DataType, ReduceOp};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

/// One rank's single network link, and when to break it: at the `break_at`-th time the
/// executor services its links while waiting (0: never).
struct OneLink {
    link: Box<RailLink>,
    peer_host: String,
    services: usize,
    break_at: Vec<usize>,
}

impl Links for OneLink {
    fn link(&mut self, _peer: usize, _chan: usize) -> railring::Result<*mut dyn Link> {
        Ok(&mut *self.link as *mut RailLink as *mut dyn Link)
    }
    fn host_of(&self, _peer: usize) -> String {
        self.peer_host.clone()
    }
    fn service(&mut self) -> railring::Result<()> {
        self.services += 1;
        if self.break_at.contains(&self.services) {
            self.link
                .fail_now("test: rail given up")
                .map_err(|e| railring::Error::Plan(format!("fail_now: {e}")))?;
        }
        Ok(())
    }
}

fn rails() -> Vec<Rail> {
    [("lo", "127.0.0.1"), ("lo:1", "127.0.0.2")]
        .iter()
        .map(|(name, ip)| Rail::new(*name, ip.parse::<Ipv4Addr>().unwrap(), 8))
        .collect()
}

static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn ctx(net: &Arc<TcpNet>, peer_net: &Arc<TcpNet>, me: usize, peer: usize, run: usize) -> RailCtx {
    RailCtx {
        net: net.clone(),
        id: LinkId {
            comm: 42,
            me,
            peer,
            chan: 0,
        },
        home: 0,
        spread: vec![0],
        peer_addrs: peer_net.addrs.clone(),
        my_host: format!("h{me}"),
        peer_host: format!("h{peer}"),
        peer_key: format!("test-peer-h{peer}-run{run}"),
        streams: 1,
        rail_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        abort: None,
    }
}

/// The pair of connected rail links (rank 0 connects, rank 1 accepts).
fn pair(streams: usize, spread: Vec<usize>) -> (RailLink, RailLink) {
    let a = TcpNet::start(rails(), "secret").unwrap();
    let b = TcpNet::start(rails(), "secret").unwrap();
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut c0 = ctx(&a, &b, 0, 1, run);
    let mut c1 = ctx(&b, &a, 1, 0, run);
    c0.streams = streams;
    c1.streams = streams;
    c0.spread = spread;
    let l0 = std::thread::spawn(move || RailLink::connect(c0).unwrap());
    let acc = b
        .accept(42, 0, 0, Duration::from_secs(5))
        .unwrap()
        .expect("accepted");
    let l1 = RailLink::accepted(c1, acc);
    (l0.join().unwrap(), l1)
}

fn val(rank: usize, call: usize, i: usize) -> u32 {
    ((i * 7 + rank * 3 + call * 11) % 1000) as u32
}

/// Run `calls` calls of each (send_recv of `sizes[k]` u32, then a ring all-reduce of the same
/// count) on this rank, checking every element; returns the link's description at the end.
fn rank_main(me: usize, link: RailLink, sizes: &[usize], break_at: Vec<usize>) -> String {
    let mut links = OneLink {
        link: Box::new(link),
        peer_host: format!("h{}", 1 - me),
        services: 0,
        break_at,
    };
    let peer = 1 - me;
    let mut staging = Vec::new();
    let layout = Layout {
        nodes: vec![vec![0], vec![1]],
    };
    for (call, &n) in sizes.iter().enumerate() {
        let mut ex = Executor {
            rank: me,
            size: 2,
            links: &mut links,
            fabric: None,
            timeout: Duration::from_secs(60),
            chunk: 64 << 10,
            staging: &mut staging,
            mem: None,
        };
        // point to point, both directions at once
        let send: Vec<u32> = (0..n).map(|i| val(me, call, i)).collect();
        let mut recv = vec![0u32; n];
        let d = |root: usize| CallDesc {
            seq: call as u64 + 1,
            kind: CollKind::SendRecv,
            dtype: DataType::U32,
            op: ReduceOp::Sum,
            count: n as u64,
            root: root as u32,
            comm: 42,
        };
        unsafe {
            ex.p2p(
                Some((send.as_ptr() as *const u8, n * 4, peer, d(me))),
                Some((recv.as_mut_ptr() as *mut u8, n * 4, peer, d(peer))),
            )
            .unwrap_or_else(|e| panic!("rank {me} call {call} p2p: {e}"));
        }
        for (i, &x) in recv.iter().enumerate() {
            assert_eq!(
                x,
                val(peer, call, i),
                "rank {me} call {call}: element {i} of {n}"
            );
        }
        // a ring all-reduce: received chunks are reduced, so a byte taken twice would show
        let plan = build_plan(CollKind::AllReduce, Algo::Ring, &layout, me, n, 0).unwrap();
        let mut buf: Vec<u32> = (0..n).map(|i| val(me, call, i)).collect();
        let desc = CallDesc {
            seq: call as u64 + 1,
            kind: CollKind::AllReduce,
            dtype: DataType::U32,
            op: ReduceOp::Sum,
            count: n as u64,
            root: 0,
            comm: 42,
        };
        unsafe {
            ex.run(
                &plan,
                &desc,
                ReduceOp::Sum,
                Bufs {
                    work: buf.as_mut_ptr() as *mut u8,
                    work_bytes: n * 4,
                    input: std::ptr::null(),
                    input_bytes: 0,
                    src: None,
                    scratch: std::ptr::null_mut(),
                    scratch_bytes: 0,
                },
            )
            .unwrap_or_else(|e| panic!("rank {me} call {call} all-reduce: {e}"));
        }
        for (i, &x) in buf.iter().enumerate() {
            assert_eq!(
                x,
                val(0, call, i) + val(1, call, i),
                "rank {me} call {call}: reduced element {i} of {n}"
            );
        }
    }
    eprintln!("rank {me}: {} services", links.services);
    format!("{} moves {}", links.link.describe(), links.link.moves())
}

fn sizes() -> Vec<usize> {
    // small (retained tails), medium (acknowledged in chunks) and large (many frames)
    let mut v = Vec::new();
    for k in 0..8 {
        v.extend([1, 3000, 40_000, 300_000, 900_000 + k * 13]);
    }
    v
}

fn moves(s: &str) -> u32 {
    s.rsplit(' ').next().unwrap().parse().unwrap()
}

fn run(break0: Vec<usize>, break1: Vec<usize>, streams: usize) -> (String, String) {
    run_spread(break0, break1, streams, vec![0])
}

fn run_spread(
    break0: Vec<usize>,
    break1: Vec<usize>,
    streams: usize,
    spread: Vec<usize>,
) -> (String, String) {
    let (l0, l1) = pair(streams, spread);
    let s = sizes();
    let s2 = s.clone();
    let t0 = std::thread::spawn(move || rank_main(0, l0, &s, break0));
    let t1 = std::thread::spawn(move || rank_main(1, l1, &s2, break1));
    (t0.join().unwrap(), t1.join().unwrap())
}

#[test]
fn no_failure_moves_nothing() {
    let (a, b) = run(vec![], vec![], 1);
    assert!(moves(&a) == 0 && moves(&b) == 0, "{a} / {b}");
}

#[test]
fn the_connecting_side_gives_a_rail_up_mid_transfer() {
    let (a, b) = run(vec![3, 25, 60], vec![], 1);
    // both ends took part in every move (and maybe moved home again afterwards)
    assert!(moves(&a) >= 3 && moves(&a) == moves(&b), "{a} / {b}");
}

#[test]
fn the_accepting_side_gives_a_rail_up_mid_transfer() {
    let (a, b) = run(vec![], vec![5, 50], 1);
    assert!(moves(&a) >= 2 && moves(&a) == moves(&b), "{a} / {b}");
}

#[test]
fn both_sides_give_rails_up_at_once_and_striped_links_move_too() {
    let (a, b) = run(vec![7, 40], vec![7, 41], 3);
    assert!(moves(&a) >= 2 && moves(&a) == moves(&b), "{a} / {b}");
}

#[test]
fn a_link_striped_over_two_rails_moves_whole_and_loses_nothing() {
    // no failure: the connecting side drives both rails, one connection each
    let (a, b) = run_spread(vec![], vec![], 1, vec![0, 1]);
    assert!(moves(&a) == 0 && moves(&b) == 0, "{a} / {b}");
    assert!(a.contains("tcp lo ") && a.contains("tcp lo:1 "), "{a}");
    // rails given up mid-transfer on both sides: every element still right (rank_main checks)
    let (a, b) = run_spread(vec![4, 30], vec![9], 2, vec![0, 1]);
    assert!(moves(&a) >= 2 && moves(&a) == moves(&b), "{a} / {b}");
}
