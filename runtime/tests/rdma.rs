//! The RDMA transport without hardware: `RAILRING_IB_HCA` parsing, net selection and its
//! fallback to TCP with injected `devices()` results, the flow-control state machine through
//! the public API; and a loopback link when the machine has an active HCA (skipped loudly
//! otherwise).
#![cfg(feature = "rdma")]

use railring::store::{self, Store, StoreClient};
use railring::transport::rdma::flow::{Flow, FlowConfig};
use railring::transport::rdma::hca::HcaFilter;
use railring::transport::rdma::{
    probe_hcas, select_net_from, select_net_with, HcaPort, NetChoice, NetSelection, RdmaNet,
};
use railring::transport::Link;
use railring::transport::LinkId;
use std::io;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn hca_grammar() {
    let f = HcaFilter::parse("^=mlx5_2:1,mlx5_3").unwrap();
    assert!(!f.matches("mlx5_2", 1));
    assert!(f.matches("mlx5_2", 2));
    assert!(!f.matches("mlx5_3", 7));
    assert!(f.matches("mlx5_30", 1));
    assert!(HcaFilter::parse("mlx5_0:one").is_err());
}

#[test]
fn devices_error_falls_back_to_socket() {
    let r = select_net_with(NetChoice::Ib, None, || {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "Function not implemented (os error 38)",
        ))
    });
    assert!(
        matches!(r, NetSelection::Socket(Some(ref w)) if w.contains("os error 38")),
        "{r:?}"
    );
    let r = select_net_with(NetChoice::Auto, None, || Ok(vec![]));
    assert!(matches!(r, NetSelection::Socket(Some(_))));
    let one = HcaPort {
        device: "mlx5_0".into(),
        port: 1,
    };
    let r = select_net_with(NetChoice::Auto, None, || Ok(vec![one.clone()]));
    assert_eq!(r, NetSelection::Ib(vec![one]));
}

/// All environment cases in one test (the environment is process-wide).
#[test]
fn environment_knobs() {
    std::env::remove_var("RAILRING_IB_HCA");
    std::env::set_var("RAILRING_NET", "socket");
    assert_eq!(
        select_net_from(&railring::config::Config::from_env().unwrap()).unwrap(),
        NetSelection::Socket(None)
    );
    std::env::set_var("RAILRING_NET", "carrier-pigeon");
    let e = select_net_from(&railring::config::Config::from_env().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("RAILRING_NET"), "{e}");
    std::env::set_var("RAILRING_NET", "ib");
    std::env::set_var("RAILRING_IB_HCA", "mlx5_0:x");
    let e = select_net_from(&railring::config::Config::from_env().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("RAILRING_IB_HCA"), "{e}");
    std::env::set_var("RAILRING_IB_HCA", "mlx5");
    // This machine: ib requested; without RDMA this is TCP with a reason, never a crash.
    match select_net_from(&railring::config::Config::from_env().unwrap()).unwrap() {
        NetSelection::Socket(why) => eprintln!("RAILRING_NET=ib here: TCP ({why:?})"),
        NetSelection::Ib(h) => eprintln!("RAILRING_NET=ib here: {h:?}"),
    }
    std::env::remove_var("RAILRING_NET");
    std::env::remove_var("RAILRING_IB_HCA");
}

#[test]
fn flow_control_public_api() {
    let c = FlowConfig::new(2, 4, 8).unwrap();
    let (mut tx, mut rx) = (Flow::new(c), Flow::new(c));
    let a = tx.post_data(4).unwrap();
    let b = tx.post_data(2).unwrap();
    assert!(!tx.can_send(), "2 credits used");
    rx.on_arrival(b.imm, b.len).unwrap();
    rx.on_arrival(a.imm, a.len).unwrap();
    assert_eq!(rx.readable(), Some((0, 4)));
    rx.consume(4).unwrap();
    tx.on_send_completion(a.wr_id).unwrap();
    tx.on_credit(rx.credit_due(false).unwrap()).unwrap();
    assert!(tx.can_send());
}

#[test]
fn loopback_link_on_hardware() {
    let hcas = match probe_hcas() {
        Ok(h) if !h.is_empty() => h,
        Ok(_) => {
            eprintln!("SKIPPED: loopback_link_on_hardware: no active RDMA port");
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED: loopback_link_on_hardware: no RDMA ({e})");
            return;
        }
    };
    let net = RdmaNet::open(&hcas[..1], 0).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let srv = store::serve(l, "k", Store::new()).unwrap();
    let st = Arc::new(
        StoreClient::connect(&srv.addr.to_string(), "k", Duration::from_secs(10)).unwrap(),
    );
    let mut a = net
        .link(
            st.clone(),
            LinkId {
                comm: 9,
                me: 0,
                peer: 1,
                chan: 0,
            },
            0,
        )
        .unwrap();
    let mut b = net
        .link(
            st,
            LinkId {
                comm: 9,
                me: 1,
                peer: 0,
                chan: 0,
            },
            0,
        )
        .unwrap();
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let (mut sent, mut got) = (0, Vec::with_capacity(data.len()));
    let mut buf = vec![0u8; 100_000];
    let t = Instant::now();
    while got.len() < data.len() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "loopback stalled at {} bytes",
            got.len()
        );
        sent += a.try_send(&data[sent..]).unwrap();
        let n = b.try_recv(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
        let _ = a.try_recv(&mut buf[..0]);
    }
    assert_eq!(got, data);
}
