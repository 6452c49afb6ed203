//! The communicator: who the ranks are, where they live, and the collective API.

use crate::bootstrap::StoreClient;
use crate::config::{launch_from_env, Config, Launch};
use crate::error::{Error, Result};
use crate::executor::{Bufs, CallDesc, Executor, Links, DEVICE_CHAN};
use crate::host;
use crate::transport::shm::{segment_path, Geometry, Node, ShmFabric, ShmLink};
use crate::transport::tcp::{discover_rails, RailAddr, TcpNet};
use crate::transport::Link;
use railring_collectives::build::build_plan;
use railring_collectives::plan::{Algo, CollKind, Layout, Plan};
use railring_collectives::{as_bytes, as_bytes_mut, kernels, DataType, Element, ReduceOp};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What every rank publishes about itself at start-up.
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
}

/// Limit on the world description read from the store.
const MAX_WORLD: usize = 1 << 20;

/// A group of ranks that run collectives together.
///
/// Calls on one communicator run in the order they are made (non-blocking ones included); every
/// rank must make the same calls in the same order. After a failed call (a peer died, calls
/// disagreed, a timeout) the communicator refuses further calls.
pub struct Communicator {
    sh: Arc<Shared>,
}

/// Work for the communicator's worker thread.
type Job = Box<dyn FnOnce() + Send>;

struct Shared {
    inner: Mutex<Inner>,
    turn: Mutex<(u64, u64)>,
    turn_cv: Condvar,
    worker: Mutex<Option<mpsc::Sender<Job>>>,
    /// Set once the worker exists: from then on calls take tickets.
    worker_started: std::sync::atomic::AtomicBool,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    node: usize,
    nnodes: usize,
}

/// A non-blocking operation in flight. `wait` returns its buffer.
#[must_use = "a started collective must be waited for"]
pub struct Pending<T> {
    rx: mpsc::Receiver<Result<T>>,
}

impl<T> Pending<T> {
    /// Block until the operation completes.
    pub fn wait(self) -> Result<T> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Poisoned(
                "the communicator's worker thread is gone".into(),
            ))
        })
    }
    /// The result if the operation has completed, else the pending operation back.
    pub fn test(self) -> std::result::Result<Result<T>, Pending<T>> {
        match self.rx.try_recv() {
            Ok(r) => Ok(r),
            Err(mpsc::TryRecvError::Empty) => Err(self),
            Err(mpsc::TryRecvError::Disconnected) => {
                Ok(Err(Error::Poisoned("worker thread is gone".into())))
            }
        }
    }
}

