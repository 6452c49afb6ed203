//! The link table: every link this rank has, keyed by peer and channel, made on first use
//! from the peers' published addresses — shared memory to ranks of this node, else RDMA when
//! selected (feature `rdma`; GPUDirect rings on [`DEVICE_CHAN`] channels), else TCP (the lower
//! rank connects, the higher accepts). The executor asks it for links through [`Links`], so a
//! call's walk is comm → executor → transport.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::StoreClient;
use crate::transport::failover::{AbortCheck, RailCtx, RailLink};
use crate::transport::shm::{Node, ShmLink};
use crate::transport::tcp::{RailAddr, TcpNet};
use crate::transport::{Link, LinkId};
use railring_collectives::fx::FxMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Channel used by point-to-point calls (separate TCP connections from collectives' rings).
pub const P2P_CHAN: usize = 1 << 16;
/// Flag on the channel of links that move device memory (GPUDirect RDMA: rings in device
/// memory), kept apart from the host-memory links of the same peers.
pub const DEVICE_CHAN: usize = 1 << 17;

/// Gives the executor a link to a peer on a channel, connecting on first use.
pub trait Links: Send {
    /// A stable pointer to the link (valid until the provider is dropped).
    fn link(&mut self, peer: usize, chan: usize) -> Result<*mut dyn Link>;
    /// The link to a peer on a channel if it exists already (never connects: the executor
    /// looks ahead with it, and a connect out of plan order could wait on a peer that waits
    /// on us).
    fn existing(&mut self, _peer: usize, _chan: usize) -> Option<*mut dyn Link> {
        None
    }
    /// Host name of a peer, for errors.
    fn host_of(&self, peer: usize) -> String;
    /// Called now and then while the executor waits: let links that are not part of the
    /// current exchange answer a peer's move to another rail and resend what it lacks.
    fn service(&mut self) -> Result<()> {
        Ok(())
    }
}

/// What every rank publishes about itself at start-up (the communicator gathers them into its
/// world; the link table connects to their addresses).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerInfo {
    pub rank: usize,
    pub host_id: String,
    pub hostname: String,
    pub pid: u32,
    pub addrs: Vec<RailAddr>,
    /// The kernel's boot id (ranks on one machine share its CPUs, whatever their namespaces).
    #[serde(default)]
    pub kernel: String,
    /// CPUs this rank may run on (0: not reported).
    #[serde(default)]
    pub cpus: u32,
    /// Which CPUs, as a CPU list (empty: not reported): the union over a machine's ranks is the
    /// CPUs they share, which a count cannot give once each rank is bound to a few of them.
    #[serde(default)]
    pub cpu_list: String,
}

/// Every link of one communicator on this rank (see the module docs).
pub struct LinkTable {
    me: usize,
    comm: u64,
    rail: usize,
    /// The TCP rails this rank's links to other nodes stripe over, `rail` first.
    spread: Vec<usize>,
    timeout: Duration,
    connect_timeout: Duration,
    /// `RAILRING_RAIL_TIMEOUT` (see `transport::failover`).
    rail_timeout: Duration,
    /// TCP connections per peer and channel (`RAILRING_NET_STREAMS`).
    streams: usize,
    map: FxMap<(usize, usize), Box<dyn Link>>,
    node: Option<Arc<Node>>,
    /// comm rank → local index on this node (only for ranks on this node)
    local_index: FxMap<usize, usize>,
    net: Option<Arc<TcpNet>>,
    peers: Arc<Vec<PeerInfo>>,
    store: Option<Arc<StoreClient>>,
    /// The RDMA network, when one was selected (`RAILRING_NET`, feature `rdma`).
    #[cfg(feature = "rdma")]
    ib: Option<Arc<crate::transport::rdma::RdmaNet>>,
    /// Makes device rings for GPUDirect links (channels with [`DEVICE_CHAN`]); set by the
    /// first device collective when every rank agreed to GPUDirect RDMA.
    #[cfg(all(feature = "rdma", feature = "cuda"))]
    dev_rings: Option<RingMaker>,
}

#[cfg(all(feature = "rdma", feature = "cuda"))]
pub type RingMaker =
    Arc<dyn Fn() -> std::io::Result<Box<dyn crate::transport::rdma::DeviceRings>> + Send + Sync>;

impl LinkTable {
    /// The map key of a link: one shared-memory link per local peer, whatever the channel.
    fn key(&self, peer: usize, chan: usize) -> (usize, usize) {
        match self.local_index.get(&peer) {
            Some(_) => (peer, 0),
            None => (peer, chan),
        }
    }
}

impl Links for LinkTable {
    fn existing(&mut self, peer: usize, chan: usize) -> Option<*mut dyn Link> {
        let key = self.key(peer, chan);
        self.map.get_mut(&key).map(|l| &mut **l as *mut dyn Link)
    }

