//! An RDMA link ([`RdmaLink`]): one RC queue pair to a peer with its rings, connecting
//! without blocking through the bootstrap store, turning the [`flow`](super::flow) state
//! machine's decisions into verbs calls, and serving the [`Link`] trait (host memory, and
//! device memory on GPUDirect links).

use super::conn::{conn_keys, ConnInfo};
use super::flow::{Flow, FlowConfig, WrKind};
use super::mr_cache::MrCache;
use super::rings::{
    drain_slots, fill_slots, DeviceRings, Rings, DEFAULT_SLOTS, DEFAULT_SLOT_BYTES,
};
use super::verbs::{ffi, last_err, IbDev, Mr};
use crate::store::StoreClient;
use crate::transport::{Link, LinkError, MemKind, Registration};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which link this is, as the bootstrap store knows it (the keys of both sides' connection
/// records, [`conn_keys`]).
pub(super) use crate::transport::LinkId as LinkEnds;

/// One signaled RDMA write: `len` bytes from `local` (registered under `lkey`) to `remote` in
/// the peer's memory (`rkey`), with an immediate value when `imm` is set.
struct RdmaWrite {
    local: u64,
    len: u32,
    lkey: u32,
    remote: u64,
    rkey: u32,
    imm: Option<u32>,
    wr_id: u64,
}

enum Conn {
    /// Our record is published; waiting for the peer's.
    WaitPeer,
    /// RTR/RTS done; waiting for the peer to say it is RTR too.
    WaitReady(ConnInfo),
    Up(ConnInfo),
}

/// An RC queue pair to one peer with its rings (see the module docs).
pub struct RdmaLink {
    dev: Arc<IbDev>,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    rings: Rings,
    /// [0]: mailbox the peer writes its consumed count into; [1]: source of our reports.
    mbox: Box<[u64; 2]>,
    send_mr: Mr,
    recv_mr: Mr,
    mbox_mr: Mr,
    flow: Flow,
    conn: Conn,
    psn: u32,
    store: Arc<StoreClient>,
    peer_keys: (String, String),
    my_rtr_key: String,
    last_check: Instant,
    cache: MrCache<Mr>,
    sent: u64,
    desc: String,
    broken: Option<String>,
}

// SAFETY: the verbs objects are owned by the link and used from one thread at a time (&mut).
unsafe impl Send for RdmaLink {}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        // SAFETY: objects created in create(); destroyed once, QP before CQ, MRs after the QP.
        unsafe {
            ffi::ibv_destroy_qp(self.qp);
            ffi::ibv_destroy_cq(self.cq);
        }
        self.send_mr.dereg();
        self.recv_mr.dereg();
        self.mbox_mr.dereg();
        self.cache.clear(Mr::dereg);
    }
}

