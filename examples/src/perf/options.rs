//! railperf's command line (nccl-tests flags) and the collectives it measures.

use railring::{DataType, ReduceOp};

pub const USAGE: &str = "usage: railperf COLLECTIVE [options]
collectives: allreduce reducescatter allgather broadcast reduce alltoall sendrecv
  -b, --minbytes N      smallest size (default 32M; K/M/G suffixes)
  -e, --maxbytes N      largest size (default 32M)
  -i, --stepbytes N     size increment (default 1M)
  -f, --stepfactor N    size multiplication factor (overrides -i)
  -n, --iters N         timed iterations per size (default 20)
  -w, --warmup_iters N  warmup iterations (default 5)
  -c, --check 0/1       check results (default 1)
  -o, --op OP           sum|prod|min|max|avg|all (default sum)
  -d, --datatype T      int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double|all (default float)
  -r, --root N          root for broadcast/reduce (default 0)
  -a, --average 0-3     time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum (default 1)
  -z, --blocking 0/1    0: start all iterations then wait (non-blocking API); 1: blocking calls (default 0)
  --discard-first 0/1   1: time the run's first measurement (the first size, out of place)
                        twice and keep the second (default 1): a process's first timed loop
                        can catch a start-up state no later one sees (Open MPI's one-way calls
                        over TCP: 1.0-1.7 us a call where every later loop takes 3.6-4.7)
  -J, --output_file F   also write results as JSON rows to F
  --csv F               also write results as CSV to F, one row per measurement (columns:
                        collective,library,nranks,size,count,type,redop,root,placement,
                        time_us,algbw,busbw,wrong,calls; placement is out-of-place or in-place,
                        calls blocking or non-blocking; bandwidths in GB/s)
  --vs-mpi              say how to compare with MPI (railcompare)
  -h, --help
