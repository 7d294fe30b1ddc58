//! Network namespaces for fault tests (root): each daemon gets its own
//! namespace with one address on a bridge the test creates, so a link can be
//! cut (`ip link set ... down` on the host side of its veth) and healed.
//! Unix sockets live in the filesystem, so the CLI reaches a daemon's socket
//! from the host as usual. Everything is named `gqf<tag>...` (or another
//! prefix, see [`Net::with_prefix`]) and removed in Drop (and before creating,
//! in case an earlier run died).

use std::process::Command;

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `iptables ARGS` in namespace `ns`, panicking on failure.
fn iptables(ns: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "iptables"])
        .args(args)
        .output()
        .expect("run ip netns exec");
    assert!(
        out.status.success(),
        "iptables {} in {ns} failed (one-way cuts need iptables: apt-get install -y iptables): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Panics unless iptables can be run (one-way cuts need it).
pub fn require_iptables() {
    let ok = Command::new("iptables")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "one-way partitions need iptables: apt-get install -y iptables"
    );
}

/// Runs `ip ARGS`, ignoring failure (cleanup of what may not exist).
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip").args(args).output();
}

/// One namespace with its address.
#[derive(Clone, Debug)]
pub struct Host {
    /// The namespace's name.
    pub ns: String,
    /// Its address on the bridge.
    pub ip: String,
    /// The host side of its veth pair (cut and heal this one).
    veth: String,
}

impl Host {
    /// `ip:port`.
    pub fn addr(&self, port: u16) -> String {
        format!("{}:{port}", self.ip)
    }
}

/// A bridge `10.88.<subnet>.0/24` and the namespaces on it.
pub struct Net {
    prefix: String,
    tag: String,
    subnet: u8,
    bridge: String,
    hosts: Vec<Host>,
}

impl Net {
    /// Creates the bridge; `tag` (at most 8 characters) makes the names
    /// unique to a test, `subnet` its addresses.
    pub fn new(tag: &str, subnet: u8) -> Net {
        Net::with_prefix("gqf", tag, subnet)
    }

