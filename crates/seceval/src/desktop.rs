//! `airlock seceval --template desktop`: a column of its own, run in the daemon's desktop
//! sandboxes (their X servers and browsers up, `daemon.rs`): the catalog's filesystem,
//! process and network cases from inside sandbox A (one attempt each, judged by the outcome
//! the catalog expects; the layer behind it is the one the process tier's proofs pin in the
//! same run), and cases only a desktop has:
//!
//! - another sandbox's X server and debugging port are not this one's (a marker set in A's
//!   root window and a page opened in A's browser are not seen from B);
//! - the data plane opens port 9222 only with the sandbox's own access token (or an API key);
//! - the host's abstract Unix sockets (an X server's among them) and its X socket files are not
//!   reachable from inside;
//! - Chromium runs with `--no-sandbox` (its own sandbox cannot work inside Airlock's), and so
//!   under Airlock's confinement: no capabilities, `no_new_privs`, the seccomp filter.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper::Method;

use super::catalog::Case;
use super::daemon::Daemon;
use super::report::{CaseResult, TierResults};
use super::runner::{self, Env, Verdict};

/// The column's name in the scorecard.
pub const COLUMN: &str = "process, inside a desktop sandbox";
/// The catalog groups the column runs.
const GROUPS: &[&str] = &[
    "fs-confidentiality",
    "fs-integrity",
    "process-kernel",
    "network",
];
const GROUP: &str = "desktop";

/// The column, or an error when the daemon (with its desktop sandboxes) is not running.
pub fn column(env: &Env, cases: &[&Case]) -> anyhow::Result<TierResults> {
    let daemon = env
        .daemon
        .as_ref()
        .context("the daemon's desktop sandboxes did not start")?;
    let mut results = Vec::new();
    for case in cases.iter().filter(|c| GROUPS.contains(&c.group.as_str())) {
        let mut verdict = runner::evaluate_in_daemon_sandbox(env, case).unwrap_or_else(|err| {
            Verdict::WrongLayer {
                detail: format!("could not run: {}", crate::one_line(&err)),
            }
        });
        if case.id == "fs-conf.init-descriptors" && matches!(verdict, Verdict::Allowed { .. }) {
            verdict = agent_descriptors(env, daemon);
        }
        results.push(CaseResult::new(case, verdict, None, Vec::new()));
    }
    let token = format!("seceval-{:x}", std::process::id());
    let own: [(&str, &str, &str, Verdict); 5] = [
        (
            "desktop.x-server-cross",
            "network-namespace+mount-view",
            "B's display is its own",
            x_server_cross(daemon, &token),
        ),
        (
            "desktop.cdp-cross",
            "network-namespace",
            "B's port 9222 is its own browser",
            cdp_cross(daemon, &token),
        ),
        (
            "desktop.cdp-data-plane-credential",
            "daemon-auth",
            "http 401 without the sandbox's token",
            cdp_data_plane(daemon),
        ),
        (
            "desktop.host-sockets",
            "network-namespace+mount-view",
            "errno ECONNREFUSED / ENOENT",
            host_sockets(env, daemon),
        ),
        (
            "desktop.chromium-confined",
            "no-privileges+seccomp",
            "--no-sandbox, no capabilities, no_new_privs, seccomp",
            chromium_confined(daemon),
        ),
    ];
    for (id, layers, expected, verdict) in own {
        results.push(CaseResult {
            id: id.to_owned(),
            group: GROUP.to_owned(),
            layers: layers.split('+').map(str::to_owned).collect(),
            expected: expected.to_owned(),
            airlock: verdict,
            bwrap: None,
            notes: Vec::new(),
        });
    }
    Ok(TierResults {
        tier: COLUMN.to_owned(),
        cases: results,
    })
}

