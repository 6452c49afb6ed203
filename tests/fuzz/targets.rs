//! The fuzz targets: each parser that reads a file, the environment, the command line or a
//! network frame, with its seeds and dictionary. Shared by both fuzzers: the mutational harness
//! (`tests/fuzz/main.rs`, which runs them with `tests/fuzz/run.rs`) and the coverage-guided one
//! (`tests/fuzz-lf/main.rs`, libFuzzer, which includes this file with `#[path]`), so a target is
//! defined once. This file uses only `std`, `railring`, `railring-collectives` and `railrun`.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Target {
    pub name: &'static str,
    /// Valid inputs (fixtures, hand-written) the mutations start from.
    pub seeds: Vec<Vec<u8>>,
    /// The grammar's tokens.
    pub dict: &'static [&'static str],
    /// One execution: parse the input, ignore the result. Must not panic, hang or allocate
    /// more than the input's size justifies.
    pub exec: fn(&[u8]),
}

/// The workspace root: the nearest folder above this crate's that holds ARCHITECTURE.md (the
/// crate is `tests/` or `tests/fuzz-lf/`).
fn root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|p| p.join("ARCHITECTURE.md").is_file())
        .unwrap_or(here)
        .to_path_buf()
}

fn files(dir: &str, ext: Option<&str>) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root().join(dir)) {
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if ext.is_none_or(|e| p.extension().is_some_and(|x| x == e)) {
                if let Ok(b) = std::fs::read(&p) {
                    v.push(b);
                }
            }
        }
    }
    v
}

fn text(d: &[u8]) -> String {
    String::from_utf8_lossy(d).into_owned()
}

