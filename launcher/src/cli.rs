//! railrun's command line: a hand-rolled, mpirun-compatible parser.
//!
//! Options come before the program; the first argument that is not an option (or the argument
//! after `--`) is the program, and everything after it belongs to the program. Long options may
//! be written with one or two dashes (`-np 4`, `--np 4`, `-hostfile F`, `--hostfile=F`), as
//! Open MPI accepts.

use std::path::PathBuf;
use std::time::Duration;

/// The default for `--connect-timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What railrun was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Launch (or dry-run) a job.
    Run(Box<RunOpts>),
    /// `railrun topo ...`: the arguments after `topo`.
    Topo(Vec<String>),
    /// `railrun plan ...`: the arguments after `plan`.
    Plan(Vec<String>),
    /// `railrun doctor ...`: the arguments after `doctor`.
    Doctor(Vec<String>),
    /// Hidden: `railrun --agent`, the remote side started over SSH.
    Agent {
        verbose: u8,
    },
    Help,
    Version,
}

pub use crate::placement::{MapBy, RankBy};

/// `--dry-run` / `--dry-run=json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun {
    Table,
    Json,
}

/// `--bind-to`: the runtime's binding mode, passed to ranks as `RAILRING_BIND_TO`.
pub use railring::topology::BindTo;

/// One `-x`: forward `name` (value: None) or set it (Some).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSpec {
    pub name: String,
    pub value: Option<String>,
}

/// Options of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOpts {
    pub np: Option<usize>,
    pub hostfile: Option<PathBuf>,
    pub hosts: Option<String>,
    pub ppn: Option<usize>,
    /// `--map-by` (`-N n`: `ppr:n:node`); `None`: the host source's family decides.
    pub map_by: Option<MapBy>,
    pub rank_by: Option<RankBy>,
    pub oversubscribe: bool,
    /// `--nolocal`: no rank on this machine.
    pub nolocal: bool,
    /// `--display-map`: print the placement table on stdout, then run.
    pub display_map: bool,
    /// `-wdir` / `--wdir` / `-wd`: the ranks' working directory.
    pub wdir: Option<PathBuf>,
    /// `--merge-stderr-to-stdout`: rank stderr lines go to railrun's stdout.
    pub merge_stderr: bool,
    /// `-genvall` / `-envall` (Hydra): every variable of railrun's environment to every rank.
    pub env_all: bool,
    /// `--mca KEY VALUE` pairs, in order (see [`mca_effect`]).
    pub mca: Vec<(String, String)>,
    /// A Hydra-only option was given (`-f`, `-ppn`, `-genv`, `-env`, `-envlist`, `-genvall`...):
    /// a hostfile of bare host names then follows Hydra's rules.
    pub hydra_hint: bool,
    /// What railrun tells the user before it starts: pasted options it ignores (warnings).
    pub warnings: Vec<String>,
    /// What pasted options became (said with `-v`).
    pub notes: Vec<String>,
    pub dry_run: Option<DryRun>,
    pub report_bindings: bool,
    /// `--fabric F`: order nodes by the fabric (falls back to `RAILRING_FABRIC`).
    pub fabric: Option<PathBuf>,
    /// `--fabric-keep-order`: with a fabric, keep the host source's order (the dry run still
    /// shows the crossings).
    pub fabric_keep_order: bool,
    pub env: Vec<EnvSpec>,
    pub tag_output: bool,
    pub output_dir: Option<PathBuf>,
    /// `--ssh`; falls back to `RAILRUN_SSH`, then `ssh` (resolved by the launcher).
    pub ssh: Option<String>,
    pub launch_agent: Option<String>,
    pub connect_timeout: Duration,
    pub timeout: Option<Duration>,
    pub bind_to: Option<BindTo>,
    pub verbose: u8,
    pub program: String,
    pub args: Vec<String>,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            np: None,
            hostfile: None,
            hosts: None,
            ppn: None,
            map_by: None,
            rank_by: None,
            oversubscribe: false,
            nolocal: false,
            display_map: false,
            wdir: None,
            merge_stderr: false,
            env_all: false,
            mca: Vec::new(),
            hydra_hint: false,
            warnings: Vec::new(),
            notes: Vec::new(),
            dry_run: None,
            report_bindings: false,
            fabric: None,
            fabric_keep_order: false,
            env: Vec::new(),
            tag_output: false,
            output_dir: None,
            ssh: None,
            launch_agent: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: None,
            bind_to: None,
            verbose: 0,
            program: String::new(),
            args: Vec::new(),
        }
    }
}

/// A command-line error (railrun exits with 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CliError(pub String);

fn err<T>(s: impl Into<String>) -> Result<T, CliError> {
    Err(CliError(s.into()))
}

