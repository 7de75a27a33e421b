//! Runs one case: the attempt in the sandbox, the proof runs that pin the blocking layer, the
//! control outside, the checks afterwards, and the same attempt under bwrap for the baseline.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::catalog::{Ablate, Case, ControlAt, InteractAction, Need, Outcome, Pattern, Post, Via};
use super::daemon::Daemon;
use super::fakenet::FakeNet;
use super::fixtures::{Fixtures, expand};

/// The bwrap command line of the baseline, exactly as the issue names it.
pub const BWRAP_ARGS: &[&str] = &[
    "--unshare-all",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
];

/// Names the egress proxy of an evaluation run sends to the test upstream; every other name
/// fails to resolve, and `rebind.test` resolves to 169.254.169.254 as a rebinding DNS would.
const EGRESS_UPSTREAM_NAMES: &[&str] = &["allowed.test", "other.test"];

/// The credential a proxy-mode case's policy reads on the host; it must never be seen inside.
pub const CREDENTIAL_VAR: &str = "AIRLOCK_SECEVAL_CREDENTIAL";
pub const CREDENTIAL_VALUE: &str = "seceval-real-credential-5b1e";

/// An attempt that neither the sandbox's own timeout nor the probe ends is killed after this.
const ATTEMPT_BOUND: Duration = Duration::from_secs(120);

/// Everything the cases run against.
#[derive(Debug)]
pub struct Env {
    pub airlock: PathBuf,
    pub probe: PathBuf,
    pub fixtures: Fixtures,
    pub fakenet: Option<FakeNet>,
    pub daemon: Option<Daemon>,
    pub policies: BTreeMap<String, PathBuf>,
    /// `--policy FILE`: applied to every `airlock run` case without a policy of its own.
    pub user_policy: Option<PathBuf>,
    /// Fixtures that could not be set up on this host, and why.
    pub unavailable: BTreeMap<Need, String>,
    /// The tier the cases run on; on the container tier every `airlock run` runs the test
    /// image (`{image}`) unless the case names another, and the probe is the image's.
    pub tier: airlock_api::Tier,
}

/// What happened to one case in one column.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Stopped, by these layers (proven), or for the baseline, with this outcome.
    Blocked {
        by: String,
    },
    /// The attack succeeded.
    Allowed {
        outcome: String,
    },
    /// A documented gap: the attack succeeded, as SECURITY.md says it does.
    KnownGap {
        outcome: String,
        reason: String,
    },
    /// Stopped, but not as the catalog says: a layer that should hold did not.
    WrongLayer {
        detail: String,
    },
    NotApplicable {
        reason: String,
    },
}

impl Verdict {
    pub fn label(&self) -> String {
        match self {
            Verdict::Blocked { by } => format!("blocked({by})"),
            Verdict::Allowed { outcome } => format!("ALLOWED ({outcome})"),
            Verdict::KnownGap { outcome, .. } => format!("ALLOWED, known gap ({outcome})"),
            Verdict::WrongLayer { detail } => format!("WRONG LAYER ({detail})"),
            Verdict::NotApplicable { reason } => format!("n/a ({reason})"),
        }
    }

    /// Whether this verdict fails the run.
    pub fn fails(&self) -> bool {
        matches!(self, Verdict::Allowed { .. } | Verdict::WrongLayer { .. })
    }
}

/// Where one attempt runs.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    Airlock(&'a [Ablate]),
    Bwrap,
    Control(ControlAt),
    Daemon,
}

/// One attempt's end, and what the checks afterwards found.
struct Attempt {
    outcome: Outcome,
    post_failures: Vec<String>,
}

/// Whether `outcome` means the attack got through, given what was expected.
fn got_through(expected: &Pattern, outcome: &Outcome) -> bool {
    if expected.is_refusal() {
        outcome.is_ok()
    } else {
        outcome.is_ok() && !expected.matches(outcome)
    }
}

