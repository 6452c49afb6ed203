//! Choosing the network: RDMA or TCP (`RAILRING_NET`, `RAILRING_IB_HCA`), pure over an
//! injected verbs probe so tests need no hardware; the communicator's hooks ([`select_net`],
//! [`link_for`]); and whether device memory may go to the NIC directly (GPUDirect RDMA, from the
//! GPU–NIC path class).

use super::hca::{HcaFilter, HcaPort};
use super::net::RdmaNet;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::StoreClient;
use crate::topology::PathClass;
use crate::transport::Link;
use std::io;
use std::sync::Arc;

/// `RAILRING_NET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetChoice {
    /// RDMA when a usable HCA exists, else TCP.
    Auto,
    /// RDMA requested: still falls back to TCP (with an INFO line) when no HCA is usable.
    Ib,
    /// TCP only.
    Socket,
}

impl NetChoice {
    pub fn parse(s: &str) -> Option<NetChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(NetChoice::Auto),
            "ib" | "rdma" | "verbs" => Some(NetChoice::Ib),
            "socket" | "tcp" => Some(NetChoice::Socket),
            _ => None,
        }
    }
}

/// What [`select_net_with`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetSelection {
    Ib(Vec<HcaPort>),
    /// TCP, and why (None when `RAILRING_NET=socket` asked for it).
    Socket(Option<String>),
}