/// Parse a count (`-np`, `--ppn`): a whole number >= 1.
fn parse_count(opt: &str, v: &str) -> Result<usize, CliError> {
    match v.parse::<usize>() {
        Ok(n) if (1..=10_000_000).contains(&n) => Ok(n),
        _ => err(format!(
            "{opt} `{v}`: expected a whole number from 1 to 10000000"
        )),
    }
}

/// Parse seconds (may be fractional): > 0 and at most ~115 days.
pub fn parse_secs(opt: &str, v: &str) -> Result<Duration, CliError> {
    match v.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 1e7 => Ok(Duration::from_secs_f64(s)),
        Ok(s) if s > 1e7 => err(format!(
            "{opt} `{v}`: {v} is more than the maximum 10000000 s (about 115 days)"
        )),
        Ok(s) if s <= 0.0 => err(format!(
            "{opt} `{v}`: expected a number of seconds greater than 0"
        )),
        _ => err(format!(
            "{opt} `{v}`: expected a number of seconds greater than 0 (at most 10000000)"
        )),
    }
}

fn parse_bind_to(v: &str) -> Result<BindTo, CliError> {
    let t = v.to_ascii_lowercase();
    let mut parts = t.split(':');
    let mode = parts.next().unwrap_or("");
    // Open MPI's modifiers only relax its checks; railring never refuses to overload a CPU.
    for m in parts {
        if !matches!(m, "overload-allowed" | "if-supported") {
            return err(format!(
                "--bind-to `{v}`: unknown modifier `{m}`; expected overload-allowed or if-supported"
            ));
        }
    }
    match mode {
        "none" => Ok(BindTo::None),
        "auto" => Ok(BindTo::Auto),
        "numa" => Ok(BindTo::Numa),
        "core" => Ok(BindTo::Core),
        "socket" | "package" => Ok(BindTo::Socket),
        "hwthread" => Ok(BindTo::Hwthread),
        _ => err(format!(
            "--bind-to `{v}`: expected none, auto, hwthread, core, numa, socket or package"
        )),
    }
}

/// What railrun does with one `--mca KEY VALUE` (Open MPI's parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McaEffect {
    /// Becomes this `-x VAR=VALUE` for every rank.
    Env(&'static str, String),
    /// Becomes `--ssh VALUE`.
    Ssh(String),
    /// Meaningless for railring (Open MPI's own machinery).
    Ignored,
    /// Would mean something, but not in a form railring has: the reason.
    Unsupported(String),
}

/// The `--mca` parameters railrun honours (documented in docs/railrun.md):
///
/// | key | becomes |
/// |---|---|
/// | `btl_tcp_if_include` | `RAILRING_SOCKET_IFNAME==LIST` (exact names) |
/// | `btl_tcp_if_exclude` | `RAILRING_SOCKET_IFNAME=^=LIST` |
/// | `oob_tcp_if_include` / `_exclude` | the same, unless a `btl_tcp_if_*` is given |
/// | `plm_rsh_agent` | `--ssh VALUE` (unless `--ssh` is given) |
///
/// Every other key is ignored with one warning listing them.
pub fn mca_effect(key: &str, value: &str) -> McaEffect {
    let ifaces = |exclude: bool| {
        if value.contains('/') {
            return McaEffect::Unsupported(format!(
                "railring picks rail interfaces by name, not by subnet ({value}); use -x RAILRING_SOCKET_IFNAME=NAMES"
            ));
        }
        let list: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .collect();
        if list.is_empty() {
            return McaEffect::Unsupported("an empty interface list".into());
        }
        let prefix = if exclude { "^=" } else { "=" };
        McaEffect::Env(
            railring::vars::SOCKET_IFNAME,
            format!("{prefix}{}", list.join(",")),
        )
    };
    match key {
        "btl_tcp_if_include" | "oob_tcp_if_include" => ifaces(false),
        "btl_tcp_if_exclude" | "oob_tcp_if_exclude" => ifaces(true),
        "plm_rsh_agent" | "orte_rsh_agent" | "pml_rsh_agent" => McaEffect::Ssh(value.to_string()),
        _ => McaEffect::Ignored,
    }
}