struct LinkTable {
    me: usize,
    comm: u64,
    rail: usize,
    timeout: Duration,
    connect_timeout: Duration,
    /// TCP connections per peer and channel (`RAILRING_NET_STREAMS`).
    streams: usize,
    map: HashMap<(usize, usize), Box<dyn Link>>,
    node: Option<Arc<Node>>,
    /// comm rank → local index on this node (only for ranks on this node)
    local_index: HashMap<usize, usize>,
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
type RingMaker =
    Arc<dyn Fn() -> std::io::Result<Box<dyn crate::transport::rdma::DeviceRings>> + Send + Sync>;

impl Links for LinkTable {
    fn link(&mut self, peer: usize, chan: usize) -> Result<*mut dyn Link> {
        let key = match self.local_index.get(&peer) {
            Some(_) => (peer, 0),
            None => (peer, chan),
        };
        if let Some(l) = self.map.get_mut(&key) {
            return Ok(&mut **l as *mut dyn Link);
        }
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
                    .device_link(
                        store.clone(),
                        self.comm,
                        self.me,
                        peer,
                        chan,
                        self.rail,
                        rings,
                    )
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
                self.comm,
                self.me,
                peer,
                chan,
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
            if self.me < peer {
                Box::new(
                    net.connect(
                        self.comm,
                        self.me,
                        chan,
                        self.rail,
                        &pi.addrs,
                        self.connect_timeout,
                        self.streams,
                    )
                    .map_err(terr)?,
                )
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
                        if store
                            .check(std::slice::from_ref(&key))
                            .ok()
                            .and_then(|p| p.first().copied())
                            == Some(true)
                        {
                            let why = store
                                .get(&key, Duration::from_secs(1))
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
                    Some(l) => Box::new(l),
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

struct Inner {
    rank: usize,
    size: usize,
    comm: u64,
    job: String,
    layout: Layout,
    peers: Arc<Vec<PeerInfo>>,
    store: Option<Arc<StoreClient>>,
    net: Option<Arc<TcpNet>>,
    links: LinkTable,
    fabric: Option<Box<dyn crate::transport::NodeFabric>>,
    cfg: Config,
    seq: u64,
    p2p_send: HashMap<usize, u64>,
    p2p_recv: HashMap<usize, u64>,
    plans: HashMap<(CollKind, Algo, usize, usize), Arc<Plan>>,
    choices: HashMap<(CollKind, usize, usize, usize), (Algo, String)>,
    staging: Vec<u64>,
    poisoned: Option<String>,
    split_seq: u64,
    rail: usize,
    /// The bootstrap store this rank serves (rank 0 under srun / torchrun-style env).
    store_server: Option<crate::bootstrap::store::ServerHandle>,
    /// The last call's (kind, count, element size, root, algorithm, plan).
    last: Option<(CollKind, usize, usize, usize, Arc<Plan>)>,
}

fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = std::env::var("RAILRING_DEBUG")
            .unwrap_or_else(|_| "WARN".into())
            .to_ascii_lowercase();
        let level = match level.as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "error" => "error",
            _ => "warn",
        };
        let filter = match std::env::var("RAILRING_DEBUG_SUBSYS") {
            Ok(s) if !s.trim().is_empty() => s
                .split(',')
                .map(|x| format!("railring::{}={level}", x.trim().to_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(","),
            _ => format!("railring={level}"),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_target(true)
            .without_time()
            .try_init();
    });
}

fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl Communicator {
    /// Join the job this process was started in: railrun's environment (`RAILRING_*`), or a world
    /// of one when started alone.
    pub fn init() -> Result<Communicator> {
        init_logging();
        let cfg = Config::from_env()?;
        #[cfg(feature = "mpi")]
        if let Some(c) = crate::bootstrap::mpi::init_if_mpirun(&cfg)? {
            return Ok(c); // started by mpirun / mpiexec (see bootstrap::mpi)
        }
        match launch_from_env()? {
            Launch::Alone => Self::alone(cfg),
            Launch::Store {
                rank,
                size,
                store_addr,
                secret,
                job_id,
                source,
            } => {
                tracing::info!(target: "railring::init", rank, size, "bootstrap via {source} store at {store_addr}");
                let store = Arc::new(StoreClient::connect(
                    &store_addr,
                    &secret,
                    cfg.connect_timeout,
                )?);
                Self::bootstrap(store, rank, size, &secret, &job_id, cfg)
            }
            Launch::HostedStore {
                rank,
                size,
                store_addr,
                serve_on,
                secret,
                job_id,
                source,
            } => {
                let server = if rank == 0 {
                    let l =
                        std::net::TcpListener::bind(&serve_on).map_err(|e| Error::Transport {
                            rank,
                            what: format!(
                                "rank 0 serving the bootstrap store on {serve_on} ({source})"
                            ),
                            err: e,
                        })?;
                    Some(
                        crate::bootstrap::store::serve(l, &secret, crate::bootstrap::Store::new())
                            .map_err(|e| Error::Transport {
                                rank,
                                what: "starting the store".into(),
                                err: e,
                            })?,
                    )
                } else {
                    None
                };
                tracing::info!(target: "railring::init", rank, size, "bootstrap via {source}: store at {store_addr}");
                let store = Arc::new(StoreClient::connect(
                    &store_addr,
                    &secret,
                    cfg.connect_timeout,
                )?);
                let c = Self::bootstrap(store, rank, size, &secret, &job_id, cfg)?;
                c.lock().store_server = server;
                Ok(c)
            }
        }
    }

    /// Keep the bootstrap store this rank serves running as long as the communicator.
    #[allow(dead_code)] // used by the `mpi` feature
    pub(crate) fn keep_store_server(&self, server: crate::bootstrap::store::ServerHandle) {
        self.lock().store_server = Some(server);
    }

    fn alone(cfg: Config) -> Result<Communicator> {
        let me = PeerInfo {
            rank: 0,
            host_id: host::host_id(),
            hostname: host::hostname(),
            pid: std::process::id(),
            addrs: vec![],
            kernel: host::kernel_id(),
        };
        let peers = Arc::new(vec![me]);
        Ok(Self::assemble(
            0,
            1,
            1,
            "solo".into(),
            Layout::single_node(1),
            peers,
            None,
            None,
            None,
            cfg,
            0,
        ))
    }

    /// Bootstrap through a store: publish this rank, learn everyone, set up shared memory.
    pub fn bootstrap(
        store: Arc<StoreClient>,
        rank: usize,
        size: usize,
        secret: &str,
        job: &str,
        cfg: Config,
    ) -> Result<Communicator> {
        let rails = discover_rails(cfg.socket_ifname.as_deref()).map_err(|e| Error::Env {
            var: "RAILRING_SOCKET_IFNAME".into(),
            value: cfg.socket_ifname.clone().unwrap_or_default(),
            why: e.to_string(),
        })?;
        let net = TcpNet::start(rails, secret).map_err(|e| Error::Transport {
            rank,
            what: "listening on rail interfaces".into(),
            err: e,
        })?;
        let me = PeerInfo {
            rank,
            host_id: host::host_id(),
            hostname: host::hostname(),
            pid: std::process::id(),
            addrs: net.addrs.clone(),
            kernel: host::kernel_id(),
        };
        let comm = 1u64;
        let js = serde_json::to_vec(&me).map_err(|e| Error::Invalid(e.to_string()))?;
        store.set(&format!("c{comm:x}/info/{rank}"), &js)?;
        let world_key = format!("c{comm:x}/world");
        if rank == 0 {
            let keys: Vec<String> = (0..size).map(|r| format!("c{comm:x}/info/{r}")).collect();
            store.wait(&keys, cfg.timeout)?;
            let mut all = Vec::with_capacity(size);
            for k in &keys {
                all.push(store.get(k, cfg.timeout)?);
            }
            let joined = format!(
                "[{}]",
                all.iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            store.set(&world_key, joined.as_bytes())?;
        }
        let world = store.get(&world_key, cfg.timeout)?;
        if world.len() > MAX_WORLD.saturating_mul(size.max(1)).min(1 << 30) {
            return Err(Error::Invalid("world description too large".into()));
        }
        let peers: Vec<PeerInfo> = serde_json::from_slice(&world)
            .map_err(|e| Error::Invalid(format!("world description from the store: {e}")))?;
        if peers.len() != size || peers.iter().enumerate().any(|(i, p)| p.rank != i) {
            return Err(Error::Invalid(format!(
                "world description lists {} ranks, expected {size}",
                peers.len()
            )));
        }
        // Ranks on this kernel share its CPUs even when they are different "nodes" (network
        // namespaces, containers): more of them than CPUs means waits must yield, not spin.
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let on_kernel: Vec<&PeerInfo> = peers
            .iter()
            .filter(|p| !p.kernel.is_empty() && p.kernel == peers[rank].kernel)
            .collect();
        let here = on_kernel.len();
        crate::transport::set_oversubscribed(here > cpus);
        let mut hosts: Vec<&str> = on_kernel.iter().map(|p| p.host_id.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        if here > cpus && hosts.len() > 1 {
            if let Some(i) = on_kernel.iter().position(|p| p.rank == rank) {
                crate::transport::set_kernel_slot(i, here);
            }
        }
        let peers = Arc::new(peers);
        Self::build(
            rank,
            (0..size).collect(),
            comm,
            job.to_string(),
            peers,
            Some(store),
            Some(net),
            cfg,
            None,
        )
    }

    /// Build a communicator over `members` (parent ranks, in new-rank order).
    #[allow(clippy::too_many_arguments)]
    fn build(
        rank: usize,
        members: Vec<usize>,
        comm: u64,
        job: String,
        parent_peers: Arc<Vec<PeerInfo>>,
        store: Option<Arc<StoreClient>>,
        net: Option<Arc<TcpNet>>,
        cfg: Config,
        parent_rail: Option<usize>,
    ) -> Result<Communicator> {
        let size = members.len();
        let peers: Vec<PeerInfo> = members
            .iter()
            .enumerate()
            .map(|(i, &pr)| {
                let mut p = parent_peers[pr].clone();
                p.rank = i;
                p
            })
            .collect();
        // Nodes: ranks sharing a host identity, ordered by their lowest rank.
        let mut nodes: Vec<(String, Vec<usize>)> = Vec::new();
        for p in &peers {
            match nodes.iter_mut().find(|(h, _)| *h == p.host_id) {
                Some((_, v)) => v.push(p.rank),
                None => nodes.push((p.host_id.clone(), vec![p.rank])),
            }
        }
        let layout = Layout {
            nodes: nodes.iter().map(|(_, v)| v.clone()).collect(),
        };
        let (node_index, local_rank) = layout
            .locate(rank)
            .ok_or_else(|| Error::Invalid("rank missing from layout".into()))?;
        let local = layout.nodes[node_index].clone();
        let rails = net.as_ref().map(|n| n.rails.len()).unwrap_or(1).max(1);
        let rail = if comm == 1 {
            Self::bind(rank, local_rank, local.len(), net.as_deref())
        } else {
            // sub-communicators keep the process's binding and rail
            parent_rail.unwrap_or(local_rank % rails)
        };
        let peers = Arc::new(peers);
        let node = if local.len() > 1 {
            let store = store
                .as_ref()
                .ok_or_else(|| Error::Invalid("several local ranks but no store".into()))?;
            Some(Self::setup_shm(
                store,
                comm,
                &job,
                &local,
                local_rank,
                &nodes[node_index].0,
                &cfg,
            )?)
        } else {
            None
        };
        let c = Self::assemble(
            rank, size, node_index, job, layout, peers, store, net, node, cfg, comm,
        );
        c.sh.inner.lock().unwrap_or_else(|e| e.into_inner()).rail = rail;
        c.sh.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .links
            .rail = rail;
        #[cfg(feature = "rdma")]
        if nodes.len() > 1 {
            let ib = crate::transport::rdma::select_net(rank)?;
            c.sh.inner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .links
                .ib = ib;
        }
        tracing::info!(target: "railring::init", rank, size, "node {node_index} local rank {local_rank}/{}, rail {rail}", local.len());
        Ok(c)
    }

    /// Bind this process (CPUs from the topology) and pick its rail: the NIC the topology chose
    /// for this local rank when every local rank's NIC is one of the rail interfaces, else local
    /// rank i -> rail i mod R. Topology problems are logged, never fatal.
    fn bind(rank: usize, local_rank: usize, local_size: usize, net: Option<&TcpNet>) -> usize {
        use crate::topology::{apply_cpu_binding, BindOptions, Topology};
        let nrails = net.map(|n| n.rails.len()).unwrap_or(1).max(1);
        let fallback = local_rank % nrails;
        let bindings = Topology::discover().and_then(|t| {
            BindOptions::from_env().and_then(|mut o| {
                // choose among the rail interfaces only
                o.nic_allow = net.map(|n| n.rails.iter().map(|r| r.ifname.clone()).collect());
                t.bindings(local_size, &o)
            })
        });
        let bindings = match bindings {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(target: "railring::topo", rank, "topology unavailable ({e}); rail {fallback} by local rank, CPUs unbound");
                return fallback;
            }
        };
        let Some(me) = bindings.get(local_rank) else {
            return fallback;
        };
        // More local ranks share this CPU set than it has CPUs (a 2-core laptop running 4
        // ranks): pin each to one CPU of the set, round-robin, so each core keeps the same
        // processes and waits hand the core straight to a peer instead of migrating it.
        let sharers: Vec<usize> = (0..bindings.len())
            .filter(|&i| bindings[i].cpus == me.cpus)
            .collect();
        let cpus = if let (Some((i, n)), false) =
            (crate::transport::kernel_slot(), me.cpus.is_empty())
        {
            // Several nodes on one kernel (emulated hosts): give each node its own share of the
            // CPUs, as real nodes have, by pinning the kernel's ranks in rank order in blocks.
            // A node's ranks then wait on each other on their own CPUs, and the network peers
            // of a ring (other nodes) run beside them instead of on the same CPU.
            let c = vec![me.cpus[(i * me.cpus.len() / n.max(1)).min(me.cpus.len() - 1)]];
            tracing::info!(target: "railring::topo", rank, "{n} ranks of several nodes share this kernel's CPUs {}: pinned to CPU {} (rank {i} of {n} here, in blocks)", crate::topology::format_cpulist(&me.cpus), c[0]);
            c
        } else if !me.cpus.is_empty()
            && (sharers.len() > me.cpus.len() || crate::transport::oversubscribed())
        {
            let k = sharers.iter().position(|&i| i == local_rank).unwrap_or(0);
            let c = vec![me.cpus[k % me.cpus.len()]];
            tracing::info!(target: "railring::topo", rank, "{} local ranks share CPUs {}: oversubscribed, pinned to CPU {}", sharers.len(), crate::topology::format_cpulist(&me.cpus), c[0]);
            c
        } else {
            me.cpus.clone()
        };
        if let Err(e) = apply_cpu_binding(&cpus) {
            tracing::warn!(target: "railring::topo", rank, "could not bind CPUs {cpus:?}: {e}");
        }
        let rail_of = |b: &crate::topology::Binding| {
            let nic = b.nics.first()?;
            net?.rails
                .iter()
                .position(|r| r.ifname == nic.netdev || r.ifname == nic.name)
        };
        let all: Option<Vec<usize>> = bindings.iter().map(rail_of).collect();
        let (rail, why) = match all {
            Some(v) => (v[local_rank], "the topology's nearest NIC"),
            None => (fallback, "local rank modulo the number of rails (the topology's NICs are not all rail interfaces)"),
        };
        let rail_name = net
            .and_then(|n| n.rails.get(rail))
            .map(|r| r.ifname.clone())
            .unwrap_or_default();
        tracing::info!(
            target: "railring::topo",
            rank,
            "local rank {local_rank}: GPU {}, NIC {}, CPUs {}, rail {rail} ({rail_name}) by {why}; {}",
            me.gpu.as_ref().map(|g| g.index.to_string()).unwrap_or_else(|| "none".into()),
            me.nics.first().map(|n| format!("{} ({})", n.name, n.path_class)).unwrap_or_else(|| "none".into()),
            crate::topology::format_cpulist(&me.cpus),
            me.reason
        );
        rail
    }

    fn setup_shm(
        store: &StoreClient,
        comm: u64,
        job: &str,
        local: &[usize],
        me: usize,
        host_id: &str,
        cfg: &Config,
    ) -> Result<Arc<Node>> {
        let key = format!("{:x}", fnv(&[host_id.as_bytes()]));
        let path = segment_path(job, comm, &key);
        let geo = Geometry {
            local_size: local.len(),
            slot_bytes: (cfg.shm_slot + 63) & !63,
            ring_bytes: 256 << 10,
        };
        let rank = local[me];
        let shm_err = |what: &str, e: std::io::Error| Error::Shm {
            rank,
            what: format!("{what} {}", path.display()),
            err: e,
        };
        let ready = format!("c{comm:x}/shm/{key}");
        let node = if me == 0 {
            let _ = std::fs::remove_file(&path);
            let n = Node::open(&path, geo, local.to_vec(), me, host::hostname(), true)
                .map_err(|e| shm_err("creating", e))?;
            store.set(&ready, b"1")?;
            n
        } else {
            store.get(&ready, cfg.timeout)?;
            Node::open(&path, geo, local.to_vec(), me, host::hostname(), false)
                .map_err(|e| shm_err("opening", e))?
        };
        // The last rank to map the segment removes its name: nothing is left in /dev/shm.
        if store.add(&format!("c{comm:x}/shm-mapped/{key}"), 1)? == local.len() as i64 {
            let _ = std::fs::remove_file(&path);
        }
        Ok(node)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        rank: usize,
        size: usize,
        node_index: usize,
        job: String,
        layout: Layout,
        peers: Arc<Vec<PeerInfo>>,
        store: Option<Arc<StoreClient>>,
        net: Option<Arc<TcpNet>>,
        node: Option<Arc<Node>>,
        cfg: Config,
        comm: u64,
    ) -> Communicator {
        let local = layout
            .nodes
            .get(node_index)
            .cloned()
            .unwrap_or_else(|| vec![rank]);
        let local_rank = local.iter().position(|&r| r == rank).unwrap_or(0);
        let local_index: HashMap<usize, usize> = if node.is_some() {
            local.iter().enumerate().map(|(i, &r)| (r, i)).collect()
        } else {
            HashMap::new()
        };
        let fabric = node.as_ref().map(|n| {
            Box::new(ShmFabric::new(n.clone(), cfg.timeout))
                as Box<dyn crate::transport::NodeFabric>
        });
        let links = LinkTable {
            me: rank,
            comm,
            rail: 0,
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout,
            streams: cfg.net_streams,
            map: HashMap::new(),
            node,
            local_index,
            net: net.clone(),
            peers: peers.clone(),
            store: store.clone(),
            #[cfg(feature = "rdma")]
            ib: None,
            #[cfg(all(feature = "rdma", feature = "cuda"))]
            dev_rings: None,
        };
        let nnodes = layout.nodes.len();
        let inner = Inner {
            rank,
            size,
            comm,
            job,
            layout,
            peers,
            store,
            net,
            links,
            fabric,
            cfg,
            seq: 0,
            p2p_send: HashMap::new(),
            p2p_recv: HashMap::new(),
            plans: HashMap::new(),
            choices: HashMap::new(),
            staging: Vec::new(),
            poisoned: None,
            split_seq: 0,
            rail: 0,
            store_server: None,
            last: None,
        };
        Communicator {
            sh: Arc::new(Shared {
                inner: Mutex::new(inner),
                turn: Mutex::new((0, 0)),
                turn_cv: Condvar::new(),
                worker: Mutex::new(None),
                worker_started: std::sync::atomic::AtomicBool::new(false),
                rank,
                size,
                local_rank,
                local_size: local.len(),
                node: node_index,
                nnodes,
            }),
        }
    }

    pub fn rank(&self) -> usize {
        self.sh.rank
    }
    pub fn size(&self) -> usize {
        self.sh.size
    }
    pub fn local_rank(&self) -> usize {
        self.sh.local_rank
    }
    pub fn local_size(&self) -> usize {
        self.sh.local_size
    }
    /// Index of this rank's node (nodes ordered by their lowest rank).
    pub fn node(&self) -> usize {
        self.sh.node
    }
    pub fn nnodes(&self) -> usize {
        self.sh.nnodes
    }
    /// Which ranks share which node.
    pub fn layout(&self) -> Layout {
        self.lock().layout.clone()
    }
    /// The rail (index into this rank's rail interfaces) its network traffic uses, and its name.
    pub fn rail(&self) -> (usize, Option<String>) {
        let g = self.lock();
        let name = g
            .net
            .as_ref()
            .and_then(|n| n.rails.get(g.rail).map(|r| r.ifname.clone()));
        (g.rail, name)
    }
    /// Bytes sent so far over network links (for counters and tests).
    pub fn net_bytes_sent(&self) -> u64 {
        let g = self.lock();
        g.links
            .map
            .iter()
            .filter(|(k, _)| !g.links.local_index.contains_key(&k.0))
            .map(|(_, l)| l.bytes_sent())
            .sum()
    }
    /// The algorithm the communicator would use for `kind` of `count` elements of `dtype`, and why.
    pub fn explain(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> (Algo, String) {
        self.lock().choose(kind, count, dtype.size(), root)
    }
    /// The plan this rank runs for such a call (for `--explain` style output).
    pub fn plan_for(
        &self,
        kind: CollKind,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<Plan> {
        let mut g = self.lock();
        let (algo, _) = g.choose(kind, count, dtype.size(), root);
        g.plan(kind, algo, count, root).map(|p| (*p).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.sh.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- ordering of calls (blocking and non-blocking) ----

    fn ticket(&self) -> u64 {
        let mut t = self.sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        let k = t.0;
        t.0 += 1;
        k
    }

    fn run<R>(sh: &Shared, ticket: u64, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        {
            let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
            while t.1 != ticket {
                t = sh.turn_cv.wait(t).unwrap_or_else(|e| e.into_inner());
            }
        }
        let r = {
            let mut g = sh.inner.lock().unwrap_or_else(|e| e.into_inner());
            Inner::guarded(&mut g, f)
        };
        let mut t = sh.turn.lock().unwrap_or_else(|e| e.into_inner());
        t.1 += 1;
        sh.turn_cv.notify_all();
        r
    }

    fn blocking<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        // Until a non-blocking call has started the worker, calls run in the caller's order and
        // need no tickets: the fast path for small messages is one uncontended lock.
        let worker_started = self
            .sh
            .worker_started
            .load(std::sync::atomic::Ordering::Acquire);
        if !worker_started {
            let mut g = self.lock();
            return Inner::guarded(&mut g, f);
        }
        let t = self.ticket();
        Self::run(&self.sh, t, f)
    }

    fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<R> + Send + 'static,
    ) -> Pending<R> {
        let (tx, rx) = mpsc::channel();
        let t = self.ticket();
        let sh = self.sh.clone();
        let job: Job = Box::new(move || {
            let r = Self::run(&sh, t, f);
            let _ = tx.send(r);
        });
        let mut w = self.sh.worker.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let (jtx, jrx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name("railring-worker".into())
                .spawn(move || {
                    while let Ok(j) = jrx.recv() {
                        j();
                    }
                });
            if spawned.is_ok() {
                *w = Some(jtx);
                self.sh
                    .worker_started
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        match w.as_ref() {
            Some(s) => {
                if let Err(mpsc::SendError(j)) = s.send(job) {
                    j();
                }
            }
            None => job(),
        }
        Pending { rx }
    }

    // ---- collectives ----

    /// In-place all-reduce: every rank ends with the reduction of every rank's `buf`.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.blocking(|g| g.all_reduce(as_bytes_mut(buf), T::DTYPE, op))
    }

    /// Out-of-place all-reduce.
    pub fn all_reduce_into<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        if input.len() != output.len() {
            return Err(Error::Invalid(format!(
                "all_reduce_into: input has {} elements, output {}",
                input.len(),
                output.len()
            )));
        }
        self.blocking(|g| {
            g.all_reduce_from(as_bytes_mut(output), Some(as_bytes(input)), T::DTYPE, op)
        })
    }

    /// Non-blocking all-reduce of an owned buffer; `wait()` returns it reduced.
    pub fn all_reduce_start<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.all_reduce(as_bytes_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// Reduce-scatter: `input` holds `size` blocks of `output.len()` elements; rank r's `output`
    /// receives the reduction of block r.
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.size();
        if input.len() != output.len() * n {
            return Err(Error::Invalid(format!(
                "reduce_scatter: input has {} elements, expected {} x {n}",
                input.len(),
                output.len()
            )));
        }
        let mut work = input.to_vec();
        self.reduce_scatter_in_place(&mut work, op)?;
        let r = self.rank();
        output.copy_from_slice(&work[r * output.len()..(r + 1) * output.len()]);
        Ok(())
    }

    /// In-place reduce-scatter: `buf` holds `size` blocks; afterwards this rank's block holds the
    /// reduction (other blocks are scratch).
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.blocking(|g| g.reduce_scatter(as_bytes_mut(buf), T::DTYPE, op))
    }

    pub fn reduce_scatter_start<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.reduce_scatter(as_bytes_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// All-gather: `output` (`size` x `input.len()`) receives every rank's `input`, in rank order.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let (n, r, c) = (self.size(), self.rank(), input.len());
        if output.len() != c * n {
            return Err(Error::Invalid(format!(
                "all_gather: output has {} elements, expected {c} x {n}",
                output.len()
            )));
        }
        output[r * c..(r + 1) * c].copy_from_slice(input);
        self.all_gather_in_place(output)
    }

    /// In-place all-gather: this rank's block of `buf` is its contribution.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.blocking(|g| g.all_gather(as_bytes_mut(buf), T::DTYPE))
    }

    pub fn all_gather_start<T: Element>(&self, mut buf: Vec<T>) -> Pending<Vec<T>> {
        self.submit(move |g| g.all_gather(as_bytes_mut(&mut buf), T::DTYPE).map(|_| buf))
    }

    /// Broadcast `root`'s `buf` to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.blocking(|g| g.broadcast(as_bytes_mut(buf), T::DTYPE, root))
    }

    pub fn broadcast_start<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.broadcast(as_bytes_mut(&mut buf), T::DTYPE, root)
                .map(|_| buf)
        })
    }