fn strs(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// A byte stream for handshakes: reads the input, swallows writes.
struct Pipe(Cursor<Vec<u8>>);
impl Read for Pipe {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(b)
    }
}
impl Write for Pipe {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const KNOBS: &[&str] = &[
    "RAILRING_TIMEOUT",
    "RAILRING_CONNECT_TIMEOUT",
    "RAILRING_ALGO",
    "RAILRING_COST",
    "RAILRING_SOCKET_IFNAME",
    "RAILRING_SHM_SLOT",
    "RAILRING_NET_CHUNK",
    "RAILRING_NET_STREAMS",
    "RAILRING_PIPELINE_SEG",
    "RAILRING_NET_GDR_LEVEL",
    "RAILRING_DEBUG",
    "RAILRING_DEBUG_SUBSYS",
    "RAILRING_HOST_ID",
    "RAILRING_NET",
    "RAILRING_IB_HCA",
    "RAILRING_IB_GID_INDEX",
    "RAILRING_GPU_SLOT",
    "RAILRING_NIC_MAP",
    "RAILRING_BIND_TO",
    "RAILRING_LOCAL_SIZE",
];

pub fn all() -> Vec<Target> {
    let hostfiles = {
        let mut v = files("hostfiles", None);
        v.extend(files("tests/fixtures/hostfiles", None));
        v.extend(strs(&[
            "a slots=2 max_slots=4\nbob@b:3\n# c\nc user=x\n",
            "n[1-3]\n",
        ]));
        v
    };
    let xml = files("tests/fixtures/topology", Some("xml"));
    let store_frames = {
        use railring::store::wire::{Request, Response};
        let mut v = Vec::new();
        for req in [
            Request::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
            Request::Get {
                key: b"c0/world".to_vec(),
                timeout: Duration::from_secs(3),
            },
            Request::Wait {
                keys: vec![b"a".to_vec(), b"b".to_vec()],
                timeout: Duration::from_millis(5),
            },
            Request::Add {
                key: b"n".to_vec(),
                delta: -3,
            },
            Request::Check {
                keys: vec![b"x".to_vec()],
            },
        ] {
            let p = req.encode();
            let mut f = (p.len() as u32).to_le_bytes().to_vec();
            f.extend(p);
            v.push(f);
        }
        for resp in [
            Response::Ok,
            Response::Value(b"abc".to_vec()),
            Response::Int(-5),
            Response::Present(vec![true, false]),
            Response::Timeout(vec![b"k".to_vec()]),
            Response::Error("e".into()),
        ] {
            let p = resp.encode();
            let mut f = (p.len() as u32).to_le_bytes().to_vec();
            f.extend(p);
            v.push(f);
        }
        v
    };
    let descs = {
        use railring::executor::CallDesc;
        use railring::{DataType, ReduceOp};
        use railring_collectives::plan::CollKind;
        vec![CallDesc {
            seq: 7,
            kind: CollKind::AllReduce,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            count: 1000,
            root: 0,
            comm: 3,
        }
        .encode()
        .to_vec()]
    };
    vec![
        Target {
            name: "hostfile",
            seeds: hostfiles.clone(),
            dict: &["slots=", "max_slots=", "max-slots=", "user=", "@", ":", "#", "\n", "localhost", "-"],
            exec: |d| {
                let _ = railrun::host_source::parse_hostfile_str(&text(d), "fuzz");
            },
        },
        Target {
            name: "host-arg",
            seeds: strs(&["a,b:2,bob@c", "n1:4,n2", "localhost"]),
            dict: &[",", ":", "@", "-", "localhost"],
            exec: |d| {
                let _ = railrun::host_source::parse_host_arg(&text(d));
            },
        },
        Target {
            name: "slurm-hostlist",
            seeds: strs(&["n[1-4,7],gpu-[01-16]x,a", "rack[1-2]-n[001-100]", "node1", "n[0-65535]"]),
            dict: &["[", "]", "-", ",", "0", "00001", "65536", "99999"],
            exec: |d| {
                if let Ok(v) = railring::hostlist::expand(&text(d)) {
                    let _ = railring::hostlist::compress(&v);
                }
            },
        },
        Target {
            name: "tasks-per-node",
            seeds: strs(&["2(x3),1", "4", "1(x65536)", "2,2,3(x2)"]),
            dict: &["(x", ")", ",", "4294967295"],
            exec: |d| {
                let _ = railring::hostlist::parse_tasks_per_node(&text(d));
            },
        },
        Target {
            name: "slurm-env",
            seeds: strs(&["n[1-2]\n2(x2)", "a,b\n1,3"]),
            dict: &["[", "]", "(x", ")", ",", "\n"],
            exec: |d| {
                let t = text(d);
                let mut parts = t.splitn(2, '\n');
                let list = parts.next().unwrap_or("").to_string();
                let tasks = parts.next().map(str::to_string);
                let env = move |k: &str| match k {
                    "SLURM_JOB_NODELIST" => Some(list.clone()),
                    "SLURM_TASKS_PER_NODE" | "SLURM_JOB_CPUS_PER_NODE" => tasks.clone(),
                    _ => None,
                };
                let _ = railrun::host_source::hosts_from_slurm_env(&env);
            },
        },
        Target {
            name: "nccl-xml",
            seeds: xml.clone(),
            dict: &["<system version=\"1\">", "<cpu ", "<pci ", "<gpu ", "<nic ", "<net ", "</pci>", "/>", "busid=\"", "numaid=\"", "affinity=\"", "<!DOCTYPE s [<!ENTITY a \"&b;&b;\">]>", "&a;", "<![CDATA[", "<!--"],
            exec: |d| {
                let _ = railring::topology::Topology::from_nccl_xml_str(&text(d), "fuzz.xml");
                let _ = railring::topology::Topology::from_xml_str(&text(d), "fuzz.xml");
            },
        },
        Target {
            name: "hwloc-xml",
            seeds: xml,
            dict: &["<topology version=\"2.0\">", "<object type=\"Machine\" os_index=\"0\">", "<object type=\"PCIDev\" pci_busid=\"0000:00:01.0\">", "<object type=\"OSDev\" name=\"eth0\" osdev_type=\"2\">", "</object>", "cpuset=\"0x", "nodeset=\"", "<info name=\"", "<distances2 ", "/>"],
            exec: |d| {
                let _ = railring::topology::Topology::from_hwloc_xml_str(&text(d), "fuzz.xml");
            },
        },
        Target {
            name: "store-frame",
            seeds: store_frames,
            dict: &[],
            exec: |d| {
                use railring::store::wire::{read_frame, Request, Response};
                use railring::store::{Backend, Store};
                let store = Store::new();
                let handle = |req: Request| {
                    // The store answers what decodes, with the frame's own timeouts; the keys a
                    // Get or Wait asks for are set first, so no call blocks.
                    match &req {
                        Request::Get { key, .. } => {
                            store.handle(Request::Set { key: key.clone(), value: b"v".to_vec() });
                        }
                        Request::Wait { keys, .. } => {
                            for k in keys.iter().take(64) {
                                store.handle(Request::Set { key: k.clone(), value: vec![] });
                            }
                            if keys.len() > 64 {
                                return;
                            }
                        }
                        _ => {}
                    }
                    let _ = store.handle(req).encode();
                };
                let mut c = Cursor::new(d);
                while let Ok(Some(f)) = read_frame(&mut c) {
                    if let Ok(req) = Request::decode(&f) {
                        handle(req);
                    }
                    let _ = Response::decode(&f);
                }
                if let Ok(req) = Request::decode(d) {
                    handle(req);
                }
                let _ = Response::decode(d);
            },
        },
        Target {
            name: "data-hello",
            seeds: {
                // the connector's handshake reply (nonce, proof, purpose) then its hello
                let mut h = vec![0u8; 16 + 32];
                h.push(4);
                h.extend(b"data");
                h.extend(3u64.to_le_bytes());
                h.extend([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
                vec![h]
            },
            dict: &["data", "store"],
            exec: |d| {
                let mut p = Pipe(Cursor::new(d.to_vec()));
                let _ = railring::store::auth::server_handshake(&mut p, b"secret", Some("data"));
                let _ = railring::store::auth::client_handshake(&mut Pipe(Cursor::new(d.to_vec())), b"secret", "data");
                let _ = railring::transport::tcp::parse_hello(d);
                if d.len() > 49 {
                    let _ = railring::transport::tcp::parse_hello(&d[49..]);
                }
            },
        },
        Target {
            name: "call-desc",
            seeds: descs,
            dict: &["RRHD"],
            exec: |d| {
                let mut b = [0u8; railring::transport::DESC];
                let n = d.len().min(b.len());
                b[..n].copy_from_slice(&d[..n]);
                if let Some(c) = railring::executor::CallDesc::decode(&b) {
                    let _ = c.describe();
                }
                let _ = railring::executor::CallDesc::describe_bytes(&b);
            },
        },
        Target {
            name: "agent-frame",
            seeds: {
                use railrun::proto::{encode, Msg};
                vec![
                    encode(&Msg::Ping { timeout_ms: 6000 }).unwrap(),
                    encode(&Msg::Kill { signal: 15 }).unwrap(),
                    encode(&Msg::StoreReq { conn: 1, id: 2, frame: vec![1, 2, 3] }).unwrap(),
                ]
            },
            dict: &["\"type\"", "\"Spawn\"", "\"Output\"", "\"data\":\"", "==", "{", "}", "[", "]", "null", "1e999"],
            exec: |d| {
                let mut r = d;
                while let Ok(Some(_)) = railrun::proto::read_msg(&mut r) {}
                let _ = railrun::proto::read_magic(&mut &d[..]);
            },
        },
        Target {
            name: "railrun-cli",
            seeds: strs(&[
                "-np\n4\n--hostfile\nhf\n-x\nA=1\n--map-by\nnode\nprog\narg",
                "--host=a,b\n--ppn\n2\n--timeout\n1.5\n--bind-to\ncore\n-v\n-v\nprog",
                "topo\n--format\njson",
                "--dry-run=json\n-H\nn1:2\n--oversubscribe\nprog",
            ]),
            dict: &["\n", "-np", "--np=", "-H", "--host", "--hostfile", "-x", "--ppn", "--map-by", "--bind-to", "--timeout", "--connect-timeout", "--ssh", "--dry-run", "--output-dir", "--", "-"],
            exec: |d| {
                let t = text(d);
                let args: Vec<String> = t.split('\n').map(str::to_string).collect();
                let _ = railrun::cli::parse(&args);
            },
        },
        Target {
            name: "env-knobs",
            seeds: strs(&[
                "RAILRING_TIMEOUT=10\nRAILRING_SHM_SLOT=1M\nRAILRING_NET_CHUNK=512K",
                "RAILRING_COST=net_beta=1.25e8,net_alpha=5e-5\nRAILRING_ALGO=ring",
                "RAILRING_NET_STREAMS=4\nRAILRING_NET_GDR_LEVEL=PHB\nRAILRING_DEBUG=INFO\nRAILRING_DEBUG_SUBSYS=net,init",
                "RAILRING_IB_GID_INDEX=3\nRAILRING_GPU_SLOT=64K\nRAILRING_HOST_ID=x\nRAILRING_PIPELINE_SEG=0",
            ]),
            dict: &["RAILRING_TIMEOUT=", "RAILRING_SHM_SLOT=", "RAILRING_NET_CHUNK=", "RAILRING_NET_STREAMS=", "RAILRING_COST=", "RAILRING_ALGO=", "=", "\n", "K", "M", "G", "T"],
            exec: |d| {
                for k in KNOBS {
                    std::env::remove_var(k);
                }
                for line in text(d).lines() {
                    if let Some((k, v)) = line.split_once('=') {
                        if let Some(knob) = KNOBS.iter().find(|n| **n == k) {
                            if !v.contains('\0') {
                                std::env::set_var(knob, v);
                            }
                        }
                    }
                }
                let _ = railring::config::Config::from_env();
                for k in KNOBS {
                    std::env::remove_var(k);
                }
            },
        },
    ]
}

/// Saved inputs that once failed: replayed before any mutation. Inputs too large to keep as
/// files are made here (XML nested 30 000 levels deep: a stack overflow before the depth
/// pre-scan).
pub fn regressions(target: &str) -> Vec<Vec<u8>> {
    let mut v = files(&format!("tests/fuzz/regressions/{target}"), None);
    let deep = |root: &str, open: &str, close: &str| -> Vec<u8> {
        format!(
            "<{root}>{}{}</{root}>",
            open.repeat(30_000),
            close.repeat(30_000)
        )
        .into_bytes()
    };
    match target {
        "nccl-xml" => v.push(deep("system version=\"1\"", "<cpu>", "</cpu>")),
        "hwloc-xml" => v.push(deep(
            "topology version=\"2.0\"",
            "<object type=\"Machine\">",
            "</object>",
        )),
        _ => {}
    }
    v
}