    /// Like [`Net::new`], with names starting with `prefix` (3 characters)
    /// instead of `gqf`: a benchmark keeps its names apart from the tests'.
    pub fn with_prefix(prefix: &str, tag: &str, subnet: u8) -> Net {
        assert!(tag.len() <= 8, "netns tag {tag:?} is longer than 8");
        assert!(
            prefix.len() <= 3,
            "netns prefix {prefix:?} is longer than 3"
        );
        let bridge = format!("{prefix}{tag}b");
        let net = Net {
            prefix: prefix.to_string(),
            tag: tag.to_string(),
            subnet,
            bridge: bridge.clone(),
            hosts: Vec::new(),
        };
        net.remove_leftovers();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("10.88.{subnet}.1/24"),
            "dev",
            &bridge,
        ]);
        ip(&["link", "set", &bridge, "up"]);
        net
    }

    fn ns_name(&self, i: usize) -> String {
        format!("{}-{}-{i}", self.prefix, self.tag)
    }

    fn remove_leftovers(&self) {
        for i in 0..32 {
            let ns = self.ns_name(i);
            if std::path::Path::new("/run/netns").join(&ns).exists() {
                ip_quiet(&["netns", "del", &ns]);
            }
            ip_quiet(&["link", "del", &format!("{}{}{i}", self.prefix, self.tag)]);
        }
        ip_quiet(&["link", "del", &self.bridge]);
    }

    /// Adds a namespace with the next address (10.88.S.11, .12, ...).
    pub fn add_host(&mut self) -> Host {
        let i = self.hosts.len();
        let ns = self.ns_name(i);
        let veth = format!("{}{}{i}", self.prefix, self.tag);
        let peer = format!("{}{}{i}p", self.prefix, self.tag);
        let addr = format!("10.88.{}.{}", self.subnet, 11 + i);
        ip(&["netns", "add", &ns]);
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &ns]);
        ip(&["link", "set", &veth, "master", &self.bridge]);
        ip(&["link", "set", &veth, "up"]);
        let in_ns = |args: &[&str]| {
            let mut full = vec!["-n", ns.as_str()];
            full.extend_from_slice(args);
            ip(&full);
        };
        in_ns(&["link", "set", &peer, "name", "eth0"]);
        in_ns(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        in_ns(&["link", "set", "eth0", "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        let host = Host { ns, ip: addr, veth };
        self.hosts.push(host.clone());
        host
    }

    /// A command that runs `program` inside namespace `ns` (`ip netns
    /// exec` execs it, so the child's pid is the program's).
    pub fn command(ns: &str, program: &std::path::Path) -> Command {
        let mut c = super::clean_command("ip");
        c.args(["netns", "exec", ns]).arg(program);
        // Any free HTTP port, as `gpuq_command` gives: a namespace may
        // hold more than one daemon.
        c.env("GPUQ_HTTP_LISTEN", "127.0.0.1:0");
        c
    }

    /// Cuts `host` off the bridge: nothing goes in or out.
    pub fn cut(&self, host: &Host) {
        ip(&["link", "set", &host.veth, "down"]);
    }

    /// Reconnects `host`.
    pub fn heal(&self, host: &Host) {
        ip(&["link", "set", &host.veth, "up"]);
    }

    /// A one-way cut: drops everything `host` sends to `to` (iptables in
    /// its namespace), while it still hears them. Panics, saying what to
    /// install, without iptables.
    pub fn cut_outgoing(&self, host: &Host, to: &[&Host]) {
        for t in to {
            iptables(&host.ns, &["-A", "OUTPUT", "-d", &t.ip, "-j", "DROP"]);
        }
    }

    /// Removes `host`'s one-way cuts.
    pub fn heal_outgoing(&self, host: &Host) {
        iptables(&host.ns, &["-F", "OUTPUT"]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting the host end first is synchronous; the namespace's
        // cleanup is not, and the names may be reused at once.
        for h in &self.hosts {
            ip_quiet(&["link", "del", &h.veth]);
            ip_quiet(&["netns", "del", &h.ns]);
        }
        ip_quiet(&["link", "del", &self.bridge]);
    }
}

/// A control plane of one server per host (`s1` bootstraps in `hosts[0]`,
/// the others join it), each listening on its namespace's address, with
/// `extra` config lines; waits until all are voters.
pub fn server_set(root: &std::path::Path, hosts: &[Host], extra: &str) -> super::ServerSet {
    use super::Server;
    let place = |s: &mut Server, h: &Host| {
        s.host = h.ip.clone();
        s.netns = Some(h.ns.clone());
        s.port = 7420;
        s.extra_config = extra.into();
    };
    let mut first = Server::joining(&root.join("s1"), "s1", "", "");
    first.mode = vec!["--bootstrap".into()];
    place(&mut first, &hosts[0]);
    first.start();
    let token = first.server_token();
    let mut servers = vec![first];
    for (i, h) in hosts.iter().enumerate().skip(1) {
        let name = format!("s{}", i + 1);
        let mut s = Server::joining(&root.join(&name), &name, &servers[0].addr(), &token);
        place(&mut s, h);
        s.start();
        s.wait_voter(&name);
        s.mode.clear();
        servers.push(s);
    }
    let set = super::ServerSet { servers };
    set.wait_members(hosts.len());
    set
}

/// A compute agent with `gpus` fake GPUs in `host`'s namespace, joined
/// through `server` (the only server it is told of).
pub fn agent(
    server: &super::Server,
    host: &Host,
    dir: &std::path::Path,
    name: &str,
    gpus: u32,
    token: &str,
) -> super::Agent {
    super::Agent::start_in(server, dir, name, gpus, token, "", Some(&host.ns))
}

/// Like [`agent`], with the hardware it reports given in full (`hw.cpus`
/// instead of the tests' 64).
pub fn agent_hw(
    server: &super::Server,
    host: &Host,
    dir: &std::path::Path,
    name: &str,
    hw: super::AgentHw,
    token: &str,
) -> super::Agent {
    super::Agent::start_hw(server, dir, name, hw, token, "", Some(&host.ns))
}