/// Turn the `--mca` pairs into `-x` variables, `--ssh`, warnings and notes.
fn apply_mca(o: &mut RunOpts) {
    let mut ignored = Vec::new();
    let mut seen_btl_if = false;
    let pairs = o.mca.clone();
    for (k, _) in &pairs {
        seen_btl_if |= k.starts_with("btl_tcp_if_");
    }
    for (k, v) in &pairs {
        let shown = format!("{k}={v}");
        match mca_effect(k, v) {
            McaEffect::Env(var, val) => {
                if k.starts_with("oob_") && seen_btl_if {
                    o.notes.push(format!(
                        "--mca {shown}: the btl_tcp_if_* setting chooses the rails instead"
                    ));
                    continue;
                }
                if o.env.iter().any(|e| e.name == var) {
                    o.warnings
                        .push(format!("--mca {shown}: -x {var} is given too; it wins"));
                    continue;
                }
                o.notes
                    .push(format!("--mca {shown}: every rank gets {var}={val}"));
                o.env.push(EnvSpec {
                    name: var.to_string(),
                    value: Some(val),
                });
            }
            McaEffect::Ssh(cmd) => {
                if o.ssh.is_some() {
                    o.warnings
                        .push(format!("--mca {shown}: --ssh is given too; it wins"));
                } else {
                    o.notes.push(format!("--mca {shown}: used as --ssh"));
                    o.ssh = Some(cmd);
                }
            }
            McaEffect::Ignored => ignored.push(shown),
            McaEffect::Unsupported(why) => {
                o.warnings.push(format!("--mca {shown}: not used: {why}"))
            }
        }
    }
    if !ignored.is_empty() {
        o.warnings.push(format!(
            "--mca: ignoring {}: Open MPI parameters that have no railring counterpart (docs/railrun.md lists the ones railrun honours)",
            ignored.join(", ")
        ));
    }
}

/// A valid environment variable name for `-x`.
fn valid_env_name(n: &str) -> bool {
    !n.is_empty()
        && !n.contains('=')
        && !n.contains('\0')
        && !n.starts_with(|c: char| c.is_ascii_digit())
}

fn parse_x(v: &str) -> Result<EnvSpec, CliError> {
    let (name, value) = match v.split_once('=') {
        Some((n, val)) => (n, Some(val.to_string())),
        None => (v, None),
    };
    if !valid_env_name(name) || value.as_deref().is_some_and(|x| x.contains('\0')) {
        return err(format!("-x `{v}`: expected VAR or VAR=value"));
    }
    Ok(EnvSpec {
        name: name.to_string(),
        value,
    })
}

