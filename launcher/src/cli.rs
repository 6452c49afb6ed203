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
    /// `railrun doctor ...`: the arguments after `doctor`.
    Doctor(Vec<String>),
    /// Hidden: `railrun --agent`, the remote side started over SSH.
    Agent {
        verbose: u8,
    },
    Help,
    Version,
}

pub use crate::placement::MapBy;

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
    pub map_by: MapBy,
    pub oversubscribe: bool,
    pub dry_run: Option<DryRun>,
    pub report_bindings: bool,
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
            map_by: MapBy::Slot,
            oversubscribe: false,
            dry_run: None,
            report_bindings: false,
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
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e7 => Ok(Duration::from_secs_f64(s)),
        _ => err(format!(
            "{opt} `{v}`: expected a number of seconds greater than 0"
        )),
    }
}

fn parse_map_by(v: &str) -> Result<MapBy, CliError> {
    MapBy::parse(v).map_err(|e| CliError(e.to_string()))
}

fn parse_bind_to(v: &str) -> Result<BindTo, CliError> {
    match v.to_ascii_lowercase().as_str() {
        "none" => Ok(BindTo::None),
        "numa" => Ok(BindTo::Numa),
        "core" => Ok(BindTo::Core),
        _ => err(format!("--bind-to `{v}`: expected none, numa or core")),
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
        match name {
            "np" | "n" | "c" => o.np = Some(parse_count(a, &value(&mut i)?)?),
            "hostfile" | "machinefile" | "f" | "default-hostfile" => {
                o.hostfile = Some(PathBuf::from(value(&mut i)?))
            }
            "H" | "host" | "hosts" => {
                let v = value(&mut i)?;
                o.hosts = Some(match o.hosts.take() {
                    Some(prev) => format!("{prev},{v}"),
                    None => v,
                });
            }
            "ppn" | "npernode" | "N" => o.ppn = Some(parse_count(a, &value(&mut i)?)?),
            "map-by" => o.map_by = parse_map_by(&value(&mut i)?)?,
            "bynode" => {
                flag(&inline)?;
                o.map_by = MapBy::Node
            }
            "byslot" => {
                flag(&inline)?;
                o.map_by = MapBy::Slot
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
    Ok(Command::Run(Box::new(o)))
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
  railrun doctor [options]             (health sweep of the nodes and rails; railrun doctor --help)

Everything after PROGRAM belongs to the program. Long options take one or two
dashes (-np 4, --np 4, -hostfile F, --hostfile=F).

Placement:
  -np N, -n N              number of ranks (default: every slot of the host source)
  --hostfile F, -hostfile F, --machinefile F, -machinefile F, -f F
                           Open MPI (`host slots=N`) or Hydra (`host:N`) hostfile
  -H LIST, --host LIST     hosts `a,b:2,user@c`; with --hostfile: a subset of it
  --ppn N, -ppn N          ranks per node
  --map-by slot|node|ppr:N:node
                           fill hosts slot by slot (default), round-robin over
                           hosts, or N ranks per node
  --oversubscribe          allow more ranks than slots
  --dry-run                print the placement table and start nothing
  --dry-run=json           the same as JSON
  --report-bindings        print each rank's GPU / NIC(s) / CPUs before starting
  --bind-to none|numa|core passed to ranks as RAILRING_BIND_TO

Environment and I/O:
  -x VAR                   forward VAR's value from railrun's environment
  -x VAR=value             set VAR for every rank (repeatable)
  --tag-output             prefix every output line with `[rank] `
  --output-dir DIR         write DIR/rank.N.out per rank instead of the terminal
                           railrun's stdin goes to rank 0; other ranks get /dev/null

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

Environment read by railrun: RAILRUN_SSH (like --ssh), RAILRUN_KILL_GRACE
(seconds between SIGTERM and SIGKILL when a job is killed; default 3).

Exit status: 0 if every rank exited 0; otherwise the first failing rank's code
(128+N for a signal N); 124 after --timeout; 130/143/129 when railrun got
SIGINT/SIGTERM/SIGHUP; 127 when the program cannot be found/started; 255 when
a node's agent could not be reached or was lost; 1 for a bad host source or
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
        assert_eq!(o.map_by, MapBy::PprNode(2));
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

        let o = run("-n 3 -f m --machinefile m2 -- -weird-prog x");
        assert_eq!(o.hostfile, Some(PathBuf::from("m2")));
        assert_eq!(o.program, "-weird-prog");
        assert_eq!(o.args, vec!["x"]);
        assert_eq!(run("--map-by node p").map_by, MapBy::Node);
        assert_eq!(run("-map-by slot p").map_by, MapBy::Slot);
        assert_eq!(run("--dry-run p").dry_run, Some(DryRun::Table));
        assert_eq!(run("p").connect_timeout, DEFAULT_CONNECT_TIMEOUT);
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
            "--map-by ppr:2:socket p",
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