fn unavailable_need(env: &Env, case: &Case) -> Option<String> {
    case.needs
        .iter()
        .find_map(|need| env.unavailable.get(need).cloned())
}

/// The sandbox column.
pub fn evaluate(env: &Env, case: &Case) -> anyhow::Result<(Verdict, Vec<String>)> {
    let mut notes = Vec::new();
    if let Some(reason) = &case.na {
        return Ok((
            Verdict::NotApplicable {
                reason: reason.clone(),
            },
            notes,
        ));
    }
    if let Some(reason) = unavailable_need(env, case) {
        return Ok((Verdict::NotApplicable { reason }, notes));
    }
    let expected = Pattern::parse(&case.expect.outcome).map_err(anyhow::Error::msg)?;
    let main_target = if case.via == Via::Daemon {
        Target::Daemon
    } else {
        Target::Airlock(&[])
    };
    let first = match case.via {
        Via::Scenario if super::scenarios::is_run_scenario(case.scenario.as_deref()) => Attempt {
            outcome: super::scenarios::run(env, case.scenario.as_deref().unwrap_or_default())?,
            post_failures: Vec::new(),
        },
        Via::Scenario => {
            let daemon = env.daemon.as_ref().context("the daemon is not running")?;
            let name = case.scenario.as_deref().unwrap_or_default();
            Attempt {
                outcome: daemon.scenario(name, env)?,
                post_failures: Vec::new(),
            }
        }
        _ => attempt(env, case, main_target, None)?,
    };
    if got_through(&expected, &first.outcome) || !first.post_failures.is_empty() {
        let mut outcome = first.outcome.to_string();
        for failure in &first.post_failures {
            outcome.push_str("; ");
            outcome.push_str(failure);
        }
        let verdict = match &case.known_gap {
            Some(reason) => Verdict::KnownGap {
                outcome,
                reason: reason.clone(),
            },
            None => Verdict::Allowed { outcome },
        };
        return Ok((verdict, notes));
    }
    let control = match &case.control {
        Some(control) => {
            let pattern = Pattern::parse(&control.outcome).map_err(anyhow::Error::msg)?;
            let run = attempt(env, case, Target::Control(control.at), None)?;
            Some((pattern.matches(&run.outcome), run.outcome))
        }
        None => None,
    };
    if !expected.matches(&first.outcome) {
        // The host itself fails the same way: nothing here is Airlock's doing.
        if let Some((false, outside)) = &control
            && *outside == first.outcome
        {
            let reason = format!("passes trivially here: outside a sandbox it ends {outside} too");
            return Ok((Verdict::NotApplicable { reason }, notes));
        }
        let detail = format!("{} instead of {}", first.outcome, case.expect.outcome);
        return Ok((Verdict::WrongLayer { detail }, notes));
    }
    let mut layer_proven = false;
    for proof in &case.proofs {
        let pattern = Pattern::parse(&proof.outcome).map_err(anyhow::Error::msg)?;
        let target = if case.via == Via::Daemon {
            Target::Daemon
        } else {
            Target::Airlock(&proof.ablate)
        };
        let run = attempt(env, case, target, proof.probe.as_deref())?;
        if !pattern.matches(&run.outcome) {
            let what = if proof.ablate.is_empty() {
                "evidence".to_owned()
            } else {
                format!(
                    "with {} off",
                    proof
                        .ablate
                        .iter()
                        .map(|a| a.flag())
                        .collect::<Vec<_>>()
                        .join("+")
                )
            };
            let detail = format!("{what}: {} instead of {}", run.outcome, proof.outcome);
            return Ok((Verdict::WrongLayer { detail }, notes));
        }
        layer_proven |= !proof.ablate.is_empty();
    }
    if let Some((false, outside)) = &control {
        if !layer_proven {
            let reason = format!("passes trivially here: outside a sandbox it ends {outside} too");
            return Ok((Verdict::NotApplicable { reason }, notes));
        }
        notes.push(format!(
            "outside a sandbox this host answers {outside} too; the proof shows Airlock's own layer"
        ));
    }
    if case.known_gap.is_some() {
        notes.push(
            "listed as a known gap but blocked here: update the catalog and SECURITY.md".into(),
        );
    }
    Ok((
        Verdict::Blocked {
            by: case.expect.layers.join("+"),
        },
        notes,
    ))
}

