//! The fake internet: two network namespaces joined by a veth pair and nothing else. `net`
//! holds the remote targets (a metadata server at 169.254.169.254 and fd00:ec2::254, a DNS
//! server at 10.53.0.53 that answers every name, an exfiltration sink at 198.51.100.7:443),
//! served by `airlock-probe fake-servers`, which logs every connection and query. `client`
//! has a route to them and runs the controls, which show that the targets answer whoever can
//! reach them. Neither namespace has a link to the host's network, so no packet leaves the
//! machine; both disappear when [`FakeNet`] is dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

use super::fixtures::read_text;

#[derive(Debug)]
pub struct FakeNet {
    net: String,
    client: String,
    servers: Option<Child>,
    log: PathBuf,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running `ip` (install iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

impl FakeNet {
    pub fn start(probe: &Path, scratch: &Path) -> anyhow::Result<FakeNet> {
        let pid = std::process::id();
        let mut fake = FakeNet {
            net: format!("airlock-se-{pid}-net"),
            client: format!("airlock-se-{pid}-cli"),
            servers: None,
            log: scratch.join("fakenet.log"),
        };
        let (net, client) = (fake.net.clone(), fake.client.clone());
        let (net_if, client_if) = (format!("se{pid}n"), format!("se{pid}c"));
        ip(&["netns", "add", &net])?;
        ip(&["netns", "add", &client])?;
        ip(&[
            "-n", &net, "link", "add", &net_if, "type", "veth", "peer", "name", &client_if,
            "netns", &client,
        ])?;
        for (ns, dev, addresses) in [
            (
                &net,
                &net_if,
                [
                    "169.254.169.254/16",
                    "10.53.0.53/24",
                    "198.51.100.7/24",
                    "fd00:ec2::254/64",
                ],
            ),
            (
                &client,
                &client_if,
                [
                    "169.254.1.1/16",
                    "10.53.0.1/24",
                    "198.51.100.1/24",
                    "fd00:ec2::1/64",
                ],
            ),
        ] {
            for address in addresses {
                let mut args = vec![
                    "-n",
                    ns.as_str(),
                    "addr",
                    "add",
                    address,
                    "dev",
                    dev.as_str(),
                ];
                if address.contains(':') {
                    args.push("nodad");
                }
                ip(&args)?;
            }
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        let log = fake.log.display().to_string();
        let mut servers = Command::new("ip")
            .args(["netns", "exec", &net])
            .arg(probe)
            .args([
                "fake-servers",
                &log,
                "tcp:169.254.169.254:80:metadata",
                "tcp:[fd00:ec2::254]:80:metadata6",
                "tcp:198.51.100.7:443:sink",
                "dns:10.53.0.53:53",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the fake servers")?;
        let mut line = String::new();
        if let Some(stdout) = servers.stdout.take() {
            BufReader::new(stdout).read_line(&mut line)?;
        }
        fake.servers = Some(servers);
        if line.trim() != "ready" {
            bail!("the fake servers did not start: {}", line.trim());
        }
        Ok(fake)
    }

    /// The placeholders of the fake targets.
    pub fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("meta", "169.254.169.254:80".into()),
            ("meta6", "[fd00:ec2::254]:80".into()),
            ("metamapped", "[::ffff:169.254.169.254]:80".into()),
            ("exfil", "198.51.100.7:443".into()),
            ("dns", "10.53.0.53:53".into()),
            ("fakeclient", self.client.clone()),
        ]
    }

    /// How many connections and queries the fake servers have logged so far.
    pub fn events(&self) -> u64 {
        read_text(&self.log).lines().count() as u64
    }

    /// A command that runs `program` in the client namespace.
    pub fn in_client(&self, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.client]).arg(program);
        command
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        if let Some(mut servers) = self.servers.take() {
            drop(servers.stdin.take());
            let _ = servers.kill();
            let _ = servers.wait();
        }
        for ns in [&self.net, &self.client] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