    /// Reduce to `root`: `output` on the root receives the reduction of every rank's `input`
    /// (on other ranks `output` is used as scratch).
    pub fn reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        if input.len() != output.len() {
            return Err(Error::Invalid(format!(
                "reduce: input has {} elements, output {}",
                input.len(),
                output.len()
            )));
        }
        output.copy_from_slice(input);
        self.blocking(|g| g.reduce(as_bytes_mut(output), T::DTYPE, op, root))
    }

    /// In-place reduce: the root's `buf` receives the reduction; other ranks' `buf` is unchanged.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        if self.rank() == root {
            self.blocking(|g| g.reduce(as_bytes_mut(buf), T::DTYPE, op, root))
        } else {
            let mut tmp = buf.to_vec();
            self.blocking(|g| g.reduce(as_bytes_mut(&mut tmp), T::DTYPE, op, root))
        }
    }

    pub fn reduce_start<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Pending<Vec<T>> {
        self.submit(move |g| {
            g.reduce(as_bytes_mut(&mut buf), T::DTYPE, op, root)
                .map(|_| buf)
        })
    }

    /// All-to-all: `input` holds `size` blocks (block j goes to rank j); `output` receives
    /// `size` blocks (block j from rank j).
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let n = self.size();
        if input.len() != output.len() || !input.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!(
                "all_to_all: input {} and output {} elements must be equal and divisible by {n}",
                input.len(),
                output.len()
            )));
        }
        self.blocking(|g| g.all_to_all(as_bytes(input), as_bytes_mut(output), T::DTYPE))
    }

    pub fn all_to_all_start<T: Element>(&self, input: Vec<T>) -> Pending<Vec<T>> {
        let mut out = vec![T::default(); input.len()];
        let n = self.size();
        self.submit(move |g| {
            if !input.len().is_multiple_of(n) {
                return Err(Error::Invalid(
                    "all_to_all: length not divisible by the world size".into(),
                ));
            }
            g.all_to_all(as_bytes(&input), as_bytes_mut(&mut out), T::DTYPE)
                .map(|_| out)
        })
    }

    /// Send `buf` to `peer` (matched in order with the peer's `recv` from this rank).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.blocking(|g| g.p2p(Some((as_bytes(buf), peer)), None, T::DTYPE))
    }

    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.blocking(|g| g.p2p(None, Some((as_bytes_mut(buf), peer)), T::DTYPE))
    }

    /// Send to `dest` and receive from `src` at the same time (no deadlock when ranks pair up).
    pub fn send_recv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        self.blocking(|g| {
            g.p2p(
                Some((as_bytes(send), dest)),
                Some((as_bytes_mut(recv), src)),
                T::DTYPE,
            )
        })
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(|g| g.barrier())
    }

    pub fn barrier_start(&self) -> Pending<()> {
        self.submit(|g| g.barrier())
    }

    /// Split like `MPI_Comm_split`: ranks passing the same `color` form a new communicator,
    /// ordered by (`key`, old rank). `None` (MPI_UNDEFINED) takes part but gets no communicator.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.blocking(|g| g.split(color, key))
    }
}