    fn link(&mut self, peer: usize, chan: usize) -> Result<*mut dyn Link> {
        if let Some(l) = self.existing(peer, chan) {
            return Ok(l);
        }
        let key = self.key(peer, chan);
        if chan & DEVICE_CHAN != 0 && !self.local_index.contains_key(&peer) {
            #[cfg(all(feature = "rdma", feature = "cuda"))]
            if let (Some(net), Some(store), Some(make)) = (&self.ib, &self.store, &self.dev_rings) {
                let what = format!("GPUDirect RDMA link to rank {peer} (channel {chan})");
                let rings = make().map_err(|e| Error::Transport {
                    rank: self.me,
                    what: what.clone(),
                    err: e,
                })?;
                let l = net
                    .device_link(store.clone(), self.id(peer, chan), self.rail, rings)
                    .map_err(|e| Error::Transport {
                        rank: self.me,
                        what,
                        err: e,
                    })?;
                let e = self.map.entry(key).or_insert(Box::new(l));
                return Ok(&mut **e as *mut dyn Link);
            }
            return Err(Error::Plan(format!(
                "channel {chan} to rank {peer} needs a GPUDirect RDMA link, and this rank has none"
            )));
        }
        let link: Box<dyn Link> = if let (Some(&li), Some(node)) =
            (self.local_index.get(&peer), &self.node)
        {
            Box::new(ShmLink::new(node.clone(), li))
        } else {
            #[cfg(feature = "rdma")]
            if let Some(l) = crate::transport::rdma::link_for(
                self.ib.as_ref(),
                self.store.as_ref(),
                self.id(peer, chan),
                self.rail,
            )? {
                let e = self.map.entry(key).or_insert(l);
                return Ok(&mut **e as *mut dyn Link);
            }
            let net = self
                .net
                .as_ref()
                .ok_or_else(|| Error::Plan("network link needed but no TCP endpoint".into()))?;
            let pi = self
                .peers
                .get(peer)
                .ok_or_else(|| Error::Plan(format!("no such peer {peer}")))?;
            let terr = |e: std::io::Error| Error::Transport {
                rank: self.me,
                what: format!(
                    "connecting to rank {peer} on {} (channel {chan})",
                    pi.hostname
                ),
                err: e,
            };
            let ctx = self.rail_ctx(net, pi, peer, chan);
            if self.me < peer {
                Box::new(RailLink::connect(ctx).map_err(terr)?)
            } else {
                // Wait in slices: between them, look for an abort record so a rank whose peer
                // died before connecting fails in about a second, not at the timeout.
                let start = std::time::Instant::now();
                let accepted = loop {
                    let left = self.timeout.saturating_sub(start.elapsed());
                    if let Some(l) = net
                        .accept(self.comm, peer, chan, left.min(Duration::from_secs(1)))
                        .map_err(terr)?
                    {
                        break Some(l);
                    }
                    if let Some(store) = &self.store {
                        let key = format!("c{:x}/abort", self.comm);
                        // Short deadlines: the store may be gone too (see StoreClient).
                        if store
                            .check_within(std::slice::from_ref(&key), Duration::from_secs(2))
                            .ok()
                            .and_then(|p| p.first().copied())
                            == Some(true)
                        {
                            let why = store
                                .get_within(&key, Duration::from_secs(1))
                                .map(|v| String::from_utf8_lossy(&v).into_owned())
                                .unwrap_or_default();
                            return Err(Error::PeerDead {
                                    rank: self.me,
                                    peer,
                                    host: pi.hostname.clone(),
                                    why: format!("the job is failing while waiting for it to connect; first failure reported: {why}"),
                                });
                        }
                    }
                    if start.elapsed() >= self.timeout {
                        break None;
                    }
                };
                match accepted {
                    Some(l) => Box::new(RailLink::accepted(ctx, l)),
                    None => {
                        return Err(Error::Timeout {
                            rank: self.me,
                            secs: self.timeout.as_secs(),
                            waiting: vec![peer],
                            what: format!(
                                "waiting for rank {peer} on {} to connect (channel {chan})",
                                pi.hostname
                            ),
                        })
                    }
                }
            }
        };
        tracing::debug!(target: "railring::net", rank = self.me, "link to rank {peer} ch {chan}: {}", link.describe());
        let e = self.map.entry(key).or_insert(link);
        Ok(&mut **e as *mut dyn Link)
    }
    fn host_of(&self, peer: usize) -> String {
        self.peers
            .get(peer)
            .map(|p| p.hostname.clone())
            .unwrap_or_else(|| "?".into())
    }
}

/// Link tables alive in this process (one per communicator).
static LIVE_TABLES: AtomicUsize = AtomicUsize::new(0);

impl Drop for LinkTable {
    /// The links go (a TCP link that still owes its peer bytes lingers until they are taken:
    /// `transport::failover`); the process's last table waits for those, so a program that
    /// ends right after its last call loses nothing in flight.
    fn drop(&mut self) {
        self.map.clear();
        if LIVE_TABLES.fetch_sub(1, Ordering::AcqRel) == 1 {
            crate::transport::failover::settle();
        }
    }
}

