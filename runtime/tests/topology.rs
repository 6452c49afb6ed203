//! Topology loaders, path classes, bindings and renderings.
//!
//! Fixtures: tests/fixtures/topology/ (see tests/fixtures/README.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use railring::topology::render;
use railring::topology::{
    apply_cpu_binding, process_allowed_cpus, BindOptions, BindTo, Binding, DeviceId, NicMap,
    PathClass, TopoError, Topology,
};

const NDV4: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/topology/azure-ndv4-topo.xml"
);
const NDV2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/topology/azure-ndv2-topo.xml"
);
const P4D: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/topology/aws-p4d-24xl-topo.xml"
);
const DGX2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/topology/nvidiaDGX2.xml"
);
const SL390: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/topology/24em64t-2n6c2t-pci.xml"
);

use PathClass::{Node, Nv, Phb, Pix, Pxb, Same, Sys};

fn gpu(i: usize) -> DeviceId {
    DeviceId::Gpu(i)
}
fn nic(i: usize) -> DeviceId {
    DeviceId::Nic(i)
}
fn range(a: usize, b: usize) -> Vec<usize> {
    (a..=b).collect()
}
fn ranges(r: &[(usize, usize)]) -> Vec<usize> {
    r.iter().flat_map(|&(a, b)| a..=b).collect()
}
/// Options for a file that describes another machine: no CPU restriction.
fn file_opts() -> BindOptions {
    BindOptions::default()
}
fn primary(b: &Binding) -> usize {
    b.nics[0].index
}

// ---------------------------------------------------------------- fixtures

#[test]
fn azure_ndv4_gpu_i_gets_nic_i() {
    let t = Topology::from_file(NDV4).unwrap();
    assert!(t.source.starts_with("nccl-xml:"));
    assert_eq!(t.numa_nodes.len(), 4);
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.nics.len(), 8);
    let busids: Vec<&str> = t.gpus.iter().map(|g| g.busid.as_deref().unwrap()).collect();
    assert_eq!(
        busids,
        [
            "0001:00:00.0",
            "0002:00:00.0",
            "0003:00:00.0",
            "0004:00:00.0",
            "000b:00:00.0",
            "000c:00:00.0",
            "000d:00:00.0",
            "000e:00:00.0"
        ]
    );
    // NICs have no <net name>: named by bus id, in bus order.
    let names: Vec<&str> = t.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "0101:00:00.0",
            "0102:00:00.0",
            "0103:00:00.0",
            "0104:00:00.0",
            "0105:00:00.0",
            "0106:00:00.0",
            "0107:00:00.0",
            "0108:00:00.0"
        ]
    );
    // One virtual switch holds GPU0, GPU1, NIC0, NIC1 (NUMA 1) etc.
    assert_eq!(t.path_class(gpu(0), nic(0)), Pix);
    assert_eq!(t.path_class(gpu(0), nic(1)), Pix);
    assert_eq!(t.path_class(gpu(0), gpu(1)), Pix);
    assert_eq!(t.path_class(gpu(0), nic(2)), Sys);
    assert_eq!(t.path_class(gpu(0), gpu(2)), Sys);
    assert_eq!(t.path_class(gpu(3), gpu(3)), Same);
    assert_eq!(t.gpus[0].numa, Some(1));
    assert_eq!(t.gpus[2].numa, Some(0));

    let b = t.bindings(8, &file_opts()).unwrap();
    assert_eq!(b.len(), 8);
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.local_rank, i);
        assert_eq!(bi.gpu.as_ref().unwrap().index, i);
        assert_eq!(bi.gpu.as_ref().unwrap().cuda_ordinal, i);
        assert_eq!(bi.nics.len(), 1, "rank {i}: {:?}", bi.nics);
        assert_eq!(primary(bi), i, "GPU{i} must get NIC{i}: {}", bi.reason);
        assert_eq!(bi.nics[0].path_class, Pix);
        assert!(bi.reason.contains("tie at PIX"), "{}", bi.reason);
        assert!(bi.reason.contains("rail alignment"), "{}", bi.reason);
    }
    // CPU list = the NUMA node's affinity.
    let numa_cpus = [
        (1, range(24, 47)),
        (1, range(24, 47)),
        (0, range(0, 23)),
        (0, range(0, 23)),
    ];
    for (i, (n, cpus)) in numa_cpus.iter().enumerate() {
        assert_eq!(b[i].numa, Some(*n));
        assert_eq!(&b[i].cpus, cpus);
    }
    assert_eq!(b[4].cpus, range(72, 95)); // 000b on NUMA 3
    assert_eq!(b[6].cpus, range(48, 71)); // 000d on NUMA 2

    // Two ranks: each gets its own NIC of the shared switch, and no extra.
    let b2 = t.bindings(2, &file_opts()).unwrap();
    assert_eq!(b2.iter().map(primary).collect::<Vec<_>>(), [0, 1]);
    assert!(b2.iter().all(|b| b.nics.len() == 1));
    // One rank: the idle NIC of the same tier becomes an extra rail.
    let b1 = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(
        b1[0].nics.iter().map(|n| n.index).collect::<Vec<_>>(),
        [0, 1]
    );
    assert!(
        b1[0].reason.contains("also 0102:00:00.0"),
        "{}",
        b1[0].reason
    );
}

#[test]
fn aws_p4d_two_gpus_share_their_switch_nic() {
    let t = Topology::from_file(P4D).unwrap();
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.nics.len(), 4);
    assert_eq!(t.nics[0].busid.as_deref(), Some("0000:10:1b.0"));
    assert_eq!(t.nics[3].busid.as_deref(), Some("0000:a0:1b.0"));
    // 8 GT/s x16 after 128b/130b coding.
    assert_eq!(t.nics[0].bandwidth_mbps(&t), 126_031);
    assert_eq!(t.path_class(gpu(0), nic(0)), Pix);
    assert_eq!(t.path_class(gpu(0), gpu(1)), Pix);
    assert_eq!(t.path_class(gpu(0), gpu(2)), Phb);
    assert_eq!(t.path_class(gpu(0), nic(1)), Phb);
    assert_eq!(t.path_class(gpu(0), gpu(4)), Sys);
    assert_eq!(t.path_class(nic(0), nic(1)), Phb);
    assert_eq!(t.path_class(nic(0), nic(2)), Sys);

    let b = t.bindings(8, &file_opts()).unwrap();
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.gpu.as_ref().unwrap().index, i);
        assert_eq!(bi.nics.len(), 1);
        assert_eq!(primary(bi), i / 2, "GPU{i}: {}", bi.reason);
        assert_eq!(bi.nics[0].path_class, Pix);
        assert_eq!(bi.nics[0].speed_mbps, Some(126_031));
    }
    assert!(
        b[1].reason.contains("shared with local rank(s) 0"),
        "{}",
        b[1].reason
    );
    assert!(
        b[0].reason.contains("the only NIC at the best path class"),
        "{}",
        b[0].reason
    );
    let numa0 = ranges(&[(0, 23), (48, 71)]);
    let numa1 = ranges(&[(24, 47), (72, 95)]);
    for i in 0..4 {
        assert_eq!(b[i].cpus, numa0);
        assert_eq!(b[i + 4].cpus, numa1);
    }
}

#[test]
fn azure_ndv2_single_nic_for_all_gpus() {
    let t = Topology::from_file(NDV2).unwrap();
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.nics.len(), 1);
    assert_eq!(t.nics[0].busid.as_deref(), Some("0101:00:00.0"));
    assert_eq!(t.nics[0].numa, Some(0));
    // Hyper-V gives each device its own PCI domain (host bridge): NODE
    // within the NUMA node, SYS across.
    assert_eq!(t.path_class(gpu(0), gpu(1)), Node);
    assert_eq!(t.path_class(gpu(0), gpu(4)), Sys);
    let b = t.bindings(8, &file_opts()).unwrap();
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.nics.len(), 1);
        assert_eq!(primary(bi), 0);
        let want = if i < 4 { Node } else { Sys };
        assert_eq!(bi.nics[0].path_class, want, "GPU{i}");
        assert!(bi.reason.contains("the only NIC"), "{}", bi.reason);
        assert_eq!(bi.cpus, if i < 4 { range(0, 19) } else { range(20, 39) });
    }
}

