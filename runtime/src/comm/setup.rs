//! Making communicators: [`Communicator::init`] from the launch (railrun, Slurm, torchrun-style
//! env, MPI with the `mpi` feature, or alone), the world gathered through the store, this
//! process's binding and rail, the node's shared-memory segment, and `split`.

use super::call::{Inner, World};
use super::{Communicator, PeerInfo, Shared};
use crate::bootstrap::{self, Launch, Rendezvous};
use crate::config::{Config, SingleCopy};
use crate::error::{Error, Result};
use crate::machine;
use crate::store::StoreClient;
use crate::transport::links::LinkTable;
use crate::transport::shm::{segment_path, Geometry, Node, ShmFabric};
use crate::transport::tcp::{discover_rails, TcpNet};
use crate::vars;
use railring_collectives::plan::Layout;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Limit on the world description read from the store.
const MAX_WORLD: usize = 1 << 20;

/// Log lines to stderr, coloured only when `cfg.log_color` says so (a terminal, no `NO_COLOR`;
/// railrun decides for its ranks): files and pipes get plain text.
fn init_logging(cfg: &Config) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(&cfg.log_filter))
            .with_ansi(cfg.log_color)
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
    /// Join the job this process was started in (see [`crate::bootstrap::launch`]): railrun's
    /// environment (`RAILRING_*`), a Slurm step, torchrun-style env, an MPI launcher (feature
    /// `mpi`), or a world of one when started alone.
    pub fn init() -> Result<Communicator> {
        let cfg = Config::from_env()?;
        init_logging(&cfg);
        match bootstrap::launch::from_process_env()? {
            Launch::Alone => Self::alone(cfg),
            #[cfg(feature = "mpi")]
            Launch::Mpi { source } => {
                // started by mpirun / mpiexec (see bootstrap::mpi)
                let timeout = cfg.connect_timeout;
                bootstrap::mpi::init_world(source, timeout, |rv| Self::from_rendezvous(rv, cfg))
            }
            launch => match bootstrap::join(launch, cfg.connect_timeout)? {
                Some(rv) => Self::from_rendezvous(rv, cfg),
                None => Self::alone(cfg),
            },
        }
    }

    /// A railring communicator over the ranks of an MPI communicator (usually
    /// `universe.world()`), in its rank order. Collective over `world`: every rank of it must
    /// call this. MPI only carries the bootstrap (see [`crate::bootstrap::mpi`]); collectives
    /// run on railring's own shared memory and TCP rails. The caller keeps MPI initialized for
    /// as long as it uses MPI itself; the returned communicator does not need MPI after this
    /// call.
    ///
    /// ```no_run
    /// let universe = mpi::initialize().expect("MPI already initialized");
    /// let comm = railring::Communicator::from_mpi(&universe.world())?;
    /// # Ok::<(), railring::Error>(())
    /// ```
    #[cfg(feature = "mpi")]
    pub fn from_mpi<C: mpi::topology::Communicator>(world: &C) -> Result<Communicator> {
        let cfg = Config::from_env()?;
        let rv = bootstrap::mpi::rendezvous_over(world, cfg.connect_timeout)?;
        Self::from_rendezvous(rv, cfg)
    }

    fn alone(cfg: Config) -> Result<Communicator> {
        let me = PeerInfo {
            rank: 0,
            host_id: machine::host_id(cfg.host_id.as_deref()),
            hostname: machine::hostname(),
            pid: std::process::id(),
            addrs: vec![],
            kernel: machine::kernel_id(),
            cpus: cpus(),
            cpu_list: cpu_list(),
        };
        let world = World {
            job: "solo".into(),
            peers: Arc::new(vec![me]),
            store: None,
            net: None,
            cfg,
        };
        Ok(Self::assemble(0, 0, Layout::single_node(1), 0, world, None))
    }

    /// Build the world communicator from a rendezvous: listen on the rails, publish this rank,
    /// learn everyone, bind, set up shared memory.
    pub fn from_rendezvous(rv: Rendezvous, cfg: Config) -> Result<Communicator> {
        let Rendezvous {
            rank,
            size,
            store,
            secret,
            job,
            server,
        } = rv;
        let rails = discover_rails(cfg.socket_ifname.as_deref()).map_err(|e| Error::Env {
            var: vars::SOCKET_IFNAME.into(),
            value: cfg.socket_ifname.clone().unwrap_or_default(),
            why: e.to_string(),
        })?;
        let net = TcpNet::start(rails, &secret).map_err(|e| Error::Transport {
            rank,
            what: "listening on rail interfaces".into(),
            err: e,
        })?;
        let me = PeerInfo {
            rank,
            host_id: machine::host_id(cfg.host_id.as_deref()),
            hostname: machine::hostname(),
            pid: std::process::id(),
            addrs: net.addrs.clone(),
            kernel: machine::kernel_id(),
            cpus: cpus(),
            cpu_list: cpu_list(),
        };
        let comm = 1u64;
        let peers = gather_world(&store, comm, &me, size, &cfg)?;
        note_kernel_sharing(&peers, rank);
        let world = World {
            job,
            peers: Arc::new(peers),
            store: Some(store),
            net: Some(net),
            cfg,
        };
        let c = Self::build(rank, (0..size).collect(), comm, world, None)?;
        c.lock().store_server = server;
        Ok(c)
    }

    /// Build a communicator over `members` (ranks of `world.peers`, in new-rank order);
    /// `parent_rail` for sub-communicators (they keep the process's binding and rail).
    fn build(
        rank: usize,
        members: Vec<usize>,
        comm: u64,
        world: World,
        parent_rail: Option<usize>,
    ) -> Result<Communicator> {
        let size = members.len();
        let peers: Vec<PeerInfo> = members
            .iter()
            .enumerate()
            .map(|(i, &pr)| {
                let mut p = world.peers[pr].clone();
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
        let net = world.net.as_deref();
        let rails = net.map(|n| n.rails.len()).unwrap_or(1).max(1);
        let rail = if comm == 1 {
            Self::bind(
                rank,
                local_rank,
                local.len(),
                cpu_union(local.iter().filter_map(|&r| world.peers.get(r))),
                net,
                &world.cfg,
            )
        } else {
            // sub-communicators keep the process's binding and rail
            parent_rail.unwrap_or(local_rank % rails)
        };
        let node = if local.len() > 1 {
            let store = world
                .store
                .as_ref()
                .ok_or_else(|| Error::Invalid("several local ranks but no store".into()))?;
            // Do this node's ranks share their kernel's CPUs with more ranks than it has? The
            // same answer on every local rank: worked out from what every rank published.
            let kernels: Vec<&str> = local.iter().map(|&r| peers[r].kernel.as_str()).collect();
            let crowded = kernels_crowded(&world.peers, &kernels);
            Some(Self::setup_shm(
                store,
                comm,
                &world.job,
                &local,
                local_rank,
                &nodes[node_index].0,
                &world.cfg,
                crowded,
            )?)
        } else {
            None
        };
        let world = World {
            peers: Arc::new(peers),
            ..world
        };
        // The cost model prices every rail of a node unless told otherwise: the rails every rank
        // listens on (the same number on every rank, so every rank chooses alike).
        let mut world = world;
        if !world.cfg.cost_local_alpha_given && any_kernel_oversubscribed(&world.peers) {
            // Ranks outnumber the CPUs of some machine (a node's own ranks, or nodes emulated
            // in namespaces of one kernel): every in-node round there waits for descheduled
            // peers. Decided from what every rank published, so every rank prices alike.
            world.cfg.cost.local.alpha = world
                .cfg
                .cost
                .local
                .alpha
                .max(crate::config::OVERSUBSCRIBED_LOCAL_ALPHA);
        }
        if !world.cfg.cost_rails_given {
            world.cfg.cost.rails = world
                .peers
                .iter()
                .map(|p| p.addrs.len())
                .min()
                .unwrap_or(1)
                .max(1);
        }
        let c = Self::assemble(rank, comm, layout, node_index, world, node);
        {
            let mut g = c.lock();
            g.rail = rail;
            let spread = rail_spread(rail, local.len(), rails, g.world.cfg.rails_per_rank);
            g.links.set_rails(rail, &spread);
            #[cfg(feature = "rdma")]
            if nodes.len() > 1 {
                let ib = crate::transport::rdma::select_net(rank, &g.world.cfg)?;
                g.links.set_rdma(ib);
            }
        }
        tracing::info!(target: "railring::init", rank, size, "node {node_index} local rank {local_rank}/{}, rail {rail}", local.len());
        Ok(c)
    }

    /// Bind this process (CPUs from the topology) and pick its rail: the NIC the topology chose
    /// for this local rank when every local rank's NIC is one of the rail interfaces, else local
    /// rank i -> rail i mod R. Topology problems are logged, never fatal.
    fn bind(
        rank: usize,
        local_rank: usize,
        local_size: usize,
        node_cpus: Option<Vec<usize>>,
        net: Option<&TcpNet>,
        cfg: &Config,
    ) -> usize {
        use crate::topology::apply_cpu_binding;
        let nrails = net.map(|n| n.rails.len()).unwrap_or(1).max(1);
        let fallback = local_rank % nrails;
        // railrun bound this process before exec to exactly what --report-bindings showed
        // (RAILRING_BOUND_CPUS, still the mask): with an explicit binding mode
        // (RAILRING_BIND_TO) that mask is kept as it is; by default the pinning below may still
        // narrow it (it says so).
        let by_railrun =
            crate::bootstrap::launch::railrun::bound_cpus(&crate::bootstrap::launch::process_env)
                .filter(|l| crate::topology::process_allowed_cpus().ok().as_ref() == Some(l));
        let bindings = cfg.topology().and_then(|t| {
            cfg.bind.options().and_then(|mut o| {
                // choose among the rail interfaces only
                o.nic_allow = net.map(|n| n.rails.iter().map(|r| r.ifname.clone()).collect());
                // Bound by railrun, this rank's own mask may be one core (`auto`): compute the
                // node's bindings over the CPUs its ranks share, as railrun did.
                if let (Some(_), Some(shared)) = (&by_railrun, &node_cpus) {
                    o.allowed_cpus = Some(shared.clone());
                }
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
        if let (Some(l), true) = (&by_railrun, cfg.bind.bind_to.is_some()) {
            tracing::info!(target: "railring::topo", rank, "CPUs {} as railrun bound this rank before exec ({}); kept", crate::topology::format_cpulist(l), crate::vars::BIND_TO);
        }
        let keep = by_railrun.is_some() && cfg.bind.bind_to.is_some();
        // More local ranks share this CPU set than it has CPUs (a 2-core laptop running 4
        // ranks): pin each to one CPU of the set, round-robin, so each core keeps the same
        // processes and waits hand the core straight to a peer instead of migrating it.
        let sharers: Vec<usize> = (0..bindings.len())
            .filter(|&i| bindings[i].cpus == me.cpus)
            .collect();
        let cpus = if keep {
            Vec::new()
        } else if let (Some((i, n)), false) = (crate::transport::kernel_slot(), me.cpus.is_empty())
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
            crate::topology::format_cpulist(by_railrun.as_ref().filter(|_| keep).unwrap_or(&me.cpus)),
            me.reason
        );
        rail
    }

    #[allow(clippy::too_many_arguments)]
    fn setup_shm(
        store: &StoreClient,
        comm: u64,
        job: &str,
        local: &[usize],
        me: usize,
        host_id: &str,
        cfg: &Config,
        crowded: Option<(usize, u32)>,
    ) -> Result<Arc<Node>> {
        let key = format!("{:x}", fnv(&[host_id.as_bytes()]));
        let geo = Geometry {
            local_size: local.len(),
            // the knob counts the data a slot holds; its header line comes on top, so the
            // default 1 MiB slot carries a whole 1 MiB chunk (2 MiB broadcast: 2 chunks, not 3)
            slot_bytes: ((cfg.shm_slot + 63) & !63) + crate::transport::shm::SLOT_LINE,
            ring_bytes: 256 << 10,
        };
        let rank = local[me];
        let shm_err = |what: &str, path: &std::path::Path, e: std::io::Error| Error::Shm {
            rank,
            what: format!("{what} {}", path.display()),
            err: e,
        };
        // The node's first rank picks the segment's name at random and tells the others
        // through the store (another user can neither predict nor take it first).
        let ready = format!("c{comm:x}/shm/{key}");
        let (node, path) = if me == 0 {
            let tag = crate::transport::shm::segment_tag().map_err(|e| Error::Shm {
                rank,
                what: "choosing a shared-memory segment name".into(),
                err: e,
            })?;
            let path = segment_path(job, comm, &key, &tag);
            let n = Node::open(&path, geo, local.to_vec(), me, machine::hostname(), true)
                .map_err(|e| shm_err("creating", &path, e))?;
            store.set(&ready, tag.as_bytes())?;
            (n, path)
        } else {
            let tag = await_rank(
                store,
                &ready,
                (rank, local[0]),
                cfg.timeout,
                "shared-memory setup",
            )?;
            if !crate::transport::shm::valid_tag(&tag) {
                return Err(Error::Shm {
                    rank,
                    what: "opening the node's shared-memory segment".into(),
                    err: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the store holds no valid segment name",
                    ),
                });
            }
            let path = segment_path(job, comm, &key, &String::from_utf8_lossy(&tag));
            let n = Node::open(&path, geo, local.to_vec(), me, machine::hostname(), false)
                .map_err(|e| shm_err("opening", &path, e))?;
            (n, path)
        };
        // The last rank to map the segment removes its name: nothing is left in /dev/shm.
        if store.add(&format!("c{comm:x}/shm-mapped/{key}"), 1)? == local.len() as i64 {
            let _ = std::fs::remove_file(&path);
        }
        if local.len() > 1 {
            Self::agree_single_copy(
                store,
                &format!("c{comm:x}/shm-read/{key}"),
                &node,
                cfg,
                crowded,
            )?;
        }
        Ok(node)
    }

    /// Agree with the node's other ranks whether each can read every other's memory
    /// (`process_vm_readv`; a seccomp filter, a ptrace restriction or separate PID namespaces
    /// forbid it): each publishes where its probe token lives, reads every peer's, and
    /// publishes its verdict; the fabric copies once only when every verdict is yes, so all
    /// local ranks take the same path. A rank told `RAILRING_SHM_SINGLE_COPY=off` still takes
    /// part (it says no), so ranks started with different settings agree too. All-to-all reads
    /// directly when the node is not `crowded` (more ranks on its kernel than CPUs, as
    /// published), when every rank was told `on`, or when the kernel copies fast
    /// ([`Self::agree_large_single`]; `fabric::SINGLE_COPY_ALLTOALL_MIN`).
    fn agree_single_copy(
        store: &StoreClient,
        base: &str,
        node: &Node,
        cfg: &Config,
        crowded: Option<(usize, u32)>,
    ) -> Result<()> {
        let (l, me) = (node.geo.local_size, node.me);
        let (pid, addr, token) = node.probe();
        store.set(
            &format!("{base}/probe/{me}"),
            format!("{pid} {addr:x} {token:x}").as_bytes(),
        )?;
        let wanted = cfg.shm_single_copy != SingleCopy::Off;
        let mut ok = wanted;
        for j in (0..l).filter(|&j| j != me && wanted) {
            let v = await_rank(
                store,
                &format!("{base}/probe/{j}"),
                (node.ranks[me], node.ranks[j]),
                cfg.timeout,
                "shared-memory setup (single-copy probe)",
            )?;
            let v = String::from_utf8_lossy(&v);
            let mut w = v.split_whitespace();
            let probe = (|| {
                let pid = w.next()?.parse::<u32>().ok()?;
                let addr = usize::from_str_radix(w.next()?, 16).ok()?;
                let token = u64::from_str_radix(w.next()?, 16).ok()?;
                Some((pid, addr, token))
            })();
            ok &= probe.is_some_and(|p| node.can_read(j, p));
        }
        // the verdict: 0 no, 1 yes, 2 yes and told `on`; the node goes by the least
        let verdict = match (ok, cfg.shm_single_copy) {
            (false, _) => 0u8,
            (true, SingleCopy::On) => 2,
            (true, _) => 1,
        };
        store.set(&format!("{base}/ok/{me}"), &[b'0' + verdict])?;
        let mut least = verdict;
        for j in (0..l).filter(|&j| j != me) {
            let v = match await_rank(
                store,
                &format!("{base}/ok/{j}"),
                (node.ranks[me], node.ranks[j]),
                cfg.timeout,
                "shared-memory setup (single-copy verdict)",
            )?
            .as_slice()
            {
                b"2" => 2,
                b"1" => 1,
                _ => 0,
            };
            least = least.min(v);
        }
        let all = least > 0;
        let is_crowded = crowded.is_some();
        // whether the kernel copies fast decides on two-rank nodes and on crowded ones not
        // told `on`
        let crowded = crowded.filter(|_| least < 2);
        let large = if all && (l == 2 || crowded.is_some()) {
            Self::agree_large_single(store, base, node, cfg)?
        } else {
            None
        };
        let fast = large.as_ref().is_some_and(|l| l.0);
        if all {
            // timed here, not in the first collective that copies between processes
            crate::transport::shm::kernel_skew_slow();
        }
        let staged_alltoall = crowded.filter(|_| !fast);
        node.set_single_copy(
            all,
            if staged_alltoall.is_some() {
                usize::MAX
            } else {
                crate::transport::shm::SINGLE_COPY_ALLTOALL_MIN
            },
            l == 2 && fast,
            is_crowded,
        );
        let verdict = if !all {
            if !wanted {
                "off (RAILRING_SHM_SINGLE_COPY=off)".to_string()
            } else if ok {
                "off (a peer cannot read its peers' memory, or was told not to)".to_string()
            } else {
                "off (this rank cannot read a peer's memory: process_vm_readv refused)".to_string()
            }
        } else {
            let mut v = "on".to_string();
            match (&large, crowded) {
                // crowded: the calibration decides the all-to-all
                (Some((on, why)), Some((n, c))) if l > 2 => {
                    v += &if *on {
                        format!(
                            ", all-to-all read directly though {n} ranks share {c} CPUs ({why})"
                        )
                    } else {
                        format!(", all-to-all staged ({n} ranks share {c} CPUs; {why})")
                    }
                }
                (Some((on, why)), _) => {
                    let what = if *on {
                        "every size"
                    } else {
                        "large blocks staged"
                    };
                    v += &format!(", {what} ({why})");
                }
                (None, _) => {}
            }
            v
        };
        tracing::info!(
            target: "railring::init",
            rank = node.ranks[me],
            "in-node single-copy reads (process_vm_readv): {verdict}"
        );
        Ok(())
    }

    /// On a node of two ranks that reads directly, agree whether blocks of every size are read
    /// directly (else from `fabric::SINGLE_COPY_PAIR_MAX` / `SINGLE_COPY_BROADCAST_MAX` /
    /// `SINGLE_COPY_ALLTOALL_MAX` up they stage); on a crowded node, whether the all-to-all
    /// reads directly (else it stages): each rank publishes its
    /// `RAILRING_SHM_SINGLE_COPY_LARGE`; the node's first rank decides — `off` if anyone said
    /// off, `on` if everyone said on, else as its measured kernel copy says
    /// (`shm::kernel_copy_ratio` under 1) — and publishes it with the reason, which every rank
    /// logs.
    fn agree_large_single(
        store: &StoreClient,
        base: &str,
        node: &Node,
        cfg: &Config,
    ) -> Result<Option<(bool, String)>> {
        let (l, me) = (node.geo.local_size, node.me);
        let want = match cfg.shm_single_copy_large {
            SingleCopy::Off => b'0',
            SingleCopy::Auto => b'1',
            SingleCopy::On => b'2',
        };
        store.set(&format!("{base}/large/{me}"), &[want])?;
        if me != 0 {
            let v = await_rank(
                store,
                &format!("{base}/large"),
                (node.ranks[me], node.ranks[0]),
                cfg.timeout,
                "shared-memory setup (large-copy decision)",
            )?;
            let v = String::from_utf8_lossy(&v);
            let (on, why) = v.split_once(' ').unwrap_or(("0", "no decision"));
            return Ok(Some((on == "1", why.to_string())));
        }
        let mut least = want;
        for j in 1..l {
            let v = await_rank(
                store,
                &format!("{base}/large/{j}"),
                (node.ranks[me], node.ranks[j]),
                cfg.timeout,
                "shared-memory setup (large-copy wish)",
            )?;
            least = least.min(*v.first().unwrap_or(&b'0'));
        }
        let (on, why) = match least {
            b'2' => (true, "RAILRING_SHM_SINGLE_COPY_LARGE=on".to_string()),
            b'1' => match crate::transport::shm::kernel_copy_ratio() {
                Some(r) => (
                    r < 1.0,
                    format!(
                        "a kernel copy takes {r:.2}x two memory copies here; \
                         RAILRING_SHM_SINGLE_COPY_LARGE=on|off overrides"
                    ),
                ),
                None => (false, "kernel copy refused".to_string()),
            },
            _ => (false, "RAILRING_SHM_SINGLE_COPY_LARGE=off".to_string()),
        };
        store.set(
            &format!("{base}/large"),
            format!("{} {why}", u8::from(on)).as_bytes(),
        )?;
        Ok(Some((on, why)))
    }

    /// The communicator of `rank` (ranks and nodes as `layout` says, this rank on node
    /// `node_index`; `world.peers` are this communicator's ranks) over this node's segment.
    fn assemble(
        rank: usize,
        comm: u64,
        layout: Layout,
        node_index: usize,
        world: World,
        node: Option<Arc<Node>>,
    ) -> Communicator {
        let size = world.peers.len();
        let local = layout
            .nodes
            .get(node_index)
            .cloned()
            .unwrap_or_else(|| vec![rank]);
        let local_rank = local.iter().position(|&r| r == rank).unwrap_or(0);
        let fabric = node.as_ref().map(|n| {
            Box::new(ShmFabric::new(n.clone(), world.cfg.timeout))
                as Box<dyn crate::transport::NodeFabric>
        });
        let links = LinkTable::new(
            rank,
            comm,
            &world.cfg,
            node.map(|n| (n, &local[..])),
            world.net.clone(),
            world.peers.clone(),
            world.store.clone(),
        );
        let nnodes = layout.nodes.len();
        let inner = Inner::new(rank, comm, layout, world, links, fabric);
        Communicator {
            sh: Arc::new(Shared {
                inner: super::bias::BiasedLock::new(inner),
                turn: Mutex::new(Default::default()),
                turn_cv: Condvar::new(),
                worker: Mutex::new(None),
                worker_started: std::sync::atomic::AtomicBool::new(false),
                #[cfg(test)]
                hold_worker: Default::default(),
                rank,
                size,
                local_rank,
                local_size: local.len(),
                node: node_index,
                nnodes,
            }),
        }
    }
}

/// Read the store key that rank `peer` of this communicator publishes, as rank `me`
/// (`(me, peer)`); see [`stalled_on`].
fn await_rank(
    store: &StoreClient,
    key: &str,
    (me, peer): (usize, usize),
    timeout: Duration,
    what: &str,
) -> Result<Vec<u8>> {
    store
        .get(key, timeout)
        .map_err(|e| stalled_on(e, (store, &[], peer), (me, timeout), what))
}

/// A store wait of rank `me` for `keys` (key i published by rank i of this communicator; none:
/// one key, `fallback`'s) that timed out: the ranks that never published theirs (stopped,
/// hung, busy elsewhere; `fallback` when every key is there by now) are named as a stalled
/// collective names them — `no progress for N s (RAILRING_TIMEOUT) while waiting for rank(s)
/// [..] in what` — not as store keys. Other store errors pass through.
fn stalled_on(
    e: crate::store::StoreError,
    (store, keys, fallback): (&StoreClient, &[String], usize),
    (me, timeout): (usize, Duration),
    what: &str,
) -> Error {
    if !matches!(e, crate::store::StoreError::Timeout { .. }) {
        return e.into();
    }
    let mut waiting: Vec<usize> = if keys.is_empty() {
        Vec::new()
    } else {
        store
            .check(keys)
            .map(|have| (0..have.len()).filter(|&r| !have[r]).collect())
            .unwrap_or_default()
    };
    if waiting.is_empty() {
        waiting.push(fallback);
    }
    Error::Timeout {
        rank: me,
        secs: timeout.as_secs(),
        waiting,
        what: what.into(),
    }
}

/// Publish this rank's [`PeerInfo`] and read everyone's: rank 0 gathers them into one `world`
/// record in the store, every rank reads that.
fn gather_world(
    store: &StoreClient,
    comm: u64,
    me: &PeerInfo,
    size: usize,
    cfg: &Config,
) -> Result<Vec<PeerInfo>> {
    let rank = me.rank;
    let js = serde_json::to_vec(me).map_err(|e| Error::Invalid(e.to_string()))?;
    store.set(&format!("c{comm:x}/info/{rank}"), &js)?;
    let world_key = format!("c{comm:x}/world");
    if rank == 0 {
        let keys: Vec<String> = (0..size).map(|r| format!("c{comm:x}/info/{r}")).collect();
        store.wait(&keys, cfg.timeout).map_err(|e| {
            stalled_on(
                e,
                (store, &keys, 0),
                (rank, cfg.timeout),
                "start-up (every rank publishing its address)",
            )
        })?;
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
    let world = await_rank(
        store,
        &world_key,
        (rank, 0),
        cfg.timeout,
        "start-up (rank 0 gathering every rank's address)",
    )?;
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
    Ok(peers)
}

/// The CPUs this process may run on.
fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// The CPUs this process may run on, as a CPU list (empty if unknown).
fn cpu_list() -> String {
    crate::topology::process_allowed_cpus()
        .map(|c| crate::topology::format_cpulist(&c))
        .unwrap_or_default()
}

/// Longest CPU list a peer's report may carry (a longer one counts as not reported).
const MAX_CPU_LIST: usize = 4096;

/// The CPUs a peer reported (`None`: no list, too long, or not a CPU list).
fn reported_cpus(p: &PeerInfo) -> Option<Vec<usize>> {
    Some(p.cpu_list.as_str())
        .filter(|l| !l.is_empty() && l.len() <= MAX_CPU_LIST)
        .and_then(|l| crate::topology::parse_cpulist(l).ok())
}

/// The union of the CPU lists these ranks reported, where every one of them did.
fn cpu_union<'a>(peers: impl IntoIterator<Item = &'a PeerInfo>) -> Option<Vec<usize>> {
    let mut u = std::collections::BTreeSet::new();
    for p in peers {
        u.extend(reported_cpus(p)?);
    }
    (!u.is_empty()).then(|| u.into_iter().collect())
}

/// Per machine (kernel): how many of these ranks run there and how many CPUs they share —
/// the union of the CPU lists they reported where every one of them did (ranks bound to a core
/// each still share the machine's), else the fewest CPUs one of them reported (ranks that did
/// not report a kernel are left out).
fn kernel_load(peers: &[PeerInfo]) -> std::collections::BTreeMap<&str, (usize, u32)> {
    let mut by: std::collections::BTreeMap<&str, Vec<&PeerInfo>> = Default::default();
    for p in peers.iter().filter(|p| !p.kernel.is_empty()) {
        by.entry(p.kernel.as_str()).or_default().push(p);
    }
    by.into_iter()
        .map(|(k, ps)| {
            let least = ps.iter().map(|p| p.cpus).min().unwrap_or(u32::MAX);
            let c = cpu_union(ps.iter().copied())
                .map_or(least, |u| u32::try_from(u.len()).unwrap_or(u32::MAX));
            (k, (ps.len(), c))
        })
        .collect()
}

/// (ranks, CPUs) of a machine that runs more ranks than it has CPUs.
fn crowded((n, c): (usize, u32)) -> Option<(usize, u32)> {
    (c > 0 && c != u32::MAX && n > c as usize).then_some((n, c))
}

/// Whether some machine (kernel) runs more of these ranks than it has CPUs (as its ranks
/// reported them; a kernel whose ranks did not report CPUs counts as not oversubscribed).
fn any_kernel_oversubscribed(peers: &[PeerInfo]) -> bool {
    kernel_load(peers)
        .into_values()
        .any(|l| crowded(l).is_some())
}

/// (ranks, CPUs) of the first of `kernels` (a node's ranks' machines) that runs more of
/// `peers` than it has CPUs: the same answer on every rank that passes the same lists.
fn kernels_crowded(peers: &[PeerInfo], kernels: &[&str]) -> Option<(usize, u32)> {
    let load = kernel_load(peers);
    kernels
        .iter()
        .find_map(|k| load.get(k).copied().and_then(crowded))
}

/// Ranks on this kernel share its CPUs even when they are different "nodes" (network
/// namespaces, containers): more of them than CPUs means waits must yield, not spin, and when
/// several nodes share the kernel each gets its own block of CPUs (see `bind`).
fn note_kernel_sharing(peers: &[PeerInfo], rank: usize) {
    // the CPUs this kernel's ranks share (not this rank's own: railrun may have bound it to one)
    let cpus = kernel_load(peers)
        .get(peers[rank].kernel.as_str())
        .map(|l| l.1 as usize)
        .filter(|&c| c > 0 && c != u32::MAX as usize)
        .unwrap_or(cpus() as usize);
    crate::transport::set_kernel_cpus(cpus);
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
}

impl Inner {
    /// `Communicator::split` on this rank: agree on every rank's (color, key) through the store,
    /// then build the new communicator of this rank's color.
    pub(super) fn split(&mut self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.split_seq += 1;
        let seq = self.split_seq;
        let Some(store) = self.world.store.clone() else {
            // A world of one: the only member.
            return Ok(color.and_then(|_| {
                let c = Communicator::alone(self.world.cfg.clone());
                c.ok()
            }));
        };
        let me = format!("{},{key}", color.map(|c| c as i64).unwrap_or(-1));
        let base = format!("c{:x}/split/{seq}", self.comm);
        let keys: Vec<String> = (0..self.size).map(|r| format!("{base}/{r}")).collect();
        let timeout = self.world.cfg.timeout;
        // a rank that never comes to the split (stopped, hung) is named as a stalled collective
        // names it, not as a store key; everyone arrived: rank 0 never published the records
        let stalled = |e| stalled_on(e, (store.as_ref(), &keys, 0), (self.rank, timeout), "split");
        store.set(&keys[self.rank], me.as_bytes())?;
        if self.rank == 0 {
            store.wait(&keys, timeout).map_err(stalled)?;
            let mut all = Vec::new();
            for k in &keys {
                all.push(String::from_utf8_lossy(&store.get(k, timeout)?).into_owned());
            }
            store.set(&format!("{base}/all"), all.join(";").as_bytes())?;
        }
        let all = String::from_utf8_lossy(
            &store
                .get(&format!("{base}/all"), timeout)
                .map_err(stalled)?,
        )
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
        let c = Communicator::build(new_rank, members, comm, self.world.clone(), Some(self.rail))?;
        Ok(Some(c))
    }
}

/// The rails a rank on rail `rail` drives, with `local` ranks on its node and `rails` TCP rails:
/// `per` rails (`RAILRING_RAILS_PER_RANK`; 0: `rails / local` when that is more than 1, else 1),
/// `rail`, `rail + local`, `rail + 2 local`, ... (mod `rails`), so the node's ranks share its
/// rails without overlap when `local` divides `rails`.
pub(crate) fn rail_spread(rail: usize, local: usize, rails: usize, per: usize) -> Vec<usize> {
    let local = local.max(1);
    let rails = rails.max(1);
    let per = if per == 0 {
        (rails / local).max(1)
    } else {
        per
    };
    let mut v = Vec::new();
    for j in 0..per.min(rails) {
        let r = (rail + j * local) % rails;
        if !v.contains(&r) {
            v.push(r);
        }
    }
    v
}

#[cfg(test)]
mod spread_tests {
    use super::rail_spread;

    #[test]
    fn rails_are_shared_out_when_ranks_are_fewer() {
        // one rank, two rails: both; two ranks, two rails: one each
        assert_eq!(rail_spread(0, 1, 2, 0), vec![0, 1]);
        assert_eq!(rail_spread(1, 2, 2, 0), vec![1]);
        // two ranks, four rails: 0,2 and 1,3
        assert_eq!(rail_spread(0, 2, 4, 0), vec![0, 2]);
        assert_eq!(rail_spread(1, 2, 4, 0), vec![1, 3]);
        // three ranks, four rails: one each (no rail driven twice by one rank)
        assert_eq!(rail_spread(2, 3, 4, 0), vec![2]);
        // forced: one rail per rank, or more than there are
        assert_eq!(rail_spread(1, 1, 4, 1), vec![1]);
        assert_eq!(rail_spread(3, 1, 2, 8), vec![1, 0]);
        assert_eq!(rail_spread(0, 4, 1, 0), vec![0]);
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::*;

    fn peer(rank: usize, kernel: &str, cpus: u32) -> PeerInfo {
        PeerInfo {
            rank,
            host_id: format!("h{rank}"),
            hostname: format!("h{rank}"),
            pid: 1,
            addrs: vec![],
            kernel: kernel.into(),
            cpus,
            cpu_list: String::new(),
        }
    }

    #[test]
    fn a_kernel_with_more_ranks_than_cpus_is_seen_alike_by_every_rank() {
        // four emulated hosts on one 2-CPU kernel
        let one: Vec<PeerInfo> = (0..4).map(|r| peer(r, "k", 2)).collect();
        assert!(any_kernel_oversubscribed(&one));
        // two real machines of 2 CPUs with 2 ranks each
        let two: Vec<PeerInfo> = (0..4).map(|r| peer(r, ["a", "b"][r / 2], 2)).collect();
        assert!(!any_kernel_oversubscribed(&two));
        // one of them with 3 ranks; ranks that did not report CPUs (older builds) never count
        let mut three = two.clone();
        three.push(peer(4, "a", 2));
        assert!(any_kernel_oversubscribed(&three));
        let unknown: Vec<PeerInfo> = (0..4).map(|r| peer(r, "k", 0)).collect();
        assert!(!any_kernel_oversubscribed(&unknown));
        // a node's view: only its own kernels count
        assert_eq!(kernels_crowded(&one, &["k"]), Some((4, 2)));
        assert_eq!(kernels_crowded(&three, &["a", "a", "a"]), Some((3, 2)));
        assert_eq!(kernels_crowded(&three, &["b", "b"]), None);
        assert_eq!(kernels_crowded(&unknown, &["k"]), None);
        assert_eq!(kernels_crowded(&one, &[""]), None);
    }

    #[test]
    fn ranks_bound_to_a_core_each_still_share_their_machines_cpus() {
        let with = |lists: &[&str]| -> Vec<PeerInfo> {
            lists
                .iter()
                .enumerate()
                .map(|(r, l)| {
                    let mut p = peer(r, "k", 1);
                    p.cpu_list = l.to_string();
                    p
                })
                .collect()
        };
        // 4 ranks bound one core each on a 2-CPU machine: crowded, 2 CPUs shared
        let four = with(&["0", "1", "0", "1"]);
        assert_eq!(kernels_crowded(&four, &["k"]), Some((4, 2)));
        // 4 ranks bound two cores each on an 8-CPU machine: not crowded
        let mut roomy = with(&["0-1", "2-3", "4-5", "6-7"]);
        for p in &mut roomy {
            p.cpus = 2;
        }
        assert!(!any_kernel_oversubscribed(&roomy));
        assert_eq!(kernel_load(&roomy)["k"], (4, 8));
        // one rank without a list (an older build): the fewest CPUs reported decides
        roomy[3].cpu_list.clear();
        assert_eq!(kernel_load(&roomy)["k"], (4, 2));
        // a list that does not parse counts as not reported
        roomy[3].cpu_list = "x".into();
        assert_eq!(kernel_load(&roomy)["k"], (4, 2));
        assert_eq!(cpu_union(&roomy), None);
        assert_eq!(cpu_union(&four), Some(vec![0, 1]));
        assert_eq!(cpu_union(&four[1..2]), Some(vec![1]));
        assert_eq!(cpu_union(&four[..0]), None);
    }
}

/// A rank that stops while a communicator is being set up (a split's new communicator on a
/// node of several ranks) is named as a stalled collective names it: the rank, the timeout and
/// who did not come, not a store key.
#[cfg(test)]
mod stall_tests {
    use super::{fnv, Communicator};
    use crate::config::Config;
    use crate::error::Error;
    use crate::store::{serve, Store, StoreClient};
    use crate::transport::shm::segment_path;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    fn setup_as(me: usize, job: &str) -> Error {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = serve(l, "k", Store::new()).unwrap();
        let store = StoreClient::connect(&h.addr.to_string(), "k", Duration::from_secs(2)).unwrap();
        let mut cfg = Config::from_env().unwrap();
        cfg.timeout = Duration::from_secs(1);
        let t = Instant::now();
        // comm ranks 4 and 6 share the node; the other one never comes
        let r = Communicator::setup_shm(&store, 0x77, job, &[4, 6], me, "h", &cfg, None);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // the leader's segment (its name is random): every file of this test's job
        let key = format!("{:x}", fnv(&[b"h"]));
        let prefix = segment_path(job, 0x77, &key, "");
        let prefix = prefix.file_name().unwrap().to_string_lossy().into_owned();
        for e in std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        r.err()
            .expect("set-up without the node's other rank must fail")
    }

    #[test]
    fn a_missing_node_leader_is_named() {
        let job = format!("stall-a-{}", std::process::id());
        let e = setup_as(1, &job);
        assert!(
            matches!(&e, Error::Timeout { rank: 6, secs: 1, waiting, .. } if waiting == &[4]),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("rank 6: no progress for 1 s (RAILRING_TIMEOUT) while waiting for rank(s) [4] in shared-memory setup"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_node_member_is_named() {
        let job = format!("stall-b-{}", std::process::id());
        let e = setup_as(0, &job);
        assert!(
            matches!(&e, Error::Timeout { rank: 4, secs: 1, waiting, .. } if waiting == &[6]),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("no progress for 1 s (RAILRING_TIMEOUT) while waiting for rank(s) [6]"),
            "{e}"
        );
    }
}
