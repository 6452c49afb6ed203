//! A link's rings and its data path verbs aside: where the rings live (host memory, or device
//! memory for GPUDirect RDMA through [`DeviceRings`], implemented on the CUDA side — this file
//! makes no CUDA calls) and how slots are filled ([`fill_slots`]) and drained
//! ([`drain_slots`]) — plain functions over the flow state, tested against a NIC played by the
//! test.

use super::flow::{self, Flow};
use std::io;

/// Slot size and count of each link's rings (`RAILRING_NET_CHUNK` sized slots are the TCP
/// equivalent; 8 slots keep several chunks in flight).
pub(super) const DEFAULT_SLOTS: u32 = 8;
pub(super) const DEFAULT_SLOT_BYTES: u32 = 512 << 10;

/// Device memory holding a GPUDirect link's two rings (send staging and receive), each
/// [`ring_bytes`] long, and the copies in and out of them. The NIC reads the send ring and
/// writes the receive ring in device memory directly, so device data never passes through host
/// memory; the CUDA implementation is `transport::cuda::gdr::CudaRings`.
pub trait DeviceRings: Send {
    /// CUDA ordinal of the device the rings are on.
    fn ordinal(&self) -> i32;
    /// Device addresses of the send and the receive ring.
    fn rings(&self) -> (u64, u64);
    /// Copy each `(dst, src, len)` (host or device addresses: unified addressing) and wait until
    /// all are done.
    ///
    /// # Safety
    /// Every range valid for its access on its side.
    unsafe fn copy(&mut self, list: &[(u64, u64, usize)]) -> io::Result<()>;
    /// Make the NIC's completed writes into device memory visible to the device's next reads
    /// (`cuFlushGPUDirectRDMAWrites`).
    fn flush_nic_writes(&mut self) -> io::Result<()>;
}

/// Bytes of each ring of a link (device rings are allocated this size).
pub fn ring_bytes() -> usize {
    DEFAULT_SLOTS as usize * DEFAULT_SLOT_BYTES as usize
}

/// Where a link's rings live.
pub(super) enum Rings {
    Host { send: Vec<u8>, recv: Vec<u8> },
    Device(Box<dyn DeviceRings>),
}

impl Rings {
    pub(super) fn addrs(&self) -> (u64, u64) {
        match self {
            Rings::Host { send, recv } => (send.as_ptr() as u64, recv.as_ptr() as u64),
            Rings::Device(d) => d.rings(),
        }
    }
}

/// The sending half of a link's data path, verbs aside: take ring slots for up to `len` bytes
/// of `src` and fill them — host rings with plain copies, device rings with one batch of
/// device copies that has finished when this returns (the NIC reads the slots next). Returns
/// the writes to post and the bytes taken. `Err`: the link is broken.
///
/// # Safety
/// `src` valid for reads of `len` bytes of a kind the rings can copy from; `rings` sized for
/// `flow`'s configuration.
pub(super) unsafe fn fill_slots(
    flow: &mut Flow,
    rings: &mut Rings,
    src: *const u8,
    len: usize,
) -> std::result::Result<(Vec<flow::DataPost>, usize), String> {
    let mut posts = Vec::new();
    let mut list = Vec::new();
    let (send_base, _) = rings.addrs();
    let mut off = 0;
    while off < len && flow.can_send() {
        let n = (len - off).min(flow.config().slot_bytes as usize);
        let p = flow.post_data(n).map_err(|e| e.to_string())?;
        match rings {
            // The slot lies inside the ring (flow checks lengths against the slot size).
            Rings::Host { send, .. } => {
                std::ptr::copy_nonoverlapping(src.add(off), send.as_mut_ptr().add(p.local_off), n)
            }
            Rings::Device(_) => list.push((
                send_base + p.local_off as u64,
                (src as u64).wrapping_add(off as u64),
                n,
            )),
        }
        posts.push(p);
        off += n;
    }
    if let (Rings::Device(d), false) = (rings, list.is_empty()) {
        d.copy(&list)
            .map_err(|e| format!("staging into the send ring: {e}"))?;
    }
    Ok((posts, off))
}

