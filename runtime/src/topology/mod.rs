//! Node topology and affinity: one model, three loaders, path classes,
//! per-local-rank binding, and renderings (matrix, JSON, SVG).
//!
//! - [`Topology::discover`]: live sysfs, or the file named by
//!   `RAILRING_TOPO_FILE` (format detected from its root element:
//!   `<system` → NCCL topology, `<topology` → hwloc).
//! - [`Topology::from_sysfs_root`], [`Topology::from_file`],
//!   [`Topology::from_nccl_xml_str`], [`Topology::from_hwloc_xml_str`].
//! - [`Topology::path_class`]: `X`, `NV#`, `PIX`, `PXB`, `PHB`, `NODE`,
//!   `SYS` as `nvidia-smi topo -m` prints them (see [`PathClass`]).
//! - [`Topology::bindings`]: GPU, NIC(s), CPUs and the reason for each
//!   local rank (see the `binding` module docs for the tie-breaks);
//!   [`apply_cpu_binding`] applies the CPU part.
//!
//! Inputs are bounded: files up to [`MAX_FILE_BYTES`], XML nesting up to
//! [`MAX_XML_DEPTH`], at most 4096 GPUs/NICs and 65536 PCI nodes; nothing
//! read from a file, sysfs or the environment can make this module panic.
//! Errors name the file and line and what was expected.

mod binding;
mod cpus;
mod hwloc_xml;
mod model;
mod nccl_xml;
mod paths;
pub mod render;
mod sysfs;
mod util;

use std::path::Path;

pub use binding::{
    apply_cpu_binding, process_allowed_cpus, BindOptions, BindTo, BindVars, Binding, GpuRef,
    NicMap, NicRef, MAX_LOCAL_SIZE,
};
pub use cpus::{MapObj, NodeMap};
pub use model::{DeviceId, Gpu, Nic, NumaNode, PciKind, PciNode, Topology};
pub use paths::PathClass;
pub use util::{format_cpulist, parse_cpulist};

/// Largest topology file accepted.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Deepest XML element nesting followed.
pub const MAX_XML_DEPTH: usize = 256;
/// Most XML nodes roxmltree may build for one file.
const MAX_XML_NODES: u32 = 2_000_000;

/// Everything that can go wrong reading a topology or computing a binding.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("{file}: cannot read topology file: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {size} bytes is over the {limit}-byte limit for topology files")]
    TooLarge { file: String, size: u64, limit: u64 },
    #[error("{file}: not UTF-8 text; expected an NCCL or hwloc topology XML file")]
    NotText { file: String },
    #[error("{file}:{line}:{col}: malformed XML: {msg}")]
    Xml {
        file: String,
        line: u32,
        col: u32,
        msg: String,
    },
    #[error("{file}:{line}: expected {expected} as root element, found <{found}>")]
    UnknownFormat {
        file: String,
        line: u32,
        found: String,
        expected: String,
    },
    #[error("{file}:{line}: {what}: expected {expected}, found {found:?}")]
    Invalid {
        file: String,
        line: u32,
        what: String,
        expected: String,
        found: String,
    },
    #[error("{file}:{line}: {msg}")]
    Limit {
        file: String,
        line: u32,
        msg: String,
    },
    #[error("sysfs {path}: {msg}")]
    Sysfs { path: String, msg: String },
    #[error(
        "{} {input:?}: {msg}; expected RANKS:NIC[+NIC...] entries separated by ';' or ','",
        crate::vars::NIC_MAP
    )]
    NicMap { input: String, msg: String },
    #[error("bind-to {found:?}: expected none, auto, hwthread, core, numa, socket or package")]
    BindTo { found: String },
    #[error("{var}: {msg}")]
    Env { var: String, msg: String },
    #[error("local size {found} is out of range: expected at most {max}")]
    LocalSize { found: usize, max: usize },
    #[error("cannot set CPU affinity to {cpus}: {msg}")]
    Affinity { cpus: String, msg: String },
}

/// 1-based line of an XML node.
/// Error helpers shared by the XML loaders: line numbers and file-named errors.
pub(crate) trait XmlCtx<'a, 'i: 'a> {
    fn doc(&self) -> &'a roxmltree::Document<'i>;
    fn file(&self) -> &str;

    fn line(&self, n: roxmltree::Node) -> u32 {
        xml_line(self.doc(), n)
    }

    fn invalid(&self, n: roxmltree::Node, what: &str, expected: &str, found: &str) -> TopoError {
        TopoError::Invalid {
            file: self.file().to_string(),
            line: self.line(n),
            what: what.to_string(),
            expected: expected.to_string(),
            found: found.chars().take(80).collect(),
        }
    }

    fn limit(&self, n: roxmltree::Node, msg: &str) -> TopoError {
        TopoError::Limit {
            file: self.file().to_string(),
            line: self.line(n),
            msg: msg.to_string(),
        }
    }
}

pub(crate) fn xml_line(doc: &roxmltree::Document, n: roxmltree::Node) -> u32 {
    doc.text_pos_at(n.range().start).row
}