/// Decide between RDMA and TCP. `probe` lists active HCA ports (an `Err` is what
/// `ibverbs::devices()` returns without RDMA support). Falling back logs one INFO line.
pub fn select_net_with(
    choice: NetChoice,
    filter: Option<&HcaFilter>,
    probe: impl FnOnce() -> io::Result<Vec<HcaPort>>,
) -> NetSelection {
    if choice == NetChoice::Socket {
        return NetSelection::Socket(None);
    }
    let why = match probe() {
        Err(e) => format!("no RDMA support ({e})"),
        Ok(all) if all.is_empty() => "no RDMA device with an active port".to_string(),
        Ok(all) => {
            let chosen: Vec<HcaPort> = all
                .iter()
                .filter(|h| filter.is_none_or(|f| f.matches(&h.device, h.port)))
                .cloned()
                .collect();
            if !chosen.is_empty() {
                return NetSelection::Ib(chosen);
            }
            format!(
                "RAILRING_IB_HCA={} matches none of {}",
                filter.map(|f| f.to_string()).unwrap_or_default(),
                all.iter()
                    .map(|h| format!("{}:{}", h.device, h.port))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    let asked = match choice {
        NetChoice::Ib => "RAILRING_NET=ib, but ",
        _ => "",
    };
    tracing::info!(target: "railring::net", "{asked}{why}: using TCP sockets");
    NetSelection::Socket(Some(why))
}

/// Parse `RAILRING_NET` / `RAILRING_IB_HCA` (as [`Config`] read them) and probe the machine.
/// Bad values are errors naming the variable; a missing device is not an error (TCP is
/// selected).
pub fn select_net_from(cfg: &Config) -> Result<NetSelection> {
    let var = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
    let choice = match var(&cfg.net) {
        None => NetChoice::Auto,
        Some(v) => NetChoice::parse(&v).ok_or_else(|| Error::Env {
            var: "RAILRING_NET".into(),
            value: v.clone(),
            why: "expected ib, socket or auto".into(),
        })?,
    };
    let filter = match var(&cfg.ib_hca) {
        None => None,
        Some(v) => Some(HcaFilter::parse(&v).map_err(|e| Error::Env {
            var: "RAILRING_IB_HCA".into(),
            value: v.clone(),
            why: e.to_string(),
        })?),
    };
    Ok(select_net_with(choice, filter.as_ref(), probe_hcas))
}

/// The hook for the communicator: `Ok(Some(net))` to use RDMA links between nodes, `Ok(None)`
/// for TCP. Opening the chosen devices failing also falls back to TCP with an INFO line. The
/// devices are opened once per process (sub-communicators share them); bad `RAILRING_NET` /
/// `RAILRING_IB_HCA` values are errors every time.
pub(crate) fn select_net(rank: usize, cfg: &Config) -> Result<Option<Arc<RdmaNet>>> {
    static NET: std::sync::Mutex<Option<Option<Arc<RdmaNet>>>> = std::sync::Mutex::new(None);
    let sel = select_net_from(cfg)?;
    let mut cached = NET.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = cached.as_ref() {
        return Ok(n.clone());
    }
    let net = match sel {
        NetSelection::Socket(_) => None,
        NetSelection::Ib(hcas) => match RdmaNet::open(&hcas, cfg.ib_gid_index) {
            Ok(n) => {
                tracing::info!(target: "railring::net", rank, "RDMA over {}", n.describe());
                Some(Arc::new(n))
            }
            Err(e) => {
                tracing::info!(target: "railring::net", rank, "opening RDMA devices failed ({e}): using TCP sockets");
                None
            }
        },
    };
    *cached = Some(net.clone());
    Ok(net)
}

/// The link `LinkTable::link` uses for a network peer when RDMA was selected (`Ok(None)`: use
/// TCP). Errors name the peer and channel.
pub(crate) fn link_for(
    net: Option<&Arc<RdmaNet>>,
    store: Option<&Arc<StoreClient>>,
    id: crate::transport::LinkId,
    rail: usize,
) -> Result<Option<Box<dyn Link>>> {
    let (Some(net), Some(store)) = (net, store) else {
        return Ok(None);
    };
    let l = net
        .link(store.clone(), id, rail)
        .map_err(|e| Error::Transport {
            rank: id.me,
            what: format!("RDMA link to rank {} (channel {})", id.peer, id.chan),
            err: e,
        })?;
    Ok(Some(Box::new(l)))
}

/// Active HCA ports on this machine, through `ibverbs::devices()`. Never panics: a device that
/// cannot be opened, or whose port 1 is not active, is skipped.
pub fn probe_hcas() -> io::Result<Vec<HcaPort>> {
    let list = ibverbs::devices()?;
    let mut out = Vec::new();
    for dev in list.iter() {
        let Some(name) = dev.name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        // ibverbs 0.9 opens port 1 and fails unless it is ACTIVE or ARMED.
        match dev.open() {
            Ok(_) => out.push(HcaPort {
                device: name,
                port: 1,
            }),
            Err(e) => {
                tracing::debug!(target: "railring::net", "RDMA device {name} skipped: {e}")
            }
        }
    }
    Ok(out)
}

/// Whether device memory may be registered with the NIC directly (GPUDirect RDMA): only when
/// the GPU and the NIC share a PCIe switch (PIX: one switch, PXB: several). Through the host
/// bridge or across CPUs it is slower than staging through host memory, or unsupported.
pub fn gpudirect_allowed(path: Option<PathClass>) -> bool {
    gpudirect_at(path, Some(PathClass::Pxb))
}

/// GPUDirect RDMA at `level` (`RAILRING_NET_GDR_LEVEL`, [`crate::config::parse_gdr_level`]) for a GPU–NIC `path` (`None`:
/// unknown, never; `X` / `NV#` are not GPU–NIC paths and never qualify either).
pub fn gpudirect_at(path: Option<PathClass>, level: Option<PathClass>) -> bool {
    match (path, level) {
        (Some(p), Some(l)) => p >= PathClass::Pix && p <= l,
        _ => false,
    }
}

/// The GPU–NIC path class from the topology (`None` when either device is unknown).
pub fn gpu_nic_path(
    topo: &crate::topology::Topology,
    gpu_busid: &str,
    nic_name: &str,
) -> Option<PathClass> {
    let norm = |s: &str| s.trim().to_ascii_lowercase();
    let g = topo.gpus.iter().position(|g| {
        g.busid.as_deref().is_some_and(|b| {
            norm(b).ends_with(&norm(gpu_busid)) || norm(gpu_busid).ends_with(&norm(b))
        })
    })?;
    let n = topo.nics.iter().position(|n| n.matches(nic_name))?;
    Some(topo.path_class(
        crate::topology::DeviceId::Gpu(g),
        crate::topology::DeviceId::Nic(n),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn port(d: &str) -> HcaPort {
        HcaPort {
            device: d.into(),
            port: 1,
        }
    }

    #[test]
    fn net_choice_parses() {
        assert_eq!(NetChoice::parse("IB"), Some(NetChoice::Ib));
        assert_eq!(NetChoice::parse(" socket "), Some(NetChoice::Socket));
        assert_eq!(NetChoice::parse("auto"), Some(NetChoice::Auto));
        assert_eq!(NetChoice::parse(""), Some(NetChoice::Auto));
        assert_eq!(NetChoice::parse("infiniband!"), None);
    }

    #[test]
    fn devices_error_selects_socket() {
        // what ibverbs::devices() returns on this machine (no RDMA kernel support)
        let enosys = || Err(io::Error::from_raw_os_error(38));
        for choice in [NetChoice::Auto, NetChoice::Ib] {
            match select_net_with(choice, None, enosys) {
                NetSelection::Socket(Some(why)) => {
                    assert!(why.contains("no RDMA support"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn no_devices_selects_socket() {
        match select_net_with(NetChoice::Ib, None, || Ok(vec![])) {
            NetSelection::Socket(Some(why)) => assert!(why.contains("no RDMA device")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn socket_choice_never_probes() {
        let probed = RefCell::new(false);
        let r = select_net_with(NetChoice::Socket, None, || {
            *probed.borrow_mut() = true;
            Ok(vec![port("mlx5_0")])
        });
        assert_eq!(r, NetSelection::Socket(None));
        assert!(!*probed.borrow());
    }

    #[test]
    fn devices_are_filtered() {
        let all = || Ok(vec![port("mlx5_0"), port("mlx5_1"), port("mlx5_10")]);
        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert_eq!(
            select_net_with(NetChoice::Auto, Some(&f), all),
            NetSelection::Ib(vec![port("mlx5_1")])
        );
        let f = HcaFilter::parse("^mlx5_1").unwrap();
        assert_eq!(
            select_net_with(NetChoice::Auto, Some(&f), all),
            NetSelection::Ib(vec![port("mlx5_0")])
        );
        assert_eq!(
            select_net_with(NetChoice::Auto, None, all),
            NetSelection::Ib(vec![port("mlx5_0"), port("mlx5_1"), port("mlx5_10")])
        );
        let f = HcaFilter::parse("bnxt").unwrap();
        match select_net_with(NetChoice::Ib, Some(&f), all) {
            NetSelection::Socket(Some(why)) => {
                assert!(why.contains("RAILRING_IB_HCA=bnxt matches none"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gpudirect_only_below_a_pcie_switch() {
        assert!(gpudirect_allowed(Some(PathClass::Pix)));
        assert!(gpudirect_allowed(Some(PathClass::Pxb)));
        for c in [
            PathClass::Phb,
            PathClass::Node,
            PathClass::Sys,
            PathClass::Same,
            PathClass::Nv(4),
        ] {
            assert!(!gpudirect_allowed(Some(c)), "{c}");
        }
        assert!(!gpudirect_allowed(None));
    }

    #[test]
    fn gdr_level_admits_pcie_paths_up_to_it() {
        // a level admits its own class and every closer one, never an unknown path
        assert!(gpudirect_at(Some(PathClass::Pix), Some(PathClass::Pxb)));
        assert!(!gpudirect_at(Some(PathClass::Phb), Some(PathClass::Pxb)));
        assert!(gpudirect_at(Some(PathClass::Phb), Some(PathClass::Phb)));
        assert!(gpudirect_at(Some(PathClass::Sys), Some(PathClass::Sys)));
        assert!(!gpudirect_at(Some(PathClass::Pix), None));
        assert!(!gpudirect_at(None, Some(PathClass::Sys)));
    }

    #[test]
    fn gpudirect_decision_from_a_real_topology() {
        use crate::topology::{DeviceId, Topology};
        let t = Topology::from_file("../tests/fixtures/topology/aws-p4d-24xl-topo.xml").unwrap();
        let (mut yes, mut no) = (0, 0);
        for (g, gpu) in t.gpus.iter().enumerate() {
            let bus = gpu.busid.clone().unwrap();
            for (n, nic) in t.nics.iter().enumerate() {
                let p = gpu_nic_path(&t, &bus, &nic.name);
                assert_eq!(p, Some(t.path_class(DeviceId::Gpu(g), DeviceId::Nic(n))));
                if gpudirect_allowed(p) {
                    yes += 1;
                } else {
                    no += 1;
                }
            }
        }
        assert!(
            yes > 0 && no > 0,
            "p4d has PIX and SYS GPU-NIC pairs ({yes}/{no})"
        );
        assert_eq!(gpu_nic_path(&t, "0000:ff:00.0", &t.nics[0].name), None);
    }

    #[test]
    fn probing_this_machine_never_panics() {
        // Without RDMA hardware this is Err (ENOSYS) or an empty list; either selects TCP.
        match probe_hcas() {
            Ok(v) => eprintln!("RDMA ports here: {v:?}"),
            Err(e) => eprintln!("no RDMA here: {e}"),
        }
        let _ = select_net_with(NetChoice::Auto, None, probe_hcas);
    }
}