/// The receiving half: hand out up to `len` bytes into `dst`, in sequence. Device rings: flush
/// the NIC's writes, then copy everything in one batch that has finished when this returns.
/// Either way every byte handed out is in `dst` on return, so the caller may report credit
/// (and the sender overwrite the slots) afterwards — never before. `Err`: the link is broken.
///
/// # Safety
/// `dst` valid for writes of `len` bytes of a kind the rings can copy to; `rings` sized for
/// `flow`'s configuration.
pub(super) unsafe fn drain_slots(
    flow: &mut Flow,
    rings: &mut Rings,
    dst: *mut u8,
    len: usize,
) -> std::result::Result<usize, String> {
    let (_, recv_base) = rings.addrs();
    let mut got = 0;
    let mut list = Vec::new();
    while got < len {
        let Some((off, avail)) = flow.readable() else {
            break;
        };
        let n = avail.min(len - got);
        match rings {
            // flow hands out ranges inside the ring
            Rings::Host { recv, .. } => {
                std::ptr::copy_nonoverlapping(recv.as_ptr().add(off), dst.add(got), n)
            }
            Rings::Device(_) => list.push((
                (dst as u64).wrapping_add(got as u64),
                recv_base + off as u64,
                n,
            )),
        }
        flow.consume(n).map_err(|e| e.to_string())?;
        got += n;
    }
    if let (Rings::Device(d), false) = (rings, list.is_empty()) {
        d.flush_nic_writes()
            .and_then(|_| d.copy(&list))
            .map_err(|e| format!("copying out of the receive ring: {e}"))?;
    }
    Ok(got)
}