/// The daemon's pid 1 is the agent, exec'd inside the sandbox's user namespace, so its `/proc`
/// entries belong to the sandbox's uid 0, the workload's: `stat` of `/proc/1/fd/4` succeeds
/// (descriptor numbers and types are listable), where `airlock run`'s init, made outside, stays
/// unmapped. What the case is after, opening the descriptor, needs ptrace access to a
/// non-dumpable process: a known gap while that holds, an escape if it does not.
fn agent_descriptors(env: &Env, daemon: &Daemon) -> Verdict {
    let probe = env.probe.display().to_string();
    let opened = daemon.exec(0, vec![probe, "read".into(), "/proc/1/fd/4".into()]);
    let eacces = |out: &str, code| {
        super::catalog::Outcome::from_probe(out, Some(code), None)
            == super::catalog::Outcome::Errno(13)
    };
    match opened {
        Ok((out, code)) if eacces(&out, code) => Verdict::KnownGap {
            outcome: "stat ok; read /proc/1/fd/4: errno EACCES".into(),
            reason: "the agent's descriptor table is listable by the workload (same uid in its \
                     own user namespace); the descriptors cannot be opened (non-dumpable)"
                .into(),
        },
        Ok((out, code)) => Verdict::Allowed {
            outcome: format!("read /proc/1/fd/4: {} (exit {code})", out.trim()),
        },
        Err(err) => Verdict::WrongLayer {
            detail: format!("could not run: {}", crate::one_line(&err)),
        },
    }
}

/// A case's verdict from a check that says what got through, or fails to run.
fn judged(layers: &str, check: anyhow::Result<Option<String>>) -> Verdict {
    match check {
        Ok(None) => Verdict::Blocked {
            by: layers.to_owned(),
        },
        Ok(Some(outcome)) => Verdict::Allowed { outcome },
        Err(err) => Verdict::WrongLayer {
            detail: format!("could not run: {}", crate::one_line(&err)),
        },
    }
}

fn shell(daemon: &Daemon, index: usize, script: &str) -> anyhow::Result<(String, i32)> {
    daemon.exec(
        index,
        vec!["/bin/sh".into(), "-c".into(), script.to_owned()],
    )
}

/// A marker in A's root window must not show on B's `:0`.
fn x_server_cross(daemon: &Daemon, token: &str) -> Verdict {
    let check = || -> anyhow::Result<Option<String>> {
        let set =
            format!("xprop -display :0 -root -f AIRLOCK_SECEVAL 8s -set AIRLOCK_SECEVAL {token}");
        let (_, code) = shell(daemon, 0, &set)?;
        anyhow::ensure!(code == 0, "xprop could not set the marker in sandbox A");
        let read = "xprop -display :0 -root AIRLOCK_SECEVAL";
        let (own, _) = shell(daemon, 0, read)?;
        anyhow::ensure!(
            own.contains(token),
            "control: A does not see its own marker ({own})"
        );
        let (other, code) = shell(daemon, 1, read)?;
        anyhow::ensure!(
            code == 0 || other.is_empty() || !other.contains(token),
            "B's xprop failed unexpectedly"
        );
        Ok(other
            .contains(token)
            .then(|| format!("sandbox B read A's marker: {}", other.trim())))
    };
    judged("network-namespace+mount-view", check())
}

/// A page opened in A's browser must not be listed by B's port 9222.
fn cdp_cross(daemon: &Daemon, token: &str) -> Verdict {
    let check = || -> anyhow::Result<Option<String>> {
        let open =
            format!("curl -sf -X PUT 'http://127.0.0.1:9222/json/new?about:blank%23{token}'");
        let (_, code) = shell(daemon, 0, &open)?;
        anyhow::ensure!(code == 0, "sandbox A's browser did not open a page");
        let list = "curl -s http://127.0.0.1:9222/json/list";
        let (own, _) = shell(daemon, 0, list)?;
        anyhow::ensure!(
            own.contains(token),
            "control: A's browser does not list its page"
        );
        let (other, _) = shell(daemon, 1, list)?;
        Ok(other
            .contains(token)
            .then(|| "sandbox B's port 9222 lists A's page".to_owned()))
    };
    judged("network-namespace", check())
}

/// The data plane's port 9222 of A: refused without a credential and with B's token; open with
/// A's own (the control).
fn cdp_data_plane(daemon: &Daemon) -> Verdict {
    let check = || -> anyhow::Result<Option<String>> {
        let anonymous = airlock_server::client::Client::new(&daemon.client().base_url(), None)?;
        let a = daemon.id(0).to_owned();
        let get = |token: Option<String>| {
            let anonymous = anonymous.clone();
            let a = a.clone();
            async move {
                let mut headers =
                    vec![("e2b-sandbox-id", a.as_str()), ("e2b-sandbox-port", "9222")];
                if let Some(token) = &token {
                    headers.push(("x-access-token", token.as_str()));
                }
                anonymous
                    .raw(Method::GET, "/json/version", &headers, Vec::new())
                    .await
                    .map(|(status, _, _)| status.as_u16())
            }
        };
        let own = daemon.block_on(get(Some(daemon.token(0).to_owned())))?;
        anyhow::ensure!(own == 200, "control: A's own token got {own}");
        let none = daemon.block_on(get(None))?;
        let other = daemon.block_on(get(Some(daemon.token(1).to_owned())))?;
        Ok(match (none, other) {
            (401, 401) => None,
            _ => Some(format!(
                "no credential: http {none}; sandbox B's token: http {other}"
            )),
        })
    };
    judged("daemon-auth", check())
}