fn parse_xml<'a>(text: &'a str, name: &str) -> Result<roxmltree::Document<'a>, TopoError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(TopoError::TooLarge {
            file: name.to_string(),
            size: text.len() as u64,
            limit: MAX_FILE_BYTES,
        });
    }
    if let Some((line, _)) = util::xml_too_deep(text, MAX_XML_DEPTH) {
        return Err(TopoError::Limit {
            file: name.to_string(),
            line,
            msg: format!("elements nest deeper than {MAX_XML_DEPTH} levels"),
        });
    }
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        nodes_limit: MAX_XML_NODES,
    };
    roxmltree::Document::parse_with_options(text, opts).map_err(|e| {
        let pos = e.pos();
        TopoError::Xml {
            file: name.to_string(),
            line: pos.row,
            col: pos.col,
            msg: e.to_string(),
        }
    })
}

impl Topology {
    /// The topology of this machine: from `topo_file` (an NCCL or hwloc XML,
    /// `RAILRING_TOPO_FILE`, see [`crate::config`]) or, with `None`, from
    /// sysfs. NICs the file names only by bus id get their interface names
    /// from the live sysfs when the same bus id exists here.
    ///
    /// A file describes this machine here, so where it is partial the live sysfs fills in:
    /// NCCL `<pci>` devices without `class=` take the class of the same bus id here, and
    /// NICs without interface names take this machine's (see [`Topology::from_file_merged`]).
    /// Every warning of the file (one saying loudly that it yields no GPU and no NIC, say) is
    /// logged at WARN (`railring::topo`).
    pub fn discover_from(topo_file: Option<&Path>) -> Result<Topology, TopoError> {
        match topo_file {
            Some(f) => {
                let t = Topology::from_file_merged(f, Path::new("/"))?;
                for w in &t.warnings {
                    tracing::warn!(target: "railring::topo", "{}: {w}", crate::vars::TOPO_FILE);
                }
                Ok(t)
            }
            None => Topology::from_sysfs_root(Path::new("/")),
        }
    }

    /// A topology file of the machine whose root is `live` (`/`): read like
    /// [`Topology::from_file`], then completed from that machine's sysfs where the file is
    /// partial — NCCL `<pci busid>` devices without `class=` take the class and vendor of the
    /// same bus id there, NICs known only by bus id or RDMA name take its interface names.
    /// Nothing the file says is overridden.
    pub fn from_file_merged(path: impl AsRef<Path>, live: &Path) -> Result<Topology, TopoError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = read_text(path)?;
        let doc = parse_xml(&text, &name)?;
        let mut t = match doc.root_element().tag_name().name() {
            "system" => nccl_xml::load_merged(&doc, &name, Some(live))?,
            _ => Topology::from_xml_str(&text, &name)?,
        };
        sysfs::enrich_names(&mut t, live);
        Ok(t)
    }

    /// Reads a sysfs tree under `root` (`/` for the live system; tests build
    /// fake trees: `root/sys/devices/...`, `root/sys/bus/pci/devices/*`,
    /// `root/sys/class/net/*`, `root/sys/class/infiniband/*`).
    pub fn from_sysfs_root(root: &Path) -> Result<Topology, TopoError> {
        sysfs::load(root)
    }

    /// Reads an NCCL or hwloc XML file (detected from the root element).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Topology, TopoError> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Topology::from_xml_str(&text, &path.display().to_string())
    }
}

/// A topology file's text, at most [`MAX_FILE_BYTES`].
fn read_text(path: &Path) -> Result<String, TopoError> {
    use std::io::Read;
    {
        let name = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|e| TopoError::Io {
            file: name.clone(),
            source: e,
        })?;
        let mut buf = Vec::new();
        f.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| TopoError::Io {
                file: name.clone(),
                source: e,
            })?;
        if buf.len() as u64 > MAX_FILE_BYTES {
            return Err(TopoError::TooLarge {
                file: name,
                size: buf.len() as u64,
                limit: MAX_FILE_BYTES,
            });
        }
        String::from_utf8(buf).map_err(|_| TopoError::NotText { file: name.clone() })
    }
}

impl Topology {
    /// Parses NCCL (`<system>`) or hwloc (`<topology>`) XML; `name` is used
    /// in errors.
    pub fn from_xml_str(text: &str, name: &str) -> Result<Topology, TopoError> {
        let doc = parse_xml(text, name)?;
        match doc.root_element().tag_name().name() {
            "system" => nccl_xml::load(&doc, name),
            "topology" => hwloc_xml::load(&doc, name),
            other => Err(TopoError::UnknownFormat {
                file: name.to_string(),
                line: xml_line(&doc, doc.root_element()),
                found: other.chars().take(40).collect(),
                expected: "<system> (NCCL topology) or <topology> (hwloc)".into(),
            }),
        }
    }

    /// Parses an NCCL topology file (`NCCL_TOPO_FILE` format).
    pub fn from_nccl_xml_str(text: &str, name: &str) -> Result<Topology, TopoError> {
        let doc = parse_xml(text, name)?;
        nccl_xml::load(&doc, name)
    }

    /// Parses an hwloc XML export (format 1.x, 2.0 or 3.0).
    pub fn from_hwloc_xml_str(text: &str, name: &str) -> Result<Topology, TopoError> {
        let doc = parse_xml(text, name)?;
        hwloc_xml::load(&doc, name)
    }
}