/// The bwrap column: the same attempt, with bwrap's outcome.
pub fn baseline(env: &Env, case: &Case) -> anyhow::Result<Verdict> {
    if let Some(reason) = case.baseline_na.as_ref().or(case.na.as_ref()) {
        return Ok(Verdict::NotApplicable {
            reason: reason.clone(),
        });
    }
    if case.via != Via::Run {
        return Ok(Verdict::NotApplicable {
            reason: "needs Airlock's daemon".into(),
        });
    }
    if let Some(reason) = unavailable_need(env, case) {
        return Ok(Verdict::NotApplicable { reason });
    }
    let expected = Pattern::parse(&case.expect.outcome).map_err(anyhow::Error::msg)?;
    let run = attempt(env, case, Target::Bwrap, None)?;
    if got_through(&expected, &run.outcome) || !run.post_failures.is_empty() {
        let mut outcome = run.outcome.to_string();
        for failure in &run.post_failures {
            outcome.push_str("; ");
            outcome.push_str(failure);
        }
        return Ok(Verdict::Allowed { outcome });
    }
    Ok(Verdict::Blocked {
        by: run.outcome.to_string(),
    })
}

fn attempt(
    env: &Env,
    case: &Case,
    target: Target<'_>,
    probe: Option<&[String]>,
) -> anyhow::Result<Attempt> {
    let mut values = env.fixtures.per_attempt()?;
    if let Some(fakenet) = &env.fakenet {
        for (name, value) in fakenet.values() {
            values.insert(name.to_owned(), value);
        }
    }
    if let Some(daemon) = &env.daemon {
        for (name, value) in daemon.values() {
            values.insert(name.to_owned(), value);
        }
    }
    let expand_all = |args: &[String]| -> anyhow::Result<Vec<String>> {
        args.iter()
            .map(|a| expand(a, &values, &env.policies))
            .collect::<anyhow::Result<Vec<_>>>()
            .with_context(|| format!("case {}", case.id))
    };
    let probe_args = expand_all(probe.unwrap_or(&case.probe))?;
    let mut sandbox_args = expand_all(&case.sandbox)?;
    Fixtures::prepare_workspace(&values, &sandbox_args)?;
    if case
        .interact
        .as_ref()
        .is_some_and(|i| i.action == InteractAction::PlantLateSecret)
    {
        env.fixtures.reset_late_secret();
    }
    let before = sink_events(env);
    let upstream_before = env.fixtures.upstream_bytes();
    let outcome = match target {
        Target::Daemon => {
            let daemon = env.daemon.as_ref().context("the daemon is not running")?;
            daemon.exec_probe(&env.probe, &probe_args)?
        }
        _ => {
            let mut command = match target {
                Target::Airlock(ablations) => {
                    let mut command = Command::new(&env.airlock);
                    command.arg("__seceval-run");
                    for ablation in ablations {
                        command.args(["--ablate", ablation.flag()]);
                    }
                    if !sandbox_args.iter().any(|a| a == "--timeout") {
                        sandbox_args.extend(["--timeout".into(), "60s".into()]);
                    }
                    if let Some(upstream) = values.get("upstream") {
                        for name in EGRESS_UPSTREAM_NAMES {
                            command.args(["--egress-upstream", &format!("{name}={upstream}")]);
                        }
                        command.args(["--egress-dns", "rebind.test=169.254.169.254"]);
                    }
                    if let Some(policy) = &env.user_policy
                        && !sandbox_args.iter().any(|a| a == "--policy")
                    {
                        sandbox_args.extend(["--policy".into(), policy.display().to_string()]);
                    }
                    let container = env.tier == airlock_api::Tier::Container
                        || sandbox_args.iter().any(|a| a == "--image");
                    if container && !sandbox_args.iter().any(|a| a == "--image") {
                        let image = values.get("image").context("the test image is missing")?;
                        sandbox_args.extend(["--image".into(), image.clone()]);
                    }
                    command.args(&sandbox_args).arg("--");
                    if container {
                        command.arg(super::fixtures::IMAGE_PROBE);
                    } else {
                        command.arg(&env.probe);
                    }
                    command
                }
                Target::Bwrap => {
                    let mut command = Command::new("bwrap");
                    command.args(BWRAP_ARGS).arg("--").arg(&env.probe);
                    command
                }
                Target::Control(ControlAt::Host) => Command::new(&env.probe),
                Target::Control(ControlAt::FakeClient) => env
                    .fakenet
                    .as_ref()
                    .context("the fake internet is not running")?
                    .in_client(&env.probe),
                Target::Daemon => unreachable_target()?,
            };
            command.args(&probe_args);
            if case.leak_descriptors {
                command = leaking_descriptors(&command);
            }
            run_command(env, case, command, &values)?
        }
    };
    let mut post_failures = Vec::new();
    for post in &case.post {
        match post {
            Post::Silent => {
                let after = sink_events(env);
                if after != before {
                    post_failures.push(format!("{} event(s) reached a sink", after - before));
                }
            }
            Post::UpstreamSilent => {
                let received = env.fixtures.upstream_bytes() - upstream_before;
                if received > 0 {
                    post_failures.push(format!("{received} byte(s) reached the upstream"));
                }
            }
            Post::LayersUntouched => {
                if !env.fixtures.image_layer_untouched() {
                    post_failures.push("the image's layer directory changed".to_owned());
                }
            }
            Post::NoSurvivor => {
                let marker = values.get("marker").cloned().unwrap_or_default();
                let survivors = wait_for_no_process_with(&marker);
                if !survivors.is_empty() {
                    post_failures.push(format!(
                        "{} process(es) outlived the sandbox",
                        survivors.len()
                    ));
                }
            }
        }
    }
    Ok(Attempt {
        outcome,
        post_failures,
    })
}