#[test]
fn hwloc_dgx2_gpus_without_nics() {
    let t = Topology::from_file(DGX2).unwrap();
    assert!(t.source.starts_with("hwloc-xml:"));
    assert_eq!(t.gpus.len(), 16, "NVSwitches are not GPUs");
    assert!(t.nics.is_empty());
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(t.numa_nodes[0].cpus, [0, 1]);
    assert_eq!(t.numa_nodes[1].cpus, [24, 25]);
    assert_eq!(t.gpus[0].busid.as_deref(), Some("0000:34:00.0"));
    assert_eq!(t.gpus[0].model.as_deref(), Some("Tesla V100-SXM3-32GB-H"));
    assert_eq!(
        t.gpus[4].uuid.as_deref(),
        Some("GPU-d256cac8-f12b-b2a2-5487-ee294f6e4617")
    );
    // nvidia-smi on a DGX-2: NV6 between every pair (6 links into the NVSwitch fabric).
    for a in 0..16 {
        for b in 0..16 {
            let want = if a == b { Same } else { Nv(6) };
            assert_eq!(t.path_class(gpu(a), gpu(b)), want, "GPU{a}-GPU{b}");
        }
    }
    // The PCIe classes underneath (two-level PLX trees).
    assert_eq!(t.pcie_path_class(gpu(0), gpu(1)), Pix);
    assert_eq!(t.pcie_path_class(gpu(0), gpu(2)), Pxb);
    assert_eq!(t.pcie_path_class(gpu(0), gpu(4)), Node);
    assert_eq!(t.pcie_path_class(gpu(0), gpu(8)), Sys);
    assert_eq!(t.pcie_path_class(gpu(8), gpu(12)), Node);

    let b = t.bindings(16, &file_opts()).unwrap();
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.gpu.as_ref().unwrap().index, i);
        assert!(bi.nics.is_empty());
        assert!(bi.reason.contains("no NIC found"), "{}", bi.reason);
        // this file lists 2 CPUs per NUMA node: 8 ranks on each outnumber them evenly, so
        // the default binding gives each a core, round-robin
        let base = if i < 8 { 0 } else { 24 };
        assert_eq!(bi.cpus, [base + i % 2]);
    }
    let numa = BindOptions::from_values(Some("numa"), None, None, None).unwrap();
    for (i, bi) in t.bindings(16, &numa).unwrap().iter().enumerate() {
        assert_eq!(bi.cpus, if i < 8 { vec![0, 1] } else { vec![24, 25] });
    }
}

#[test]
fn hwloc_sl390s_connectx_on_package_0() {
    let t = Topology::from_file(SL390).unwrap();
    assert_eq!(t.gpus.len(), 3, "the ATI ES1000 is not an NVIDIA GPU");
    let g: Vec<&str> = t.gpus.iter().map(|g| g.busid.as_deref().unwrap()).collect();
    assert_eq!(g, ["0000:06:00.0", "0000:11:00.0", "0000:14:00.0"]);
    assert_eq!(t.gpus[0].numa, Some(0));
    assert_eq!(t.gpus[1].numa, Some(1));
    let n: Vec<&str> = t.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(n, ["eth0", "eth1", "mlx4_0"]);
    assert_eq!(t.nics[2].rdma.as_deref(), Some("mlx4_0"));
    assert_eq!(t.nics[2].netdevs, ["eth2", "ib0"]);
    assert_eq!(t.nics[2].bandwidth_mbps(&t), 16_000);
    assert_eq!(t.nics[0].bandwidth_mbps(&t), 1_600);
    assert_eq!(t.numa_nodes[0].package, Some(0));
    assert_eq!(t.numa_nodes[1].package, Some(1));

    assert_eq!(t.path_class(gpu(0), nic(2)), Phb);
    assert_eq!(t.path_class(gpu(1), nic(2)), Sys);
    assert_eq!(t.path_class(gpu(2), nic(2)), Sys);
    assert_eq!(t.path_class(nic(0), nic(1)), Pix);
    assert_eq!(t.path_class(gpu(1), gpu(2)), Phb);
    assert_eq!(t.path_class(gpu(0), gpu(1)), Sys);

    let b = t.bindings(3, &file_opts()).unwrap();
    let want = [Phb, Sys, Sys];
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.nics.len(), 1, "{:?}", bi.nics);
        assert_eq!(bi.nics[0].name, "mlx4_0");
        assert_eq!(bi.nics[0].netdev, "eth2");
        assert_eq!(bi.nics[0].path_class, want[i]);
        assert!(bi.reason.contains("bandwidth decided"), "{}", bi.reason);
    }
    let even: Vec<usize> = (0..24).step_by(2).collect();
    let odd: Vec<usize> = (1..24).step_by(2).collect();
    assert_eq!(b[0].cpus, even);
    assert_eq!(b[1].cpus, odd);

    // bind-to core: ranks 1 and 2 share NUMA 1 and split its 6 cores,
    // keeping hyper-threads (PU n and n+12) together.
    let opts = BindOptions::from_values(Some("core"), None, None, None).unwrap();
    assert_eq!(opts.bind_to, BindTo::Core);
    let b = t.bindings(3, &opts).unwrap();
    assert_eq!(b[0].cpus, even);
    assert_eq!(b[1].cpus, [1, 3, 5, 13, 15, 17]);
    assert_eq!(b[2].cpus, [7, 9, 11, 19, 21, 23]);
    assert!(b[1].reason.contains("bind-to core"), "{}", b[1].reason);
}

// ---------------------------------------------------------------- fake sysfs

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fake sysfs tree in a temporary directory.
struct FakeSys {
    root: PathBuf,
}

