//! How the agent of a remote node is started: over ssh, or as a one-task srun step inside a
//! Slurm allocation ([`choose_agent_launcher`]), with which command line ([`agent_argv`]), as a
//! remote shell in its own session that dies with railrun.

use super::{Failure, Job, EXIT_CONFIG};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How railrun starts the agent of a remote node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentLauncher {
    /// `ssh [opts] HOST 'exec railrun --agent'` (`--ssh` / `RAILRUN_SSH`).
    Ssh,
    /// `srun --nodes=1 --ntasks=1 --nodelist=HOST --overlap ... railrun --agent`, a one-task job
    /// step of the current Slurm allocation on that node (this srun binary).
    Srun(PathBuf),
}

/// Is a Slurm node list in the environment (what makes the host source the allocation when
/// neither `--hostfile` nor `-H` is given; see [`crate::host_source::resolve_hosts`])?
pub fn slurm_nodelist_set(env: &dyn Fn(&str) -> Option<String>) -> bool {
    ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .iter()
        .any(|v| env(v).is_some_and(|s| !s.trim().is_empty()))
}

/// Choose how to start remote agents. `RAILRUN_LAUNCHER=ssh|srun` decides when set; otherwise
/// srun when the hosts come from the Slurm allocation (`slurm_hosts`), the allocation is ours
/// (`SLURM_JOB_ID`), `srun` is on `$PATH` and no `--ssh` was given on the command line; else ssh.
pub fn choose_agent_launcher(
    slurm_hosts: bool,
    ssh_flag: bool,
    env: &dyn Fn(&str) -> Option<String>,
    find: &dyn Fn(&str) -> Option<PathBuf>,
) -> Result<AgentLauncher, String> {
    let in_allocation = env("SLURM_JOB_ID").is_some_and(|s| !s.trim().is_empty());
    match env("RAILRUN_LAUNCHER")
        .map(|s| s.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("auto") => {
            if slurm_hosts && in_allocation && !ssh_flag {
                if let Some(p) = find("srun") {
                    return Ok(AgentLauncher::Srun(p));
                }
            }
            Ok(AgentLauncher::Ssh)
        }
        Some("ssh") => Ok(AgentLauncher::Ssh),
        Some("srun") => {
            if !in_allocation {
                return Err("RAILRUN_LAUNCHER=srun: not inside a Slurm allocation (SLURM_JOB_ID is not set); \
                            run railrun from salloc or sbatch, or use RAILRUN_LAUNCHER=ssh"
                    .into());
            }
            find("srun")
                .map(AgentLauncher::Srun)
                .ok_or_else(|| "RAILRUN_LAUNCHER=srun: `srun` is not in $PATH".to_string())
        }
        Some(_) => Err(format!(
            "RAILRUN_LAUNCHER=`{}`: expected ssh, srun or auto",
            env("RAILRUN_LAUNCHER")
                .unwrap_or_default()
                .chars()
                .take(64)
                .collect::<String>()
        )),
    }
}

/// The command line that starts one node's agent. For ssh: the remote shell words, batch mode,
/// the connect timeout, `[user@]host` and `exec AGENT --agent`. For srun (Slurm 22.05 or later,
/// for `--overlap` sharing every resource): a one-task step on that node, unbuffered so the
/// binary frames flow as written (22.05 gives the task a raw pty for stdout; stdin stays a
/// pipe), not bound to CPUs, without MPI setup, killed with the step on a bad exit.
pub fn agent_argv(
    launcher: &AgentLauncher,
    ssh: &[String],
    connect_timeout: Duration,
    user: Option<&str>,
    host: &str,
    agent_path: &str,
    verbose: u8,
) -> Vec<String> {
    match launcher {
        AgentLauncher::Ssh => {
            let mut remote_cmd = format!("exec {} --agent", crate::cli::shell_quote(agent_path));
            if verbose > 1 {
                remote_cmd.push_str(" -v");
            }
            let target = match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_string(),
            };
            let mut v: Vec<String> = ssh.to_vec();
            if v.is_empty() {
                v.push("ssh".into());
            }
            v.extend([
                "-o".into(),
                "BatchMode=yes".into(),
                "-o".into(),
                format!("ConnectTimeout={}", connect_timeout.as_secs().max(1)),
            ]);
            // End ssh's options before the destination, so no host name can be read as one
            // (the host sources also refuse names starting with `-`). Only for OpenSSH's ssh:
            // a wrapper given with --ssh may not know `--`.
            if std::path::Path::new(&v[0])
                .file_name()
                .is_some_and(|n| n == "ssh")
            {
                v.push("--".into());
            }
            v.extend([target, remote_cmd]);
            v
        }
        AgentLauncher::Srun(srun) => {
            let mut v: Vec<String> = vec![
                srun.to_string_lossy().into_owned(),
                "--nodes=1".into(),
                "--ntasks=1".into(),
                "--ntasks-per-node=1".into(),
                format!("--nodelist={host}"),
                "--overlap".into(),
                "--export=ALL".into(),
                "--kill-on-bad-exit=1".into(),
                "--unbuffered".into(),
                "--cpu-bind=none".into(),
                "--mpi=none".into(),
                "--job-name=railrun-agent".into(),
                agent_path.to_string(),
                "--agent".into(),
            ];
            if verbose > 1 {
                v.push("-v".into());
            }
            v
        }
    }
}