/// Untyped forms of the collectives: buffers as bytes plus a [`DataType`]. Lengths must be
/// multiples of the element size. (Benchmarks and language bindings use these.)
impl Communicator {
    fn check_len(buf: &[u8], dtype: DataType) -> Result<()> {
        if !buf.len().is_multiple_of(dtype.size()) {
            return Err(Error::Invalid(format!(
                "{} bytes is not a whole number of {dtype} elements",
                buf.len()
            )));
        }
        Ok(())
    }
    pub fn all_reduce_raw(&self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.all_reduce(buf, dtype, op))
    }
    /// Out of place: `output` receives the reduction of every rank's `input`.
    pub fn all_reduce_into_raw(
        &self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        Self::check_len(input, dtype)?;
        if input.len() != output.len() {
            return Err(Error::Invalid(
                "all_reduce_into: input and output lengths differ".into(),
            ));
        }
        self.blocking(|g| g.all_reduce_from(output, Some(input), dtype, op))
    }
    /// In place: `buf` holds `size` blocks; this rank's block receives the reduction.
    pub fn reduce_scatter_raw(&self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.reduce_scatter(buf, dtype, op))
    }
    /// In place: this rank's block of `buf` is its contribution.
    pub fn all_gather_raw(&self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.all_gather(buf, dtype))
    }
    pub fn broadcast_raw(&self, buf: &mut [u8], dtype: DataType, root: usize) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.broadcast(buf, dtype, root))
    }
    /// In place; non-root buffers are used as scratch.
    pub fn reduce_raw(
        &self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        Self::check_len(buf, dtype)?;
        self.blocking(|g| g.reduce(buf, dtype, op, root))
    }
    pub fn all_to_all_raw(&self, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
        Self::check_len(input, dtype)?;
        if input.len() != output.len() || !(input.len() / dtype.size()).is_multiple_of(self.size())
        {
            return Err(Error::Invalid(
                "all_to_all: input and output must be equal and divisible by the world size".into(),
            ));
        }
        self.blocking(|g| g.all_to_all(input, output, dtype))
    }
    pub fn send_recv_raw(
        &self,
        send: &[u8],
        dest: usize,
        recv: &mut [u8],
        src: usize,
        dtype: DataType,
    ) -> Result<()> {
        Self::check_len(send, dtype)?;
        Self::check_len(recv, dtype)?;
        self.blocking(|g| g.p2p(Some((send, dest)), Some((recv, src)), dtype))
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Stop the worker (pending jobs still run: the sender is dropped after them).
        if let Ok(mut w) = self.sh.worker.lock() {
            w.take();
        }
    }
}

