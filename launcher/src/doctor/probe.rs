//! The rank side of `railrun doctor` (`railrun doctor --probe`, started by railrun like any
//! program): every rank of a node takes part in the in-node all-reduce; the node's first rank
//! takes the inventory (CPUs, NUMA, GPUs, every interface's state, speed, MTU and addresses
//! from sysfs), measures memory bandwidth and runs its share of the pairwise rail sweep. All
//! coordination goes through the job's bootstrap store (over railrun's SSH channel), never
//! over the rails being tested; node 0's leader assembles the report and prints it as
//! `RRDOCTOR ` lines that railrun's output directory hands to the launcher.

use super::report::{NicReport, NodeReport, Pair, Report};
use super::sweep;
use railring::store::StoreClient;
use railring::transport::tcp::IfFilter;
use railring::Communicator;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The prefix of the report lines rank 0 prints.
pub const LINE: &str = "RRDOCTOR ";
const WAIT: Duration = Duration::from_secs(600);

/// What the launcher tells the probes.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeOpts {
    pub duration: Duration,
    pub max_rounds: usize,
    /// The rail filter (NCCL grammar); `None`: every interface but loopback and virtual ones.
    pub ifname: Option<String>,
}

impl ProbeOpts {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--duration".into(),
            format!("{}", self.duration.as_secs_f64()),
            "--max-rounds".into(),
            self.max_rounds.to_string(),
        ];
        if let Some(f) = &self.ifname {
            v.push("--ifname".into());
            v.push(f.clone());
        }
        v
    }
    pub fn parse(args: &[String]) -> Result<ProbeOpts, String> {
        let mut o = ProbeOpts {
            duration: Duration::from_millis(400),
            max_rounds: 16,
            ifname: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut v = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--duration" => {
                    o.duration = Duration::from_secs_f64(
                        v()?.parse::<f64>()
                            .ok()
                            .filter(|s| (0.01..=60.0).contains(s))
                            .ok_or("--duration: 0.01 to 60 seconds")?,
                    )
                }
                "--max-rounds" => {
                    o.max_rounds = v()?.parse().map_err(|_| "--max-rounds: a number")?
                }
                "--ifname" => o.ifname = Some(v()?),
                x => return Err(format!("unknown probe argument {x:?}")),
            }
        }
        Ok(o)
    }
}

/// Run the probe; the exit code.
pub fn run(args: &[String]) -> i32 {
    match ProbeOpts::parse(args).and_then(|o| probe(&o)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("railrun doctor probe: {e}");
            1
        }
    }
}

fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn probe(o: &ProbeOpts) -> Result<(), String> {
    let cfg = railring::config::Config::from_env().map_err(err("configuration"))?;
    let launch = railring::bootstrap::launch::from_process_env().map_err(err("launch"))?;
    let rv = railring::bootstrap::join(launch, cfg.connect_timeout)
        .map_err(err("joining the job"))?
        .ok_or("not started by railrun (no job to join)")?;
    let store = rv.store.clone();
    let secret = rv.secret.as_bytes().to_vec();
    let comm = Communicator::from_rendezvous(rv, cfg).map_err(err("communicator"))?;
    let (node, nnodes) = (comm.node(), comm.nnodes());
    let (local, lsize) = (comm.local_rank(), comm.local_size());
    // every rank of the node: the in-node all-reduce
    let nc = comm
        .split(Some(node as u32), local as i64)
        .map_err(err("splitting by node"))?
        .ok_or("no node communicator")?;
    let allreduce = if lsize > 1 {
        Some(in_node_allreduce(&nc)?)
    } else {
        None
    };
    if local != 0 {
        return Ok(());
    }
    let filter = o.ifname.as_deref().map(IfFilter::parse);
    let mut me = inventory(node, filter.as_ref());
    me.allreduce_gbs = allreduce;
    me.local_ranks = lsize;
    me.mem_gbs = Some(mem_bandwidth());
    let leaders = Leaders {
        store: &store,
        n: nnodes,
        me: node,
    };
    // listen on every rail address, publish them with the inventory
    let mut mine: BTreeMap<String, (Ipv4Addr, SocketAddr)> = BTreeMap::new();
    for nic in me.nics.iter().filter(|n| n.rail) {
        if let Some(ip) = nic
            .addrs
            .first()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<Ipv4Addr>().ok())
        {
            let addr = sweep::listen(ip, secret.clone())
                .map_err(err(&format!("listening on {} ({ip})", nic.name)))?;
            mine.insert(nic.name.clone(), (ip, addr));
        }
    }
    let addrs: BTreeMap<String, String> = mine
        .iter()
        .map(|(k, v)| (k.clone(), v.1.to_string()))
        .collect();
    leaders.publish(
        "inv",
        &serde_json::to_string(&(&me, &addrs)).map_err(err("json"))?,
    )?;
    let all: Vec<(NodeReport, BTreeMap<String, String>)> = leaders
        .gather("inv")?
        .iter()
        .map(|s| serde_json::from_str(s).map_err(err("a node's inventory")))
        .collect::<Result<_, _>>()?;
    let mut rails: Vec<String> = all
        .iter()
        .flat_map(|(n, _)| n.nics.iter().filter(|x| x.rail).map(|x| x.name.clone()))
        .collect();
    rails.sort();
    rails.dedup();
    // the sweep: rail by rail, round by round, every leader at once
    let shifts = sweep::shifts(nnodes, o.max_rounds);
    let t0 = Instant::now();
    let mut pairs = Vec::new();
    for rail in &rails {
        for (k, s) in shifts.iter().enumerate() {
            leaders.barrier(&format!("{rail}/{k}"))?;
            let to = (node + s) % nnodes;
            let target = all[to].1.get(rail);
            let r = match (mine.get(rail), target) {
                (None, _) => Err(format!("{} has no IPv4 address on {rail}", me.host)),
                (_, None) => Err(format!("{} has no IPv4 address on {rail}", all[to].0.host)),
                (Some((ip, _)), Some(t)) => match t.parse::<SocketAddr>() {
                    Ok(t) => sweep::test(*ip, t, &secret, o.duration),
                    Err(e) => Err(format!("bad address {t}: {e}")),
                },
            };
            pairs.push(match r {
                Ok((bps, lat)) => Pair {
                    rail: rail.clone(),
                    from: node,
                    to,
                    bps: Some(bps),
                    lat_us: Some(lat),
                    error: None,
                },
                Err(e) => Pair {
                    rail: rail.clone(),
                    from: node,
                    to,
                    bps: None,
                    lat_us: None,
                    error: Some(e),
                },
            });
        }
    }
    let sweep_s = t0.elapsed().as_secs_f64();
    // nobody leaves while a peer may still be sending to its listener
    leaders.barrier("end")?;
    leaders.publish(
        "pairs",
        &serde_json::to_string(&pairs).map_err(err("json"))?,
    )?;
    if node != 0 {
        return Ok(());
    }
    let mut report = Report {
        nodes: all.into_iter().map(|(n, _)| n).collect(),
        rails,
        ppn: lsize,
        duration_s: o.duration.as_secs_f64(),
        shifts,
        sweep_s,
        ..Default::default()
    };
    for s in leaders.gather("pairs")? {
        let p: Vec<Pair> = serde_json::from_str(&s).map_err(err("a node's results"))?;
        report.pairs.extend(p);
    }
    let js = serde_json::to_string(&report).map_err(err("json"))?;
    let mut out = String::new();
    for c in js.as_bytes().chunks(3000) {
        out.push_str(LINE);
        out.push_str(&String::from_utf8_lossy(c));
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// The node leaders' meeting points in the store.
struct Leaders<'a> {
    store: &'a Arc<StoreClient>,
    n: usize,
    me: usize,
}

