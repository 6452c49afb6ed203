//! Questions about a running cluster: names, addresses, commands and code inside a host,
//! the processes living there, hostfiles, rail byte counters, a summary.

use super::cmd::{run_cmd, write_file};
use super::net::{mgmt_addr_of, rail_addr_of, rate_bytes_per_sec};
use super::procfs::{
    in_netns_path, netns_path, ns_id, pids_in_netns, proc_cmdline, proc_is_zombie,
};
use super::{Cluster, Host};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

impl Cluster {
    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "emulated cluster {}: unknown host {name:?} (have {:?})",
                    self.tag,
                    self.hosts.iter().map(|h| &h.name).collect::<Vec<_>>()
                )
            })
    }

    /// The cluster's unique tag (namespace names are `rr<tag>-<host>`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The cluster directory (keys, configs, logs, hostfiles).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Compute host names `n1`..`nN` (without `head`).
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().skip(1).map(|h| h.name.clone()).collect()
    }

    /// Number of rails per compute host.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// The network namespace name of a host (`"head"`, `"n1"`, ...).
    pub fn netns(&self, host: &str) -> String {
        self.host(host).ns.clone()
    }

    /// PID of the holder process of a host (target for `nsenter -t`).
    pub fn holder_pid(&self, host: &str) -> u32 {
        self.host(host).holder
    }

    /// PID of the sshd listener of a host.
    pub fn sshd_pid(&self, host: &str) -> u32 {
        self.host(host).sshd
    }

    /// The ssh client config (`Host head`, `Host n1`, ...).
    pub fn ssh_config(&self) -> &Path {
        &self.ssh_cfg
    }

    /// `"ssh -F <dir>/ssh_config"`: a launcher's remote-shell command.
    pub fn ssh_command(&self) -> String {
        format!("ssh -F {}", self.ssh_cfg.display())
    }

    /// Management address of a host (head: 10.77.0.1, nK: 10.77.0.(10+K)).
    pub fn mgmt_addr(&self, host: &str) -> Ipv4Addr {
        mgmt_addr_of(self.host(host).index)
    }

    /// Address of compute host `host` on rail `rail`: 10.77.(10+rail).(10+K).
    /// Panics for `head` (no rail addresses) or a rail out of range.
    pub fn rail_addr(&self, host: &str, rail: usize) -> Ipv4Addr {
        let h = self.host(host);
        assert!(
            h.index > 0,
            "emulated cluster: {host} has no rail addresses"
        );
        assert!(
            rail < self.rails,
            "emulated cluster: rail {rail} out of range (rails = {})",
            self.rails
        );
        rail_addr_of(h.index, rail)
    }

    /// A command that runs `argv` inside `host`'s network, UTS and mount
    /// namespaces (via `nsenter -t <holder>`), in the caller's current
    /// directory. Add env/stdio and spawn it as usual. An empty `argv` runs
    /// `$SHELL`.
    pub fn exec(&self, host: &str, argv: &[&str]) -> Command {
        self.exec_os(host, argv)
    }

    /// railrun on `host` talking to the cluster over its ssh: `railrun BEFORE... --ssh CMD
    /// ARGS...` (BEFORE: a sub-command such as `doctor`, or nothing), with stdin closed and no
    /// Slurm node list or `RAILRUN_SSH` from the test's environment.
    pub fn railrun_on(&self, host: &str, before: &[&str], args: &[&str]) -> Command {
        let bin = crate::bins::railrun()
            .to_str()
            .expect("utf-8 path")
            .to_string();
        let ssh = self.ssh_command();
        let mut argv: Vec<&str> = vec![&bin];
        argv.extend_from_slice(before);
        argv.extend_from_slice(&["--ssh", &ssh]);
        argv.extend_from_slice(args);
        let mut cmd = self.exec(host, &argv);
        cmd.env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST")
            .env_remove("RAILRUN_SSH")
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// Like [`Cluster::exec`] for non-UTF-8 arguments.
    pub fn exec_os<S: AsRef<OsStr>>(&self, host: &str, argv: &[S]) -> Command {
        let h = self.host(host);
        let mut c = Command::new(&self.tools.nsenter);
        c.arg("-t")
            .arg(h.holder.to_string())
            .args(["-n", "-u", "-m", "--wd=.", "--"]);
        c.args(argv);
        c
    }

    /// Run `f` on a thread inside `host`'s network namespace (sockets made
    /// there stay there). Name resolution inside `f` still uses the root
    /// namespace's /etc/hosts: use addresses.
    pub fn in_netns<R: Send, F: FnOnce() -> R + Send>(
        &self,
        host: &str,
        f: F,
    ) -> Result<R, String> {
        in_netns_path(&netns_path(&self.host(host).ns), f)
    }

    /// Processes living in `host`'s network namespace, except the harness's
    /// own holder and sshd listener. Per-connection sshd processes of live
    /// ssh sessions are included. Zombies are not listed.
    pub fn pids_on(&self, host: &str) -> Vec<(u32, String)> {
        let h = self.host(host);
        let Some(id) = ns_id(&netns_path(&h.ns)) else {
            return Vec::new();
        };
        let ids: HashSet<(u64, u64)> = [id].into_iter().collect();
        let mut v: Vec<(u32, String)> = pids_in_netns(&ids)
            .into_iter()
            .filter(|&p| p != h.holder && p != h.sshd && !proc_is_zombie(p))
            .map(|p| (p, proc_cmdline(p)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        v.sort();
        v
    }

    /// Poll [`Cluster::pids_on`] until it is empty; Err(survivors) after
    /// `timeout`.
    pub fn wait_no_survivors(
        &self,
        host: &str,
        timeout: Duration,
    ) -> Result<(), Vec<(u32, String)>> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.pids_on(host);
            if v.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(v);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Write an Open MPI hostfile (`n1 slots=S` per line) into the cluster
    /// directory and return its path.
    pub fn hostfile(&self, slots_per_host: usize) -> Result<PathBuf, String> {
        let path = self.dir.join(format!("hostfile-{slots_per_host}"));
        let mut s = String::new();
        for n in self.host_names() {
            s.push_str(&format!("{n} slots={slots_per_host}\n"));
        }
        write_file(&path, &s, 0o644)?;
        Ok(path)
    }

    /// (tx_bytes, rx_bytes) of `rail<rail>` on `host`, read from
    /// `/sys/class/net/rail<rail>/statistics` as seen inside the host.
    pub fn rail_bytes(&self, host: &str, rail: usize) -> Result<(u64, u64), String> {
        let h = self.host(host);
        let base = PathBuf::from(format!(
            "/proc/{}/root/sys/class/net/rail{rail}/statistics",
            h.holder
        ));
        let read = |f: &str| -> Result<u64, String> {
            let p = base.join(f);
            fs::read_to_string(&p)
                .map_err(|e| format!("read {} (host {host}): {e}", p.display()))?
                .trim()
                .parse()
                .map_err(|e| format!("parse {}: {e}", p.display()))
        };
        Ok((read("tx_bytes")?, read("rx_bytes")?))
    }

    /// Take `host`'s `rail<rail>` interface down (`up == false`) or up again — what `ip link
    /// set rail1 down` inside the host does (its switch-side end loses the carrier).
    pub fn set_rail_up(&self, host: &str, rail: usize, up: bool) -> Result<(), String> {
        let ns = self.host(host).ns.clone();
        let dev = format!("rail{rail}");
        run_cmd(
            Command::new(&self.tools.ip).args([
                "-n",
                &ns,
                "link",
                "set",
                &dev,
                if up { "up" } else { "down" },
            ]),
            None,
        )
        .map(|_| ())
    }

    /// Stop (or restart) the switch of rail `rail`: its bridge goes down and drops every frame,
    /// while every host's `rail<rail>` stays up with a carrier — the path dies silently, only
    /// missing acknowledgements tell.
    pub fn set_rail_switch_up(&self, rail: usize, up: bool) -> Result<(), String> {
        run_cmd(
            Command::new(&self.tools.ip).args([
                "-n",
                &format!("rr{}-sw", self.tag),
                "link",
                "set",
                &format!("br-rail{rail}"),
                if up { "up" } else { "down" },
            ]),
            None,
        )
        .map(|_| ())
    }

    /// Set the MTU of `host`'s `rail<rail>` interface (the switch side keeps its own).
    pub fn set_rail_mtu(&self, host: &str, rail: usize, mtu: u32) -> Result<(), String> {
        let ns = self.host(host).ns.clone();
        let dev = format!("rail{rail}");
        run_cmd(
            Command::new(&self.tools.ip).args([
                "-n",
                &ns,
                "link",
                "set",
                &dev,
                "mtu",
                &mtu.to_string(),
            ]),
            None,
        )
        .map(|_| ())
    }

    /// Shape both directions of `host`'s rail link (host side `rail<rail>`, switch side
    /// `r<rail>-<host>`) to `rate` (tc syntax) with `tbf`, replacing any shaping there.
    pub fn shape_rail(&self, host: &str, rail: usize, rate: &str) -> Result<(), String> {
        let bps = rate_bytes_per_sec(rate)?;
        let tc = self.tools.tc.clone().ok_or("tc not found")?;
        let burst = ((bps * 0.010) as u64).max(128 * 1024).to_string();
        let ends = [
            (self.host(host).ns.clone(), format!("rail{rail}")),
            (format!("rr{}-sw", self.tag), format!("r{rail}-{host}")),
        ];
        for (ns, dev) in ends {
            run_cmd(
                Command::new(&tc).args([
                    "-n", &ns, "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", rate,
                    "burst", &burst, "latency", "50ms",
                ]),
                None,
            )?;
        }
        Ok(())
    }

    /// Human-readable summary (used by `emucluster up`).
    /// The hosts' TCP congestion control (`None`: inherited from the root namespace).
    pub fn tcp_cc(&self) -> Option<&str> {
        self.tcp_cc.as_deref()
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "emulated cluster {} ({} hosts x {} rails{}, TCP {}), dir {}\n",
            self.tag,
            self.hosts_n,
            self.rails,
            self.rail_rate
                .as_deref()
                .map(|r| format!(", rails shaped to {r}"))
                .unwrap_or_default(),
            self.tcp_cc
                .as_deref()
                .unwrap_or("congestion control inherited"),
            self.dir.display()
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "  {:<5} netns {:<16} mgmt0 {:<12} holder pid {:<7} sshd pid {}",
                h.name,
                h.ns,
                mgmt_addr_of(h.index).to_string(),
                h.holder,
                h.sshd
            ));
            if h.index > 0 {
                let rails: Vec<String> = (0..self.rails)
                    .map(|r| format!("rail{r} {}", rail_addr_of(h.index, r)))
                    .collect();
                s.push_str(&format!("  {}", rails.join("  ")));
            }
            s.push('\n');
        }
        s
    }
}