impl LinkTable {
    /// An empty table for rank `me` of communicator `comm` (timeouts and streams from `cfg`).
    /// `node` (with `local`, the node's
    /// ranks in local order) when this rank shares a node segment with others.
    pub fn new(
        me: usize,
        comm: u64,
        cfg: &Config,
        node: Option<(Arc<Node>, &[usize])>,
        net: Option<Arc<TcpNet>>,
        peers: Arc<Vec<PeerInfo>>,
        store: Option<Arc<StoreClient>>,
    ) -> LinkTable {
        let (node, local_index) = match node {
            Some((n, local)) => (
                Some(n),
                local.iter().enumerate().map(|(i, &r)| (r, i)).collect(),
            ),
            None => (None, FxMap::default()),
        };
        LIVE_TABLES.fetch_add(1, Ordering::AcqRel);
        LinkTable {
            me,
            comm,
            rail: 0,
            spread: vec![0],
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout,
            rail_timeout: cfg.rail_timeout,
            streams: cfg.net_streams,
            map: FxMap::default(),
            node,
            local_index,
            net,
            peers,
            store,
            #[cfg(feature = "rdma")]
            ib: None,
            #[cfg(all(feature = "rdma", feature = "cuda"))]
            dev_rings: None,
        }
    }

    /// What a TCP link to `peer` on `chan` needs to move between rails.
    fn rail_ctx(&self, net: &Arc<TcpNet>, pi: &PeerInfo, peer: usize, chan: usize) -> RailCtx {
        let abort: Option<AbortCheck> = self.store.clone().map(|store| {
            let key = format!("c{:x}/abort", self.comm);
            let f: AbortCheck = Arc::new(move || {
                let set = store
                    .check(std::slice::from_ref(&key))
                    .ok()
                    .and_then(|p| p.first().copied())
                    == Some(true);
                set.then(|| {
                    store
                        .get(&key, Duration::from_secs(1))
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_default()
                })
            });
            f
        });
        RailCtx {
            net: net.clone(),
            id: self.id(peer, chan),
            home: self.rail,
            spread: self.spread.clone(),
            peer_addrs: pi.addrs.clone(),
            my_host: self
                .peers
                .get(self.me)
                .map(|p| p.hostname.clone())
                .unwrap_or_default(),
            peer_host: pi.hostname.clone(),
            peer_key: pi.host_id.clone(),
            streams: self.streams,
            rail_timeout: self.rail_timeout,
            connect_timeout: self.connect_timeout,
            abort,
        }
    }

    /// The identity of this rank's link to `peer` on `chan`.
    fn id(&self, peer: usize, chan: usize) -> LinkId {
        LinkId {
            comm: self.comm,
            me: self.me,
            peer,
            chan,
        }
    }

    /// The rail (index into the TCP / RDMA rails) this rank's network links use.
    pub fn set_rail(&mut self, rail: usize) {
        self.set_rails(rail, &[]);
    }

    /// [`Self::set_rail`], with TCP links to other nodes striped over `rail` and `more` (a node
    /// with fewer ranks than rails: every rail carries its share).
    pub fn set_rails(&mut self, rail: usize, more: &[usize]) {
        self.rail = rail;
        self.spread = vec![rail];
        for &r in more {
            if !self.spread.contains(&r) {
                self.spread.push(r);
            }
        }
    }

    /// The rails this rank's TCP links to other nodes drive (its rail first).
    pub fn rails(&self) -> &[usize] {
        &self.spread
    }

    /// Use this RDMA network for links to other nodes (`None`: TCP).
    #[cfg(feature = "rdma")]
    pub fn set_rdma(&mut self, ib: Option<Arc<crate::transport::rdma::RdmaNet>>) {
        self.ib = ib;
    }

    /// The RDMA network links to other nodes use, if one was selected.
    #[cfg(feature = "rdma")]
    pub fn rdma(&self) -> Option<&Arc<crate::transport::rdma::RdmaNet>> {
        self.ib.as_ref()
    }

    /// From now on, make GPUDirect links ([`DEVICE_CHAN`] channels) with rings from `make`.
    #[cfg(all(feature = "rdma", feature = "cuda"))]
    pub fn set_device_rings(&mut self, make: RingMaker) {
        self.dev_rings = Some(make);
    }

    /// Bytes sent so far over links to other nodes.
    pub fn net_bytes_sent(&self) -> u64 {
        self.map
            .iter()
            .filter(|(k, _)| !self.local_index.contains_key(&k.0))
            .map(|(_, l)| l.bytes_sent())
            .sum()
    }

    /// Tell every peer this rank is failing: raise the node's abort word and close every link
    /// at once (none lingers: `Link::abandon`).
    pub fn abort(&mut self) {
        if let Some(n) = &self.node {
            n.abort();
        }
        for l in self.map.values_mut() {
            l.abandon();
        }
        self.map.clear();
    }
}