impl Leaders<'_> {
    fn publish(&self, what: &str, v: &str) -> Result<(), String> {
        self.store
            .set(&format!("doctor/{what}/{}", self.me), v.as_bytes())
            .map_err(err("store"))
    }
    fn gather(&self, what: &str) -> Result<Vec<String>, String> {
        let keys: Vec<String> = (0..self.n).map(|i| format!("doctor/{what}/{i}")).collect();
        self.store.wait(&keys, WAIT).map_err(err("store"))?;
        keys.iter()
            .map(|k| {
                self.store
                    .get(k, WAIT)
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .map_err(err("store"))
            })
            .collect()
    }
    fn barrier(&self, name: &str) -> Result<(), String> {
        self.publish(&format!("bar/{name}"), "")?;
        let keys: Vec<String> = (0..self.n)
            .map(|i| format!("doctor/bar/{name}/{i}"))
            .collect();
        self.store.wait(&keys, WAIT).map_err(err("store"))
    }
}

/// Bus bandwidth of an all-reduce of 4 MiB over the node's ranks (GB/s).
fn in_node_allreduce(nc: &Communicator) -> Result<f64, String> {
    let n = nc.size() as f64;
    let mut b = vec![1.0f32; 1 << 20];
    nc.all_reduce(&mut b, railring::ReduceOp::Sum)
        .map_err(err("in-node all-reduce"))?;
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        nc.all_reduce(&mut b, railring::ReduceOp::Sum)
            .map_err(err("in-node all-reduce"))?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((4 << 20) as f64 * 2.0 * (n - 1.0) / n / best / 1e9)
}

/// Copy bandwidth of one core over 64 MiB (read + write bytes, GB/s), best of four.
fn mem_bandwidth() -> f64 {
    let n = 64 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * n as f64 / best / 1e9
}

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// This node's inventory (every interface but loopback; `filter` says which carry rails).
pub fn inventory(node: usize, filter: Option<&IfFilter>) -> NodeReport {
    let topo = railring::topology::Topology::discover_from(None).ok();
    // the machine's CPUs, not this process's affinity (railrun binds ranks)
    let cpus = topo
        .as_ref()
        .map(|t| t.numa_nodes.iter().map(|n| n.cpus.len()).sum::<usize>())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    let cpu_model = read("/proc/cpuinfo")
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    let mut addrs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Ok(ifs) = nix::ifaddrs::getifaddrs() {
        for ifa in ifs {
            let Some(ip) = ifa
                .address
                .as_ref()
                .and_then(|a| a.as_sockaddr_in().map(|s| s.ip()))
            else {
                continue;
            };
            let prefix = ifa
                .netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in().map(|s| u32::from(s.ip()).count_ones()))
                .unwrap_or(32);
            addrs
                .entry(ifa.interface_name.clone())
                .or_default()
                .push(format!("{ip}/{prefix}"));
        }
    }
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let nics = names
        .into_iter()
        .filter(|n| n != "lo")
        .map(|name| {
            let base = format!("/sys/class/net/{name}");
            let rail = match filter {
                Some(f) => f.matches(&name),
                None => !["docker", "virbr", "veth", "br-", "cni", "flannel", "cali"]
                    .iter()
                    .any(|p| name.starts_with(p)),
            };
            NicReport {
                rail,
                state: read(&format!("{base}/operstate")).unwrap_or_else(|| "unknown".into()),
                speed_mbps: read(&format!("{base}/speed")).and_then(|s| s.parse().ok()),
                mtu: read(&format!("{base}/mtu")).and_then(|s| s.parse().ok()),
                addrs: addrs.get(&name).cloned().unwrap_or_default(),
                name,
            }
        })
        .collect();
    NodeReport {
        node,
        host: railring::machine::hostname(),
        kernel: railring::machine::kernel_id(),
        cpus,
        cpu_model,
        numa_nodes: topo
            .as_ref()
            .map(|t| t.numa_nodes.len())
            .unwrap_or(1)
            .max(1),
        gpus: topo
            .as_ref()
            .map(|t| {
                t.gpus
                    .iter()
                    .map(|g| {
                        g.model
                            .clone()
                            .unwrap_or_else(|| format!("GPU {}", g.index))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        nics,
        ..Default::default()
    }
}