/// `command`, started from a shell that opened descriptors 7 and 8 without close-on-exec, as a
/// careless caller would.
fn leaking_descriptors(command: &Command) -> Command {
    let mut shell = Command::new("sh");
    shell
        .args(["-c", "exec 7</etc/hostname 8>/dev/null; exec \"$@\"", "sh"])
        .arg(command.get_program())
        .args(command.get_args());
    shell
}

fn unreachable_target() -> anyhow::Result<Command> {
    anyhow::bail!("internal: a daemon attempt reached the command runner")
}

fn sink_events(env: &Env) -> u64 {
    env.fixtures.sink_events() + env.fakenet.as_ref().map_or(0, FakeNet::events)
}

/// Runs `command`, acting on its output lines as the case says, within [`ATTEMPT_BOUND`].
/// Output is read on threads of their own: a process the command left behind may hold the
/// pipes open, so once the command has ended its output is awaited only briefly.
fn run_command(
    env: &Env,
    case: &Case,
    mut command: Command,
    values: &BTreeMap<String, String>,
) -> anyhow::Result<Outcome> {
    let mut child = command
        .env("AIRLOCK_SECEVAL_HOST_SECRET", "seceval-host-secret")
        .env(CREDENTIAL_VAR, CREDENTIAL_VALUE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let interact = case.interact.clone();
    let port = values.get("port").cloned().unwrap_or_default();
    let late = env.fixtures.late_secret_paths();
    let (out_tx, out_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(interact) = &interact
                && line.trim() == interact.on
            {
                match interact.action {
                    InteractAction::PlantLateSecret => {
                        let _ = super::fixtures::plant_late_secret(&late);
                    }
                    InteractAction::ConnectInbound => {
                        if let Ok(address) = format!("127.0.0.1:{port}").parse() {
                            let _ = std::net::TcpStream::connect_timeout(
                                &address,
                                Duration::from_secs(2),
                            );
                        }
                    }
                }
            }
            text.push_str(&line);
            text.push('\n');
        }
        let _ = out_tx.send(text);
    });
    let (err_tx, err_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        let _ = err_tx.send(text);
    });
    let deadline = Instant::now() + ATTEMPT_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let grace = Duration::from_secs(5);
    let stdout = out_rx.recv_timeout(grace).unwrap_or_default();
    let stderr = err_rx.recv_timeout(grace).unwrap_or_default();
    let Some(status) = status else {
        return Ok(Outcome::Hung);
    };
    let outcome = Outcome::from_probe(&stdout, status.code(), status.signal());
    if std::env::var_os("AIRLOCK_SECEVAL_DEBUG").is_some() {
        eprintln!(
            "seceval: {} {:?} -> {outcome} {}",
            case.id,
            command.get_args().collect::<Vec<_>>(),
            stderr.trim()
        );
    }
    Ok(outcome)
}

