//! This node's ranks: the one code path that railrun uses for the ranks on its own machine and
//! every `railrun --agent` uses for the ranks of its node. It serves the bootstrap store the
//! ranks connect to on `127.0.0.1` (railrun's store itself, or the agent's relay) and the PMI-1
//! server MPICH-family programs talk to ([`crate::pmi`], over the same store), binds each rank
//! to the CPUs `--report-bindings` shows before exec ([`crate::bind`]), starts the ranks in
//! order, notes their exits and signals their process groups. Where output and exits go is the
//! caller's [`RankEvents`]; when to kill is the caller's lifecycle.

use crate::bind::{self, RankBinding};
use crate::pmi::{AbortAware, PmiService};
use crate::proto::RankSpec;
use crate::spawn::{self, RankCommand, RankEvents, RankSetup};
use railring::store::{self, Backend, ServerHandle};
use railring::topology::process_allowed_cpus;
use railring::vars;
use std::collections::BTreeMap;
use std::io;
use std::net::TcpListener;
use std::process::ChildStdin;
use std::sync::Arc;

/// Why the store endpoint for this node's ranks could not be opened.
#[derive(Debug)]
pub enum ServeError {
    /// No port on `127.0.0.1`.
    Bind(io::Error),
    /// The listener was there but the store could not be served on it.
    Serve(io::Error),
}

impl ServeError {
    /// The system's error, whichever step failed.
    pub fn into_cause(self) -> io::Error {
        match self {
            ServeError::Bind(e) | ServeError::Serve(e) => e,
        }
    }
}

/// A rank that could not be started; the ranks after it were not tried.
#[derive(Debug)]
pub struct NotStarted {
    /// Its position in the list given to [`NodeRanks::start`].
    pub index: usize,
    pub rank: u32,
    /// `cannot start PROGRAM: CAUSE`.
    pub message: String,
    pub cause: io::Error,
}

struct Started {
    rank: u32,
    pid: u32,
    exited: bool,
}

/// Which job the node's ranks belong to (its PMI-1 key-value space is named after it).
#[derive(Clone, Copy, Debug)]
pub struct JobIdent<'a> {
    pub id: &'a str,
    pub world_size: u32,
}

/// How the node's ranks will be bound, computed before any starts ([`NodeRanks::plan`]).
#[derive(Debug, Default)]
pub struct NodePlan {
    /// One per rank, in the order of the ranks given.
    ranks: Vec<RankBinding>,
    /// `--report-bindings` lines, one per rank.
    pub report: Vec<String>,
    /// Lines worth telling the user once (OMP_NUM_THREADS set, no topology).
    pub notes: Vec<String>,
}

/// The ranks started on this node and the store endpoint they connect to.
#[derive(Default)]
pub struct NodeRanks {
    started: Vec<Started>,
    /// Rank 0's stdin until the caller takes it.
    stdin: Option<ChildStdin>,
    server: Option<ServerHandle>,
    /// `RAILRING_STORE_ADDR` and `RAILRING_JOB_SECRET`, once the store is served.
    store_env: Vec<(String, String)>,
    /// The PMI-1 server over the same store.
    pmi: Option<Arc<PmiService>>,
    world_size: u32,
}

impl NodeRanks {
    pub fn new() -> NodeRanks {
        NodeRanks::default()
    }

