//! `railrun topo`: show this node's topology (or a file's), the path-class
//! matrix like `nvidia-smi topo -m`, and the binding of each local rank.
//!
//! ```text
//! railrun topo [--topo-file FILE] [--svg FILE] [--json] [--local-size N] [--bind-to MODE]
//! ```
//!
//! Without `--topo-file` the node is discovered live (or from
//! `RAILRING_TOPO_FILE`), and `CUDA_VISIBLE_DEVICES`, `RAILRING_NIC_MAP`,
//! `RAILRING_BIND_TO` and this process's CPU affinity apply. With
//! `--topo-file` the file describes some other machine: only
//! `RAILRING_NIC_MAP` and `--bind-to`/`RAILRING_BIND_TO` apply.

use std::io::Write;
use std::path::{Path, PathBuf};

use railring::config::{bind_vars_from_env, topo_file_from_env};
use railring::topology::{render, BindOptions, Topology};
use railring::vars;

const USAGE: &str =
    "usage: railrun topo [--topo-file FILE] [--svg FILE] [--json] [--local-size N] [--bind-to MODE]

  --topo-file FILE   read an NCCL (<system>) or hwloc (<topology>) XML file instead of this node
  --svg FILE         also draw sockets, switches, GPUs and NICs with the chosen GPU-NIC pairs
  --json             print devices, path classes and bindings as JSON
  --local-size N     local ranks to show bindings for (default: number of GPUs, or 1 without GPU)
  --bind-to MODE     none | auto (default) | hwthread | core | numa | socket | package
Unknown options are errors (exit 2).
";

#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    topo_file: Option<PathBuf>,
    svg: Option<PathBuf>,
    json: bool,
    local_size: Option<usize>,
    bind_to: Option<String>,
    help: bool,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = args.iter().peekable();
    if it.peek().map(|s| s.as_str()) == Some("topo") {
        it.next();
    }
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone().or_else(|| it.next().cloned()) {
                Some(v) if !v.is_empty() => Ok(v),
                _ => Err(format!("{name} needs a value\n{USAGE}")),
            }
        };
        let no_value = |name: &str| -> Result<(), String> {
            match &inline {
                None => Ok(()),
                Some(_) => Err(format!("{name} takes no value (got {arg:?})\n{USAGE}")),
            }
        };
        match flag {
            "--topo-file" => a.topo_file = Some(PathBuf::from(value("--topo-file")?)),
            "--svg" => a.svg = Some(PathBuf::from(value("--svg")?)),
            "--json" => {
                no_value("--json")?;
                a.json = true
            }
            "--local-size" => {
                let v = value("--local-size")?;
                let n: usize = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1 && *n <= railring::topology::MAX_LOCAL_SIZE)
                    .ok_or_else(|| {
                        format!(
                            "--local-size {v:?}: expected a number from 1 to {}",
                            railring::topology::MAX_LOCAL_SIZE
                        )
                    })?;
                a.local_size = Some(n);
            }
            "--bind-to" => {
                let v = value("--bind-to")?;
                v.parse::<railring::topology::BindTo>()
                    .map_err(|e| format!("--bind-to: {e}\n{USAGE}"))?;
                a.bind_to = Some(v)
            }
            "-h" | "--help" => {
                no_value("--help")?;
                a.help = true
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown option {other:?}\n{USAGE}"))
            }
            other => return Err(format!("unexpected argument {other:?}\n{USAGE}")),
        }
    }
    Ok(a)
}

/// Loads the topology and binding options: from `topo_file` (another
/// machine: no CPU-affinity or `CUDA_VISIBLE_DEVICES` restriction) or from
/// this node and its environment. `bind_to` overrides `RAILRING_BIND_TO`.
pub fn load(
    topo_file: Option<&Path>,
    bind_to: Option<&str>,
) -> Result<(Topology, BindOptions), String> {
    let env_bind = std::env::var(vars::BIND_TO).ok();
    let bind = bind_to.or(env_bind.as_deref());
    match topo_file {
        Some(f) => {
            let topo = Topology::from_file(f).map_err(|e| e.to_string())?;
            let map = std::env::var(vars::NIC_MAP).ok();
            let opts = BindOptions::from_values(bind, map.as_deref(), None, None)
                .map_err(|e| e.to_string())?;
            Ok((topo, opts))
        }
        None => {
            let topo = Topology::discover_from(topo_file_from_env().as_deref())
                .map_err(|e| e.to_string())?;
            let mut opts = bind_vars_from_env().options().map_err(|e| e.to_string())?;
            if let Some(b) = bind_to {
                opts.bind_to = b
                    .parse()
                    .map_err(|e: railring::topology::TopoError| e.to_string())?;
            }
            Ok((topo, opts))
        }
    }
}

/// The default number of local ranks: one per visible GPU, or 1.
pub fn default_local_size(topo: &Topology, opts: &BindOptions) -> usize {
    topo.visible_gpus(opts.cuda_visible_devices.as_deref())
        .0
        .len()
        .max(1)
}

