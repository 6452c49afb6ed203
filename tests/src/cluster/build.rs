//! Bringing a cluster up: keys and configs, namespaces, holder processes, links (and rail
//! shaping), one sshd per host; then the state file `attach` reads.

use super::cmd::{describe, run_cmd, write_file};
use super::net::{mgmt_addr_of, rail_addr_of};
use super::procfs::{in_netns_path, netns_path, proc_starttime};
use super::{Cluster, HOLDER_WAIT, SSHD_WAIT};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

impl Cluster {
    fn sw_ns(&self) -> String {
        format!("rr{}-sw", self.tag)
    }

    /// Brings the cluster up, step by step. On an error the caller drops the cluster, which
    /// tears down whatever was created so far.
    pub(super) fn build(&mut self, rate_bps: Option<f64>, detached: bool) -> Result<(), String> {
        self.write_files()?;
        self.add_namespaces()?;
        self.start_holders(detached)?;
        match self.fabric.clone() {
            None => {
                self.add_links(false)?;
                if let Some(bps) = rate_bps {
                    self.shape_rails(bps)?;
                }
            }
            Some(f) => {
                self.add_links(true)?;
                self.add_fabric(&f)?;
            }
        }
        self.start_sshds(detached)?;
        self.wait_sshd()?;
        self.write_state()?;
        Ok(())
    }

    /// Keys, `authorized_keys`, the cluster's /etc/hosts, the ssh client config and one
    /// sshd config per host.
    fn write_files(&self) -> Result<(), String> {
        let dir = self.dir.clone();
        for key in ["ssh_host_ed25519_key", "id_ed25519"] {
            run_cmd(
                Command::new(&self.tools.ssh_keygen)
                    .args([
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        &format!("railring-emucluster-{}", self.tag),
                        "-f",
                    ])
                    .arg(dir.join(key)),
                None,
            )?;
            fs::set_permissions(dir.join(key), fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("chmod {key}: {e}"))?;
        }
        let pubkey = fs::read_to_string(dir.join("id_ed25519.pub"))
            .map_err(|e| format!("read id_ed25519.pub: {e}"))?;
        write_file(&dir.join("authorized_keys"), &pubkey, 0o600)?;

        let mut etc_hosts = String::from("127.0.0.1\tlocalhost\n");
        for h in &self.hosts {
            etc_hosts.push_str(&format!("{}\t{}\n", mgmt_addr_of(h.index), h.name));
        }
        for h in self.hosts.iter().skip(1) {
            for r in 0..self.rails {
                etc_hosts.push_str(&format!(
                    "{}\t{}-rail{r}\n",
                    rail_addr_of(h.index, r),
                    h.name
                ));
            }
        }
        write_file(&dir.join("hosts"), &etc_hosts, 0o644)?;

        let mut ssh_config = String::new();
        for h in &self.hosts {
            ssh_config.push_str(&format!(
                "Host {name}\n  HostName {addr}\n  User root\n  IdentityFile {id}\n  IdentitiesOnly yes\n  \
                 StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n  \
                 ConnectTimeout 5\n\n",
                name = h.name,
                addr = mgmt_addr_of(h.index),
                id = dir.join("id_ed25519").display()
            ));
        }
        write_file(&dir.join("ssh_config"), &ssh_config, 0o644)?;

        for h in &self.hosts {
            let hd = dir.join(&h.name);
            fs::create_dir_all(&hd).map_err(|e| format!("mkdir {}: {e}", hd.display()))?;
            let cfg = format!(
                "# railring emulated cluster {tag}, host {name}\n\
                 ListenAddress {addr}\n\
                 Port 22\n\
                 HostKey {dir}/ssh_host_ed25519_key\n\
                 PidFile {hd}/sshd.pid\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 AuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UseDNS no\n\
                 PrintMotd no\n\
                 PrintLastLog no\n\
                 MaxStartups 256\n\
                 MaxSessions 256\n\
                 LogLevel INFO\n",
                tag = self.tag,
                name = h.name,
                addr = mgmt_addr_of(h.index),
                dir = dir.display(),
                hd = hd.display()
            );
            write_file(&hd.join("sshd_config"), &cfg, 0o644)?;
        }
        Ok(())
    }

    /// The switch's and every host's network namespace.
    fn add_namespaces(&self) -> Result<(), String> {
        let ip = self.tools.ip.clone();
        let sw = self.sw_ns();
        let mut all_ns = vec![sw.clone()];
        all_ns.extend(self.hosts.iter().map(|h| h.ns.clone()));
        for ns in &all_ns {
            run_cmd(Command::new(&ip).args(["netns", "add", ns]), None)?;
        }
        // switch: no IPv6 chatter on the links (keeps rail counters clean), and no firewall on
        // its bridges: where br_netfilter is loaded (Docker loads it) every bridged frame would
        // go through the host's iptables, a cost per packet a cluster switch does not have
        // (a fifth of a small send's kernel time here)
        run_cmd(
            Command::new(&ip).args(["netns", "exec", &sw, "sh", "-c"]).arg(
                "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; \
                 do [ -e $f ] && echo 1 > $f; done; \
                 for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables \
                 /proc/sys/net/bridge/bridge-nf-call-arptables; do [ -e $f ] && echo 0 > $f; done; true",
            ),
            None,
        )?;
        Ok(())
    }