impl FakeSys {
    fn new(tag: &str) -> FakeSys {
        let root = std::env::temp_dir().join(format!(
            "railring-topo-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        for d in [
            "sys/devices/system/node",
            "sys/devices/system/cpu",
            "sys/bus/pci/devices",
            "sys/class/net",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        FakeSys { root }
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{content}\n")).unwrap();
    }

    fn numa(&self, id: usize, cpus: &str, package: usize) {
        self.write(&format!("sys/devices/system/node/node{id}/cpulist"), cpus);
        for c in railring::topology::parse_cpulist(cpus).unwrap() {
            self.write(
                &format!("sys/devices/system/cpu/cpu{c}/topology/physical_package_id"),
                &package.to_string(),
            );
        }
    }

    /// A PCI function at `path` below sys/devices (`pci0000:00/0000:00:01.0/…`).
    fn pci(&self, path: &str, class: u32, vendor: u16, numa: i32) {
        let dir = format!("sys/devices/{path}");
        self.write(&format!("{dir}/class"), &format!("0x{class:06x}"));
        self.write(&format!("{dir}/vendor"), &format!("0x{vendor:04x}"));
        self.write(&format!("{dir}/device"), "0x1234");
        self.write(&format!("{dir}/numa_node"), &numa.to_string());
        self.write(&format!("{dir}/current_link_speed"), "16.0 GT/s PCIe");
        self.write(&format!("{dir}/current_link_width"), "16");
        let bdf = path.rsplit('/').next().unwrap();
        let depth = 3; // sys/bus/pci/devices -> ../../../devices
        let target = format!("{}devices/{path}", "../".repeat(depth));
        std::os::unix::fs::symlink(target, self.root.join("sys/bus/pci/devices").join(bdf))
            .unwrap();
    }

    fn bridge(&self, path: &str, numa: i32) {
        self.pci(path, 0x060400, 0x10b5, numa);
    }

    fn netdev(&self, name: &str, pci: Option<&str>, flags: &str, speed: &str) {
        let dir = format!("sys/class/net/{name}");
        self.write(&format!("{dir}/flags"), flags);
        self.write(
            &format!("{dir}/type"),
            if name == "lo" { "772" } else { "1" },
        );
        self.write(&format!("{dir}/speed"), speed);
        if let Some(p) = pci {
            std::os::unix::fs::symlink(
                self.root.join("sys/devices").join(p),
                self.root.join(&dir).join("device"),
            )
            .unwrap();
        }
    }

    fn ib(&self, name: &str, pci: &str, rate: &str) {
        let dir = format!("sys/class/infiniband/{name}");
        self.write(&format!("{dir}/ports/1/rate"), rate);
        std::os::unix::fs::symlink(
            self.root.join("sys/devices").join(pci),
            self.root.join(&dir).join("device"),
        )
        .unwrap();
    }

    fn path(&self) -> &Path {
        &self.root
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Two sockets, two NUMA nodes (CPUs 0-3 and 4-7).
/// Socket 0, host bridge pci0000:00:
///   root port 00:01.0 → switch 01:00.0 → ports 02:00..02:04
///     GPU 03:00.0, GPU 04:00.0, NIC 05:00.0 (mlx5_0/ib0), NIC 06:00.0 (mlx5_1/ib1)
///     port 02:04.0 → switch 07:00.0 → port 08:00.0 → GPU 09:00.0 (two switches from the NICs)
///   on-board 1 GbE 00:1f.6 (eno1), 00:1f.7 (eno2, down)
/// Socket 1, host bridge pci0000:80:
///   root port 80:01.0 → switch 81:00.0 → port 82:00.0 → GPU 83:00.0
///   root port 80:02.0 → switch 84:00.0 → port 85:00.0 → NIC 86:00.0 (mlx5_2/ib2)
/// Socket 1, host bridge pci0000:c0: root port c0:01.0 → GPU c1:00.0
/// Plus lo, a down interface, a bridge and a veth (not used: PCI NICs exist).
fn two_socket_box() -> FakeSys {
    let f = FakeSys::new("2s");
    f.numa(0, "0-3", 0);
    f.numa(1, "4-7", 1);
    let s0 = "pci0000:00/0000:00:01.0/0000:01:00.0";
    f.bridge("pci0000:00/0000:00:01.0", 0);
    f.bridge(s0, 0);
    for (port, dev, class, vendor) in [
        ("0000:02:00.0", "0000:03:00.0", 0x030200, 0x10de),
        ("0000:02:01.0", "0000:04:00.0", 0x030200, 0x10de),
        ("0000:02:02.0", "0000:05:00.0", 0x020700, 0x15b3),
        ("0000:02:03.0", "0000:06:00.0", 0x020700, 0x15b3),
    ] {
        f.bridge(&format!("{s0}/{port}"), 0);
        f.pci(&format!("{s0}/{port}/{dev}"), class, vendor, 0);
    }
    f.bridge(&format!("{s0}/0000:02:04.0"), 0);
    f.bridge(&format!("{s0}/0000:02:04.0/0000:07:00.0"), 0);
    f.bridge(&format!("{s0}/0000:02:04.0/0000:07:00.0/0000:08:00.0"), 0);
    f.pci(
        &format!("{s0}/0000:02:04.0/0000:07:00.0/0000:08:00.0/0000:09:00.0"),
        0x030000,
        0x10de,
        0,
    );
    f.pci("pci0000:00/0000:00:1f.6", 0x020000, 0x8086, 0);
    f.pci("pci0000:00/0000:00:1f.7", 0x020000, 0x8086, 0);
    f.pci("pci0000:00/0000:00:02.0", 0x030000, 0x102b, 0); // BMC VGA (Matrox): not a GPU

    f.bridge("pci0000:80/0000:80:01.0", 1);
    f.bridge("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
    f.bridge("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0", 1);
    f.pci(
        "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0",
        0x030200,
        0x10de,
        1,
    );
    f.bridge("pci0000:80/0000:80:02.0", 1);
    f.bridge("pci0000:80/0000:80:02.0/0000:84:00.0", 1);
    f.bridge("pci0000:80/0000:80:02.0/0000:84:00.0/0000:85:00.0", 1);
    let n2 = "pci0000:80/0000:80:02.0/0000:84:00.0/0000:85:00.0/0000:86:00.0";
    f.pci(n2, 0x020700, 0x15b3, 1);
    f.bridge("pci0000:c0/0000:c0:01.0", 1);
    f.pci("pci0000:c0/0000:c0:01.0/0000:c1:00.0", 0x030200, 0x10de, -1); // NUMA from local_cpulist
    f.write(
        "sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/local_cpulist",
        "4-7",
    );

    f.netdev(
        "ib0",
        Some(&format!("{s0}/0000:02:02.0/0000:05:00.0")),
        "0x1003",
        "100000",
    );
    f.ib(
        "mlx5_0",
        &format!("{s0}/0000:02:02.0/0000:05:00.0"),
        "100 Gb/sec (4X EDR)",
    );
    f.netdev(
        "ib1",
        Some(&format!("{s0}/0000:02:03.0/0000:06:00.0")),
        "0x1003",
        "100000",
    );
    f.ib(
        "mlx5_1",
        &format!("{s0}/0000:02:03.0/0000:06:00.0"),
        "100 Gb/sec (4X EDR)",
    );
    f.netdev("ib2", Some(n2), "0x1003", "100000");
    f.ib("mlx5_2", n2, "100 Gb/sec (4X EDR)");
    f.netdev("eno1", Some("pci0000:00/0000:00:1f.6"), "0x1003", "1000");
    f.netdev("eno2", Some("pci0000:00/0000:00:1f.7"), "0x1002", "-1");
    f.netdev("lo", None, "0x9", "-1");
    f.netdev("docker0", None, "0x1003", "-1");
    std::fs::create_dir_all(f.root.join("sys/class/net/docker0/bridge")).unwrap();
    f.netdev("veth0", None, "0x1003", "10000");
    f
}

#[test]
fn fake_sysfs_two_sockets() {
    let f = two_socket_box();
    let t = Topology::from_sysfs_root(f.path()).unwrap();
    assert!(t.source.starts_with("sysfs:"));
    assert_eq!(t.numa_nodes.len(), 2);
    assert_eq!(t.numa_nodes[1].package, Some(1));
    let g: Vec<&str> = t.gpus.iter().map(|g| g.busid.as_deref().unwrap()).collect();
    assert_eq!(
        g,
        [
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:09:00.0",
            "0000:83:00.0",
            "0000:c1:00.0"
        ]
    );
    assert_eq!(t.gpus[4].numa, Some(1), "from local_cpulist");
    let n: Vec<&str> = t.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        n,
        ["eno1", "mlx5_0", "mlx5_1", "mlx5_2", "veth0"],
        "lo, eno2 (down), docker0 (bridge) left out"
    );
    assert_eq!(t.nics[1].netdevs, ["ib0"]);
    assert_eq!(t.nics[1].speed_mbps, Some(100_000));
    assert!(t.nics[4].is_virtual);

    assert_eq!(t.path_class(gpu(0), gpu(1)), Pix);
    assert_eq!(t.path_class(gpu(0), nic(1)), Pix);
    assert_eq!(t.path_class(gpu(2), nic(1)), Pxb);
    assert_eq!(t.path_class(gpu(0), gpu(2)), Pxb);
    assert_eq!(t.path_class(gpu(0), nic(0)), Phb);
    assert_eq!(t.path_class(gpu(3), nic(3)), Phb);
    assert_eq!(t.path_class(gpu(4), nic(3)), Node);
    assert_eq!(t.path_class(gpu(3), gpu(4)), Node);
    assert_eq!(t.path_class(gpu(0), gpu(3)), Sys);
    assert_eq!(
        t.path_class(gpu(0), nic(4)),
        Phb,
        "virtual NICs are host-attached"
    );

    let b = t.bindings(5, &file_opts()).unwrap();
    let pairs: Vec<(usize, PathClass)> = b
        .iter()
        .map(|b| (b.nics[0].index, b.nics[0].path_class))
        .collect();
    assert_eq!(pairs, [(1, Pix), (2, Pix), (1, Pxb), (3, Phb), (3, Node)]);
    assert!(b.iter().all(|b| b.nics.len() == 1));
    assert!(
        b[2].reason
            .contains("every NIC of that tier already serves a local rank"),
        "{}",
        b[2].reason
    );
    assert!(
        b[4].reason.contains("shared with local rank(s) 3"),
        "{}",
        b[4].reason
    );
    for (i, bi) in b.iter().enumerate() {
        assert_eq!(bi.cpus, if i < 3 { range(0, 3) } else { range(4, 7) });
    }

    // Allowed CPUs (cgroup) narrow the NUMA node's list.
    let opts = BindOptions::from_values(None, None, None, Some(vec![1, 2, 5])).unwrap();
    let b = t.bindings(5, &opts).unwrap();
    assert_eq!(b[0].cpus, [1, 2]);
    assert_eq!(b[3].cpus, [5]);
    // A NUMA node with no allowed CPU falls back to all allowed CPUs.
    let opts = BindOptions::from_values(None, None, None, Some(vec![0, 1])).unwrap();
    let b = t.bindings(5, &opts).unwrap();
    assert_eq!(b[3].cpus, [0, 1]);
    assert!(
        b[3].reason.contains("has none of the allowed CPUs"),
        "{}",
        b[3].reason
    );
}

#[test]
fn fake_sysfs_veth_only_round_robin() {
    let f = FakeSys::new("veth");
    f.numa(0, "0-1", 0);
    f.numa(1, "2-3", 1);
    f.netdev("lo", None, "0x9", "-1");
    f.netdev("veth1", None, "0x1003", "10000");
    f.netdev("veth0", None, "0x1003", "10000");
    let t = Topology::from_sysfs_root(f.path()).unwrap();
    assert!(t.gpus.is_empty());
    assert_eq!(
        t.nics.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["veth0", "veth1"]
    );
    assert!(t
        .nics
        .iter()
        .all(|n| n.is_virtual && n.netdevs == [n.name.clone()]));
    let b = t.bindings(4, &file_opts()).unwrap();
    assert_eq!(
        b.iter().map(|b| b.numa).collect::<Vec<_>>(),
        [Some(0), Some(1), Some(0), Some(1)]
    );
    assert_eq!(b.iter().map(primary).collect::<Vec<_>>(), [0, 1, 0, 1]);
    assert_eq!(
        b.iter().map(|b| b.cpus.clone()).collect::<Vec<_>>(),
        [vec![0, 1], vec![2, 3], vec![0, 1], vec![2, 3]]
    );
    for bi in &b {
        assert!(bi.gpu.is_none());
        assert_eq!(bi.nics.len(), 1);
        assert_eq!(bi.nics[0].path_class, Phb);
        assert!(
            bi.reason.contains("virtual NICs count as host-attached"),
            "{}",
            bi.reason
        );
        assert!(
            bi.reason.contains("round-robin over 2 NUMA node(s)"),
            "{}",
            bi.reason
        );
    }
}

/// The default binding (`auto`): the NUMA node's CPUs, except where a NUMA node's ranks
/// outnumber its CPUs and split evenly over its cores: then one core each, round-robin.
#[test]
fn auto_binding_gives_a_core_each_only_to_an_even_oversubscription() {
    let f = FakeSys::new("auto");
    f.numa(0, "0-1", 0);
    f.numa(1, "2-5", 1);
    // NUMA node 1: two cores of two hyper-threads each
    for (c, sib) in [(2, "2,4"), (4, "2,4"), (3, "3,5"), (5, "3,5")] {
        f.write(
            &format!("sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"),
            sib,
        );
    }
    f.netdev("lo", None, "0x9", "-1");
    f.netdev("veth0", None, "0x1003", "10000");
    let t = Topology::from_sysfs_root(f.path()).unwrap();
    assert_eq!(file_opts().bind_to, BindTo::Auto);
    assert_eq!("auto".parse::<BindTo>().unwrap(), BindTo::Auto);
    let cpus = |n: usize, mode: Option<&str>| -> Vec<Vec<usize>> {
        let o = BindOptions::from_values(mode, None, None, None).unwrap();
        t.bindings(n, &o)
            .unwrap()
            .iter()
            .map(|b| b.cpus.clone())
            .collect()
    };
    // ranks go round-robin over the NUMA nodes: 2 ranks, one each; 4 ranks, 2 on each (NUMA
    // node 0's 2 CPUs are not outnumbered, NUMA node 1 has 4)
    assert_eq!(cpus(2, None), [vec![0, 1], vec![2, 3, 4, 5]]);
    assert_eq!(
        cpus(4, None),
        [vec![0, 1], vec![2, 3, 4, 5], vec![0, 1], vec![2, 3, 4, 5]]
    );
    // 6 ranks: 3 on NUMA node 0 (2 CPUs, an uneven share: the scheduler balances it), 3 on
    // NUMA node 1 (4 CPUs)
    let b = cpus(6, None);
    assert!(b.iter().step_by(2).all(|c| *c == [0, 1]), "{b:?}");
    assert!(
        b.iter().skip(1).step_by(2).all(|c| *c == [2, 3, 4, 5]),
        "{b:?}"
    );
    // 8 ranks: 4 on each NUMA node; node 0 is outnumbered (4 > 2 CPUs) and splits evenly over
    // its 2 cores; node 1 is not (4 ranks, 4 hardware threads)
    assert_eq!(
        cpus(8, None),
        [
            vec![0],
            vec![2, 3, 4, 5],
            vec![1],
            vec![2, 3, 4, 5],
            vec![0],
            vec![2, 3, 4, 5],
            vec![1],
            vec![2, 3, 4, 5]
        ]
    );
    // 12 ranks, 6 on each node: both outnumbered and even over 2 cores, 3 ranks per core (on
    // node 1 a core is its two hyper-threads)
    let b = cpus(12, None);
    let node0: Vec<_> = b.iter().step_by(2).cloned().collect();
    let node1: Vec<_> = b.iter().skip(1).step_by(2).cloned().collect();
    assert_eq!(
        node0,
        [vec![0], vec![1], vec![0], vec![1], vec![0], vec![1]]
    );
    assert_eq!(
        node1,
        [
            vec![2, 4],
            vec![3, 5],
            vec![2, 4],
            vec![3, 5],
            vec![2, 4],
            vec![3, 5]
        ]
    );
    let r = t.bindings(12, &file_opts()).unwrap();
    assert!(
        r[0].reason
            .contains("6 local ranks outnumber its 2 CPU(s), 3 per core (bind-to auto"),
        "{}",
        r[0].reason
    );
    // 10 ranks: 5 on each node, uneven over 2 cores: the NUMA node's CPUs
    assert!(cpus(10, None).iter().enumerate().all(|(i, c)| *c
        == if i % 2 == 0 {
            vec![0, 1]
        } else {
            vec![2, 3, 4, 5]
        }));
    assert!(t.bindings(10, &file_opts()).unwrap()[0]
        .reason
        .contains("(bind-to auto: numa)"));
    // an explicit numa keeps the NUMA node's CPUs however many ranks share them
    assert!(cpus(8, Some("numa")).iter().enumerate().all(|(i, c)| *c
        == if i % 2 == 0 {
            vec![0, 1]
        } else {
            vec![2, 3, 4, 5]
        }));
}

#[test]
fn fake_sysfs_without_numa_dirs_uses_online_cpus() {
    let f = FakeSys::new("flat");
    f.write("sys/devices/system/cpu/online", "0-5");
    f.pci("pci0000:00/0000:00:03.0", 0x020000, 0x1af4, -1);
    std::fs::create_dir_all(f.root.join("sys/devices/pci0000:00/0000:00:03.0/virtio2")).unwrap();
    f.netdev(
        "eth0",
        Some("pci0000:00/0000:00:03.0/virtio2"),
        "0x1003",
        "-1",
    );
    let t = Topology::from_sysfs_root(f.path()).unwrap();
    assert_eq!(t.numa_nodes.len(), 1);
    assert_eq!(t.nics.len(), 1);
    assert_eq!(t.nics[0].name, "eth0");
    assert_eq!(t.nics[0].busid.as_deref(), Some("0000:00:03.0"));
    assert_eq!(t.nics[0].numa, Some(0));
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "eth0");
    assert_eq!(b[0].nics[0].path_class, Phb);
    assert_eq!(b[0].cpus, range(0, 5));
}

#[test]
fn sysfs_root_that_does_not_exist_is_an_error() {
    let e = Topology::from_sysfs_root(Path::new("/nonexistent/railring")).unwrap_err();
    assert!(matches!(e, TopoError::Sysfs { .. }), "{e}");
}

// ---------------------------------------------------------------- live

#[test]
fn live_discovery_gives_a_binding() {
    let t = Topology::discover_from(None).unwrap();
    assert!(!t.numa_nodes.is_empty());
    assert!(t.nics.iter().all(|n| n.name != "lo"));
    let allowed = process_allowed_cpus().unwrap();
    assert!(!allowed.is_empty());
    let opts = BindOptions::from_values(None, None, None, Some(allowed.clone())).unwrap();
    let b = t.bindings(1, &opts).unwrap();
    assert_eq!(b.len(), 1);
    assert!(!b[0].cpus.is_empty());
    assert!(b[0].cpus.iter().all(|c| allowed.contains(c)));
    assert_eq!(b[0].gpu.is_some(), !t.gpus.is_empty());
    assert_eq!(b[0].nics.is_empty(), t.nics.is_empty());
    assert!(!b[0].reason.is_empty());
    // Binding to what we may already use is harmless.
    apply_cpu_binding(&b[0].cpus).unwrap();
    apply_cpu_binding(&[]).unwrap();
    let _ = render::matrix_text(&t);
    let _ = render::json_report(&t, &b);
    // The default local size of `railrun topo`: one per GPU, or 1.
    let n = t.gpus.len().max(1);
    assert_eq!(t.bindings(n, &opts).unwrap().len(), n);
}

#[test]
fn railring_topo_file_replaces_sysfs() {
    std::env::set_var("RAILRING_TOPO_FILE", P4D);
    let cfg = railring::config::Config::from_env();
    std::env::remove_var("RAILRING_TOPO_FILE");
    let t = cfg.unwrap().topology().unwrap();
    assert_eq!(t.source, format!("nccl-xml:{P4D}"));
    assert_eq!(t.gpus.len(), 8);
    let t = Topology::discover_from(Some(Path::new(SL390))).unwrap();
    assert_eq!(t.gpus.len(), 3);
}

// ---------------------------------------------------------------- errors

#[test]
fn malformed_xml_names_file_and_line() {
    let bad = "<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"ff\">\n    <pci busid=\"0000:01:00.0\"\n  </cpu>\n</system>\n";
    let e = Topology::from_nccl_xml_str(bad, "bad.xml").unwrap_err();
    match &e {
        TopoError::Xml { file, line, .. } => {
            assert_eq!(file, "bad.xml");
            assert!((3..=4).contains(line), "line {line}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().starts_with("bad.xml:"), "{e}");

    let bad = "<system>\n  <cpu numaid=\"0\" affinity=\"ff\">\n    <pci busid=\"not-a-bus\" class=\"0x030200\"/>\n  </cpu>\n</system>";
    let e = Topology::from_xml_str(bad, "node.xml").unwrap_err();
    assert!(matches!(&e, TopoError::Invalid { line: 3, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "node.xml:3: <pci busid>: expected a PCI bus id dddd:bb:dd.f, found \"not-a-bus\""
    );

    let bad = "<system>\n<cpu numaid=\"zero\"/>\n</system>";
    let e = Topology::from_xml_str(bad, "n.xml").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("n.xml:2: <cpu numaid>: expected a NUMA node number"),
        "{e}"
    );

    let bad = "<system>\n<cpu numaid=\"0\" affinity=\"00ff,zz\"/>\n</system>";
    let e = Topology::from_xml_str(bad, "n.xml").unwrap_err();
    assert!(e.to_string().starts_with("n.xml:2: <cpu affinity>"), "{e}");

    let bad = "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n <object type=\"Machine\" cpuset=\"0x1\">\n  <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0xZZ\"/>\n </object>\n</topology>";
    let e = Topology::from_hwloc_xml_str(bad, "h.xml").unwrap_err();
    assert!(matches!(&e, TopoError::Invalid { line: 4, .. }), "{e:?}");
    assert!(e.to_string().contains("expected an hwloc bitmap"), "{e}");

    let bad = "<topology version=\"3.0\">\n<object type=\"Package\">\n<object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"garbage\"/>\n</object>\n</topology>";
    let e = Topology::from_xml_str(bad, "h.xml").unwrap_err();
    assert!(
        e.to_string().starts_with("h.xml:3: <object pci_type>"),
        "{e}"
    );

    let e = Topology::from_xml_str("<html>\n<body/></html>", "x.html").unwrap_err();
    assert!(
        matches!(&e, TopoError::UnknownFormat { line: 1, .. }),
        "{e:?}"
    );
    let e = Topology::from_nccl_xml_str("<topology/>", "x.xml").unwrap_err();
    assert!(matches!(e, TopoError::UnknownFormat { .. }));

    let e = Topology::from_xml_str("", "empty.xml").unwrap_err();
    assert!(matches!(e, TopoError::Xml { .. }), "{e:?}");

    let e = Topology::from_file("/nonexistent/node.xml").unwrap_err();
    assert!(matches!(e, TopoError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/node.xml"));
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let mut s = String::from("<system><cpu numaid=\"0\">\n");
    for _ in 0..2000 {
        s.push_str("<pci class=\"0x060400\">");
    }
    for _ in 0..2000 {
        s.push_str("</pci>");
    }
    s.push_str("</cpu></system>");
    let e = Topology::from_xml_str(&s, "deep.xml").unwrap_err();
    assert!(
        matches!(e, TopoError::Limit { .. } | TopoError::Xml { .. }),
        "{e:?}"
    );
}

#[test]
fn truncated_files_never_panic() {
    for f in [NDV4, NDV2, P4D, DGX2, SL390] {
        let text = std::fs::read_to_string(f).unwrap();
        for cut in (0..text.len()).step_by(89) {
            if text.is_char_boundary(cut) {
                let _ = Topology::from_xml_str(&text[..cut], f);
            }
        }
    }
}

#[test]
fn partial_files_take_what_is_there() {
    // No affinity, no numaid, a NIC with a name and speed, a GPU with NVLinks
    // into an NVSwitch, unknown elements.
    let xml = r#"<system version="1">
  <cpu>
    <pci busid="0000:07:00.0" class="0x030200" vendor="0x10de">
      <gpu dev="0" sm="90"><nvlink target="0000:a0:00.0" count="18" tclass="0x068000"/></gpu>
    </pci>
    <pci busid="0000:08:00.0" class="0x030200"><gpu dev="1"><nvlink target="0000:a0:00.0" count="18" tclass="0x068000"/></gpu></pci>
    <pci busid="0000:09:00.0" class="0x020700"><nic><net name="mlx5_0" speed="400000" port="1"/></nic></pci>
    <whatever/>
    <nic><net name="eth0" speed="25000"/></nic>
  </cpu>
</system>"#;
    let t = Topology::from_nccl_xml_str(xml, "partial.xml").unwrap();
    assert_eq!(t.gpus.len(), 2);
    assert_eq!(t.path_class(gpu(0), gpu(1)), Nv(18));
    assert_eq!(t.pcie_path_class(gpu(0), gpu(1)), Phb);
    assert_eq!(t.nics.len(), 2);
    assert_eq!(t.nics[0].name, "mlx5_0");
    assert_eq!(t.nics[0].speed_mbps, Some(400_000));
    assert_eq!(t.nics[1].name, "eth0");
    assert!(t.nics[1].is_virtual);
    assert!(
        t.warnings
            .iter()
            .any(|w| w.contains("partial.xml:2") && w.contains("without numaid")),
        "{:?}",
        t.warnings
    );
    assert!(
        t.warnings.iter().any(|w| w.contains("without affinity")),
        "{:?}",
        t.warnings
    );
    let b = t.bindings(2, &file_opts()).unwrap();
    // Physical NIC preferred; no CPU known → nothing to bind.
    assert!(b
        .iter()
        .all(|b| b.nics[0].name == "mlx5_0" && b.cpus.is_empty()));

    // hwloc 2.0 with v2 osdev numbering, one switch with a GPU and an HCA.
    let xml = r#"<?xml version="1.0"?>
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x0000000f" nodeset="0x00000001">
  <object type="Package" os_index="0" cpuset="0x0000000f" nodeset="0x00000001">
   <object type="NUMANode" os_index="0" cpuset="0x0000000f" nodeset="0x00000001"/>
   <object type="Core" cpuset="0x00000003"/>
   <object type="Core" cpuset="0x0000000c"/>
   <object type="Bridge" bridge_type="0-1" depth="0">
    <object type="Bridge" bridge_type="1-1" pci_busid="0000:00:01.0" pci_type="0604 [8086:0000] [0000:0000] 00 00">
     <object type="Bridge" bridge_type="1-1" pci_busid="0000:01:00.0" pci_type="0604 [10b5:9797] [0000:0000] 00 00">
      <object type="Bridge" bridge_type="1-1" pci_busid="0000:02:00.0" pci_type="0604 [10b5:9797] [0000:0000] 00 00">
       <object type="PCIDev" pci_busid="0000:03:00.0" pci_type="0302 [10de:20b0] [10de:134f] a1 00" pci_link_speed="31.5">
        <object type="OSDev" name="cuda0" osdev_type="5"/>
       </object>
      </object>
      <object type="Bridge" bridge_type="1-1" pci_busid="0000:02:01.0" pci_type="0604 [10b5:9797] [0000:0000] 00 00">
       <object type="PCIDev" pci_busid="0000:04:00.0" pci_type="0207 [15b3:101b] [15b3:0007] 00 00" pci_link_speed="31.5">
        <object type="OSDev" name="ib0" osdev_type="2"/>
        <object type="OSDev" name="mlx5_0" osdev_type="3"/>
       </object>
      </object>
     </object>
    </object>
   </object>
  </object>
 </object>
</topology>"#;
    let t = Topology::from_hwloc_xml_str(xml, "v2.xml").unwrap();
    assert_eq!(t.gpus.len(), 1);
    assert_eq!(t.nics.len(), 1);
    assert_eq!(t.nics[0].name, "mlx5_0");
    assert_eq!(t.nics[0].netdevs, ["ib0"]);
    assert_eq!(t.path_class(gpu(0), nic(0)), Pix);
    assert_eq!(t.gpus[0].numa, Some(0));
    let opts = BindOptions::from_values(Some("core"), None, None, None).unwrap();
    let b = t.bindings(2, &opts).unwrap();
    assert_eq!(b[0].cpus, [0, 1]);
    assert_eq!(b[1].cpus, [2, 3]);
}

// ---------------------------------------------------------------- overrides

#[test]
fn cuda_visible_devices_selects_and_orders_gpus() {
    let t = Topology::from_file(P4D).unwrap();
    let opts = BindOptions::from_values(None, None, Some("6,7"), None).unwrap();
    let b = t.bindings(2, &opts).unwrap();
    assert_eq!(
        b[0].gpu.as_ref().map(|g| (g.index, g.cuda_ordinal)),
        Some((6, 0))
    );
    assert_eq!(
        b[1].gpu.as_ref().map(|g| (g.index, g.cuda_ordinal)),
        Some((7, 1))
    );
    assert_eq!(b.iter().map(primary).collect::<Vec<_>>(), [3, 3]);
    assert!(
        b[0].reason.contains("CUDA_VISIBLE_DEVICES=\"6,7\""),
        "{}",
        b[0].reason
    );

    // The list ends at the first invalid entry, as in CUDA.
    let (v, note) = t.visible_gpus(Some("3,1,99,2"));
    assert_eq!(v, [3, 1]);
    assert!(note.contains("\"99\""));
    assert_eq!(t.visible_gpus(Some("0,0")).0, [0]);
    // More ranks than visible GPUs: round-robin.
    let opts = BindOptions::from_values(None, None, Some("3,1"), None).unwrap();
    let b = t.bindings(3, &opts).unwrap();
    assert_eq!(
        b.iter()
            .map(|b| b.gpu.as_ref().unwrap().index)
            .collect::<Vec<_>>(),
        [3, 1, 3]
    );

    // Empty: no GPU visible → ranks spread over NUMA nodes.
    let opts = BindOptions::from_values(None, None, Some(""), None).unwrap();
    let b = t.bindings(2, &opts).unwrap();
    assert!(b.iter().all(|b| b.gpu.is_none()));
    assert_eq!(
        b.iter().map(|b| b.numa).collect::<Vec<_>>(),
        [Some(0), Some(1)]
    );
    assert_eq!(b[0].nics[0].path_class, Phb);
    assert_eq!(b[1].nics[0].path_class, Phb);
    assert!(b[1].nics[0].index >= 2, "NUMA 1 gets a NUMA-1 NIC");

    // UUID prefixes (known from hwloc's NVML info).
    let t = Topology::from_file(DGX2).unwrap();
    assert_eq!(t.visible_gpus(Some("GPU-d256cac8,GPU-d3977428")).0, [4, 0]);
}

#[test]
fn nic_map_grammar() {
    let m = NicMap::parse("0:mlx5_0,1:mlx5_1").unwrap();
    assert_eq!(m.nics_for(0), Some(&["mlx5_0".to_string()][..]));
    assert_eq!(m.nics_for(1), Some(&["mlx5_1".to_string()][..]));
    assert_eq!(m.nics_for(2), None);
    let m = NicMap::parse(" 0-3:mlx5_0 ; 4-7:mlx5_1+mlx5_2 ;*:eth0").unwrap();
    assert_eq!(m.nics_for(3).unwrap(), ["mlx5_0"]);
    assert_eq!(m.nics_for(5).unwrap(), ["mlx5_1", "mlx5_2"]);
    assert_eq!(m.nics_for(100).unwrap(), ["eth0"]);
    let m = NicMap::parse("0:0000:10:1b.0").unwrap();
    assert_eq!(m.nics_for(0).unwrap(), ["0000:10:1b.0"]);
    for bad in [
        "mlx5_0", "x:eth0", "0:", "1:a;1:b", "3-1:a", "0:a++b", "99999:a", "*:a;*:b",
    ] {
        let e = NicMap::parse(bad).unwrap_err();
        assert!(matches!(e, TopoError::NicMap { .. }), "{bad}: {e:?}");
        assert!(e.to_string().contains("expected RANKS:NIC"), "{e}");
    }
}

#[test]
fn nic_map_overrides_and_counts_as_taken() {
    let t = Topology::from_file(NDV4).unwrap();
    let opts =
        BindOptions::from_values(None, Some("0:0108:00:00.0;1:0108:00:00.0"), None, None).unwrap();
    let b = t.bindings(8, &opts).unwrap();
    assert_eq!(primary(&b[0]), 7);
    assert_eq!(primary(&b[1]), 7);
    assert_eq!(b[0].nics[0].path_class, Sys);
    assert!(b[0].reason.contains("RAILRING_NIC_MAP"), "{}", b[0].reason);
    // NIC7 already serves two ranks: GPU6 and GPU7 both take NIC6.
    assert_eq!(primary(&b[6]), 6);
    assert_eq!(primary(&b[7]), 6);
    // The idle NIC0/NIC1 are extras for nobody (ranks 0 and 1 are mapped).
    assert_eq!(b[0].nics.len(), 1);

    let opts = BindOptions::from_values(None, Some("0:nope"), None, None).unwrap();
    let e = t.bindings(1, &opts).unwrap_err();
    assert!(e.to_string().contains("no NIC named \"nope\""), "{e}");

    // By interface name on the SL390s.
    let t = Topology::from_file(SL390).unwrap();
    let opts = BindOptions::from_values(None, Some("*:eth1"), None, None).unwrap();
    let b = t.bindings(3, &opts).unwrap();
    assert!(b
        .iter()
        .all(|b| b.nics.len() == 1 && b.nics[0].name == "eth1"));
}

#[test]
fn bind_to_none_leaves_affinity_alone() {
    let t = Topology::from_file(NDV4).unwrap();
    let opts = BindOptions::from_values(Some("none"), None, None, None).unwrap();
    assert_eq!(opts.bind_to, BindTo::None);
    let b = t.bindings(8, &opts).unwrap();
    for (i, bi) in b.iter().enumerate() {
        assert!(bi.cpus.is_empty());
        assert!(bi.reason.contains("bind-to none"), "{}", bi.reason);
        // GPU and NIC choices do not change.
        assert_eq!(primary(bi), i);
    }
    assert!(BindOptions::from_values(Some("board"), None, None, None).is_err());
    assert_eq!("package".parse::<BindTo>().unwrap(), BindTo::Socket);
    assert_eq!("NUMA".parse::<BindTo>().unwrap(), BindTo::Numa);
    assert!(t.bindings(1_000_000, &file_opts()).is_err());
}

// ---------------------------------------------------------------- renderings

#[test]
fn matrix_like_nvidia_smi() {
    let t = Topology::from_file(P4D).unwrap();
    let m = render::matrix_text(&t);
    let lines: Vec<&str> = m.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7", "NIC0", "NIC1", "NIC2",
            "NIC3", "CPU", "Affinity", "NUMA", "Affinity"
        ]
    );
    let row0: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row0,
        [
            "GPU0",
            "X",
            "PIX",
            "PHB",
            "PHB",
            "SYS",
            "SYS",
            "SYS",
            "SYS",
            "PIX",
            "PHB",
            "SYS",
            "SYS",
            "0-23,48-71",
            "0"
        ]
    );
    let nic3: Vec<&str> = lines[12].split_whitespace().collect();
    assert_eq!(nic3[0], "NIC3");
    assert_eq!(nic3[12], "X");
    assert!(m.contains("NIC Legend:"));
    assert!(
        m.contains(
            "  NIC0: 0000:10:1b.0 (port speed unknown: assumed 126031 Mb/s, from its PCIe link)\n"
        ),
        "{m}"
    );
    assert!(m.contains("PIX  = Connection traversing at most a single PCIe bridge"));
}

#[test]
fn json_and_svg() {
    let t = Topology::from_file(P4D).unwrap();
    let b = t.bindings(8, &file_opts()).unwrap();
    let j: serde_json::Value = serde_json::from_str(&render::json_report(&t, &b)).unwrap();
    assert_eq!(j["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(j["nics"].as_array().unwrap().len(), 4);
    assert_eq!(j["devices"][8], "NIC0");
    assert_eq!(j["path_classes"][0][0], "X");
    assert_eq!(j["path_classes"][0][8], "PIX");
    assert_eq!(j["bindings"].as_array().unwrap().len(), 8);
    assert_eq!(j["bindings"][3]["nics"][0]["path_class"], "PIX");
    assert_eq!(j["bindings"][3]["nics"][0]["index"], 1);
    assert_eq!(j["bindings"][3]["gpu"]["busid"], "0000:20:1d.0");
    assert!(j["bindings"][3]["reason"]
        .as_str()
        .unwrap()
        .contains("shared"));

    let svg = render::svg(&t, &b);
    assert!(svg.starts_with("<svg "));
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let paths = doc.descendants().filter(|n| n.has_tag_name("path")).count();
    assert_eq!(paths, 8, "one highlighted GPU↔NIC curve per rank");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(texts.iter().filter(|t| **t == "PCIe switch").count(), 4);
    assert!(texts.iter().any(|t| t.starts_with("NUMA 1")));
    assert!(texts.contains(&"GPU7"));
    assert!(texts.iter().any(|t| t.starts_with("local rank 7: GPU7")));

    // Names are escaped; DGX-2 (no NIC) draws without curves.
    let t = Topology::from_file(DGX2).unwrap();
    let svg = render::svg(&t, &t.bindings(16, &file_opts()).unwrap());
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(
        doc.descendants().filter(|n| n.has_tag_name("path")).count(),
        0
    );
}

/// The emulated cluster's hosts: a management veth and two rail veths. With the runtime's rail
/// interfaces as `nic_allow`, local rank i gets rail i and the management link is never chosen.
#[test]
fn nic_allow_keeps_bindings_on_the_rails() {
    let f = FakeSys::new("rails");
    f.numa(0, "0-1", 0);
    f.netdev("mgmt0", None, "0x1003", "10000");
    f.netdev("rail0", None, "0x1003", "10000");
    f.netdev("rail1", None, "0x1003", "10000");
    let t = Topology::from_sysfs_root(f.path()).unwrap();
    let mut o = file_opts();
    o.nic_allow = Some(vec!["rail0".into(), "rail1".into()]);
    let b = t.bindings(4, &o).unwrap();
    let names: Vec<String> = b.iter().map(|b| b.nics[0].name.clone()).collect();
    assert_eq!(names, ["rail0", "rail1", "rail0", "rail1"]);
    // an allow-list matching nothing is ignored rather than leaving ranks without a NIC
    o.nic_allow = Some(vec!["ib0".into()]);
    let b = t.bindings(2, &o).unwrap();
    assert!(b.iter().all(|b| !b.nics.is_empty()));
}

// ---------------------------------------------------------------- --map-by / --bind-to modes

/// The SL390 file: 2 sockets (NUMA 0: even CPUs, NUMA 1: odd CPUs), 6 cores of 2 threads
/// each; its GPUs hidden (CUDA_VISIBLE_DEVICES=""), so ranks are CPU ranks.
fn sl390_map(map: Option<&str>, bind: &str, n: usize) -> Result<Vec<Binding>, TopoError> {
    let t = Topology::from_file(SL390).unwrap();
    let mut o = BindOptions::from_values(Some(bind), None, Some(""), None).unwrap();
    o.map = map.map(|m| railring::topology::NodeMap::parse(m).unwrap());
    t.bindings(n, &o)
}

#[test]
fn map_by_and_bind_to_like_open_mpi() {
    let t = Topology::from_file(SL390).unwrap();
    let socket = |s: usize| t.numa_nodes[s].cpus.clone();
    let core_of = |c: usize| {
        t.cores
            .iter()
            .find(|k| k.contains(&c))
            .cloned()
            .unwrap_or_else(|| vec![c])
    };
    let first_cores: Vec<Vec<usize>> = {
        let mut v: Vec<Vec<usize>> = t.cores.clone();
        v.sort_by_key(|c| c[0]);
        v
    };
    assert_eq!(first_cores.len(), 12, "{first_cores:?}");

    // --bind-to socket without a mapping: ranks round-robin over the NUMA nodes, bound to
    // their whole socket.
    let b = sl390_map(None, "socket", 4).unwrap();
    for (r, bi) in b.iter().enumerate() {
        assert_eq!(bi.cpus, socket(r % 2), "rank {r}: {}", bi.reason);
        assert!(bi.reason.contains("bind-to socket"), "{}", bi.reason);
    }
    // --map-by core: rank i on core i (in CPU order), bound to that core's threads.
    let b = sl390_map(Some("core"), "core", 3).unwrap();
    for (r, bi) in b.iter().enumerate() {
        assert_eq!(bi.cpus, first_cores[r], "rank {r}: {}", bi.reason);
    }
    // --map-by core --bind-to hwthread: the first thread of each rank's core.
    let b = sl390_map(Some("core"), "hwthread", 3).unwrap();
    for (r, bi) in b.iter().enumerate() {
        assert_eq!(bi.cpus, [first_cores[r][0]], "rank {r}: {}", bi.reason);
    }
    // --map-by socket (round-robin) --bind-to core: socket 0's first core, socket 1's first,
    // socket 0's second...
    let b = sl390_map(Some("socket"), "core", 4).unwrap();
    let s0: Vec<Vec<usize>> = first_cores
        .iter()
        .filter(|c| socket(0).contains(&c[0]))
        .cloned()
        .collect();
    let s1: Vec<Vec<usize>> = first_cores
        .iter()
        .filter(|c| socket(1).contains(&c[0]))
        .cloned()
        .collect();
    assert_eq!(
        b.iter().map(|x| x.cpus.clone()).collect::<Vec<_>>(),
        [s0[0].clone(), s1[0].clone(), s0[1].clone(), s1[1].clone()]
    );
    // ppr:2:socket (Open MPI binds to the socket): ranks 0,1 on socket 0, 2,3 on socket 1.
    let b = sl390_map(Some("ppr:2:socket"), "socket", 4).unwrap();
    let sets: Vec<Vec<usize>> = b.iter().map(|x| x.cpus.clone()).collect();
    assert_eq!(sets, [socket(0), socket(0), socket(1), socket(1)]);
    // ... socket:fill --bind-to core: consecutive ranks on one socket's successive cores.
    let b = sl390_map(Some("socket:fill"), "core", 4).unwrap();
    assert_eq!(
        b.iter().map(|x| x.cpus.clone()).collect::<Vec<_>>(),
        [s0[0].clone(), s0[1].clone(), s1[0].clone(), s1[1].clone()]
    );
    // More local ranks than ppr:N:socket allows on this node: an error naming the mapping.
    let e = sl390_map(Some("ppr:2:socket"), "socket", 6)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("RAILRING_MAP_BY") && e.contains("ppr:2:socket") && e.contains("2 socket(s)"),
        "{e}"
    );
    // --bind-to hwthread without a mapping: distinct threads, one per core before any
    // second thread.
    let b = sl390_map(None, "hwthread", 2).unwrap();
    assert_eq!(b[0].cpus.len(), 1);
    assert_ne!(core_of(b[0].cpus[0]), core_of(b[1].cpus[0]));
    // A GPU's NUMA node still decides for ranks with a GPU (the mapping is for CPU ranks).
    let t4 = Topology::from_file(P4D).unwrap();
    let mut o = BindOptions::from_values(Some("socket"), None, None, None).unwrap();
    o.map = Some(railring::topology::NodeMap::parse("core").unwrap());
    let b = t4.bindings(8, &o).unwrap();
    assert_eq!(b[0].numa, t4.gpus[0].numa);
    // Bad RAILRING_MAP_BY values are errors naming the variable.
    let e = railring::topology::NodeMap::parse("ppr:2:core")
        .unwrap_err()
        .to_string();
    assert!(e.contains("RAILRING_MAP_BY"), "{e}");
}

// ---------------------------------------------------------------- NIC ranking like NCCL

/// One GPU behind a switch on socket 0 with a NIC beside it (`near`, at PIX), and a NIC on
/// socket 1 (`far`, at SYS from the GPU). `None` speeds leave the attribute out.
fn two_nic_box(near: (&str, Option<u64>), far: (&str, Option<u64>)) -> Topology {
    let net = |name: &str, speed: Option<u64>, dev: u32| {
        let speed = speed.map(|s| format!(" speed=\"{s}\"")).unwrap_or_default();
        let (port, guid) = if name.starts_with("mlx") {
            ("1", "0x3d0c6e0003bac0b8")
        } else {
            ("0", "0x1")
        };
        format!("<net name=\"{name}\" dev=\"{dev}\"{speed} port=\"{port}\" guid=\"{guid}\"/>")
    };
    let xml = format!(
        r#"<system version="1">
  <cpu numaid="0" affinity="0000000f" arch="x86_64">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
      <pci busid="0000:02:00.0" class="0x030200" vendor="0x10de"><gpu dev="0" sm="80"/></pci>
      <pci busid="0000:03:00.0" class="0x020000"><nic>{}</nic></pci>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="000000f0" arch="x86_64">
    <pci busid="0000:81:00.0" class="0x020700"><nic>{}</nic></pci>
  </cpu>
</system>"#,
        net(near.0, near.1, 1),
        net(far.0, far.1, 0)
    );
    Topology::from_nccl_xml_str(&xml, "two-nic.xml").unwrap()
}

#[test]
fn a_slow_port_never_becomes_the_rail_while_a_faster_nic_exists() {
    // 1 GbE beside the GPU, 100 Gb/s RDMA on the other socket: the fast NIC, and why.
    let t = two_nic_box(("eno1", Some(1000)), ("mlx5_0", Some(100_000)));
    assert_eq!(t.path_class(gpu(0), nic(0)), Pix);
    assert_eq!(t.path_class(gpu(0), nic(1)), Sys);
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "mlx5_0", "{}", b[0].reason);
    assert!(
        b[0].reason
            .contains("bandwidth decided: eno1 (PIX, 1000 Mb/s) is 4x or more slower"),
        "{}",
        b[0].reason
    );
    // An RDMA NIC whose speed the file leaves out is assumed fast, and the reason says so.
    let t = two_nic_box(("eno1", Some(1000)), ("mlx5_0", None));
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "mlx5_0", "{}", b[0].reason);
    assert!(
        b[0].reason.contains("mlx5_0 100000 Mb/s an RDMA NIC"),
        "{}",
        b[0].reason
    );
    let m = render::matrix_text(&t);
    assert!(
        m.contains("port speed unknown: assumed 100000 Mb/s, an RDMA NIC"),
        "{m}"
    );
    // Comparable NICs: the nearer one still wins (25 vs 40 Gb/s is not 4x).
    let t = two_nic_box(("eth0", Some(25_000)), ("eth1", Some(40_000)));
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "eth0", "{}", b[0].reason);
    assert!(
        b[0].reason.contains("the only NIC at the best path class"),
        "{}",
        b[0].reason
    );
    // Both beside the GPU (a second one under the same switch): speed, then RDMA decide.
    let xml = r#"<system version="1"><cpu numaid="0" affinity="f">
      <pci busid="0000:01:00.0" class="0x060400">
        <pci busid="0000:02:00.0" class="0x030200" vendor="0x10de"><gpu dev="0"/></pci>
        <pci busid="0000:03:00.0" class="0x020000"><nic><net name="eth0" speed="100000" port="0" guid="0x0"/></nic></pci>
        <pci busid="0000:04:00.0" class="0x020700"><nic><net name="mlx5_1" speed="100000" port="1" guid="0x3d0c6e0003bac0b9"/></nic></pci>
      </pci></cpu></system>"#;
    let t = Topology::from_nccl_xml_str(xml, "rdma.xml").unwrap();
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "mlx5_1", "{}", b[0].reason);
    assert!(
        b[0].reason.contains("RDMA-capable; eth0"),
        "{}",
        b[0].reason
    );
}

#[test]
fn an_nccl_net_named_like_an_rdma_device_is_no_interface_name() {
    let t = two_nic_box(("eth3", Some(25_000)), ("mlx5_7", Some(200_000)));
    let (eth, mlx) = (&t.nics[0], &t.nics[1]);
    assert_eq!(eth.netdevs, ["eth3"]);
    assert_eq!(eth.rdma, None);
    assert_eq!(mlx.rdma.as_deref(), Some("mlx5_7"));
    assert!(mlx.netdevs.is_empty(), "{:?}", mlx.netdevs);
    assert_eq!(mlx.netdev(), None);
    let b = t.bindings(1, &file_opts()).unwrap();
    assert_eq!(b[0].nics[0].name, "mlx5_7");
    assert_eq!(
        b[0].nics[0].netdev, "",
        "never handed to TCP as an interface"
    );
    assert!(
        b[0].reason.contains("no network interface known"),
        "{}",
        b[0].reason
    );
    // ... the runtime's rail list never matches it.
    let mut o = file_opts();
    o.nic_allow = Some(vec!["eth3".into()]);
    let b = t.bindings(1, &o).unwrap();
    assert_eq!(b[0].nics[0].netdev, "eth3");
    // NCCL's IB port without a telling name (port >= 1 and a real GUID) is RDMA too.
    let xml = r#"<system version="1"><cpu numaid="0" affinity="f">
      <pci busid="0000:03:00.0" class="0x020700"><nic><net name="ibp3s0" dev="0" speed="200000" port="1" guid="0x3d0c6e0003bac0b8"/></nic></pci>
      </cpu></system>"#;
    let t = Topology::from_nccl_xml_str(xml, "ib.xml").unwrap();
    assert_eq!(t.nics[0].rdma.as_deref(), Some("ibp3s0"));
}

// ---------------------------------------------------------------- partial topology files

/// An NCCL dump whose PCI devices carry no class: it yields no GPU and no NIC.
const CLASSLESS: &str = r#"<system version="1">
  <cpu numaid="0" affinity="000000ff" arch="x86_64">
    <pci busid="0000:17:00.0"/>
    <pci busid="0000:18:00.0"/>
  </cpu>
</system>"#;

#[test]
fn a_file_without_gpus_or_nics_says_so_loudly_and_merges_with_sysfs() {
    let dir = std::env::temp_dir().join(format!("railring-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("partial.xml");
    std::fs::write(&file, CLASSLESS).unwrap();

    // Another machine's file (railrun topo --topo-file): loud, nothing merged.
    let t = Topology::from_file(&file).unwrap();
    assert!(t.gpus.is_empty() && t.nics.is_empty());
    let w = t.warnings.join("\n");
    assert!(
        w.contains("yields NO GPU AND NO NIC")
            && w.contains("2 PCI device(s) carry no class= (0000:17:00.0, 0000:18:00.0)")
            && w.contains("unset RAILRING_TOPO_FILE"),
        "{w}"
    );

    // This machine's file: the live sysfs has the same bus ids and gives their classes.
    let f = FakeSys::new("partial");
    f.numa(0, "0-7", 0);
    f.pci("pci0000:16/0000:16:00.0/0000:17:00.0", 0x030200, 0x10de, 0);
    f.pci("pci0000:16/0000:16:01.0/0000:18:00.0", 0x020000, 0x8086, 0);
    f.netdev(
        "ens8",
        Some("pci0000:16/0000:16:01.0/0000:18:00.0"),
        "0x1003",
        "100000",
    );
    // sysfs lists a function's interfaces under it, as the kernel does
    f.write(
        "sys/devices/pci0000:16/0000:16:01.0/0000:18:00.0/net/ens8/flags",
        "0x1003",
    );
    let t = Topology::from_file_merged(&file, f.path()).unwrap();
    assert_eq!(t.gpus.len(), 1, "{:?}", t.warnings);
    assert_eq!(t.gpus[0].busid.as_deref(), Some("0000:17:00.0"));
    assert_eq!(t.nics.len(), 1);
    assert_eq!(
        t.nics[0].netdevs,
        ["ens8"],
        "interface names from the live sysfs"
    );
    let w = t.warnings.join("\n");
    assert!(
        w.contains(
            "2 PCI device(s) without class=: class and vendor taken from this machine's sysfs"
        ),
        "{w}"
    );
    assert!(!w.contains("NO GPU AND NO NIC"), "{w}");
    // A live system without those bus ids: still loud, and says why.
    let g = FakeSys::new("partial-empty");
    g.numa(0, "0-7", 0);
    let t = Topology::from_file_merged(&file, g.path()).unwrap();
    let w = t.warnings.join("\n");
    assert!(
        w.contains("this machine's sysfs has none of those bus ids"),
        "{w}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