/// `railrun topo ARGS` (the arguments after `topo`; a leading `topo` is
/// skipped). Prints to stdout; returns the exit code.
pub fn run(args: &[String]) -> Result<i32, String> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run_to(args, &mut out)
}

fn run_to(args: &[String], out: &mut dyn Write) -> Result<i32, String> {
    let a = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            // A bad command line: exit 2, as railrun itself.
            eprintln!("railrun topo: {e}");
            return Ok(2);
        }
    };
    if a.help {
        out.write_all(USAGE.as_bytes()).map_err(|e| e.to_string())?;
        return Ok(0);
    }
    let (topo, opts) = load(a.topo_file.as_deref(), a.bind_to.as_deref())?;
    let local_size = a
        .local_size
        .unwrap_or_else(|| default_local_size(&topo, &opts));
    let bindings = topo
        .bindings(local_size, &opts)
        .map_err(|e| e.to_string())?;
    if let Some(svg) = &a.svg {
        std::fs::write(svg, render::svg(&topo, &bindings))
            .map_err(|e| format!("{}: cannot write SVG: {e}", svg.display()))?;
    }
    let text = if a.json {
        let mut j = render::json_report(&topo, &bindings);
        j.push('\n');
        j
    } else {
        let mut s = format!(
            "Topology from {}: {} NUMA node(s), {} GPU(s), {} NIC(s)\n",
            topo.source,
            topo.numa_nodes.len(),
            topo.gpus.len(),
            topo.nics.len()
        );
        for w in &topo.warnings {
            s.push_str(&format!("warning: {w}\n"));
        }
        s.push('\n');
        s.push_str(&render::matrix_text(&topo));
        s.push('\n');
        s.push_str(&format!("bind-to {}\n", opts.bind_to));
        s.push_str(&render::bindings_text(&topo, &bindings));
        if let Some(svg) = &a.svg {
            s.push_str(&format!("\nSVG written to {}\n", svg.display()));
        }
        s
    };
    out.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P4D: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/topology/aws-p4d-24xl-topo.xml"
    );

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn args() {
        let a = parse_args(&s(&[
            "topo",
            "--topo-file",
            "n.xml",
            "--svg=t.svg",
            "--json",
            "--local-size",
            "4",
        ]))
        .unwrap();
        assert_eq!(a.topo_file.as_deref(), Some(Path::new("n.xml")));
        assert_eq!(a.svg.as_deref(), Some(Path::new("t.svg")));
        assert!(a.json);
        assert_eq!(a.local_size, Some(4));
        assert!(parse_args(&s(&["--local-size", "0"])).is_err());
        assert!(parse_args(&s(&["--local-size"])).is_err());
        for bad in [
            &["--bogus"][..],
            &["--json=yes"],
            &["--json", "extra"],
            &["-x"],
            &["--bind-to", "board"],
            &["--help=1"],
        ] {
            let e = parse_args(&s(bad)).unwrap_err();
            assert!(
                e.contains(bad.last().unwrap().split('=').next().unwrap()),
                "{bad:?}: {e}"
            );
        }
        let mut out = Vec::new();
        assert_eq!(run_to(&s(&["--frob"]), &mut out).unwrap(), 2);
        assert!(out.is_empty());
    }

    #[test]
    fn file_matrix_json_svg() {
        let mut out = Vec::new();
        assert_eq!(
            run_to(&s(&["--topo-file", P4D, "--local-size", "2"]), &mut out).unwrap(),
            0
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("NIC Legend:"), "{text}");
        assert!(text.contains("Bindings (2 local rank(s)):"), "{text}");
        assert!(
            text.contains("local rank 1: GPU1 0000:10:1d.0, NIC0 0000:10:1b.0 (PIX"),
            "{text}"
        );

        let mut out = Vec::new();
        let svg = std::env::temp_dir().join(format!("railrun-topo-{}.svg", std::process::id()));
        run_to(
            &s(&["--topo-file", P4D, "--json", "--svg", svg.to_str().unwrap()]),
            &mut out,
        )
        .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(j["bindings"].as_array().unwrap().len(), 8);
        let pic = std::fs::read_to_string(&svg).unwrap();
        let _ = std::fs::remove_file(&svg);
        assert!(pic.starts_with("<svg") && pic.ends_with("</svg>\n"));

        let mut out = Vec::new();
        run_to(
            &s(&["--topo-file", P4D, "--local-size", "2", "--bind-to", "none"]),
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("bind-to none\n"), "{text}");
        assert!(
            text.contains("local rank 1: GPU1 0000:10:1d.0, NIC0 0000:10:1b.0 (PIX, 126031 Mb/s), CPUs unbound, NUMA 0\n"),
            "{text}"
        );
    }

    #[test]
    fn this_node() {
        let mut out = Vec::new();
        assert_eq!(run_to(&s(&["--local-size", "1"]), &mut out).unwrap(), 0);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Bindings (1 local rank(s)):"), "{text}");
    }
}