    /// Serve `backend` to this node's ranks on `127.0.0.1`, guarded by the job secret, and as
    /// the PMI-1 key-value space of `job`; the ranks started afterwards get its address, the
    /// secret and a PMI connection.
    pub fn serve_store(
        &mut self,
        secret: &str,
        backend: Arc<dyn Backend>,
        job: JobIdent<'_>,
    ) -> Result<(), ServeError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ServeError::Bind)?;
        let server = store::serve(listener, secret, backend.clone()).map_err(ServeError::Serve)?;
        self.store_env = vec![
            (vars::STORE_ADDR.to_string(), server.addr.to_string()),
            (vars::JOB_SECRET.to_string(), secret.to_string()),
        ];
        self.server = Some(server);
        self.pmi = Some(PmiService::new(backend, job.id, job.world_size));
        self.world_size = job.world_size;
        Ok(())
    }

    /// How `ranks` (this node's, started with `cmd`) will be bound: the same computation
    /// `--report-bindings` prints ([`crate::bind`]), with the variables the ranks will see.
    pub fn plan(cmd: &RankCommand<'_>, ranks: &[RankSpec], host: &str) -> NodePlan {
        let lookup = bind::job_lookup(cmd.env);
        let omp_set = lookup("OMP_NUM_THREADS").is_some();
        let allowed = process_allowed_cpus().unwrap_or_default();
        let mut plan = NodePlan::default();
        // local_size 0 (an older launcher): the ranks given are the node's.
        let sizes: Vec<(usize, usize)> = ranks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if r.local_size == 0 {
                    (i, ranks.len())
                } else {
                    (r.local_rank as usize, r.local_size as usize)
                }
            })
            .collect();
        let mut per_size: BTreeMap<usize, Result<Vec<railring::topology::Binding>, String>> =
            BTreeMap::new();
        let topo = bind::options(&lookup);
        for (spec, &(lr, ls)) in ranks.iter().zip(&sizes) {
            let b = per_size.entry(ls).or_insert_with(|| match &topo {
                Ok((t, o)) => t.bindings(ls, o).map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            });
            let (rb, text) = match b {
                Ok(v) => match v.get(lr) {
                    Some(b) => (bind::for_rank(b, &allowed, omp_set), bind::describe(b)),
                    None => (RankBinding::default(), "no binding computed".to_string()),
                },
                Err(e) => (
                    RankBinding::default(),
                    format!("topology unavailable: {e}; not bound"),
                ),
            };
            plan.report
                .push(bind::report_line(spec.rank as usize, host, lr, ls, &text));
            plan.ranks.push(rb);
        }
        // Said when a binding was asked for; by default the report (if asked) says it.
        let explicit = lookup(vars::BIND_TO).is_some_and(|v| !v.trim().is_empty());
        if let (Err(e), true) = (&topo, explicit) {
            plan.notes.push(format!(
                "cannot compute the ranks' CPU binding on {host} ({e}); they start unbound"
            ));
        }
        let omp: Vec<String> = ranks
            .iter()
            .zip(&plan.ranks)
            .filter_map(|(s, r)| r.omp.map(|n| format!("rank {}: {n}", s.rank)))
            .collect();
        if !omp.is_empty() {
            let shown: Vec<&str> = omp.iter().take(8).map(String::as_str).collect();
            let more = if omp.len() > 8 { ", ..." } else { "" };
            plan.notes.push(format!(
                "OMP_NUM_THREADS is not set: each rank on {host} gets the number of CPUs it is bound to ({}{more}); set OMP_NUM_THREADS (-x) to choose",
                shown.join(", ")
            ));
        }
        plan
    }

    /// Stop serving the store (the job is over on this node).
    pub fn close_store(&mut self) {
        self.server = None;
        self.pmi = None;
    }

    /// Start `ranks` in order, bound as `plan` says (from [`NodeRanks::plan`] for the same
    /// ranks), their output and exits going to `events`. Stops at the first rank that cannot
    /// start; the ranks started before it keep running. Must be called from the thread that
    /// lives for the whole job (see [`spawn::spawn_rank`]).
    pub fn start(
        &mut self,
        cmd: &RankCommand<'_>,
        ranks: &[RankSpec],
        plan: &NodePlan,
        events: &Arc<dyn RankEvents>,
    ) -> Result<(), NotStarted> {
        let events: Arc<dyn RankEvents> = match &self.pmi {
            Some(pmi) => Arc::new(AbortAware {
                inner: events.clone(),
                pmi: pmi.clone(),
            }),
            None => events.clone(),
        };
        for (index, spec) in ranks.iter().enumerate() {
            // SIGINT / SIGTERM while starting many ranks: stop starting them (the caller's
            // loop then takes the signal and ends the ones already started).
            if let Some(sig) = crate::signals::pending() {
                return Err(NotStarted {
                    index,
                    rank: spec.rank,
                    message: format!(
                        "not started: got {} while starting the node's ranks",
                        crate::proto::signal_name(sig)
                    ),
                    cause: io::Error::from(io::ErrorKind::Interrupted),
                });
            }
            let failed = |cause: io::Error| NotStarted {
                index,
                rank: spec.rank,
                message: format!("cannot start {}: {cause}", cmd.program.display()),
                cause,
            };
            let setup = match self.setup(spec, plan.ranks.get(index), &events) {
                Ok(s) => s,
                Err(cause) => return Err(failed(cause)),
            };
            match spawn::spawn_rank(cmd, spec, &self.store_env, setup, events.clone()) {
                Ok(p) => {
                    if let Some(pmi) = &self.pmi {
                        pmi.started(p.rank, p.pid);
                    }
                    self.started.push(Started {
                        rank: p.rank,
                        pid: p.pid,
                        exited: false,
                    });
                    if p.stdin.is_some() {
                        self.stdin = p.stdin;
                    }
                }
                Err(cause) => return Err(failed(cause)),
            }
        }
        Ok(())
    }

    /// One rank's binding and PMI connection (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`, and Hydra's
    /// `MPI_LOCALRANKID` / `MPI_LOCALNRANKS`).
    fn setup(
        &self,
        spec: &RankSpec,
        binding: Option<&RankBinding>,
        events: &Arc<dyn RankEvents>,
    ) -> io::Result<RankSetup> {
        let mut setup = RankSetup::default();
        if let Some(b) = binding.filter(|b| !b.cpus.is_empty()) {
            setup.cpus = Some(
                bind::cpu_set(&b.cpus)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            );
            setup.env.extend(b.env.iter().cloned());
        }
        if let Some(pmi) = &self.pmi {
            let fd = pmi.connect(spec.rank, events.clone())?;
            use std::os::fd::AsRawFd;
            setup.env.extend([
                (vars::PMI_FD.to_string(), fd.as_raw_fd().to_string()),
                (vars::PMI_RANK.to_string(), spec.rank.to_string()),
                (vars::PMI_SIZE.to_string(), self.world_size.to_string()),
                (
                    vars::MPI_LOCALRANKID.to_string(),
                    spec.local_rank.to_string(),
                ),
                (
                    vars::MPI_LOCALNRANKS.to_string(),
                    spec.local_size.to_string(),
                ),
            ]);
            setup.keep_fd = Some(fd);
        }
        Ok(setup)
    }

    /// Rank 0's stdin, when rank 0 was started here (once).
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// (rank, pid) of every rank started, in start order.
    pub fn pids(&self) -> Vec<(u32, u32)> {
        self.started.iter().map(|s| (s.rank, s.pid)).collect()
    }

    /// How many ranks were started.
    pub fn len(&self) -> usize {
        self.started.len()
    }

    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    /// Note that `rank` ended (or is given up on). True the first time for a rank started here.
    pub fn mark_exited(&mut self, rank: u32) -> bool {
        match self.started.iter_mut().find(|s| s.rank == rank) {
            Some(s) if !s.exited => {
                s.exited = true;
                true
            }
            _ => false,
        }
    }

    /// Is a rank started here still running?
    pub fn any_running(&self) -> bool {
        self.started.iter().any(|s| !s.exited)
    }

    /// Send `sig` to the process group of every rank still running; with `include_exited`, of
    /// every rank started (a group outlives its leader: this takes leftover descendants along).
    pub fn signal(&self, sig: i32, include_exited: bool) {
        for s in &self.started {
            if include_exited || !s.exited {
                spawn::kill_group(s.pid, sig);
            }
        }
    }
}