impl RdmaLink {
    /// Create the queue pair and the rings, register them and publish this side's
    /// [`ConnInfo`]; the connection completes later, without blocking ([`Self::progress`]).
    pub(super) fn create(
        dev: Arc<IbDev>,
        store: Arc<StoreClient>,
        ends: LinkEnds,
        device_rings: Option<Box<dyn DeviceRings>>,
    ) -> io::Result<RdmaLink> {
        let LinkEnds {
            comm,
            me,
            peer,
            chan,
        } = ends;
        let cfg = FlowConfig::new(DEFAULT_SLOTS, DEFAULT_SLOT_BYTES, 2 * DEFAULT_SLOTS + 4)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let ring = cfg.slots as usize * cfg.slot_bytes as usize;
        let rings = match device_rings {
            Some(d) => Rings::Device(d),
            None => Rings::Host {
                send: vec![0u8; ring],
                recv: vec![0u8; ring],
            },
        };
        let (send_addr, recv_addr) = rings.addrs();
        let mut mbox = Box::new([0u64; 2]);
        // SAFETY: verbs calls on a live context/PD; every pointer is checked; the buffers are
        // owned by the link and outlive their registrations (deregistered in Drop).
        unsafe {
            let cq = ffi::ibv_create_cq(
                dev.ctx,
                (cfg.sq_depth + cfg.slots) as i32 * 2,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            if cq.is_null() {
                return Err(last_err("ibv_create_cq"));
            }
            let mut init = ffi::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: cfg.sq_depth,
                    max_recv_wr: cfg.slots,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 1,
            };
            let qp = ffi::ibv_create_qp(dev.pd, &mut init);
            if qp.is_null() {
                let e = last_err("ibv_create_qp");
                ffi::ibv_destroy_cq(cq);
                return Err(e);
            }
            let cleanup = |e: io::Error| {
                ffi::ibv_destroy_qp(qp);
                ffi::ibv_destroy_cq(cq);
                e
            };
            let send_mr = dev.reg(send_addr as usize, ring).map_err(cleanup)?;
            let recv_mr = match dev.reg(recv_addr as usize, ring) {
                Ok(m) => m,
                Err(e) => {
                    send_mr.dereg();
                    return Err(cleanup(e));
                }
            };
            let mbox_mr = match dev.reg(mbox.as_mut_ptr() as usize, 16) {
                Ok(m) => m,
                Err(e) => {
                    send_mr.dereg();
                    recv_mr.dereg();
                    return Err(cleanup(e));
                }
            };
            let psn = (std::process::id() ^ (me as u32).wrapping_mul(2654435761) ^ chan as u32)
                & 0xff_ffff;
            let mut link = RdmaLink {
                desc: format!(
                    "rdma {}:{} -> rank {peer} (channel {chan}{})",
                    dev.name,
                    dev.port,
                    if matches!(rings, Rings::Device(_)) {
                        ", GPUDirect"
                    } else {
                        ""
                    }
                ),
                dev,
                cq,
                qp,
                rings,
                mbox,
                send_mr,
                recv_mr,
                mbox_mr,
                flow: Flow::new(cfg),
                conn: Conn::WaitPeer,
                psn,
                peer_keys: conn_keys(comm, chan, peer, me),
                my_rtr_key: conn_keys(comm, chan, me, peer).1,
                store,
                last_check: Instant::now() - Duration::from_secs(1),
                cache: MrCache::new(64),
                sent: 0,
                broken: None,
            };
            link.to_init()?;
            link.post_recvs()?;
            let info = ConnInfo {
                qpn: (*qp).qp_num,
                lid: link.dev.lid,
                gid: ConnInfo::gid_hex(&link.dev.gid),
                psn,
                mtu: link.dev.mtu,
                ring_addr: recv_addr,
                ring_rkey: link.recv_mr.rkey(),
                mailbox_addr: link.mbox.as_ptr() as u64,
                mailbox_rkey: link.mbox_mr.rkey(),
                slots: cfg.slots,
                slot_bytes: cfg.slot_bytes,
            };
            let (my_key, _) = conn_keys(comm, chan, me, peer);
            link.store
                .set(&my_key, &info.encode())
                .map_err(|e| io::Error::other(e.to_string()))?;
            Ok(link)
        }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        what: &str,
    ) -> io::Result<()> {
        // SAFETY: qp is live; attr is a valid struct for the fields named in mask.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(io::Error::new(
                io::Error::from_raw_os_error(rc).kind(),
                format!(
                    "ibv_modify_qp to {what}: {}",
                    io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    fn to_init(&self) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.dev.port,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )
    }

