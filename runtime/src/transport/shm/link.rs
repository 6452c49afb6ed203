//! Point-to-point links between ranks of one node ([`ShmLink`]): a single-producer ring per
//! ordered pair of local ranks in the node segment.

use super::Node;
use crate::transport::{Link, LinkError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A point-to-point link to another rank on the same node, over a single-producer ring in the
/// node segment.
pub struct ShmLink {
    node: Arc<Node>,
    peer: usize,
    sent: u64,
    /// Where in the ring's stream the send in progress began (its first `try_send`), and
    /// whether one is in progress (the last `try_send` did not take all it was given).
    cur_start: u64,
    partial: bool,
}

impl ShmLink {
    pub fn new(node: Arc<Node>, peer_local: usize) -> ShmLink {
        ShmLink {
            node,
            peer: peer_local,
            sent: 0,
            cur_start: 0,
            partial: false,
        }
    }
}

/// A producer that finds its ring full sleeps until at least this part of the ring is free
/// (or the consumer has reached the send in progress): one wake-up per batch of messages
/// instead of one per message consumed.
const WAKE_FREE_DIV: u64 = 4;

impl Link for ShmLink {
    fn early_sends(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        format!(
            "shm local {} -> local {} on {}",
            self.node.me, self.peer, self.node.host
        )
    }
    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        let (head, tail, buf) = self.node.ring(self.node.me, self.peer);
        let cap = self.node.geo.ring_bytes as u64;
        let h = head.load(Ordering::Relaxed);
        let t = tail.load(Ordering::Acquire);
        if !self.partial {
            self.cur_start = h;
        }
        let free = (cap - (h - t)) as usize;
        let n = free.min(data.len());
        self.partial = n < data.len();
        if n == 0 {
            return Ok(0);
        }
        let pos = (h % cap) as usize;
        let first = n.min(cap as usize - pos);
        // SAFETY: the ring region [buf, buf+cap) is inside the mapping; we only write free space.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.add(pos), first);
            std::ptr::copy_nonoverlapping(data.as_ptr().add(first), buf, n - first);
        }
        head.store(h + n as u64, Ordering::SeqCst);
        self.node.ring_bell();
        self.sent += n as u64;
        Ok(n)
    }
    fn try_recv(&mut self, out: &mut [u8]) -> Result<usize, LinkError> {
        let (head, tail, buf) = self.node.ring(self.peer, self.node.me);
        let cap = self.node.geo.ring_bytes as u64;
        let t = tail.load(Ordering::Relaxed);
        let h = head.load(Ordering::Acquire);
        let n = ((h - t) as usize).min(out.len());
        if n == 0 {
            return Ok(0);
        }
        let pos = (t % cap) as usize;
        let first = n.min(cap as usize - pos);
        // SAFETY: reading bytes the producer published (h was loaded with Acquire).
        unsafe {
            std::ptr::copy_nonoverlapping(buf.add(pos), out.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(buf, out.as_mut_ptr().add(first), n - first);
        }
        tail.store(t + n as u64, Ordering::SeqCst);
        // the producer, if it sleeps, sleeps until the tail reaches `want` (see park)
        if t + n as u64
            >= self
                .node
                .ring_want(self.peer, self.node.me)
                .load(Ordering::SeqCst)
        {
            self.node.ring_bell();
        }
        Ok(n)
    }
    fn check_peer(&self) -> Result<(), LinkError> {
        if let Some(r) = self
            .node
            .aborted()
            .filter(|&r| r != self.node.ranks[self.node.me])
        {
            return Err(LinkError::PeerGone(format!(
                "rank {r} on {} abandoned the collective after an error",
                self.node.host
            )));
        }
        if self.node.alive(self.peer) {
            Ok(())
        } else {
            Err(LinkError::PeerGone(format!(
                "local rank {} on {} exited",
                self.peer, self.node.host
            )))
        }
    }
    fn bytes_sent(&self) -> u64 {
        self.sent
    }
    /// Sleep on the node's bell until this link can move. A producer waiting for room sleeps
    /// until a quarter of the ring is free, or until the consumer has taken every byte sent
    /// before the send in progress (then it is receiving that send and needs the rest): a
    /// producer far ahead of its consumer (a stream of small one-way calls) wakes once per
    /// batch instead of once per message taken, each wake-up a system call on the consumer's
    /// path and a context switch on a CPU other ranks need. The consumer rings the bell only
    /// when its tail reaches the `want` stored here. Plans are deadlock-free without any
    /// buffering (the checker's rendezvous model), so a consumer that needs the send in
    /// progress first takes everything before it: no wait here outlasts that.
    fn park(&self, send: bool, recv: bool, timeout: Duration) -> bool {
        let cap = self.node.geo.ring_bytes as u64;
        let want = self.node.ring_want(self.node.me, self.peer);
        if send {
            let h = self
                .node
                .ring(self.node.me, self.peer)
                .0
                .load(Ordering::Relaxed);
            let batch = (h + cap / WAKE_FREE_DIV).saturating_sub(cap);
            want.store(batch.min(self.cur_start), Ordering::SeqCst);
        }
        let ready = || {
            let (h, t, _) = self.node.ring(self.node.me, self.peer);
            let (h, t) = (h.load(Ordering::SeqCst), t.load(Ordering::SeqCst));
            let can_send = send && h - t < cap && t >= want.load(Ordering::Relaxed);
            let (h2, t2, _) = self.node.ring(self.peer, self.node.me);
            let can_recv = recv && h2.load(Ordering::SeqCst) != t2.load(Ordering::SeqCst);
            can_send || can_recv || self.node.aborted().is_some()
        };
        // (the rings' counters are stored sequentially consistent: no fence needed)
        self.node.park(ready, timeout, false);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::Geometry;
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    /// Both ends of one node's rings in this process (local ranks 0 and 1).
    fn pair(tag: &str) -> (ShmLink, ShmLink, std::path::PathBuf) {
        let path =
            std::env::temp_dir().join(format!("railring-link-test-{tag}-{}", std::process::id()));
        let geo = Geometry {
            local_size: 2,
            slot_bytes: 4096,
            ring_bytes: 4096,
        };
        let a = Node::open(&path, geo, vec![0, 1], 0, "h".into(), true).unwrap();
        let b = Node::open(&path, geo, vec![0, 1], 1, "h".into(), false).unwrap();
        (ShmLink::new(a, 1), ShmLink::new(b, 0), path)
    }

    /// Park the producer on a thread; returns (done flag, join handle giving the time it slept).
    fn park_in_thread(
        p: ShmLink,
    ) -> (
        Arc<AtomicBool>,
        std::thread::JoinHandle<(ShmLink, Duration)>,
    ) {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            p.park(true, false, Duration::from_secs(5));
            d.store(true, Ordering::SeqCst);
            (p, t0.elapsed())
        });
        (done, t)
    }

    #[test]
    fn a_producer_far_ahead_sleeps_until_a_quarter_of_its_ring_is_free() {
        let (mut p, mut c, path) = pair("batch");
        // two whole messages fill the ring; the third cannot start
        assert_eq!(p.try_send(&[1u8; 2048]).unwrap(), 2048);
        assert_eq!(p.try_send(&[2u8; 2048]).unwrap(), 2048);
        assert_eq!(p.try_send(&[3u8; 100]).unwrap(), 0);
        let (done, t) = park_in_thread(p);
        std::thread::sleep(Duration::from_millis(100));
        // 512 bytes free: less than a quarter, and the consumer is not at the third message
        let mut buf = [0u8; 512];
        assert_eq!(c.try_recv(&mut buf).unwrap(), 512);
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !done.load(Ordering::SeqCst),
            "woken before a quarter was free"
        );
        // 1024 bytes free: the producer wakes, well before its 5 s timeout
        assert_eq!(c.try_recv(&mut buf).unwrap(), 512);
        let (mut p, slept) = t.join().unwrap();
        assert!(slept < Duration::from_secs(2), "slept {slept:?}");
        assert_eq!(p.try_send(&[3u8; 100]).unwrap(), 100);
        // the stream arrives whole and in order
        let mut rest = vec![0u8; 3072 + 100];
        let mut got = 0;
        while got < rest.len() {
            got += c.try_recv(&mut rest[got..]).unwrap();
        }
        assert!(buf.iter().all(|&x| x == 1));
        assert!(rest[..1024].iter().all(|&x| x == 1));
        assert!(rest[1024..3072].iter().all(|&x| x == 2));
        assert!(rest[3072..].iter().all(|&x| x == 3));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_consumer_inside_the_send_in_progress_wakes_its_producer_at_once() {
        let (mut p, mut c, path) = pair("inside");
        // one send larger than the ring: its first 4096 bytes go in, the rest waits
        let msg: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        assert_eq!(p.try_send(&msg).unwrap(), 4096);
        assert_eq!(p.try_send(&msg[4096..]).unwrap(), 0);
        let (_done, t) = park_in_thread(p);
        std::thread::sleep(Duration::from_millis(100));
        // the consumer takes 64 bytes of that very send: the producer must go on now
        let mut buf = vec![0u8; 5000];
        assert_eq!(c.try_recv(&mut buf[..64]).unwrap(), 64);
        let (mut p, slept) = t.join().unwrap();
        assert!(slept < Duration::from_secs(2), "slept {slept:?}");
        let mut sent = 4096;
        let mut got = 64;
        while got < msg.len() {
            if sent < msg.len() {
                sent += p.try_send(&msg[sent..]).unwrap();
            }
            got += c.try_recv(&mut buf[got..]).unwrap();
        }
        assert_eq!(buf, msg);
        let _ = std::fs::remove_file(path);
    }
}