    /// Holders: own UTS + mount namespaces, inside the host's netns (hostname, a private
    /// /dev/shm, the cluster's /etc/hosts); waits until each says `ready`.
    fn start_holders(&mut self, detached: bool) -> Result<(), String> {
        let ip = self.tools.ip.clone();
        let dir = self.dir.clone();
        let script = "set -e\n\
            for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do\n\
              if [ -e $f ]; then echo 1 > $f; fi\n\
            done\n\
            echo \"$1\" > /proc/sys/kernel/hostname\n\
            if [ -n \"$3\" ]; then echo \"$3\" > /proc/sys/net/ipv4/tcp_congestion_control; fi\n\
            mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm\n\
            mount --bind \"$2\" /etc/hosts\n\
            echo ready\n\
            exec sleep infinity\n";
        let (tx, rx) = mpsc::channel::<(usize, String)>();
        for i in 0..self.hosts.len() {
            let h = self.hosts[i].clone();
            let log = fs::File::create(dir.join(&h.name).join("holder.log"))
                .map_err(|e| format!("create holder.log: {e}"))?;
            let mut cmd = Command::new(&ip);
            cmd.args(["netns", "exec", &h.ns])
                .arg(&self.tools.unshare)
                .args([
                    "--uts",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                    "holder",
                ])
                .arg(&h.name)
                .arg(dir.join("hosts"))
                .arg(self.tcp_cc.as_deref().unwrap_or(""))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log);
            if detached {
                cmd.process_group(0);
            }
            let what = describe(&cmd);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("cannot run `{what}`: {e}"))?;
            self.hosts[i].holder = child.id();
            let stdout = child.stdout.take();
            self.children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                if let Some(out) = stdout {
                    let _ = BufReader::new(out).read_line(&mut line);
                }
                let _ = tx.send((i, line));
            });
        }
        drop(tx);
        let deadline = Instant::now() + HOLDER_WAIT;
        let mut ready = vec![false; self.hosts.len()];
        while ready.iter().any(|r| !r) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, line)) if line.trim() == "ready" => ready[i] = true,
                Ok((i, line)) => {
                    let h = &self.hosts[i];
                    let log = fs::read_to_string(dir.join(&h.name).join("holder.log"))
                        .unwrap_or_default();
                    return Err(format!(
                        "holder for host {} (netns {}) failed (said {:?}): {}",
                        h.name,
                        h.ns,
                        line.trim(),
                        log.trim()
                    ));
                }
                Err(_) => {
                    let late: Vec<&str> = self
                        .hosts
                        .iter()
                        .zip(&ready)
                        .filter(|(_, r)| !**r)
                        .map(|(h, _)| h.name.as_str())
                        .collect();
                    return Err(format!(
                        "holders for {late:?} not ready after {HOLDER_WAIT:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Bridges and veth links: everything is created from the switch namespace, with the
    /// peer end created directly in the host namespace; then each host's addresses. With
    /// `mgmt_only`, the rails are left to the fabric (`fabric.rs`).
    fn add_links(&self, mgmt_only: bool) -> Result<(), String> {
        let ip = self.tools.ip.clone();
        let sw = self.sw_ns();
        let rails = if mgmt_only { 0 } else { self.rails };
        let mut swb =
            String::from("link set lo up\nlink add br-mgmt type bridge\nlink set br-mgmt up\n");
        for r in 0..rails {
            swb.push_str(&format!(
                "link add br-rail{r} type bridge\nlink set br-rail{r} up\n"
            ));
        }
        for h in &self.hosts {
            swb.push_str(&format!(
                "link add m-{n} type veth peer name mgmt0 netns {ns}\nlink set m-{n} master br-mgmt up\n",
                n = h.name,
                ns = h.ns
            ));
            if h.index > 0 {
                for r in 0..rails {
                    swb.push_str(&format!(
                        "link add r{r}-{n} type veth peer name rail{r} netns {ns}\nlink set r{r}-{n} master br-rail{r} up\n",
                        n = h.name,
                        ns = h.ns
                    ));
                }
            }
        }
        run_cmd(
            Command::new(&ip).args(["-n", &sw, "-batch", "-"]),
            Some(&swb),
        )?;
        for h in &self.hosts {
            let mut hb = format!(
                "link set lo up\naddr add {}/24 dev mgmt0\nlink set mgmt0 up\n",
                mgmt_addr_of(h.index)
            );
            if h.index > 0 {
                for r in 0..rails {
                    hb.push_str(&format!(
                        "addr add {}/24 dev rail{r}\nlink set rail{r} up\n",
                        rail_addr_of(h.index, r)
                    ));
                }
            }
            run_cmd(
                Command::new(&ip).args(["-n", &h.ns, "-batch", "-"]),
                Some(&hb),
            )?;
        }
        Ok(())
    }

    /// `tc tbf` at the rail rate on both ends of every rail link (`bps`: the rate in bytes/s).
    fn shape_rails(&self, bps: f64) -> Result<(), String> {
        let sw = self.sw_ns();
        let tc = self.tools.tc.clone().ok_or("tc not found")?;
        let rate = self.rail_rate.clone().unwrap_or_default();
        // burst: 10 ms worth of traffic, at least 128 KiB (veth GSO packets)
        let burst = ((bps * 0.010) as u64).max(128 * 1024);
        let qdisc = |dev: &str| {
            format!("qdisc add dev {dev} root tbf rate {rate} burst {burst} latency 50ms\n")
        };
        let mut swt = String::new();
        for h in self.hosts.iter().skip(1) {
            let mut ht = String::new();
            for r in 0..self.rails {
                swt.push_str(&qdisc(&format!("r{r}-{}", h.name)));
                ht.push_str(&qdisc(&format!("rail{r}")));
            }
            if !ht.is_empty() {
                run_cmd(
                    Command::new(&tc).args(["-n", &h.ns, "-batch", "-"]),
                    Some(&ht),
                )?;
            }
        }
        if !swt.is_empty() {
            run_cmd(
                Command::new(&tc).args(["-n", &sw, "-batch", "-"]),
                Some(&swt),
            )?;
        }
        Ok(())
    }

    /// One sshd per host, inside the holder's namespaces.
    fn start_sshds(&mut self, detached: bool) -> Result<(), String> {
        let dir = self.dir.clone();
        for i in 0..self.hosts.len() {
            let h = self.hosts[i].clone();
            let hd = dir.join(&h.name);
            let log = fs::File::create(hd.join("sshd.log"))
                .map_err(|e| format!("create sshd.log: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("dup sshd.log: {e}"))?;
            let mut cmd = Command::new(&self.tools.nsenter);
            cmd.arg("-t")
                .arg(h.holder.to_string())
                .args(["-n", "-u", "-m", "--"])
                .arg(&self.tools.sshd)
                .args(["-D", "-e", "-f"])
                .arg(hd.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2);
            if detached {
                cmd.process_group(0);
            }
            let what = describe(&cmd);
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot run `{what}`: {e}"))?;
            self.hosts[i].sshd = child.id();
            self.children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(child);
        }
        Ok(())
    }

    /// Poll (from inside the head namespace) until every sshd answers with
    /// its SSH banner.
    fn wait_sshd(&self) -> Result<(), String> {
        let targets: Vec<(String, Ipv4Addr)> = self
            .hosts
            .iter()
            .map(|h| (h.name.clone(), mgmt_addr_of(h.index)))
            .collect();
        let deadline = Instant::now() + SSHD_WAIT;
        let mut pending: Vec<(String, Ipv4Addr)> = targets;
        let head = netns_path(&self.hosts[0].ns);
        loop {
            let still = in_netns_path(&head, || {
                pending
                    .iter()
                    .filter(|(_, a)| !ssh_banner_ok(SocketAddr::V4(SocketAddrV4::new(*a, 22))))
                    .cloned()
                    .collect::<Vec<_>>()
            })?;
            if still.is_empty() {
                return Ok(());
            }
            // an sshd that exited is not going to come up
            {
                let mut ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
                for h in &self.hosts {
                    if let Some(c) = ch.iter_mut().find(|c| c.id() == h.sshd) {
                        if let Ok(Some(st)) = c.try_wait() {
                            let log = fs::read_to_string(self.dir.join(&h.name).join("sshd.log"))
                                .unwrap_or_default();
                            return Err(format!(
                                "sshd on {} exited ({st}): {}",
                                h.name,
                                log.trim()
                            ));
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = still
                    .iter()
                    .map(|(n, _)| {
                        let log = fs::read_to_string(self.dir.join(n).join("sshd.log"))
                            .unwrap_or_default();
                        format!("{n}: {}", log.trim())
                    })
                    .collect();
                return Err(format!(
                    "sshd not answering after {SSHD_WAIT:?}: {}",
                    logs.join("; ")
                ));
            }
            pending = still;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn write_state(&self) -> Result<(), String> {
        let mut s = format!(
            "tag={}\nhosts={}\nrails={}\nrate={}\ntcp_cc={}\n",
            self.tag,
            self.hosts_n,
            self.rails,
            self.rail_rate.clone().unwrap_or_default(),
            self.tcp_cc.clone().unwrap_or_default()
        );
        for h in &self.hosts {
            s.push_str(&format!(
                "holder.{}={}\nsshd.{}={}\n",
                h.name, h.holder, h.name, h.sshd
            ));
            for p in [h.holder, h.sshd] {
                if let Some(st) = proc_starttime(p) {
                    s.push_str(&format!("pid.{p}={p}:{st}\n"));
                }
            }
        }
        if let Some(f) = &self.fabric {
            s.push_str(&f.state());
        }
        write_file(&self.dir.join("state"), &s, 0o644)
    }
}

fn ssh_banner_ok(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < 4 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    buf.starts_with(b"SSH-")
}