/// A host X server of its own, killed on drop.
struct HostXServer(Child);

impl Drop for HostXServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host's listening abstract sockets (from its /proc/net/unix), printable names only.
fn host_abstract_sockets() -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let mut names: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Flags 00010000: listening (__SO_ACCEPTCON).
            (fields.len() >= 8 && fields[3] == "00010000").then(|| fields[7].to_owned())
        })
        .filter(|name| {
            name.starts_with('@') && name.len() > 1 && name.bytes().all(|b| b.is_ascii_graphic())
        })
        .collect();
    names.sort();
    names.dedup();
    names.truncate(64);
    names
}

/// From inside A: every listening abstract socket of the host (a host Xvfb's among them) and
/// that server's socket file must be unreachable; on the host they answer (the control).
fn host_sockets(env: &Env, daemon: &Daemon) -> Verdict {
    let check = || -> anyhow::Result<Option<String>> {
        let display = 300 + std::process::id() % 300;
        let server = Command::new("Xvfb")
            .args([
                &format!(":{display}"),
                "-screen",
                "0",
                "320x240x24",
                "-nolisten",
                "tcp",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a host Xvfb")?;
        let _server = HostXServer(server);
        let abstract_x = format!("@/tmp/.X11-unix/X{display}");
        let file_x = format!("/tmp/.X11-unix/X{display}");
        let probe = env.probe.display().to_string();
        let started = Instant::now();
        loop {
            let answered = Command::new(&probe)
                .args(["connect-unix", &abstract_x])
                .output()
                .is_ok_and(|out| {
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .any(|l| l.trim() == "ok")
                });
            if answered {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(20),
                "control: the host's Xvfb never answered on {abstract_x}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut targets = host_abstract_sockets();
        anyhow::ensure!(
            targets.contains(&abstract_x),
            "the host's socket table does not list {abstract_x}"
        );
        targets.push(file_x);
        let mut reached = Vec::new();
        for target in &targets {
            let (out, _) = daemon.exec(
                0,
                vec![probe.clone(), "connect-unix".into(), target.clone()],
            )?;
            if out.lines().any(|l| l.trim() == "ok") {
                reached.push(target.clone());
            }
        }
        Ok((!reached.is_empty()).then(|| {
            format!(
                "{} of {} host sockets reached from inside: {}",
                reached.len(),
                targets.len(),
                reached.join(", ")
            )
        }))
    };
    if Command::new("Xvfb").arg("-help").output().is_err() {
        return Verdict::NotApplicable {
            reason: "the host has no Xvfb".into(),
        };
    }
    judged("network-namespace+mount-view", check())
}

/// Chromium's browser process in A: started with `--no-sandbox`, and confined as the workload.
fn chromium_confined(daemon: &Daemon) -> Verdict {
    let check = || -> anyhow::Result<Option<String>> {
        let script = "pid=$(pgrep -o -x chromium) || exit 3; \
                      tr '\\0' ' ' </proc/$pid/cmdline; echo; \
                      grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/$pid/status";
        let (out, code) = shell(daemon, 0, script)?;
        anyhow::ensure!(code == 0, "no Chromium runs in sandbox A (exit {code})");
        let mut wrong = Vec::new();
        if !out
            .lines()
            .next()
            .unwrap_or_default()
            .contains("--no-sandbox")
        {
            wrong.push("started without --no-sandbox".to_owned());
        }
        for line in out.lines().skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            let fine = match name {
                "NoNewPrivs" => value == "1",
                "Seccomp" => value == "2",
                _ => value.bytes().all(|b| b == b'0'),
            };
            if !fine {
                wrong.push(format!("{name} {value}"));
            }
        }
        Ok((!wrong.is_empty()).then(|| wrong.join(", ")))
    };
    judged("no-privileges+seccomp", check())
}
