//! Network namespaces for partition tests: one namespace per node, each with
//! a veth link to a bridge in the test's own namespace, on a private /24. The
//! test process reaches every node through the bridge; a node is isolated by
//! taking its link down (both directions, peers and clients alike) and healed
//! by bringing it up. Needs root (`ip netns`); everything is removed on drop.

use std::process::Command;

/// The namespaces, links and bridge of one test.
pub struct Net {
    tag: String,
    /// `10.X.Y` of the /24.
    prefix: String,
    pub nodes: usize,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Net {
    /// Creates `nodes` namespaces on a fresh bridge. Fails with a reason when
    /// namespaces cannot be made here (not root, no `ip`).
    pub fn create(nodes: usize) -> Result<Net, String> {
        let pid = std::process::id();
        let tag = format!("fl{}", pid % 100_000);
        let prefix = format!("10.{}.{}", 100 + (pid / 250) % 100, pid % 250);
        let net = Net { tag, prefix, nodes };
        net.build().inspect_err(|_| net.teardown())?;
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }

    /// The namespace of node `i` (1-based).
    pub fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    /// The bridge-side end of node `i`'s link.
    fn outer(&self, i: usize) -> String {
        format!("{}v{i}", self.tag)
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{i}", self.prefix)
    }

    fn build(&self) -> Result<(), String> {
        let br = self.bridge();
        ip(&["link", "add", "name", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}.254/24", self.prefix), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 1..=self.nodes {
            let (ns, outer, inner) = (self.ns(i), self.outer(i), format!("{}i{i}", self.tag));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &br])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{}/24", self.addr(i)), "dev", &inner])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", &inner, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Cuts node `i` off from everyone (its link down).
    pub fn isolate(&self, i: usize) {
        ip(&["link", "set", &self.outer(i), "down"]).expect("isolate");
    }

    /// Connects node `i` again.
    pub fn heal(&self, i: usize) {
        ip(&["link", "set", &self.outer(i), "up"]).expect("heal");
    }

    /// A command run inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), program]);
        c
    }

    fn teardown(&self) {
        for i in 1..=self.nodes {
            let _ = ip(&["link", "del", &self.outer(i)]);
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.teardown();
    }
}