/// Parse railrun's arguments (without argv[0]).
pub fn parse(args: &[String]) -> Result<Command, CliError> {
    if args.first().map(String::as_str) == Some("topo") {
        return Ok(Command::Topo(args[1..].to_vec()));
    }
    if args.first().map(String::as_str) == Some("plan") {
        return Ok(Command::Plan(args[1..].to_vec()));
    }
    if args.first().map(String::as_str) == Some("doctor") {
        return Ok(Command::Doctor(args[1..].to_vec()));
    }
    if args.first().map(String::as_str) == Some("--agent") {
        return parse_agent(&args[1..]);
    }
    let mut o = RunOpts::default();
    let mut i = 0;
    let mut program: Option<usize> = None;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            if i + 1 >= args.len() {
                return err("`--` must be followed by the program to run");
            }
            program = Some(i + 1);
            break;
        }
        if !a.starts_with('-') || a == "-" {
            program = Some(i);
            break;
        }
        let stripped = a.strip_prefix("--").unwrap_or_else(|| &a[1..]);
        let (name, inline) = match stripped.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (stripped, None),
        };
        // Take the option's value: inline (`--opt=v`) or the next argument.
        let value = |i: &mut usize| -> Result<String, CliError> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            *i += 1;
            match args.get(*i) {
                Some(v) => Ok(v.clone()),
                None => err(format!("option `{a}` needs a value")),
            }
        };
        let flag = |inline: &Option<String>| -> Result<(), CliError> {
            match inline {
                None => Ok(()),
                Some(_) => err(format!("option `{name}` takes no value (got `{a}`)")),
            }
        };
        // Options that take two values (`--mca KEY VALUE`, `-genv NAME VALUE`).
        let two = |i: &mut usize| -> Result<(String, String), CliError> {
            if inline.is_some() {
                return err(format!(
                    "option `{name}` takes two values: `-{name} KEY VALUE` (got `{a}`)"
                ));
            }
            match (args.get(*i + 1), args.get(*i + 2)) {
                (Some(k), Some(v)) => {
                    *i += 2;
                    Ok((k.clone(), v.clone()))
                }
                _ => err(format!("option `{a}` needs two values: `{a} KEY VALUE`")),
            }
        };
        if matches!(
            name,
            "f" | "ppn" | "genv" | "env" | "genvlist" | "envlist" | "genvall" | "envall"
        ) {
            o.hydra_hint = true;
        }
        match name {
            "np" | "n" | "c" => o.np = Some(parse_count(a, &value(&mut i)?)?),
            "hostfile" | "machinefile" | "f" | "default-hostfile" => {
                let v = PathBuf::from(value(&mut i)?);
                if let Some(prev) = &o.hostfile {
                    return err(format!(
                        "a hostfile is given twice (`{}`, then `{}` with `{a}`): railrun reads one hostfile; put the hosts in one file",
                        prev.display(),
                        v.display()
                    ));
                }
                o.hostfile = Some(v)
            }
            "H" | "host" | "hosts" => {
                let v = value(&mut i)?;
                o.hosts = Some(match o.hosts.take() {
                    Some(prev) => format!("{prev},{v}"),
                    None => v,
                });
            }
            "ppn" => o.ppn = Some(parse_count(a, &value(&mut i)?)?),
            "npernode" | "N" => {
                let n = parse_count(a, &value(&mut i)?)?;
                set_map(&mut o, a, MapBy::PprNode(n))?
            }
            "map-by" => {
                let v = value(&mut i)?;
                let (m, over) =
                    MapBy::parse_with_modifiers(&v).map_err(|e| CliError(e.to_string()))?;
                if over == Some(true) {
                    o.oversubscribe = true;
                }
                set_map(&mut o, a, m)?
            }
            "rank-by" => {
                o.rank_by =
                    Some(RankBy::parse(&value(&mut i)?).map_err(|e| CliError(e.to_string()))?)
            }
            "bynode" => {
                flag(&inline)?;
                set_map(&mut o, a, MapBy::Node)?
            }
            "byslot" => {
                flag(&inline)?;
                set_map(&mut o, a, MapBy::Slot)?
            }
            "nolocal" => {
                flag(&inline)?;
                o.nolocal = true
            }
            "display-map" => {
                flag(&inline)?;
                o.display_map = true
            }
            "allow-run-as-root" => flag(&inline)?,
            "merge-stderr-to-stdout" => {
                flag(&inline)?;
                o.merge_stderr = true
            }
            "wdir" | "wd" => {
                let v = value(&mut i)?;
                if v.is_empty() {
                    return err(format!("{a}: expected a directory"));
                }
                o.wdir = Some(PathBuf::from(v))
            }
            "mca" | "gmca" => {
                let (k, v) = two(&mut i)?;
                o.mca.push((k, v))
            }
            "genv" | "env" => {
                let (k, v) = two(&mut i)?;
                if !valid_env_name(&k) || v.contains('\0') {
                    return err(format!(
                        "{a} `{k}` `{v}`: expected {a} NAME VALUE (for NAME=VALUE use -x)"
                    ));
                }
                o.env.push(EnvSpec {
                    name: k,
                    value: Some(v),
                })
            }
            "genvlist" | "envlist" => {
                for n in value(&mut i)?
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                {
                    if !valid_env_name(n) {
                        return err(format!("{a}: `{n}` is not a variable name"));
                    }
                    o.env.push(EnvSpec {
                        name: n.to_string(),
                        value: None,
                    })
                }
            }
            "genvall" | "envall" => {
                flag(&inline)?;
                o.env_all = true
            }
            "oversubscribe" => {
                flag(&inline)?;
                o.oversubscribe = true
            }
            "dry-run" => {
                o.dry_run = Some(match inline.as_deref() {
                    None | Some("table") | Some("text") => DryRun::Table,
                    Some("json") => DryRun::Json,
                    Some(v) => {
                        return err(format!(
                            "--dry-run=`{v}`: expected --dry-run or --dry-run=json"
                        ))
                    }
                })
            }
            "report-bindings" => {
                flag(&inline)?;
                o.report_bindings = true
            }
            "x" => o.env.push(parse_x(&value(&mut i)?)?),
            "fabric" => o.fabric = Some(PathBuf::from(value(&mut i)?)),
            "fabric-keep-order" => {
                flag(&inline)?;
                o.fabric_keep_order = true
            }
            "tag-output" => {
                flag(&inline)?;
                o.tag_output = true
            }
            "output-dir" => o.output_dir = Some(PathBuf::from(value(&mut i)?)),
            "ssh" | "launch-ssh" => o.ssh = Some(value(&mut i)?),
            "launch-agent" => o.launch_agent = Some(value(&mut i)?),
            "connect-timeout" => o.connect_timeout = parse_secs(a, &value(&mut i)?)?,
            "timeout" => o.timeout = Some(parse_secs(a, &value(&mut i)?)?),
            "bind-to" => o.bind_to = Some(parse_bind_to(&value(&mut i)?)?),
            "v" | "verbose" => {
                flag(&inline)?;
                o.verbose = o.verbose.saturating_add(1)
            }
            "vv" => {
                flag(&inline)?;
                o.verbose = o.verbose.saturating_add(2)
            }
            "h" | "help" => return Ok(Command::Help),
            "V" | "version" => return Ok(Command::Version),
            "agent" => {
                return err("--agent must be the first argument (it is railrun's remote side)")
            }
            _ => {
                return err(format!(
                    "unknown option `{a}` (railrun --help lists the options)"
                ))
            }
        }
        i += 1;
    }
    let Some(p) = program else {
        return err(
            "no program given (usage: railrun [options] PROGRAM [ARGS...]; railrun --help)",
        );
    };
    o.program = args[p].clone();
    o.args = args[p + 1..].to_vec();
    if o.program.is_empty() {
        return err("the program name is empty");
    }
    if o.ppn.is_some() && o.map_by.is_some_and(|m| m != MapBy::Slot) {
        return err(format!(
            "--ppn and --map-by {} (or -N) both say how many ranks go on a host; use one of them",
            o.map_by.unwrap_or_default()
        ));
    }
    apply_mca(&mut o);
    Ok(Command::Run(Box::new(o)))
}