impl Inner {
    /// Run `f` unless an earlier failure poisoned the communicator; a failure (other than a
    /// rejected argument) poisons it.
    fn guarded<R>(g: &mut Inner, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        if let Some(p) = &g.poisoned {
            return Err(Error::Poisoned(p.clone()));
        }
        let r = f(g);
        match r {
            Err(Error::Invalid(_)) | Ok(_) => r,
            Err(e) => {
                let e = g.fail(e);
                g.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn abort_peers(&mut self) {
        if let Some(n) = &self.links.node {
            n.abort();
        }
        self.links.map.clear();
    }

    /// After a failed call: tell the peers (shm abort word, closed connections, the store's abort
    /// record) so nobody waits for this rank until a timeout, and add the first failure reported
    /// by any rank to the error when it names someone else (the root cause of a cascade).
    fn fail(&mut self, e: Error) -> Error {
        // Record first, then tell the peers: a peer that reacts to our abort finds the record.
        let Some(store) = self.store.clone() else {
            self.abort_peers();
            return e;
        };
        let key = format!("c{:x}/abort", self.comm);
        let first = match store.check(std::slice::from_ref(&key)) {
            Ok(p) if p.first() == Some(&true) => store
                .get(&key, Duration::from_secs(1))
                .ok()
                .map(|v| String::from_utf8_lossy(&v).into_owned()),
            Ok(_) => {
                let _ = store.set(&key, format!("rank {}: {e}", self.rank).as_bytes());
                None
            }
            Err(_) => None,
        };
        self.abort_peers();
        match (first, e) {
            (
                Some(f),
                Error::PeerDead {
                    rank,
                    peer,
                    host,
                    why,
                },
            ) if !f.starts_with(&format!("rank {}:", self.rank)) => Error::PeerDead {
                rank,
                peer,
                host,
                why: format!("{why}; first failure reported: {f}"),
            },
            (
                Some(f),
                Error::Timeout {
                    rank,
                    secs,
                    waiting,
                    what,
                },
            ) if !f.starts_with(&format!("rank {}:", self.rank)) => Error::Timeout {
                rank,
                secs,
                waiting,
                what: format!("{what}; first failure reported: {f}"),
            },
            (_, e) => e,
        }
    }

    /// The algorithm for a call (cached; see [`Inner::choose`]).
    fn algo(&mut self, kind: CollKind, count: usize, esz: usize, root: usize) -> Algo {
        match self.choices.get(&(kind, count, esz, root)) {
            Some((a, _)) => *a,
            None => self.choose(kind, count, esz, root).0,
        }
    }

    /// The algorithm for a call: forced by `RAILRING_ALGO`, else the cost model's choice. The
    /// choice is cached per (kind, count, element size, root): pricing builds every rank's plan.
    fn choose(&mut self, kind: CollKind, count: usize, esz: usize, root: usize) -> (Algo, String) {
        if let Some((a, why)) = self.choices.get(&(kind, count, esz, root)) {
            return (*a, why.clone());
        }
        let (a, why) = self.choose_uncached(kind, count, esz, root);
        tracing::info!(target: "railring::tune", rank = self.rank, "{kind} of {} bytes: {a} ({why})", count * esz);
        if self.choices.len() > 4096 {
            self.choices.clear();
        }
        self.choices
            .insert((kind, count, esz, root), (a, why.clone()));
        (a, why)
    }

    fn choose_uncached(
        &self,
        kind: CollKind,
        count: usize,
        esz: usize,
        root: usize,
    ) -> (Algo, String) {
        let candidates = railring_collectives::build::algorithms_for(kind);
        if let Some(a) = self.cfg.algo {
            if candidates.contains(&a)
                && build_plan(kind, a, &self.layout, self.rank, count, root).is_ok()
            {
                return (a, format!("forced by RAILRING_ALGO={a}"));
            }
        }
        // On one node the two-level plan is the shared-memory fabric alone: each rank reduces its
        // slice from every peer's staging slot, and small calls take one flag round. Every
        // point-to-point plan moves the same bytes through shm rings with more synchronisation.
        if self.layout.nodes.len() == 1
            && matches!(
                kind,
                CollKind::AllReduce
                    | CollKind::Barrier
                    | CollKind::ReduceScatter
                    | CollKind::AllGather
            )
            && candidates.contains(&Algo::TwoLevel)
        {
            return (
                Algo::TwoLevel,
                "one node: in-node shared-memory fabric".into(),
            );
        }
        self.cfg.cost.choose(kind, &self.layout, count, esz, root)
    }

    fn plan(&mut self, kind: CollKind, algo: Algo, count: usize, root: usize) -> Result<Arc<Plan>> {
        let key = (kind, algo, count, root);
        if let Some(p) = self.plans.get(&key) {
            return Ok(p.clone());
        }
        let p = Arc::new(
            build_plan(kind, algo, &self.layout, self.rank, count, root)
                .map_err(|e| Error::Plan(e.to_string()))?,
        );
        if self.plans.len() > 256 {
            self.plans.clear();
        }
        self.plans.insert(key, p.clone());
        Ok(p)
    }

    fn next_desc(
        &mut self,
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
    ) -> CallDesc {
        self.seq += 1;
        CallDesc {
            seq: self.seq,
            kind,
            dtype,
            op,
            count: count as u64,
            root: root as u32,
            comm: self.comm,
        }
    }

    /// Run one planned collective on `work` (and `input` for all-to-all).
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &mut self,
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
        work: &mut [u8],
        input: &[u8],
    ) -> Result<()> {
        self.exec_from(kind, dtype, op, count, root, work, input, None)
    }

    /// [`Inner::exec`] for an out-of-place call whose work buffer starts as a copy of `src`.
    #[allow(clippy::too_many_arguments)]
    fn exec_from(
        &mut self,
        kind: CollKind,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        root: usize,
        work: &mut [u8],
        input: &[u8],
        src: Option<&[u8]>,
    ) -> Result<()> {
        let desc = self.next_desc(kind, dtype, op, count, root);
        if self.size == 1 {
            if let Some(s) = src {
                work.copy_from_slice(s);
            }
            return Ok(());
        }
        // The last call's shape and plan: repeated calls skip both map lookups. (Pipelined
        // calls are not cached: they carry one plan per segment.)
        let cached = match &self.last {
            Some((k, c, e, r, p))
                if *k == kind && *c == count && *e == dtype.size() && *r == root =>
            {
                Some(p.clone())
            }
            _ => None,
        };
        let (plan, segs) = match cached {
            Some(p) => (p, Vec::new()),
            None => {
                let algo = self.algo(kind, count, dtype.size(), root);
                // A two-level all-reduce over several nodes, big enough: cut it into segments
                // and overlap each segment's network ring with the neighbours' in-node phases.
                let seg = self.cfg.pipeline_seg / dtype.size();
                let pipelined = kind == CollKind::AllReduce
                    && algo == Algo::TwoLevel
                    && self.layout.nodes.len() > 1
                    && self.layout.nodes.iter().all(|n| n.len() > 1)
                    && seg > 0
                    && count >= 2 * seg;
                if pipelined {
                    let k = count.div_ceil(seg);
                    let mut v = Vec::with_capacity(k);
                    for i in 0..k {
                        let (off, len) = railring_collectives::plan::split(count, k, i);
                        v.push((off, self.plan(kind, algo, len, root)?));
                    }
                    (v[0].1.clone(), v)
                } else {
                    let plan = self.plan(kind, algo, count, root)?;
                    self.last = Some((kind, count, dtype.size(), root, plan.clone()));
                    (plan, Vec::new())
                }
            }
        };
        let pipelined = !segs.is_empty();
        let mut ex = Executor {
            rank: self.rank,
            size: self.size,
            links: &mut self.links,
            fabric: self.fabric.as_deref_mut(),
            timeout: self.cfg.timeout,
            chunk: self.cfg.net_chunk,
            staging: &mut self.staging,
            mem: None,
        };
        let bufs = Bufs {
            work: work.as_mut_ptr(),
            work_bytes: work.len(),
            input: input.as_ptr(),
            input_bytes: input.len(),
            src: src.map(|s| s.as_ptr()),
        };
        // SAFETY: work, input and src are live slices of the stated lengths for the whole call.
        unsafe {
            if pipelined {
                ex.run_pipelined(&segs, &desc, op, bufs)
            } else {
                ex.run(&plan, &desc, op, bufs)
            }
        }
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::Invalid(format!(
                "root {root} is not a rank of this communicator of {} ranks",
                self.size
            )));
        }
        Ok(())
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        self.all_reduce_from(buf, None, dtype, op)
    }

