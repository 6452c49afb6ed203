//! Starting the job once every agent is up: the rank environment (job-wide and per rank), the
//! `Spawn` for every remote node, and this machine's ranks through [`NodeRanks`], the same code
//! path each agent runs for its node.
//!
//! Before anything starts, [`preflight`] checks what railrun cannot do: an Open MPI program
//! ([`super::mpi_family`]) and `-x` values for variables railrun sets itself. The rule for
//! those (docs/railrun.md, "Variables"): the user's value wins where railring still works
//! (`MASTER_ADDR`, `MASTER_PORT`, `OMP_NUM_THREADS`, `RAILRING_BIND_TO`,
//! `OMPI_MCA_orte_server`); a value equal to railrun's own is accepted; anything else is
//! refused with a message naming the variable (a rank, size or address railrun must decide).

use super::mpi_family::{self, Family};
use super::stdin::{self, StdinTarget};
use super::{Ev, Job, EXIT_CONFIG, EXIT_NOT_STARTED, EXIT_USAGE};
use crate::cli::RunOpts;
use crate::node_ranks::{JobIdent, NodeRanks};
use crate::placement::Placement;
use crate::proto::{ExitKind, JobSpec, Msg, RankSpec, Stream};
use crate::spawn::{RankCommand, RankEvents};
use crate::stdio::Sink;
use railring::store::Backend;
use railring::vars;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

/// `-x` names whose user value wins over railrun's (railring does not depend on them).
const USER_WINS: [&str; 5] = [
    vars::MASTER_ADDR,
    vars::MASTER_PORT,
    "OMP_NUM_THREADS",
    vars::BIND_TO,
    vars::OMPI_SINGLETON_SERVER,
];

/// Names only railrun can set: how ranks find this job and what it did for them.
const RAILRUN_ONLY: [&str; 5] = [
    vars::STORE_ADDR,
    vars::JOB_SECRET,
    vars::JOB_ID,
    vars::PMI_FD,
    vars::BOUND_CPUS,
];

/// Where railrun points Open MPI's singleton server when it starts more than one rank (a path
/// that does not exist: `MPI_Init` of an Open MPI program fails naming it, instead of N worlds
/// of one; see docs/mpi.md).
pub const OMPI_SINGLETON_TRAP: &str =
    "file:/railrun-cannot-start-Open-MPI-programs/use-Open-MPI-mpirun-see-railring-docs-mpi.md";

/// The value railrun gives `name` for rank `r` of `pl`, for the names it sets from the
/// placement; `None` for names it does not set that way.
fn railrun_value(name: &str, pl: &Placement, r: usize) -> Option<String> {
    let p = &pl.ranks[r];
    let v = match name {
        vars::RANK | vars::TORCHRUN_RANK | vars::OMPI_COMM_WORLD_RANK | vars::PMI_RANK => p.rank,
        vars::WORLD_SIZE
        | vars::TORCHRUN_WORLD_SIZE
        | vars::OMPI_COMM_WORLD_SIZE
        | vars::PMI_SIZE => pl.np(),
        vars::LOCAL_RANK
        | vars::TORCHRUN_LOCAL_RANK
        | vars::OMPI_COMM_WORLD_LOCAL_RANK
        | vars::MPI_LOCALRANKID => p.local_rank,
        vars::LOCAL_SIZE
        | vars::TORCHRUN_LOCAL_WORLD_SIZE
        | vars::OMPI_COMM_WORLD_LOCAL_SIZE
        | vars::MPI_LOCALNRANKS => p.local_size,
        vars::NODE_RANK => p.node_rank,
        vars::NNODES => pl.nnodes(),
        _ => return None,
    };
    Some(v.to_string())
}

/// The `-x` variables as (name, value): a `-x NAME` without value takes railrun's own; one
/// that is not set there is left out (and said by [`Job::job_env`]).
pub(super) fn user_env(opts: &RunOpts) -> Vec<(String, String)> {
    opts.env
        .iter()
        .filter_map(|x| match &x.value {
            Some(v) => Some((x.name.clone(), v.clone())),
            None => std::env::var(&x.name).ok().map(|v| (x.name.clone(), v)),
        })
        .collect()
}