/// The remote shell command, split into words: `--ssh`, else `RAILRUN_SSH`, else `ssh`.
fn ssh_argv(ssh_flag: Option<&String>) -> Result<Vec<String>, String> {
    let cmd = match (
        ssh_flag,
        std::env::var("RAILRUN_SSH")
            .ok()
            .filter(|s| !s.trim().is_empty()),
    ) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s,
        (None, None) => "ssh".to_string(),
    };
    crate::cli::split_words(&cmd).map_err(|e| e.to_string())
}

/// railrun's path on the remote nodes: `--launch-agent`, else this executable's path.
fn agent_path(launch_agent: Option<&String>) -> Result<String, String> {
    if let Some(p) = launch_agent {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find railrun's own path for the remote agent (use --launch-agent): {e}")
    })?;
    exe.to_str().map(String::from).ok_or_else(|| {
        format!(
            "railrun's path {} is not UTF-8 (use --launch-agent)",
            exe.display()
        )
    })
}

/// The remote shell for `argv`, its stdio piped. In its own session: a Ctrl-C on the terminal
/// reaches railrun alone, which then stops the job in order. PDEATHSIG: if railrun dies, ssh
/// dies, the agent sees its stdin close and kills its ranks.
pub(super) fn remote_shell(argv: &[String]) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: async-signal-safe calls only.
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            libc::setsid();
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        });
    }
    cmd
}

/// How every agent is started: the launcher, the remote shell words, railrun's remote path.
pub(super) struct AgentCommand {
    pub(super) launcher: AgentLauncher,
    pub(super) ssh: Vec<String>,
    pub(super) agent_path: String,
}