Unknown options are errors (exit 2). Accepted for nccl-tests compatibility, without effect:
  -t/--nthreads, -g/--ngpus, -m/--agg_iters, -G/--cudagraph, -p/--parallel_init (each with a value)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Coll {
    pub fn parse(s: &str) -> Option<Coll> {
        Some(
            match s
                .to_ascii_lowercase()
                .replace(['_', '-'], "")
                .trim_end_matches("perf")
            {
                "allreduce" => Coll::AllReduce,
                "reducescatter" => Coll::ReduceScatter,
                "allgather" => Coll::AllGather,
                "broadcast" | "bcast" => Coll::Broadcast,
                "reduce" => Coll::Reduce,
                "alltoall" => Coll::AllToAll,
                "sendrecv" => Coll::SendRecv,
                _ => return None,
            },
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllGather => "allgather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }
    pub(super) fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    pub(super) fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }
    /// nccl-tests' bus bandwidth factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub coll: Coll,
    pub minbytes: u64,
    pub maxbytes: u64,
    pub stepbytes: u64,
    pub stepfactor: Option<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub ops: Vec<ReduceOp>,
    pub dtypes: Vec<DataType>,
    pub root: usize,
    pub average: u8,
    pub blocking: bool,
    /// `--discard-first`: the first measurement's timed loop runs twice, the first untimed.
    pub discard_first: bool,
    pub json: Option<String>,
    /// `--csv F`: one CSV row per measurement.
    pub csv: Option<String>,
    pub help: bool,
    /// `--vs-mpi`: point to railcompare (railperf's binary handles it).
    pub vs_mpi: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            coll: Coll::AllReduce,
            minbytes: 32 << 20,
            maxbytes: 32 << 20,
            stepbytes: 1 << 20,
            stepfactor: None,
            iters: 20,
            warmup: 5,
            check: true,
            ops: vec![ReduceOp::Sum],
            dtypes: vec![DataType::F32],
            root: 0,
            average: 1,
            blocking: false,
            discard_first: true,
            json: None,
            csv: None,
            help: false,
            vs_mpi: false,
        };
        let mut coll = None;
        let mut it = args.iter().peekable();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (a.clone(), None),
            };
            let mut val = |name: &str| -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("{name} needs a value")),
                }
            };
            let size = |v: String, name: &str| {
                railring::config::parse_size(&v)
                    .ok_or_else(|| format!("{name}: '{v}' is not a size (e.g. 8, 64K, 256M)"))
            };
            let num = |v: String, name: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}: '{v}' is not a number"))
            };
            match flag.as_str() {
                "-b" | "--minbytes" => o.minbytes = size(val("-b")?, "-b")?,
                "-e" | "--maxbytes" => o.maxbytes = size(val("-e")?, "-e")?,
                "-i" | "--stepbytes" => o.stepbytes = size(val("-i")?, "-i")?,
                "-f" | "--stepfactor" => o.stepfactor = Some(num(val("-f")?, "-f")?),
                "-n" | "--iters" => o.iters = num(val("-n")?, "-n")? as usize,
                "-w" | "--warmup_iters" => o.warmup = num(val("-w")?, "-w")? as usize,
                "-c" | "--check" => o.check = num(val("-c")?, "-c")? != 0,
                "-o" | "--op" => {
                    let v = val("-o")?;
                    o.ops = if v == "all" {
                        ReduceOp::ALL.to_vec()
                    } else {
                        vec![v.parse::<ReduceOp>()?]
                    };
                }
                "-d" | "--datatype" => {
                    let v = val("-d")?;
                    o.dtypes = if v == "all" {
                        DataType::ALL.to_vec()
                    } else {
                        vec![v.parse::<DataType>()?]
                    };
                }
                "-r" | "--root" => o.root = num(val("-r")?, "-r")? as usize,
                "-a" | "--average" => {
                    o.average = num(val("-a")?, "-a")? as u8;
                    if o.average > 3 {
                        return Err("-a must be 0, 1, 2 or 3".into());
                    }
                }
                "-z" | "--blocking" => o.blocking = num(val("-z")?, "-z")? != 0,
                "--discard-first" => {
                    o.discard_first = num(val("--discard-first")?, "--discard-first")? != 0
                }
                "-J" | "--output_file" => o.json = Some(val("-J")?),
                "--csv" => o.csv = Some(val("--csv")?),
                "--vs-mpi" => o.vs_mpi = true,
                "-h" | "--help" => o.help = true,
                // accepted for command-line compatibility with nccl-tests; no meaning here
                "-t" | "--nthreads" | "-g" | "--ngpus" | "-m" | "--agg_iters" | "-G"
                | "--cudagraph" | "-p" | "--parallel_init" => {
                    val(&flag)?;
                }
                f if coll.is_none() && !f.starts_with('-') => {
                    coll = Some(Coll::parse(f).ok_or_else(|| format!("unknown collective '{f}'"))?);
                }
                f if f.starts_with('-') => {
                    return Err(format!("unknown option '{f}' (railperf --help lists them)"))
                }
                f => return Err(format!("unexpected argument '{f}' after the collective")),
            }
        }
        o.coll = coll.unwrap_or(Coll::AllReduce);
        if o.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if o.minbytes > o.maxbytes {
            return Err(format!(
                "-b {} is larger than -e {}",
                o.minbytes, o.maxbytes
            ));
        }
        if o.maxbytes > 1 << 40 {
            return Err("-e above 1T".into());
        }
        if o.stepfactor == Some(0) || o.stepfactor == Some(1) && o.minbytes != o.maxbytes {
            return Err("-f must be at least 2".into());
        }
        if o.stepfactor.is_none() && o.stepbytes == 0 && o.minbytes != o.maxbytes {
            return Err("-i must be at least 1".into());
        }
        Ok(o)
    }

    /// The sizes to run, in bytes.
    pub fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.minbytes;
        while s <= self.maxbytes && v.len() < 4096 {
            v.push(s);
            let next = match self.stepfactor {
                Some(f) => s.saturating_mul(f.max(2)),
                None => s.saturating_add(self.stepbytes.max(1)),
            };
            if next == s {
                break;
            }
            s = next;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn options_and_sizes() {
        let a: Vec<String> = "allreduce -b 8 -e 64 -f 2 -n 3 -w 1 -c 1 -d half -o all"
            .split(' ')
            .map(String::from)
            .collect();
        let o = Options::parse(&a).unwrap();
        assert_eq!(o.sizes(), vec![8, 16, 32, 64]);
        assert_eq!(o.dtypes, vec![DataType::F16]);
        assert_eq!(o.ops.len(), 5);
        let o = Options::parse(&[
            "-b".into(),
            "1K".into(),
            "-e".into(),
            "3K".into(),
            "-i".into(),
            "1K".into(),
        ])
        .unwrap();
        assert_eq!(o.sizes(), vec![1024, 2048, 3072]);
        assert!(Options::parse(&["-b".into(), "9".into(), "-e".into(), "8".into()]).is_err());
        assert!(Options::parse(&["bogus".into()]).is_err());
        assert!(Options::parse(&["-n".into()]).is_err());
        // Unknown options are errors naming the option, long or short, anywhere.
        for bad in [
            "allreduce --frob",
            "--minbytes=8 --iters-typo 3",
            "-q allreduce",
            "allreduce extra",
            "allreduce --csv",
        ] {
            let a: Vec<String> = bad.split(' ').map(String::from).collect();
            let e = Options::parse(&a).unwrap_err();
            let name = bad
                .split(' ')
                .find(|w| {
                    *w == "--frob"
                        || *w == "--iters-typo"
                        || *w == "-q"
                        || *w == "extra"
                        || *w == "--csv"
                })
                .unwrap();
            assert!(e.contains(name), "{bad}: {e}");
        }
        let a: Vec<String> = "allreduce --csv out.csv --vs-mpi -t 1"
            .split(' ')
            .map(String::from)
            .collect();
        let o = Options::parse(&a).unwrap();
        assert_eq!(o.csv.as_deref(), Some("out.csv"));
        assert!(o.vs_mpi);
        // the first measurement is timed twice by default; --discard-first 0 times it once
        assert!(o.discard_first);
        let a: Vec<String> = "broadcast --discard-first 0"
            .split(' ')
            .map(String::from)
            .collect();
        assert!(!Options::parse(&a).unwrap().discard_first);
    }
    #[test]
    fn bus_factors() {
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::Broadcast.bus_factor(4), 1.0);
    }
}
