//! Starting the job once every agent is up: the rank environment (job-wide and per rank), the
//! `Spawn` for every remote node, and this machine's ranks through [`NodeRanks`], the same code
//! path each agent runs for its node.

use super::stdin::{self, StdinTarget};
use super::{Ev, Job, EXIT_CONFIG, EXIT_NOT_STARTED};
use crate::proto::{ExitKind, JobSpec, Msg, RankSpec, Stream};
use crate::spawn::{RankCommand, RankEvents};
use crate::stdio::Sink;
use railring::vars;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

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

    /// Variables common to every rank: `-x` first, then railrun's own names.
    fn job_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for x in &self.opts.env {
            match &x.value {
                Some(v) => env.push((x.name.clone(), v.clone())),
                None => match std::env::var(&x.name) {
                    Ok(v) => env.push((x.name.clone(), v)),
                    Err(_) => self.say(&format!(
                        "-x {}: not set (or not UTF-8) in railrun's environment; not forwarded",
                        x.name
                    )),
                },
            }
        }
        let (maddr, mport) = self.master();
        let world = self.pl.np().to_string();
        for (k, v) in [
            (vars::WORLD_SIZE, world.clone()),
            (vars::NNODES, self.pl.nnodes().to_string()),
            (vars::JOB_ID, self.job_id.clone()),
            (vars::TORCHRUN_WORLD_SIZE, world.clone()),
            (vars::OMPI_COMM_WORLD_SIZE, world),
            (vars::MASTER_ADDR, maddr),
            (vars::MASTER_PORT, mport.to_string()),
        ] {
            env.push((k.to_string(), v));
        }
        if let Some(b) = self.opts.bind_to {
            env.push((vars::BIND_TO.into(), b.as_str().into()));
        }
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
        }
    }

    /// Send every agent its node's ranks, start this machine's, then forward stdin to rank 0.
    pub(super) fn launch(&mut self) {
        let env = self.job_env();
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
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
        if let Err(e) = self.local.serve_store(&self.secret, self.store.clone()) {
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
        let started = self.local.start(&cmd, &specs, &events);
        if let Some(s) = self.local.take_stdin() {
            self.stdin_target = Some(StdinTarget::Local(s));
        }
        if let Err(e) = started {
            for &rest in &ranks[e.index..] {
                self.set_done(rest);
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