impl Job<'_> {
    /// Decide how agents start; `None` (the failure said and recorded) when that is impossible.
    pub(super) fn agent_command(&mut self) -> Option<AgentCommand> {
        let env = |k: &str| std::env::var(k).ok();
        let slurm_hosts =
            self.opts.hostfile.is_none() && self.opts.hosts.is_none() && slurm_nodelist_set(&env);
        let find = |n: &str| super::find_in_path(n, &env);
        let launcher =
            match choose_agent_launcher(slurm_hosts, self.opts.ssh.is_some(), &env, &find) {
                Ok(l) => l,
                Err(e) => {
                    self.say(&e);
                    self.failure = Some(Failure { code: EXIT_CONFIG });
                    return None;
                }
            };
        let ssh = match &launcher {
            AgentLauncher::Ssh => ssh_argv(self.opts.ssh.as_ref()),
            AgentLauncher::Srun(_) => Ok(Vec::new()),
        };
        let (ssh, agent_path) = match (ssh, agent_path(self.opts.launch_agent.as_ref())) {
            (Ok(s), Ok(p)) => (s, p),
            (Err(e), _) | (_, Err(e)) => {
                self.say(&e);
                self.failure = Some(Failure { code: EXIT_CONFIG });
                return None;
            }
        };
        if let AgentLauncher::Srun(p) = &launcher {
            self.vlog(&format!(
                "starting the agents with {} (Slurm allocation {})",
                p.display(),
                env("SLURM_JOB_ID").unwrap_or_default()
            ));
        }
        Some(AgentCommand {
            launcher,
            ssh,
            agent_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn agent_launcher_choice() {
        let srun = PathBuf::from("/opt/slurm/bin/srun");
        let found = |_: &str| Some(PathBuf::from("/opt/slurm/bin/srun"));
        let missing = |_: &str| None;
        let alloc = env_of(&[("SLURM_JOB_ID", "42"), ("SLURM_JOB_NODELIST", "n[1-2]")]);
        assert_eq!(
            choose_agent_launcher(true, false, &alloc, &found),
            Ok(AgentLauncher::Srun(srun.clone()))
        );
        // Not the allocation's hosts, no srun, --ssh given, or no allocation: ssh.
        assert_eq!(
            choose_agent_launcher(false, false, &alloc, &found),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, false, &alloc, &missing),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, true, &alloc, &found),
            Ok(AgentLauncher::Ssh)
        );
        assert_eq!(
            choose_agent_launcher(true, false, &env_of(&[("SLURM_NODELIST", "a")]), &found),
            Ok(AgentLauncher::Ssh)
        );
        // RAILRUN_LAUNCHER overrides.
        let e = env_of(&[("SLURM_JOB_ID", "42"), ("RAILRUN_LAUNCHER", "ssh")]);
        assert_eq!(
            choose_agent_launcher(true, false, &e, &found),
            Ok(AgentLauncher::Ssh)
        );
        let e = env_of(&[("SLURM_JOB_ID", "42"), ("RAILRUN_LAUNCHER", " SRUN ")]);
        assert_eq!(
            choose_agent_launcher(false, true, &e, &found),
            Ok(AgentLauncher::Srun(srun))
        );
        let err = choose_agent_launcher(true, false, &e, &missing).unwrap_err();
        assert!(
            err.contains("RAILRUN_LAUNCHER") && err.contains("PATH"),
            "{err}"
        );
        let err = choose_agent_launcher(
            true,
            false,
            &env_of(&[("RAILRUN_LAUNCHER", "srun")]),
            &found,
        )
        .unwrap_err();
        assert!(err.contains("SLURM_JOB_ID"), "{err}");
        let err =
            choose_agent_launcher(true, false, &env_of(&[("RAILRUN_LAUNCHER", "pbs")]), &found)
                .unwrap_err();
        assert!(
            err.contains("RAILRUN_LAUNCHER") && err.contains("pbs"),
            "{err}"
        );
        assert_eq!(
            choose_agent_launcher(
                true,
                false,
                &env_of(&[("RAILRUN_LAUNCHER", "auto")]),
                &found
            ),
            Ok(AgentLauncher::Ssh)
        );
    }

    #[test]
    fn agent_command_lines() {
        let ct = Duration::from_secs(15);
        let srun = AgentLauncher::Srun(PathBuf::from("/usr/bin/srun"));
        let v = agent_argv(&srun, &[], ct, Some("ignored"), "n2", "/opt/rr/railrun", 0);
        assert_eq!(
            v,
            [
                "/usr/bin/srun",
                "--nodes=1",
                "--ntasks=1",
                "--ntasks-per-node=1",
                "--nodelist=n2",
                "--overlap",
                "--export=ALL",
                "--kill-on-bad-exit=1",
                "--unbuffered",
                "--cpu-bind=none",
                "--mpi=none",
                "--job-name=railrun-agent",
                "/opt/rr/railrun",
                "--agent",
            ]
        );
        let v = agent_argv(&srun, &[], ct, None, "n2", "/a b/railrun", 2);
        assert_eq!(
            &v[v.len() - 3..],
            ["/a b/railrun", "--agent", "-v"],
            "srun passes argv, no shell quoting"
        );

        let ssh = vec!["ssh".to_string(), "-F".into(), "/tmp/cfg".into()];
        let v = agent_argv(
            &AgentLauncher::Ssh,
            &ssh,
            ct,
            Some("bob"),
            "n1",
            "/opt/rr/railrun",
            0,
        );
        assert_eq!(
            v,
            [
                "ssh",
                "-F",
                "/tmp/cfg",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=15",
                "--",
                "bob@n1",
                "exec /opt/rr/railrun --agent"
            ]
        );
        // a wrapper given with --ssh gets no `--` (it may not know it)
        let w = vec!["/usr/local/bin/my-rsh".to_string()];
        let v = agent_argv(&AgentLauncher::Ssh, &w, ct, None, "n1", "/r", 0);
        assert!(!v.contains(&"--".to_string()), "{v:?}");
        let v = agent_argv(
            &AgentLauncher::Ssh,
            &[],
            Duration::from_millis(10),
            None,
            "n1",
            "/a b/railrun",
            2,
        );
        assert_eq!(v[0], "ssh");
        assert_eq!(v[4], "ConnectTimeout=1");
        assert_eq!(v[5], "--");
        assert_eq!(v[6], "n1");
        assert_eq!(
            v[7],
            format!(
                "exec {} --agent -v",
                crate::cli::shell_quote("/a b/railrun")
            )
        );
    }

    #[test]
    fn slurm_node_list() {
        assert!(slurm_nodelist_set(&env_of(&[("SLURM_NODELIST", "n1")])));
        assert!(!slurm_nodelist_set(&env_of(&[("SLURM_JOB_NODELIST", " ")])));
    }
}