/// The link's staging halves ([`fill_slots`] / [`drain_slots`]) over both kinds of rings,
/// against a NIC played by the test: the verbs calls are the only part of a link they leave out.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rdma::flow::{FlowConfig, WrKind};
    use std::sync::Arc;
    use std::sync::Mutex;

    /// Device rings stand-in: host memory (owned through raw pointers, as a device buffer would
    /// be), every copy batch and flush logged.
    struct FakeRings {
        send: *mut u8,
        recv: *mut u8,
        len: usize,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    // SAFETY: the buffers are owned by the value.
    unsafe impl Send for FakeRings {}

    impl FakeRings {
        fn new(len: usize, log: Arc<Mutex<Vec<&'static str>>>) -> FakeRings {
            let mk = || Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
            FakeRings {
                send: mk(),
                recv: mk(),
                len,
                log,
            }
        }
    }

    impl Drop for FakeRings {
        fn drop(&mut self) {
            for p in [self.send, self.recv] {
                // SAFETY: from Box::into_raw of a boxed slice of `len` bytes in new().
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, self.len)) });
            }
        }
    }

    impl DeviceRings for FakeRings {
        fn ordinal(&self) -> i32 {
            0
        }
        fn rings(&self) -> (u64, u64) {
            (self.send as u64, self.recv as u64)
        }
        unsafe fn copy(&mut self, list: &[(u64, u64, usize)]) -> io::Result<()> {
            self.log.lock().unwrap().push("copy");
            for &(d, s, n) in list {
                std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, n);
            }
            Ok(())
        }
        fn flush_nic_writes(&mut self) -> io::Result<()> {
            self.log.lock().unwrap().push("flush");
            Ok(())
        }
    }

    struct End {
        flow: Flow,
        rings: Rings,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    fn end(cfg: FlowConfig, device: bool) -> End {
        let len = cfg.slots as usize * cfg.slot_bytes as usize;
        let log = Arc::new(Mutex::new(Vec::new()));
        let rings = if device {
            Rings::Device(Box::new(FakeRings::new(len, log.clone())))
        } else {
            Rings::Host {
                send: vec![0; len],
                recv: vec![0; len],
            }
        };
        let mut flow = Flow::new(cfg);
        let n = flow.recv_to_post();
        flow.on_recv_posted(n);
        End { flow, rings, log }
    }

    /// The NIC executes a write: sender's send slot into the receiver's receive slot, then
    /// the receive completion (with a re-posted receive) and the send completion.
    fn execute(from: &mut End, to: &mut End, p: &flow::DataPost) {
        let (s, _) = from.rings.addrs();
        let (_, r) = to.rings.addrs();
        // SAFETY: both ranges lie inside rings of the flow's shape.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (s + p.local_off as u64) as *const u8,
                (r + p.remote_off as u64) as *mut u8,
                p.len as usize,
            )
        };
        to.flow.on_arrival(p.imm, p.len).unwrap();
        let n = to.flow.recv_to_post();
        to.flow.on_recv_posted(n);
        from.flow.on_send_completion(p.wr_id).unwrap();
    }

    fn stream(device: bool, seed: u64) {
        let cfg = FlowConfig::new(4, 1000, 10).unwrap();
        let (mut a, mut b) = (end(cfg, device), end(cfg, device));
        let mut x = seed | 1;
        let mut rnd = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n.max(1) as u64) as usize
        };
        let data: Vec<u8> = (0..50_000).map(|_| rnd(256) as u8).collect();
        let mut got = vec![0u8; data.len()];
        let (mut sent, mut recvd) = (0, 0);
        let mut pending: Vec<flow::DataPost> = Vec::new();
        let (mut fills, mut drains) = (0, 0);
        let mut steps = 0;
        while recvd < data.len() {
            steps += 1;
            assert!(steps < 100_000, "no progress");
            match rnd(3) {
                0 if sent < data.len() => {
                    let want = 1 + rnd(3000).min(data.len() - sent - 1);
                    // SAFETY: a live range of `data`.
                    let (posts, n) = unsafe {
                        fill_slots(&mut a.flow, &mut a.rings, data[sent..].as_ptr(), want)
                    }
                    .unwrap();
                    assert_eq!(posts.iter().map(|p| p.len as usize).sum::<usize>(), n);
                    fills += usize::from(n > 0);
                    sent += n;
                    pending.extend(posts);
                }
                1 if !pending.is_empty() => {
                    // the NIC runs some writes, in order (one RC queue pair)
                    let k = 1 + rnd(pending.len());
                    for p in pending.drain(..k) {
                        execute(&mut a, &mut b, &p);
                    }
                }
                _ => {
                    let want = 1 + rnd(2500);
                    let want = want.min(got.len() - recvd);
                    // SAFETY: a live range of `got`.
                    let n = unsafe {
                        drain_slots(&mut b.flow, &mut b.rings, got[recvd..].as_mut_ptr(), want)
                    }
                    .unwrap();
                    assert_eq!(
                        got[recvd..recvd + n],
                        data[recvd..recvd + n],
                        "stream corrupted"
                    );
                    drains += usize::from(n > 0);
                    recvd += n;
                    // credit goes back only now; the sender may overwrite the slots at once
                    if let Some(v) = b.flow.credit_due(b.flow.readable().is_none()) {
                        b.flow.on_credit_posted(v);
                        a.flow.on_credit(v).unwrap();
                        b.flow.on_send_completion(WrKind::Credit.encode()).unwrap();
                        // nothing left to read: the sender may now overwrite any slot
                        if b.flow.readable().is_none() {
                            match &mut b.rings {
                                Rings::Host { recv, .. } => recv.fill(0xEE),
                                Rings::Device(d) => {
                                    let (_, r) = d.rings();
                                    // SAFETY: the stand-in's receive ring, 4000 bytes.
                                    unsafe { std::ptr::write_bytes(r as *mut u8, 0xEE, 4000) };
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(got, data);
        if device {
            // one batch of copies per call that moved data; every receive batch after a flush
            let la = a.log.lock().unwrap();
            assert_eq!(la.iter().filter(|e| **e == "copy").count(), fills);
            assert!(!la.contains(&"flush"), "the sender never flushes");
            let lb = b.log.lock().unwrap();
            assert_eq!(lb.len(), 2 * drains, "{lb:?}");
            for pair in lb.chunks(2) {
                assert_eq!(pair, ["flush", "copy"]);
            }
        }
    }

    #[test]
    fn device_rings_carry_a_stream_in_order() {
        for seed in 1..=20 {
            stream(true, seed);
        }
    }

    #[test]
    fn host_rings_carry_a_stream_in_order() {
        for seed in 1..=20 {
            stream(false, seed);
        }
    }

    #[test]
    fn a_failed_device_copy_breaks_the_link() {
        struct Broken;
        impl DeviceRings for Broken {
            fn ordinal(&self) -> i32 {
                0
            }
            fn rings(&self) -> (u64, u64) {
                (4096, 8192)
            }
            unsafe fn copy(&mut self, _: &[(u64, u64, usize)]) -> io::Result<()> {
                Err(io::Error::other("cuMemcpyAsync: an illegal memory access"))
            }
            fn flush_nic_writes(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let cfg = FlowConfig::new(4, 1000, 10).unwrap();
        let mut flow = Flow::new(cfg);
        let mut rings = Rings::Device(Box::new(Broken));
        let src = [1u8; 10];
        // SAFETY: the stand-in never touches memory.
        let e = unsafe { fill_slots(&mut flow, &mut rings, src.as_ptr(), 10) }.unwrap_err();
        assert!(
            e.contains("staging into the send ring") && e.contains("illegal"),
            "{e}"
        );
    }
}