/// Why a `-x` value cannot be honoured (see the module docs), or `None` when it can.
fn refuse_user_value(name: &str, value: &str, opts: &RunOpts, pl: &Placement) -> Option<String> {
    if RAILRUN_ONLY.contains(&name) {
        return Some(format!(
            "-x {name}: railrun sets {name} itself for every rank (it is how the ranks find this job); it cannot be given with -x. Remove -x {name}"
        ));
    }
    if name == vars::BIND_TO {
        if let Some(b) = opts.bind_to {
            if value.trim().parse::<railring::topology::BindTo>().ok() != Some(b) {
                return Some(format!(
                    "-x {name}={value} contradicts --bind-to {b}: give one of them"
                ));
            }
        }
        return None;
    }
    if USER_WINS.contains(&name) {
        return None;
    }
    let differs = (0..pl.np()).find(|&r| railrun_value(name, pl, r).is_some_and(|v| v != value));
    let r = differs?;
    let theirs = railrun_value(name, pl, r).unwrap_or_default();
    let same_everywhere =
        (0..pl.np()).all(|q| railrun_value(name, pl, q).as_deref() == Some(&theirs));
    Some(if same_everywhere {
        format!(
            "-x {name}={value}: this job's ranks get {name}={theirs} from railrun; {value} cannot be honoured. Remove -x {name}"
        )
    } else {
        format!(
            "-x {name}={value}: railrun gives every rank its own {name} (rank {r} gets {theirs}); one value for the whole job cannot be honoured. Remove -x {name}"
        )
    })
}

