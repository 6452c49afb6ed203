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
}

impl ShmLink {
    pub fn new(node: Arc<Node>, peer_local: usize) -> ShmLink {
        ShmLink {
            node,
            peer: peer_local,
            sent: 0,
        }
    }
}

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
        let free = (cap - (h - t)) as usize;
        let n = free.min(data.len());
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
        self.node.ring_bell();
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
    fn park(&self, send: bool, recv: bool, timeout: Duration) -> bool {
        let cap = self.node.geo.ring_bytes as u64;
        let ready = || {
            let (h, t, _) = self.node.ring(self.node.me, self.peer);
            let can_send = send && h.load(Ordering::SeqCst) - t.load(Ordering::SeqCst) < cap;
            let (h2, t2, _) = self.node.ring(self.peer, self.node.me);
            let can_recv = recv && h2.load(Ordering::SeqCst) != t2.load(Ordering::SeqCst);
            can_send || can_recv || self.node.aborted().is_some()
        };
        self.node.park(ready, timeout);
        true
    }
}