    fn to_rtr_rts(&self, r: &ConnInfo) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let gid = r.gid_bytes().unwrap_or([0; 16]);
        let global = self.dev.roce || gid != [0u8; 16] && self.dev.gid != [0u8; 16] && r.lid == 0;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.dev.mtu.min(r.mtu),
            dest_qp_num: r.qpn,
            rq_psn: r.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.dlid = r.lid;
        a.ah_attr.port_num = self.dev.port;
        if global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ffi::ibv_gid { raw: gid };
            a.ah_attr.grh.sgid_index = self.dev.gid_index;
            a.ah_attr.grh.hop_limit = 255;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    fn post_recvs(&mut self) -> io::Result<()> {
        let n = self.flow.recv_to_post();
        for _ in 0..n {
            let mut wr = ffi::ibv_recv_wr {
                wr_id: WrKind::Recv.encode(),
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a zero-length receive WR (writes with immediate carry no receive data);
            // qp and its context are live.
            let rc = unsafe {
                let ctx = (*self.qp).context;
                match (*ctx).ops.post_recv {
                    Some(f) => f(self.qp, &mut wr, &mut bad),
                    None => libc::ENOSYS,
                }
            };
            if rc != 0 {
                return Err(io::Error::new(
                    io::Error::from_raw_os_error(rc).kind(),
                    format!("ibv_post_recv: {}", io::Error::from_raw_os_error(rc)),
                ));
            }
            self.flow.on_recv_posted(1);
        }
        Ok(())
    }

    /// Post an RDMA write (with immediate when `imm` is set), signaled.
    fn post_write(&self, w: &RdmaWrite) -> io::Result<()> {
        let &RdmaWrite {
            local,
            len,
            lkey,
            remote,
            rkey,
            imm,
            wr_id,
        } = w;
        let mut sge = ffi::ibv_sge {
            addr: local,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: if imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote,
            rkey,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the sge points into a registered region owned by the link; qp is live.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_send {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(io::Error::new(
                io::Error::from_raw_os_error(rc).kind(),
                format!("ibv_post_send: {}", io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn fail(&mut self, why: String) -> LinkError {
        self.broken = Some(why.clone());
        LinkError::Io(io::Error::other(format!("{}: {why}", self.desc)))
    }

    /// Advance the connection (store look-ups at most every millisecond), drain completions and
    /// pick up credit.
    fn progress(&mut self) -> Result<bool, LinkError> {
        if let Some(b) = &self.broken {
            return Err(LinkError::Io(io::Error::other(b.clone())));
        }
        match &self.conn {
            Conn::Up(_) => {}
            _ if self.last_check.elapsed() < Duration::from_millis(1) => return Ok(false),
            Conn::WaitPeer => {
                self.last_check = Instant::now();
                let key = self.peer_keys.0.clone();
                let present = self
                    .store
                    .check(std::slice::from_ref(&key))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                if present.first() != Some(&true) {
                    return Ok(false);
                }
                let raw = self
                    .store
                    .get(&key, Duration::from_secs(5))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                let info = ConnInfo::decode(&raw).map_err(LinkError::Io)?;
                if info.slots != self.flow.config().slots
                    || info.slot_bytes != self.flow.config().slot_bytes
                {
                    return Err(self.fail(format!(
                        "peer rings are {} x {} bytes, ours {} x {}",
                        info.slots,
                        info.slot_bytes,
                        self.flow.config().slots,
                        self.flow.config().slot_bytes
                    )));
                }
                if let Err(e) = self.to_rtr_rts(&info) {
                    return Err(self.fail(e.to_string()));
                }
                self.store
                    .set(&self.my_rtr_key, b"1")
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                self.conn = Conn::WaitReady(info);
                return Ok(false);
            }
            Conn::WaitReady(info) => {
                self.last_check = Instant::now();
                let info = info.clone();
                let present = self
                    .store
                    .check(std::slice::from_ref(&self.peer_keys.1))
                    .map_err(|e| LinkError::Io(io::Error::other(e.to_string())))?;
                if present.first() != Some(&true) {
                    return Ok(false);
                }
                tracing::debug!(target: "railring::net", "{} connected", self.desc);
                self.conn = Conn::Up(info);
            }
        }
        let mut wcs = [ffi::ibv_wc::default(); 32];
        loop {
            // SAFETY: cq is live; wcs is a valid array of ibv_wc.
            let n = unsafe {
                let ctx = (*self.cq).context;
                match (*ctx).ops.poll_cq {
                    Some(f) => f(self.cq, wcs.len() as i32, wcs.as_mut_ptr() as *mut _),
                    None => -1,
                }
            };
            if n < 0 {
                return Err(self.fail("ibv_poll_cq failed".into()));
            }
            for wc in &wcs[..n as usize] {
                if let Some((status, vendor)) = wc.error() {
                    let why = format!(
                        "work completion error status {status} (vendor {vendor:#x}): the peer is unreachable or gone"
                    );
                    self.broken = Some(why.clone());
                    return Err(LinkError::PeerGone(format!("{}: {why}", self.desc)));
                }
                let r = match WrKind::decode(wc.wr_id()) {
                    Some(WrKind::Recv) => {
                        let imm = wc.imm_data().map(u32::from_be).unwrap_or(0);
                        self.flow.on_arrival(imm, wc.len() as u32)
                    }
                    Some(_) => self.flow.on_send_completion(wc.wr_id()),
                    None => Ok(()),
                };
                if let Err(e) = r {
                    return Err(self.fail(e.to_string()));
                }
            }
            if (n as usize) < wcs.len() {
                break;
            }
        }
        self.post_recvs().map_err(|e| self.fail(e.to_string()))?;
        // SAFETY: the mailbox is written by the NIC; a volatile aligned 8-byte read.
        let credit = unsafe { std::ptr::read_volatile(&self.mbox[0]) };
        if let Err(e) = self.flow.on_credit(credit) {
            return Err(self.fail(e.to_string()));
        }
        Ok(true)
    }

    fn report_credit(&mut self, idle: bool) -> Result<(), LinkError> {
        let Conn::Up(r) = &self.conn else {
            return Ok(());
        };
        let (addr, rkey) = (r.mailbox_addr, r.mailbox_rkey);
        if let Some(v) = self.flow.credit_due(idle) {
            // The NIC may read the source after later reports changed it: any value it reads
            // is a valid (monotonic) count.
            // SAFETY: mbox[1] is inside the registered mailbox region.
            unsafe { std::ptr::write_volatile(&mut self.mbox[1], v) };
            let src = &self.mbox[1] as *const u64 as u64;
            let lkey = self.mbox_mr.lkey();
            let w = RdmaWrite {
                local: src,
                len: 8,
                lkey,
                remote: addr,
                rkey,
                imm: None,
                wr_id: WrKind::Credit.encode(),
            };
            if let Err(e) = self.post_write(&w) {
                return Err(self.fail(e.to_string()));
            }
            self.flow.on_credit_posted(v);
        }
        Ok(())
    }
}

impl RdmaLink {
    /// Refuse memory the rings cannot be filled from or drained into.
    fn check_kind(&mut self, mem: MemKind) -> Result<(), LinkError> {
        if Link::supports(self, mem) {
            return Ok(());
        }
        Err(LinkError::Io(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: cannot move {mem:?} memory", self.desc),
        )))
    }

    /// Queue up to `len` bytes from `src` (memory of kind `mem`): take ring slots and fill
    /// them ([`fill_slots`]), then post the writes.
    ///
    /// # Safety
    /// `src` valid for reads of `len` bytes of kind `mem`.
    unsafe fn send_from(
        &mut self,
        src: *const u8,
        len: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.check_kind(mem)?;
        if !self.progress()? {
            return Ok(0);
        }
        let Conn::Up(r) = &self.conn else {
            return Ok(0);
        };
        let (ring, rkey) = (r.ring_addr, r.ring_rkey);
        let (posts, off) = match fill_slots(&mut self.flow, &mut self.rings, src, len) {
            Ok(x) => x,
            Err(e) => return Err(self.fail(e)),
        };
        let (send_base, _) = self.rings.addrs();
        let lkey = self.send_mr.lkey();
        for p in &posts {
            let w = RdmaWrite {
                local: send_base + p.local_off as u64,
                len: p.len,
                lkey,
                remote: ring + p.remote_off as u64,
                rkey,
                imm: Some(p.imm),
                wr_id: p.wr_id,
            };
            if let Err(e) = self.post_write(&w) {
                return Err(self.fail(e.to_string()));
            }
        }
        self.sent += off as u64;
        // Piggyback: a link used in both directions reports credit here too.
        self.report_credit(false)?;
        Ok(off)
    }

    /// Hand out up to `len` bytes into `dst` (memory of kind `mem`) with [`drain_slots`], then
    /// report credit (only now: every byte handed out has been copied).
    ///
    /// # Safety
    /// `dst` valid for writes of `len` bytes of kind `mem`.
    unsafe fn recv_into(
        &mut self,
        dst: *mut u8,
        len: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.check_kind(mem)?;
        if !self.progress()? {
            return Ok(0);
        }
        let got = match drain_slots(&mut self.flow, &mut self.rings, dst, len) {
            Ok(n) => n,
            Err(e) => return Err(self.fail(e)),
        };
        let idle = self.flow.readable().is_none();
        self.report_credit(idle)?;
        Ok(got)
    }
}

impl Link for RdmaLink {
    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn try_send(&mut self, data: &[u8]) -> Result<usize, LinkError> {
        // SAFETY: a live slice of host memory.
        unsafe { self.send_from(data.as_ptr(), data.len(), MemKind::Host) }
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        // SAFETY: a live slice of host memory.
        unsafe { self.recv_into(buf.as_mut_ptr(), buf.len(), MemKind::Host) }
    }

    unsafe fn try_send_mem(
        &mut self,
        ptr: *const u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.send_from(ptr, n, mem)
    }

    unsafe fn try_recv_mem(
        &mut self,
        ptr: *mut u8,
        n: usize,
        mem: MemKind,
    ) -> Result<usize, LinkError> {
        self.recv_into(ptr, n, mem)
    }

    fn supports(&self, mem: MemKind) -> bool {
        match (mem, &self.rings) {
            (MemKind::Host, _) => true,
            (MemKind::Device { ordinal }, Rings::Device(d)) => d.ordinal() == ordinal,
            (MemKind::Device { .. }, Rings::Host { .. }) => false,
        }
    }

    fn register(
        &mut self,
        ptr: *const u8,
        len: usize,
        mem: MemKind,
    ) -> Result<Registration, LinkError> {
        if !Link::supports(self, mem) {
            return Err(LinkError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "device memory is registered only on GPUDirect links (rings in device memory)",
            )));
        }
        let dev = self.dev.clone();
        let mr = self
            .cache
            .get_or_register(
                ptr as usize,
                len,
                mem,
                // SAFETY: the caller keeps the buffer alive while it is registered and
                // invalidates the cache before freeing it (see MrCache).
                |p, l| unsafe { dev.reg(p, l) },
                Mr::dereg,
            )
            .map_err(LinkError::Io)?;
        Ok(Registration {
            key: ((mr.rkey() as u64) << 32) | mr.lkey() as u64,
        })
    }

    fn check_peer(&self) -> Result<(), LinkError> {
        match &self.broken {
            Some(b) => Err(LinkError::PeerGone(b.clone())),
            None => Ok(()),
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.sent
    }
}