/// `--map-by` / `-N` / `--bynode` / `--byslot`: at most one mapping.
fn set_map(o: &mut RunOpts, opt: &str, m: MapBy) -> Result<(), CliError> {
    if let Some(prev) = o.map_by {
        if prev != m {
            return err(format!(
                "{opt} asks for mapping `{m}` but `{prev}` was already given; use one of --map-by, -N/--npernode, --bynode, --byslot"
            ));
        }
    }
    o.map_by = Some(m);
    Ok(())
}

/// `railrun --agent [-v]...`: the arguments after `--agent`.
fn parse_agent(args: &[String]) -> Result<Command, CliError> {
    let mut verbose = 0u8;
    for a in args {
        match a.as_str() {
            "-v" | "--verbose" => verbose = verbose.saturating_add(1),
            _ => return err(format!("--agent: unexpected argument `{a}`")),
        }
    }
    Ok(Command::Agent { verbose })
}

/// Split a command string (`--ssh`, `RAILRUN_SSH`, railcompare's pass-through arguments) into
/// words as a POSIX shell would, without expansion: whitespace separates, `'...'` quotes
/// literally, `"..."` quotes with `\` escaping only `"`, `\`, `$` and `` ` ``, and a bare `\`
/// escapes the next character. A string with no words is an error.
pub fn split_words(s: &str) -> Result<Vec<String>, CliError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut have = false;
    let mut it = s.chars();
    while let Some(c) = it.next() {
        match c {
            '\'' => {
                have = true;
                loop {
                    match it.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return err(format!("unterminated ' in {s:?}")),
                    }
                }
            }
            '"' => {
                have = true;
                loop {
                    match it.next() {
                        Some('"') => break,
                        Some('\\') => match it.next() {
                            Some(x @ ('"' | '\\' | '$' | '`')) => cur.push(x),
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => return err(format!("unterminated \" in {s:?}")),
                        },
                        Some(x) => cur.push(x),
                        None => return err(format!("unterminated \" in {s:?}")),
                    }
                }
            }
            '\\' => {
                have = true;
                match it.next() {
                    Some(x) => cur.push(x),
                    None => return err(format!("trailing backslash in {s:?}")),
                }
            }
            c if c.is_whitespace() => {
                if have {
                    out.push(std::mem::take(&mut cur));
                    have = false;
                }
            }
            c => {
                have = true;
                cur.push(c);
            }
        }
    }
    if have {
        out.push(cur);
    }
    if out.is_empty() {
        return err(format!("{s:?}: empty command"));
    }
    Ok(out)
}

/// Quote `s` for a POSIX shell (single quotes).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub const HELP: &str = "\
railrun: launch a railring job (mpirun-compatible)