/// What railrun cannot do, checked before anything starts: `Err((exit code, message))`.
pub(super) fn preflight(
    opts: &RunOpts,
    pl: &Placement,
    program: &Path,
) -> Result<(), (i32, String)> {
    for (name, value) in user_env(opts) {
        if let Some(why) = refuse_user_value(&name, &value, opts, pl) {
            return Err((
                EXIT_USAGE,
                format!("{why} (see docs/railrun.md, \"Variables\")"),
            ));
        }
    }
    if pl.np() > 1 {
        if let Family::OpenMpi(lib) = mpi_family::family(program) {
            if !mpi_family::is_railring_program(program) {
                let p = program.display();
                return Err((
                    EXIT_CONFIG,
                    format!(
                        "{p} is an Open MPI program (it links {lib}): Open MPI programs start only under Open MPI's own launcher (its PMIx server), so under railrun each rank would be a world of one. Start it with Open MPI's mpirun instead: mpirun -np {} {p} ... (railring programs run under mpirun too, see docs/mpi.md; MPICH programs run under railrun)",
                        pl.np()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Where this machine's ranks' output and exits go: the sink and the job's main loop.
struct LocalEvents {
    sink: Arc<Sink>,
    tx: Mutex<mpsc::Sender<Ev>>,
}

impl RankEvents for LocalEvents {
    fn output(&self, rank: u32, stream: Stream, line: &[u8]) {
        self.sink.line(rank, stream, line);
    }
    fn exited(&self, rank: u32, exit: ExitKind) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Ev::Exited {
                rank,
                exit,
                from: None,
            });
    }
}

impl Job<'_> {
    /// `MASTER_ADDR` / `MASTER_PORT`: node 0's name (this machine's hostname when node 0 is here
    /// under a loopback name and there are other nodes) and a port that was free there.
    fn master(&self) -> (String, u16) {
        let Some(n0) = self.nodes.first() else {
            return ("127.0.0.1".into(), 0);
        };
        if n0.local {
            let port = crate::agent::free_port();
            if self.nodes.len() == 1 {
                return ("127.0.0.1".into(), port);
            }
            let h = &n0.host;
            let lh = h.eq_ignore_ascii_case("localhost") || h.starts_with("127.") || h == "::1";
            let name = if lh {
                nix::unistd::gethostname()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| h.clone())
            } else {
                h.clone()
            };
            return (name, port);
        }
        let port = n0
            .agent
            .and_then(|a| self.agents[a].hello.as_ref().map(|h| h.2))
            .unwrap_or(0);
        (n0.host.clone(), port)
    }

    /// Variables common to every rank: `-x` first, then railrun's own names, except those whose
    /// user value wins ([`USER_WINS`]; [`preflight`] refused the values railrun cannot honour).
    fn job_env(&self) -> Vec<(String, String)> {
        let mut env = user_env(self.opts);
        for x in &self.opts.env {
            if x.value.is_none() && std::env::var(&x.name).is_err() {
                self.say(&format!(
                    "-x {}: not set (or not UTF-8) in railrun's environment; not forwarded",
                    x.name
                ));
            }
        }
        let user_has = |k: &str| env.iter().any(|(n, _)| n == k);
        let (maddr, mport) = self.master();
        let world = self.pl.np().to_string();
        let mut own: Vec<(&str, String)> = vec![
            (vars::WORLD_SIZE, world.clone()),
            (vars::NNODES, self.pl.nnodes().to_string()),
            (vars::JOB_ID, self.job_id.clone()),
            (vars::TORCHRUN_WORLD_SIZE, world.clone()),
            (vars::OMPI_COMM_WORLD_SIZE, world),
            (vars::MASTER_ADDR, maddr),
            (vars::MASTER_PORT, mport.to_string()),
        ];
        match self.opts.bind_to {
            Some(b) => own.push((vars::BIND_TO, b.as_str().into())),
            // railrun's own RAILRING_BIND_TO reaches every node's ranks (and their binding).
            None => {
                if let Ok(b) = std::env::var(vars::BIND_TO) {
                    own.push((vars::BIND_TO, b));
                }
            }
        }
        if self.pl.np() > 1 {
            own.push((vars::OMPI_SINGLETON_SERVER, OMPI_SINGLETON_TRAP.into()));
        }
        let mut honoured = Vec::new();
        let mut add = Vec::new();
        for (k, v) in own {
            if USER_WINS.contains(&k) && user_has(k) {
                honoured.push(k);
            } else {
                add.push((k.to_string(), v));
            }
        }
        if !honoured.is_empty() {
            self.vlog(&format!(
                "the job's -x value wins for {} (railring does not depend on it)",
                honoured.join(", ")
            ));
        }
        env.extend(add);
        env
    }

    /// One rank's own variables (over the job's), and whether it reads railrun's stdin.
    fn rank_spec(&self, rank: usize) -> RankSpec {
        let r = &self.pl.ranks[rank];
        let (rk, lr, ls, nr) = (
            r.rank.to_string(),
            r.local_rank.to_string(),
            r.local_size.to_string(),
            r.node_rank.to_string(),
        );
        let env = [
            (vars::RANK, &rk),
            (vars::LOCAL_RANK, &lr),
            (vars::LOCAL_SIZE, &ls),
            (vars::NODE_RANK, &nr),
            (vars::TORCHRUN_RANK, &rk),
            (vars::TORCHRUN_LOCAL_RANK, &lr),
            (vars::TORCHRUN_LOCAL_WORLD_SIZE, &ls),
            (vars::OMPI_COMM_WORLD_RANK, &rk),
            (vars::OMPI_COMM_WORLD_LOCAL_RANK, &lr),
            (vars::OMPI_COMM_WORLD_LOCAL_SIZE, &ls),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
        RankSpec {
            rank: r.rank as u32,
            env,
            stdin: r.rank == 0,
            local_rank: r.local_rank as u32,
            local_size: r.local_size as u32,
        }
    }

    /// Send every agent its node's ranks, start this machine's, then forward stdin to rank 0.
    pub(super) fn launch(&mut self) {
        let env = self.job_env();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        // Which ranks share a node, for PMI-1 clients (MPICH), before any rank asks.
        let node_of: Vec<usize> = self.pl.ranks.iter().map(|r| r.node_rank).collect();
        self.store.handle(crate::pmi::mapping_request(&node_of));
        // Remote nodes first: their agents start their ranks while we start ours.
        self.send_spawns(&env, &cwd);
        if !self.start_local_ranks(&env, &cwd) {
            return;
        }
        if let Some(target) = self.stdin_target.take() {
            stdin::forward(target);
        }
    }

    /// A `Spawn` to every agent: the job's command and variables and its node's ranks.
    fn send_spawns(&mut self, env: &[(String, String)], cwd: &Path) {
        for ai in 0..self.agents.len() {
            let node = self.agents[ai].node;
            let spec = JobSpec {
                program: self.program.to_string_lossy().into_owned(),
                args: self.opts.args.clone(),
                cwd: cwd.to_string_lossy().into_owned(),
                env: env.to_vec(),
                secret: self.secret.clone(),
                kill_grace_ms: self.grace.as_millis() as u64,
                ranks: self.nodes[node]
                    .ranks
                    .iter()
                    .map(|&r| self.rank_spec(r))
                    .collect(),
                job_id: self.job_id.clone(),
                world_size: self.pl.np() as u32,
                report_bindings: self.opts.report_bindings,
            };
            if self.nodes[node].ranks.contains(&0) {
                self.stdin_target = Some(StdinTarget::Remote(self.agents[ai].writer.clone()));
            }
            self.agents[ai].spawned = true;
            if let Err(e) = self.agents[ai].writer.send(&Msg::Spawn(spec)) {
                // The reader thread reports the lost agent; note it for verbose runs.
                self.vlog(&format!(
                    "cannot send the job to the agent on {}: {e}",
                    self.agents[ai].host
                ));
            }
        }
    }

    /// Start the ranks on this machine: serve the store to them, then start them in order.
    /// False when the store cannot be served (the failure is recorded and reported).
    fn start_local_ranks(&mut self, env: &[(String, String)], cwd: &Path) -> bool {
        let local_ranks: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| self.nodes[n].local)
            .flat_map(|n| self.nodes[n].ranks.clone())
            .collect();
        if local_ranks.is_empty() {
            return true;
        }
        let job = JobIdent {
            id: &self.job_id,
            world_size: self.pl.np() as u32,
        };
        if let Err(e) = self
            .local
            .serve_store(&self.secret, self.store.clone(), job)
        {
            for &r in &local_ranks {
                self.set_done(r);
            }
            self.fail(
                EXIT_CONFIG,
                format!(
                    "cannot serve the bootstrap store on 127.0.0.1: {}",
                    e.into_cause()
                ),
            );
            return false;
        }
        if self.kill_started.is_some() {
            for &r in &local_ranks {
                self.set_done(r);
            }
        } else {
            self.start_ranks_here(&local_ranks, env, cwd);
        }
        self.vlog(&format!("started {} local rank(s)", self.local.len()));
        true
    }

    /// Start `ranks` (all on this machine) in order; the first that cannot start fails the job.
    fn start_ranks_here(&mut self, ranks: &[usize], env: &[(String, String)], cwd: &Path) {
        let events: Arc<dyn RankEvents> = Arc::new(LocalEvents {
            sink: self.sink.clone(),
            tx: Mutex::new(self.tx.clone()),
        });
        let specs: Vec<RankSpec> = ranks.iter().map(|&r| self.rank_spec(r)).collect();
        let cmd = RankCommand {
            program: &self.program,
            args: &self.opts.args,
            cwd,
            env,
        };
        // The report (--report-bindings) was printed before the start, from the same
        // computation; the notes are said once.
        let host = ranks
            .first()
            .map(|&r| self.host_of(r).to_string())
            .unwrap_or_default();
        let plan = NodeRanks::plan(&cmd, &specs, &host);
        for n in &plan.notes {
            self.say(n);
        }
        let started = self.local.start(&cmd, &specs, &plan, &events);
        if let Some(s) = self.local.take_stdin() {
            self.stdin_target = Some(StdinTarget::Local(s));
        }
        if let Err(e) = started {
            for &rest in &ranks[e.index..] {
                self.set_done(rest);
            }
            if e.cause.kind() == std::io::ErrorKind::Interrupted {
                // A signal: the event loop takes it and ends the job with its status.
                return;
            }
            let r = e.rank as usize;
            let host = self.host_of(r).to_string();
            self.fail(
                EXIT_NOT_STARTED,
                format!("rank {r} on host {host}: {}", e.message),
            );
        }
    }
}