/// Waits (boundedly) for every host process whose command line holds `marker` to be gone;
/// kills and returns those that are not.
fn wait_for_no_process_with(marker: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = processes_with(marker);
        if found.is_empty() {
            return found;
        }
        if Instant::now() > deadline {
            for pid in &found {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn processes_with(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let program = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            (pid != me
                && program.ends_with(b"airlock-probe")
                && String::from_utf8_lossy(&cmdline).contains(marker))
            .then_some(pid)
        })
        .collect()
}

/// A case of `airlock run`'s kind attempted once in the daemon's sandbox A instead (a desktop
/// sandbox under `--template desktop`): blocked when it ends as the catalog expects, by the
/// layers the process tier's proofs pin in the same run; n/a when it needs options of its own
/// that a create does not take.
pub fn evaluate_in_daemon_sandbox(env: &Env, case: &Case) -> anyhow::Result<Verdict> {
    if let Some(reason) = &case.na {
        return Ok(Verdict::NotApplicable {
            reason: reason.clone(),
        });
    }
    if case.via != Via::Run
        || !case.sandbox.is_empty()
        || case.interact.is_some()
        || case.leak_descriptors
    {
        return Ok(Verdict::NotApplicable {
            reason: "needs sandbox options or a host caller of its own (see the process tier)"
                .into(),
        });
    }
    if let Some(reason) = unavailable_need(env, case) {
        return Ok(Verdict::NotApplicable { reason });
    }
    let expected = Pattern::parse(&case.expect.outcome).map_err(anyhow::Error::msg)?;
    let first = attempt(env, case, Target::Daemon, None)?;
    if got_through(&expected, &first.outcome) || !first.post_failures.is_empty() {
        let mut outcome = first.outcome.to_string();
        for failure in &first.post_failures {
            outcome.push_str("; ");
            outcome.push_str(failure);
        }
        return Ok(match &case.known_gap {
            Some(reason) => Verdict::KnownGap {
                outcome,
                reason: reason.clone(),
            },
            None => Verdict::Allowed { outcome },
        });
    }
    if !expected.matches(&first.outcome) {
        if let Some(control) = &case.control {
            let outside = attempt(env, case, Target::Control(control.at), None)?;
            if outside.outcome == first.outcome {
                let reason = format!(
                    "passes trivially here: outside a sandbox it ends {} too",
                    outside.outcome
                );
                return Ok(Verdict::NotApplicable { reason });
            }
        }
        let detail = format!("{} instead of {}", first.outcome, case.expect.outcome);
        return Ok(Verdict::WrongLayer { detail });
    }
    Ok(Verdict::Blocked {
        by: case.expect.layers.join("+"),
    })
}