    fn all_reduce_from(
        &mut self,
        buf: &mut [u8],
        src: Option<&[u8]>,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buf.len() / dtype.size();
        if src.is_some_and(|s| s.len() != buf.len()) {
            return Err(Error::Invalid(
                "all_reduce: input and output lengths differ".into(),
            ));
        }
        self.exec_from(CollKind::AllReduce, dtype, op, count, 0, buf, &[], src)?;
        if op == ReduceOp::Avg {
            kernels::finish_avg(dtype, buf, self.size);
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
        let esz = dtype.size();
        if !buf.len().is_multiple_of(esz * self.size) {
            return Err(Error::Invalid(format!(
                "reduce_scatter: {} elements are not {} equal blocks",
                buf.len() / esz,
                self.size
            )));
        }
        let count = buf.len() / esz / self.size;
        self.exec(CollKind::ReduceScatter, dtype, op, count, 0, buf, &[])?;
        if op == ReduceOp::Avg {
            let b = count * esz;
            kernels::finish_avg(
                dtype,
                &mut buf[self.rank * b..(self.rank + 1) * b],
                self.size,
            );
        }
        Ok(())
    }

    fn all_gather(&mut self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        let esz = dtype.size();
        if !buf.len().is_multiple_of(esz * self.size) {
            return Err(Error::Invalid(format!(
                "all_gather: {} elements are not {} equal blocks",
                buf.len() / esz,
                self.size
            )));
        }
        let count = buf.len() / esz / self.size;
        self.exec(
            CollKind::AllGather,
            dtype,
            ReduceOp::Sum,
            count,
            0,
            buf,
            &[],
        )
    }

    fn broadcast(&mut self, buf: &mut [u8], dtype: DataType, root: usize) -> Result<()> {
        self.check_root(root)?;
        let count = buf.len() / dtype.size();
        self.exec(
            CollKind::Broadcast,
            dtype,
            ReduceOp::Sum,
            count,
            root,
            buf,
            &[],
        )
    }

    fn reduce(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp, root: usize) -> Result<()> {
        self.check_root(root)?;
        let count = buf.len() / dtype.size();
        self.exec(CollKind::Reduce, dtype, op, count, root, buf, &[])?;
        if op == ReduceOp::Avg && self.rank == root {
            kernels::finish_avg(dtype, buf, self.size);
        }
        Ok(())
    }

    fn all_to_all(&mut self, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
        let count = input.len() / dtype.size() / self.size;
        if self.size == 1 {
            output.copy_from_slice(input);
            self.next_desc(CollKind::AllToAll, dtype, ReduceOp::Sum, count, 0);
            return Ok(());
        }
        self.exec(
            CollKind::AllToAll,
            dtype,
            ReduceOp::Sum,
            count,
            0,
            output,
            input,
        )
    }

    fn barrier(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        self.exec(
            CollKind::Barrier,
            DataType::U8,
            ReduceOp::Max,
            1,
            0,
            &mut b,
            &[],
        )
    }

    fn p2p(
        &mut self,
        send: Option<(&[u8], usize)>,
        recv: Option<(&mut [u8], usize)>,
        dtype: DataType,
    ) -> Result<()> {
        for p in send
            .as_ref()
            .map(|s| s.1)
            .into_iter()
            .chain(recv.as_ref().map(|r| r.1))
        {
            if p >= self.size {
                return Err(Error::Invalid(format!(
                    "peer {p} is not a rank of this communicator of {} ranks",
                    self.size
                )));
            }
        }
        let esz = dtype.size();
        // Each direction carries its own descriptor: sequence numbers count sends per peer.
        if let Some((buf, peer)) = send {
            let n = buf.len() / esz;
            let s = self.p2p_send.entry(peer).or_insert(0);
            *s += 1;
            let desc = CallDesc {
                seq: *s,
                kind: CollKind::SendRecv,
                dtype,
                op: ReduceOp::Sum,
                count: n as u64,
                root: self.rank as u32,
                comm: self.comm,
            };
            let (rdesc, rbuf) = match recv {
                Some((rb, src)) => {
                    let r = self.p2p_recv.entry(src).or_insert(0);
                    *r += 1;
                    (
                        Some((
                            CallDesc {
                                seq: *r,
                                kind: CollKind::SendRecv,
                                dtype,
                                op: ReduceOp::Sum,
                                count: (rb.len() / esz) as u64,
                                root: src as u32,
                                comm: self.comm,
                            },
                            src,
                        )),
                        Some(rb),
                    )
                }
                None => (None, None),
            };
            return self.p2p_exec(Some((buf, peer, desc)), rbuf.zip(rdesc), esz);
        }
        if let Some((rb, src)) = recv {
            let r = self.p2p_recv.entry(src).or_insert(0);
            *r += 1;
            let d = CallDesc {
                seq: *r,
                kind: CollKind::SendRecv,
                dtype,
                op: ReduceOp::Sum,
                count: (rb.len() / esz) as u64,
                root: src as u32,
                comm: self.comm,
            };
            return self.p2p_exec(None, Some((rb, (d, src))), esz);
        }
        Ok(())
    }

    /// Point-to-point: a sender's descriptor names itself as "root"; the receiver expects the
    /// sender's rank there, so the descriptors of a matching send and receive are equal.
    fn p2p_exec(
        &mut self,
        send: Option<(&[u8], usize, CallDesc)>,
        recv: Option<(&mut [u8], (CallDesc, usize))>,
        _esz: usize,
    ) -> Result<()> {
        if self.size == 1
            || send.as_ref().is_some_and(|s| s.1 == self.rank)
            || recv.as_ref().is_some_and(|r| r.1 .1 == self.rank)
        {
            // Self-send: copy directly.
            if let (Some((s, sp, _)), Some((r, (_, rp)))) = (&send, &recv) {
                if *sp == self.rank && *rp == self.rank && s.len() == r.len() {
                    let r: &mut [u8] =
                        unsafe { std::slice::from_raw_parts_mut(r.as_ptr() as *mut u8, r.len()) };
                    r.copy_from_slice(s);
                    return Ok(());
                }
            }
            return Err(Error::Invalid(
                "send/recv to self needs a matching send_recv on the same call".into(),
            ));
        }
        let mut ex = Executor {
            rank: self.rank,
            size: self.size,
            links: &mut self.links,
            fabric: None,
            timeout: self.cfg.timeout,
            chunk: self.cfg.net_chunk,
            staging: &mut self.staging,
            mem: None,
        };
        // SAFETY: the slices outlive the call.
        unsafe {
            ex.p2p(
                send.map(|(b, p, d)| (b.as_ptr(), b.len(), p, d)),
                recv.map(|(b, (d, p))| (b.as_mut_ptr(), b.len(), p, d)),
            )
        }
    }

    fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.split_seq += 1;
        let seq = self.split_seq;
        let Some(store) = self.store.clone() else {
            // A world of one: the only member.
            return Ok(color.and_then(|_| {
                let c = Communicator::alone(self.cfg.clone());
                c.ok()
            }));
        };
        let me = format!("{},{key}", color.map(|c| c as i64).unwrap_or(-1));
        let base = format!("c{:x}/split/{seq}", self.comm);
        store.set(&format!("{base}/{}", self.rank), me.as_bytes())?;
        if self.rank == 0 {
            let keys: Vec<String> = (0..self.size).map(|r| format!("{base}/{r}")).collect();
            store.wait(&keys, self.cfg.timeout)?;
            let mut all = Vec::new();
            for k in &keys {
                all.push(String::from_utf8_lossy(&store.get(k, self.cfg.timeout)?).into_owned());
            }
            store.set(&format!("{base}/all"), all.join(";").as_bytes())?;
        }
        let all = String::from_utf8_lossy(&store.get(&format!("{base}/all"), self.cfg.timeout)?)
            .into_owned();
        let mut entries = Vec::new();
        for (r, e) in all.split(';').enumerate() {
            let (c, k) = e
                .split_once(',')
                .ok_or_else(|| Error::Invalid("malformed split record".into()))?;
            let c: i64 = c
                .parse()
                .map_err(|_| Error::Invalid("malformed split color".into()))?;
            let k: i64 = k
                .parse()
                .map_err(|_| Error::Invalid("malformed split key".into()))?;
            entries.push((r, c, k));
        }
        if entries.len() != self.size {
            return Err(Error::Invalid("split: wrong number of records".into()));
        }
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> = entries
            .iter()
            .filter(|e| e.1 == color as i64)
            .map(|e| (e.2, e.0))
            .collect();
        members.sort();
        let members: Vec<usize> = members.into_iter().map(|m| m.1).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::Invalid("split: self missing".into()))?;
        let comm = fnv(&[
            &self.comm.to_le_bytes(),
            &seq.to_le_bytes(),
            &color.to_le_bytes(),
        ]) | 1;
        let c = Communicator::build(
            new_rank,
            members,
            comm,
            self.job.clone(),
            self.peers.clone(),
            Some(store),
            self.net.clone(),
            self.cfg.clone(),
            Some(self.rail),
        )?;
        Ok(Some(c))
    }
}

// Device collectives (comm_cuda.rs) reach the communicator through this child module.
#[cfg(feature = "cuda")]
#[path = "comm_cuda_hook.rs"]
pub(crate) mod cuda_hook;