Usage:
  railrun [options] PROGRAM [ARGS...]
  railrun topo [topo options]          (show the machine's topology; railrun topo --help)
  railrun plan --fabric F [options]    (predict collectives on a fabric; railrun plan --help)
  railrun doctor [options]             (health sweep of the nodes and rails; railrun doctor --help)

Everything after PROGRAM belongs to the program. Long options take one or two
dashes (-np 4, --np 4, -hostfile F, --hostfile=F).

Placement:
  -np N, -n N              number of ranks (default: every slot of the host source)
  --hostfile F, -hostfile F, --machinefile F, -machinefile F, -f F
                           Open MPI (`host slots=N`) or Hydra (`host:N`) hostfile
  -H LIST, --host LIST     hosts `a,b:2,user@c`; with --hostfile: a subset of it
  --ppn N, -ppn N          ranks per node, consecutive, wrapping around (Hydra)
  -N N, --npernode N       N ranks per node (= --map-by ppr:N:node)
  --map-by slot|node|seq|core|socket|numa|ppr:N:node|ppr:N:socket|ppr:N:numa
                           fill hosts slot by slot (default; a Hydra hostfile
                           cycles over its lines), round-robin over hosts, one
                           rank per hostfile line, by object, or N per object
                           (`:oversubscribe` allowed after it)
  --rank-by slot|node|core|socket|numa
                           how ranks are numbered over the mapped hosts
  --oversubscribe          allow more ranks than slots
  --nolocal                no rank on this machine
  --dry-run                print the placement table and start nothing
  --dry-run=json           the same as JSON
  --display-map            print the placement table on stdout, then run
  --report-bindings        print each rank's GPU / NIC(s) / CPUs before starting
  --bind-to none|auto|hwthread|core|numa|socket|package
                           passed to ranks as RAILRING_BIND_TO (default: the
                           --map-by object, else auto: numa, or one core per rank
                           where a NUMA node's ranks outnumber its CPUs evenly)
  --fabric F               order nodes by fabric file F (leaf by leaf) so rings cross
                           the fewest uplinks; --dry-run shows the crossings per ring
                           (env RAILRING_FABRIC; docs/fabric.md)
  --fabric-keep-order      with a fabric: keep the host order given (--dry-run still
                           shows each ring's crossings)

Environment and I/O:
  -x VAR                   forward VAR's value from railrun's environment
  -x VAR=value             set VAR for every rank (repeatable)
  -genv VAR VALUE, -env VAR VALUE, -envlist A,B, -genvall
                           Hydra's spellings: set, forward named, forward all
  --mca KEY VALUE          Open MPI parameters: btl_tcp_if_include/exclude and
                           oob_tcp_if_* choose the rails (RAILRING_SOCKET_IFNAME),
                           plm_rsh_agent is --ssh; the others are ignored (warned)
  -wdir DIR, --wdir DIR    the ranks' working directory (railrun moves there)
  --tag-output             prefix every output line with `[rank] `
  --merge-stderr-to-stdout rank stderr lines go to railrun's stdout
  --output-dir DIR         write DIR/rank.N.out per rank instead of the terminal
                           railrun's stdin goes to rank 0; other ranks get /dev/null
  --allow-run-as-root      accepted (railrun runs as root without it)

Remote nodes:
  --ssh \"CMD\"              remote shell command (default: ssh; env RAILRUN_SSH),
                           e.g. --ssh \"ssh -F cfg -p 2222\"
  --launch-agent PATH      path of railrun on the remote nodes
                           (default: this executable's absolute path)
  --connect-timeout SECS   time for every node's agent to answer (default 30)

Lifecycle:
  --timeout SECS           kill the whole job after SECS; exit 124
  -v, --verbose            say what railrun does (twice: more)
  -h, --help               this help
  --version                railrun's version

Environment read by railrun: RAILRUN_SSH (like --ssh), RAILRING_FABRIC (like --fabric),
RAILRUN_FANOUT (agents connecting at once; default 64), RAILRUN_KILL_GRACE
(seconds between SIGTERM and SIGKILL when a job is killed; default 3),
RAILRUN_HEARTBEAT (seconds of silence after which a node counts as lost; default 6).

Exit status: 0 if every rank exited 0; otherwise the first failing rank's code
(128+N for a signal N); 124 after --timeout; 130/143/129 when railrun got
SIGINT/SIGTERM/SIGHUP; 127 when the program cannot be found/started; 255 when
a node's agent could not be reached or was lost; 141 when railrun's stdout or
stderr was closed by its reader (`| head`); 1 for a bad host source or
placement; 2 for a bad command line.
";

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, CliError> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    fn run(s: &str) -> RunOpts {
        match p(s) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn mpirun_style() {
        let o = run(
            "-np 4 -hostfile hf --map-by ppr:2:node -x A -x B=c=d --tag-output ./prog -np 3 --x",
        );
        assert_eq!(o.np, Some(4));
        assert_eq!(o.hostfile, Some(PathBuf::from("hf")));
        assert_eq!(o.map_by, Some(MapBy::PprNode(2)));
        assert_eq!(
            o.env,
            vec![
                EnvSpec {
                    name: "A".into(),
                    value: None
                },
                EnvSpec {
                    name: "B".into(),
                    value: Some("c=d".into())
                }
            ]
        );
        assert!(o.tag_output);
        assert_eq!(o.program, "./prog");
        assert_eq!(o.args, vec!["-np", "3", "--x"]);

        let o = run("--np=2 --host=a,b -H c --ppn 1 --oversubscribe --dry-run=json --timeout 1.5 --connect-timeout=5 --bind-to core -v -v prog");
        assert_eq!(o.np, Some(2));
        assert_eq!(o.hosts.as_deref(), Some("a,b,c"));
        assert_eq!(o.ppn, Some(1));
        assert!(o.oversubscribe);
        assert_eq!(o.dry_run, Some(DryRun::Json));
        assert_eq!(o.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(o.connect_timeout, Duration::from_secs(5));
        assert_eq!(o.bind_to, Some(BindTo::Core));
        assert_eq!(o.verbose, 2);

        let o = run("-n 3 --machinefile m2 -- -weird-prog x");
        assert_eq!(o.hostfile, Some(PathBuf::from("m2")));
        assert_eq!(o.program, "-weird-prog");
        assert_eq!(o.args, vec!["x"]);
        assert_eq!(run("--map-by node p").map_by, Some(MapBy::Node));
        assert_eq!(run("-map-by slot p").map_by, Some(MapBy::Slot));
        assert_eq!(run("--dry-run p").dry_run, Some(DryRun::Table));
        assert_eq!(run("p").connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let o = run("--fabric f.json --fabric-keep-order p");
        assert_eq!(o.fabric, Some(PathBuf::from("f.json")));
        assert!(o.fabric_keep_order);
        assert!(p("--fabric-keep-order=1 p").is_err());
        assert_eq!(
            p("plan --json").unwrap(),
            Command::Plan(vec!["--json".into()])
        );
    }

    #[test]
    fn modes() {
        assert_eq!(
            p("topo --json").unwrap(),
            Command::Topo(vec!["--json".into()])
        );
        assert_eq!(p("--agent").unwrap(), Command::Agent { verbose: 0 });
        assert_eq!(p("--agent -v").unwrap(), Command::Agent { verbose: 1 });
        assert_eq!(p("-h").unwrap(), Command::Help);
        assert_eq!(p("--help prog").unwrap(), Command::Help);
        assert_eq!(p("--version").unwrap(), Command::Version);
    }

    #[test]
    fn errors() {
        for bad in [
            "",
            "-np",
            "-np x prog",
            "-np 0 prog",
            "--frob prog",
            "--map-by ppr:2:board p",
            "--map-by ppr:1:node:pe=2 p",
            "--rank-by board p",
            "--bind-to core:frob p",
            "--map-by node -N 2 p",
            "--ppn 2 --map-by node p",
            "-genv A p",
            "-genv A=B C p",
            "--mca k",
            "-wdir= p",
            "--nolocal=1 p",
            "-envlist 1A p",
            "--map-by x p",
            "--timeout 0 p",
            "--timeout nan p",
            "--timeout -1 p",
            "-x =a p",
            "-x 1A p",
            "--bind-to gpu p",
            "--dry-run=xml p",
            "--tag-output=1 p",
            "-np 2",
            "--",
            "-np 2 --agent p",
        ] {
            assert!(p(bad).is_err(), "{bad:?} should fail: {:?}", p(bad));
        }
        let e = p("--frob p").unwrap_err().to_string();
        assert!(e.contains("--frob"), "{e}");
        // A second hostfile is an error naming both, whichever spelling brings it.
        for twice in [
            "--hostfile a --hostfile b p",
            "-f a --machinefile b p",
            "-hostfile a -default-hostfile=b p",
        ] {
            let e = p(twice).unwrap_err().to_string();
            assert!(
                e.contains("`a`") && e.contains("`b`") && e.contains("one hostfile"),
                "{twice}: {e}"
            );
        }
    }

    /// Lines pasted from real mpirun / mpiexec (Hydra) scripts parse, and become what they
    /// mean to railring.
    #[test]
    fn pasted_open_mpi_lines() {
        let o = run("--allow-run-as-root --mca btl ^openib --mca btl_tcp_if_include eth1,eth2 -mca pml ob1 --mca plm_rsh_agent rsh -np 4 --bind-to socket --map-by ppr:2:socket --rank-by core --report-bindings --merge-stderr-to-stdout --display-map --nolocal -wdir /tmp ./a.out x");
        assert_eq!(o.np, Some(4));
        assert_eq!(o.bind_to, Some(BindTo::Socket));
        assert_eq!(
            o.map_by,
            Some(MapBy::PprObj(2, crate::placement::NodeObj::Socket))
        );
        assert_eq!(
            o.rank_by,
            Some(RankBy::Obj(crate::placement::NodeObj::Core))
        );
        assert!(o.report_bindings && o.merge_stderr && o.display_map && o.nolocal);
        assert_eq!(o.wdir, Some(PathBuf::from("/tmp")));
        assert_eq!(
            (o.program.as_str(), o.args.as_slice()),
            ("./a.out", &["x".to_string()][..])
        );
        // honoured --mca: the rail interfaces, the remote shell
        assert_eq!(
            o.env,
            vec![EnvSpec {
                name: "RAILRING_SOCKET_IFNAME".into(),
                value: Some("=eth1,eth2".into())
            }]
        );
        assert_eq!(o.ssh.as_deref(), Some("rsh"));
        // ... the others are listed in one warning
        assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
        assert!(
            o.warnings[0].contains("btl=^openib") && o.warnings[0].contains("pml=ob1"),
            "{:?}",
            o.warnings
        );
        assert!(!o.hydra_hint);

        let o = run("--mca btl_tcp_if_exclude lo,docker0 --mca oob_tcp_if_include eth0 -x RAILRING_DEBUG=INFO -N 2 p");
        assert_eq!(o.env.len(), 2, "{:?}", o.env);
        assert_eq!(o.env[1].name, "RAILRING_SOCKET_IFNAME");
        assert_eq!(o.env[1].value.as_deref(), Some("^=lo,docker0"));
        assert_eq!(o.map_by, Some(MapBy::PprNode(2)));
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    }

    #[test]
    fn pasted_hydra_lines() {
        let o = run("-f hosts -ppn 2 -genv OMP_NUM_THREADS 4 -env A b -envlist PATH,HOME -genvall -wdir /scratch ./a.out");
        assert!(o.hydra_hint && o.env_all);
        assert_eq!(o.ppn, Some(2));
        assert_eq!(o.hostfile, Some(PathBuf::from("hosts")));
        let env: Vec<(String, Option<String>)> = o
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            env,
            vec![
                ("OMP_NUM_THREADS".into(), Some("4".into())),
                ("A".into(), Some("b".into())),
                ("PATH".into(), None),
                ("HOME".into(), None),
            ]
        );
        assert_eq!(o.wdir, Some(PathBuf::from("/scratch")));
    }

    #[test]
    fn mca_table() {
        assert_eq!(
            mca_effect("btl_tcp_if_include", "eth0, ib0"),
            McaEffect::Env("RAILRING_SOCKET_IFNAME", "=eth0,ib0".into())
        );
        assert!(matches!(
            mca_effect("btl_tcp_if_include", "10.0.0.0/8"),
            McaEffect::Unsupported(_)
        ));
        assert_eq!(
            mca_effect("plm_rsh_agent", "rsh"),
            McaEffect::Ssh("rsh".into())
        );
        assert_eq!(mca_effect("mpi_yield_when_idle", "1"), McaEffect::Ignored);
        // -x beats --mca; btl beats oob.
        let o = run("-x RAILRING_SOCKET_IFNAME=rail --mca btl_tcp_if_include eth0 p");
        assert_eq!(o.env.len(), 1);
        assert!(
            o.warnings[0].contains("-x RAILRING_SOCKET_IFNAME"),
            "{:?}",
            o.warnings
        );
        let o = run("--mca oob_tcp_if_include mgmt0 --mca btl_tcp_if_include rail0 p");
        assert_eq!(o.env.len(), 1);
        assert_eq!(o.env[0].value.as_deref(), Some("=rail0"));
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    }

    #[test]
    fn npernode_and_map_modifiers() {
        assert_eq!(run("-N 2 p").map_by, Some(MapBy::PprNode(2)));
        assert_eq!(run("--npernode 3 p").map_by, Some(MapBy::PprNode(3)));
        assert_eq!(run("-ppn 3 p").ppn, Some(3));
        let o = run("--map-by node:oversubscribe p");
        assert_eq!((o.map_by, o.oversubscribe), (Some(MapBy::Node), true));
        assert_eq!(run("--map-by seq p").map_by, Some(MapBy::Seq));
        assert_eq!(run("--rank-by span p").rank_by, Some(RankBy::Node));
        assert_eq!(run("--bind-to hwthread p").bind_to, Some(BindTo::Hwthread));
        assert_eq!(
            run("--bind-to package:overload-allowed p").bind_to,
            Some(BindTo::Socket)
        );
        assert_eq!(
            run("-N 2 --map-by ppr:2:node p").map_by,
            Some(MapBy::PprNode(2))
        );
    }

    #[test]
    fn words_and_quotes() {
        assert_eq!(
            split_words("ssh -F cfg -p 2222").unwrap(),
            vec!["ssh", "-F", "cfg", "-p", "2222"]
        );
        assert_eq!(
            split_words(r#"ssh -o "A B" 'c d' e\ f"#).unwrap(),
            vec!["ssh", "-o", "A B", "c d", "e f"]
        );
        assert_eq!(split_words("ssh ''").unwrap(), vec!["ssh", ""]);
        assert!(split_words("ssh 'x").is_err());
        assert!(split_words("  ").is_err());
        assert_eq!(shell_quote("/usr/bin/railrun"), "/usr/bin/railrun");
        assert_eq!(shell_quote("/a b/it's"), r#"'/a b/it'\''s'"#);
        assert_eq!(shell_quote(""), "''");
    }
}
