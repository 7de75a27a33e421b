//! The control-plane cases: a daemon (`airlock serve`) the suite starts on loopback with a
//! state directory of its own, its long-lived sandboxes, and the host-side scenarios that
//! attack its API and the agent's file API (races included). Everything is removed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use airlock_api::v1::{CreateSandboxRequest, ExecRequest};
use airlock_server::client::{Client, ClientError};
use anyhow::{Context, bail};

use super::catalog::Outcome;
use super::runner::Env;

/// A variable in the daemon's own environment that no sandbox may see.
pub const DAEMON_SECRET_VAR: &str = "AIRLOCK_SECEVAL_DAEMON_SECRET";

#[derive(Debug)]
pub struct Daemon {
    child: Child,
    state: PathBuf,
    client: Client,
    runtime: tokio::runtime::Runtime,
    key: String,
    /// The Judge0-compatible API's address (`--judge0-listen`).
    judge0: Option<String>,
    /// Sandbox A (where probes run), B (another tenant) and C (for attacks that may wedge
    /// its agent), with their access tokens.
    sandboxes: Vec<(String, String)>,
    /// On the container tier, the probe's path inside the test image (the host's is not
    /// visible there).
    image_probe: Option<&'static str>,
}

impl Daemon {
    /// Starts the daemon and its three sandboxes: on the process tier, or, given the
    /// container tier's test image layer, on that image (imported into the daemon's store
    /// through `POST /v1/images/import`, as a rootfs tarball).
    pub fn start(
        airlock: &Path,
        image_layer: Option<&Path>,
        template: Option<&str>,
    ) -> anyhow::Result<Daemon> {
        let state = PathBuf::from(format!(
            "/var/tmp/airlock-seceval-{}-daemon",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&state);
        let keys = Command::new(airlock)
            .args(["keys", "--state-dir"])
            .arg(&state)
            .args(["create", "seceval"])
            .stdin(Stdio::null())
            .output()
            .context("creating an API key")?;
        if !keys.status.success() {
            bail!(
                "airlock keys create: {}",
                String::from_utf8_lossy(&keys.stderr).trim()
            );
        }
        let key = String::from_utf8_lossy(&keys.stdout).trim().to_owned();
        let mut child = Command::new(airlock)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .args(["--judge0-listen", "127.0.0.1:0", "--judge0-callback-hosts"])
            .arg(super::judge0::CALLBACK_HOST)
            .env(DAEMON_SECRET_VAR, "seceval-daemon-secret")
            .env("AIRLOCK_API_KEY", &key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting airlock serve")?;
        let (mut line, mut judge0_line) = (String::new(), String::new());
        if let Some(stdout) = child.stdout.take() {
            let mut stdout = BufReader::new(stdout);
            stdout.read_line(&mut line)?;
            stdout.read_line(&mut judge0_line)?;
        }
        let url_in = |line: &str| {
            line.split_whitespace()
                .find(|w| w.starts_with("http://"))
                .map(str::to_owned)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let address = url_in(&line);
        let mut daemon = Daemon {
            child,
            state,
            client: Client::new(
                address.as_deref().unwrap_or("http://127.0.0.1:1"),
                Some(key.clone()),
            )?,
            runtime,
            key,
            judge0: url_in(&judge0_line),
            sandboxes: Vec::new(),
            image_probe: image_layer.map(|_| super::fixtures::IMAGE_PROBE),
        };
        if address.is_none() {
            bail!("airlock serve did not start: {}", line.trim());
        }
        let image = match image_layer {
            Some(layer) => Some(daemon.import_image(layer)?),
            None => None,
        };
        for _ in 0..3 {
            let request = CreateSandboxRequest {
                timeout_ms: Some(30 * 60 * 1000),
                image: image.clone(),
                template: template.map(str::to_owned),
                ..CreateSandboxRequest::default()
            };
            let created = daemon.runtime.block_on(daemon.client.create(&request))?;
            daemon
                .sandboxes
                .push((created.sandbox.id, created.access_token));
        }
        if template == Some(airlock_server::lifecycle::DESKTOP_TEMPLATE) {
            daemon.start_desktops()?;
        }
        Ok(daemon)
    }

    /// Brings every sandbox's desktop up, so that the cases run beside a live X server and a
    /// browser with its debugging port: the display (the computer API's first action) and
    /// Chromium, whose DevTools answer proves it runs.
    fn start_desktops(&self) -> anyhow::Result<()> {
        for (id, _) in &self.sandboxes {
            self.runtime
                .block_on(
                    self.client
                        .computer(id, &airlock_api::v1::ComputerAction::ScreenSize {}),
                )
                .context("starting a desktop sandbox's display")?;
            let browser = ExecRequest {
                shell: Some(
                    "chromium about:blank >/dev/null 2>&1 & \
                     for i in $(seq 600); do \
                       curl -sf http://127.0.0.1:9222/json/version >/dev/null && exit 0; sleep 0.1; \
                     done; exit 1"
                        .to_owned(),
                ),
                env: [("DISPLAY".to_owned(), ":0".to_owned())].into(),
                ..ExecRequest::default()
            };
            let output = self
                .runtime
                .block_on(self.client.exec_collect(id, &browser))?;
            anyhow::ensure!(
                output.exit_code == 0,
                "Chromium did not start in desktop sandbox {id}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// The test image's layer as a rootfs tarball (ids and modes kept), imported under a
    /// tag of its own; returns that tag.
    fn import_image(&self, layer: &Path) -> anyhow::Result<String> {
        let archive = self.state.join("seceval-image.tar");
        let tar = Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(layer)
            .arg("-cf")
            .arg(&archive)
            .arg(".")
            .stdin(Stdio::null())
            .output()
            .context("running tar")?;
        if !tar.status.success() {
            bail!(
                "tar of the test image: {}",
                String::from_utf8_lossy(&tar.stderr).trim()
            );
        }
        let tag = "seceval/probe:latest";
        self.runtime
            .block_on(self.client.import_image(&archive, Some(tag)))
            .context("importing the test image into the daemon")?;
        let _ = std::fs::remove_file(&archive);
        Ok(tag.to_owned())
    }

    /// The probe's path inside the daemon's sandboxes.
    fn probe_path(&self, host: &Path) -> String {
        self.image_probe
            .map_or_else(|| host.display().to_string(), str::to_owned)
    }

    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// The daemon's API address (`HOST:PORT`).
    pub(super) fn address(&self) -> String {
        self.client
            .base_url()
            .trim_start_matches("http://")
            .to_owned()
    }

    /// A client of the Judge0 API (its auth header is the caller's).
    pub(super) fn judge0_client(&self) -> anyhow::Result<Client> {
        let url = self
            .judge0
            .as_deref()
            .context("airlock serve printed no Judge0 API address")?;
        Ok(Client::new(url, None)?)
    }

    pub(super) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    pub(super) fn id(&self, index: usize) -> &str {
        self.sandboxes.get(index).map_or("", |(id, _)| id.as_str())
    }

    pub fn values(&self) -> Vec<(&'static str, String)> {
        let state = self.state.display().to_string();
        vec![
            (
                "daemonaddr",
                self.client
                    .base_url()
                    .trim_start_matches("http://")
                    .to_owned(),
            ),
            (
                "agentsock",
                format!("{state}/sandboxes/{}/agent.sock", self.id(0)),
            ),
            ("state", state),
        ]
    }

    /// Runs the probe in sandbox A and reads its verdict (a signal from the exit's `status`,
    /// which names it as envd does).
    pub fn exec_probe(&self, probe: &Path, args: &[String]) -> anyhow::Result<Outcome> {
        let mut argv = vec![self.probe_path(probe)];
        argv.extend(args.iter().cloned());
        let request = ExecRequest {
            argv: Some(argv),
            timeout_ms: Some(60_000),
            ..ExecRequest::default()
        };
        let output = self
            .runtime
            .block_on(self.client.exec_collect(self.id(0), &request))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let signal = (!output.exited)
            .then(|| airlock_server::judge0::status::signal_from_status(&output.status))
            .flatten();
        let code = signal.is_none().then_some(output.exit_code);
        Ok(Outcome::from_probe(&stdout, code, signal))
    }

    /// Sandbox `index`'s access token.
    pub(super) fn token(&self, index: usize) -> &str {
        self.sandboxes.get(index).map_or("", |(_, t)| t.as_str())
    }

    /// The daemon's client, for the desktop cases' data-plane requests.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `argv` in sandbox `index`; its stdout and exit code.
    pub(super) fn exec(&self, index: usize, argv: Vec<String>) -> anyhow::Result<(String, i32)> {
        let request = ExecRequest {
            argv: Some(argv),
            timeout_ms: Some(60_000),
            ..ExecRequest::default()
        };
        let output = self
            .runtime
            .block_on(self.client.exec_collect(self.id(index), &request))?;
        Ok((
            String::from_utf8_lossy(&output.stdout).into_owned(),
            output.exit_code,
        ))
    }

    /// A host-side attack on the daemon or the agent's file API.
    pub fn scenario(&self, name: &str, env: &Env) -> anyhow::Result<Outcome> {
        let probe = self.probe_path(&env.probe);
        let a = self.id(0).to_owned();
        match name {
            "token-cross" => {
                let anonymous = Client::new(&self.client.base_url(), None)?;
                let token_a = self.sandboxes.first().map(|(_, t)| t.clone());
                let with_a = anonymous.with_access_token(token_a);
                // The probe: an image has no `true` of the host's.
                let echo = ExecRequest {
                    argv: Some(vec![probe.clone(), "getenv".into(), "PATH".into()]),
                    ..ExecRequest::default()
                };
                // Control: the token opens its own sandbox.
                self.runtime
                    .block_on(with_a.exec_collect(&a, &echo))
                    .context("sandbox A's token does not open sandbox A")?;
                Ok(api_outcome(
                    self.runtime
                        .block_on(with_a.exec_collect(self.id(1), &echo)),
                ))
            }
            "e2b-token-cross" => {
                let anonymous = Client::new(&self.client.base_url(), None)?;
                let get = |index: usize, token_of: usize| {
                    let id = self.id(index).to_owned();
                    let token = self
                        .sandboxes
                        .get(token_of)
                        .map(|(_, t)| t.clone())
                        .unwrap_or_default();
                    let anonymous = anonymous.clone();
                    async move {
                        let headers = [
                            ("e2b-sandbox-id", id.as_str()),
                            ("e2b-sandbox-port", "49983"),
                            ("x-access-token", token.as_str()),
                        ];
                        anonymous
                            .raw(
                                hyper::Method::GET,
                                "/files?path=%2Fetc%2Fpasswd",
                                &headers,
                                Vec::new(),
                            )
                            .await
                    }
                };
                // Control: B's own token opens B's envd.
                let (own, _, _) = self.runtime.block_on(get(1, 1))?;
                if !own.is_success() {
                    bail!("sandbox B's token does not open B's envd ({own})");
                }
                let (status, _, _) = self.runtime.block_on(get(1, 0))?;
                Ok(if status.is_success() {
                    Outcome::Ok(status.to_string())
                } else {
                    Outcome::Http(status.as_u16())
                })
            }
            "no-key" => {
                let anonymous = Client::new(&self.client.base_url(), None)?;
                Ok(api_outcome(
                    self.runtime
                        .block_on(anonymous.list(&[], &Default::default())),
                ))
            }
            "oversized-body" => {
                let request = CreateSandboxRequest {
                    metadata: [("x".to_owned(), "a".repeat(2 << 20))].into(),
                    ..CreateSandboxRequest::default()
                };
                match self.runtime.block_on(self.client.create(&request)) {
                    Ok(created) => {
                        let _ = self
                            .runtime
                            .block_on(self.client.delete(&created.sandbox.id));
                        Ok(Outcome::Ok("created".into()))
                    }
                    Err(err) => Ok(api_outcome::<()>(Err(err))),
                }
            }
            "file-symlink-read" => {
                let secret = format!("{}/.ssh/id_ed25519", env.fixtures.home.display());
                self.exec(
                    0,
                    vec![
                        probe,
                        "symlink-read".into(),
                        secret,
                        "/workspace/seceval-key".into(),
                    ],
                )?;
                Ok(api_outcome(self.runtime.block_on(
                    self.client.read_file(&a, "/workspace/seceval-key"),
                )))
            }
            "file-symlink-write" => {
                let victim = env.fixtures.scratch.join("victim");
                self.exec(
                    0,
                    vec![
                        probe,
                        "symlink-read".into(),
                        victim.display().to_string(),
                        "/workspace/seceval-out".into(),
                    ],
                )?;
                let answer = self.runtime.block_on(self.client.write_file(
                    &a,
                    "/workspace/seceval-out",
                    "pwned\n",
                ));
                if std::fs::read_to_string(&victim).unwrap_or_default() != "fixture\n" {
                    return Ok(Outcome::Ok("the host file changed".into()));
                }
                Ok(api_outcome(answer))
            }
            "file-traversal" => {
                let mut last = Outcome::Hung;
                for path in [
                    "/workspace/../../etc/shadow",
                    "../../../../etc/shadow",
                    "/workspace/%2e%2e/etc/shadow",
                    "/proc/1/root/etc/shadow",
                ] {
                    last = api_outcome(self.runtime.block_on(self.client.read_file(&a, path)));
                    if last.is_ok() {
                        return Ok(Outcome::Ok(format!("read {path}")));
                    }
                }
                Ok(last)
            }
            "file-rename-race" => self.rename_race(env, &probe),
            "file-fifo-swap" => self.fifo_swap(&probe),
            "kill-agent" => {
                let (out, _) = self.exec(
                    0,
                    vec![probe.clone(), "kill".into(), "1".into(), "9".into()],
                )?;
                let alive = self
                    .exec(0, vec![probe, "getenv".into(), "PATH".into()])
                    .is_ok();
                Ok(Outcome::Ok(if alive {
                    "alive".into()
                } else {
                    format!("agent gone after {}", out.trim())
                }))
            }
            judge0 if judge0.starts_with("judge0-") => super::judge0::scenario(self, judge0, env),
            "zygote-sibling" => self.zygote_sibling(&probe),
            "zygote-sibling-loopback" => self.sibling_reach(&probe, "connect", "127.0.0.1:7391"),
            "zygote-sibling-abstract" => {
                self.sibling_reach(&probe, "connect-unix", "@airlock-seceval-sibling")
            }
            other => bail!("unknown scenario `{other}`"),
        }
    }

    /// Sandboxes A and B have helpers forked by the daemon's one zygote: from inside A, signal 0
    /// (a pure existence check) to B's agent and to the zygote, by their host pids.
    fn zygote_sibling(&self, probe: &str) -> anyhow::Result<Outcome> {
        let daemon = i32::try_from(self.child.id())?;
        // Children of every thread: the zygote and its helpers belong to the daemon's keeper
        // thread.
        let children = |pid: i32| -> Vec<i32> {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten();
            tasks
                .flatten()
                .flat_map(|task| {
                    std::fs::read_to_string(task.path().join("children"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect()
        };
        let cmdline = |pid: i32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let zygote = children(daemon)
            .into_iter()
            .find(|&pid| cmdline(pid).ends_with(b"--zygote\0"))
            .context("the daemon runs no helper zygote")?;
        let b = self.id(1).to_owned();
        let agent_b = children(daemon)
            .into_iter()
            .flat_map(children)
            .find(|&pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|cgroups| cgroups.contains(&b))
            })
            .context("sandbox B's agent is not a grandchild of the daemon")?;
        let mut last = Outcome::Hung;
        for pid in [agent_b, zygote] {
            let argv = vec![probe.to_owned(), "kill".into(), pid.to_string(), "0".into()];
            let (stdout, code) = self.exec(0, argv)?;
            last = Outcome::from_probe(&stdout, Some(code), None);
            if last.is_ok() {
                return Ok(Outcome::Ok(format!("reached host pid {pid}")));
            }
        }
        Ok(last)
    }

    /// Sandbox B listens on `target` in its own network namespace; A, whose namespace came from
    /// the same zygote (and its pool), connects to the same address. The control is B reaching
    /// its own listener, before A's attempt and after it.
    fn sibling_reach(&self, probe: &str, connect: &str, target: &str) -> anyhow::Result<Outcome> {
        let argv = |verb: &str, rest: &[&str]| {
            let mut argv = vec![probe.to_owned(), verb.to_owned(), target.to_owned()];
            argv.extend(rest.iter().map(|s| (*s).to_owned()));
            ExecRequest {
                argv: Some(argv),
                timeout_ms: Some(30_000),
                ..ExecRequest::default()
            }
        };
        let attempt = |index: usize| {
            let request = argv(connect, &[]);
            async move {
                let output = self.client.exec_collect(self.id(index), &request).await?;
                let stdout = String::from_utf8_lossy(&output.stdout);
                anyhow::Ok(Outcome::from_probe(&stdout, Some(output.exit_code), None))
            }
        };
        let holder = argv("hold-listener", &["2", "20"]);
        let (client, b) = (self.client.clone(), self.id(1).to_owned());
        self.runtime.block_on(async {
            let held = tokio::spawn(async move { client.exec_collect(&b, &holder).await });
            let mut control = Outcome::Hung;
            for _ in 0..100 {
                control = attempt(1).await?;
                if control.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if !control.is_ok() {
                bail!("the control: B never reached its own {target} ({control})");
            }
            let outcome = attempt(0).await?;
            if outcome.is_ok() {
                return Ok(Outcome::Ok(format!("reached B's {target}")));
            }
            let after = attempt(1).await?;
            let held = held.await??;
            let held = String::from_utf8_lossy(&held.stdout);
            if !after.is_ok() || held.trim() != "ok accepted 2" {
                bail!("the control: B's listener on {target} went away ({after}, `{held}`)");
            }
            Ok(outcome)
        })
    }

    /// The workload swaps `/workspace/race` between a directory and a symlink to a host
    /// directory while the API uploads into it; nothing may land on the host.
    fn rename_race(&self, env: &Env, probe: &str) -> anyhow::Result<Outcome> {
        let a = self.id(0).to_owned();
        let target = env.fixtures.scratch.join("race-target");
        std::fs::create_dir_all(&target)?;
        self.runtime
            .block_on(self.client.mkdir(&a, "/workspace/race"))?;
        let racer = ExecRequest {
            argv: Some(vec![
                probe.to_owned(),
                "rename-race".into(),
                "/workspace/race".into(),
                target.display().to_string(),
                "3".into(),
            ]),
            timeout_ms: Some(30_000),
            ..ExecRequest::default()
        };
        let client = self.client.clone();
        let id = a.clone();
        let mut refused = 0;
        self.runtime.block_on(async {
            let race = tokio::spawn(async move { client.exec_collect(&id, &racer).await });
            tokio::time::sleep(Duration::from_millis(300)).await;
            for n in 0..60 {
                let path = format!("/workspace/race/f{n}");
                if self.client.write_file(&a, &path, "pwned\n").await.is_err() {
                    refused += 1;
                }
            }
            let _ = race.await;
        });
        let landed = std::fs::read_dir(&target).map(|d| d.count()).unwrap_or(0);
        if std::env::var_os("AIRLOCK_SECEVAL_DEBUG").is_some() {
            eprintln!("seceval: rename race: {refused} of 60 uploads refused");
        }
        Ok(Outcome::Ok(format!("landed={landed}")))
    }

    /// The workload swaps a FIFO and a regular file at one path while the API downloads and
    /// uploads it: an agent that opens a FIFO blocks its only thread. Runs in sandbox C.
    fn fifo_swap(&self, probe: &str) -> anyhow::Result<Outcome> {
        let c = self.id(2).to_owned();
        let racer = ExecRequest {
            argv: Some(vec![
                probe.to_owned(),
                "fifo-race".into(),
                "/workspace/ff".into(),
                "4".into(),
            ]),
            timeout_ms: Some(30_000),
            ..ExecRequest::default()
        };
        let client = self.client.clone();
        let id = c.clone();
        let answered = self.runtime.block_on(async {
            let race = tokio::spawn(async move { client.exec_collect(&id, &racer).await });
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut answered = 0;
            for n in 0..80 {
                let attempt = async {
                    if n % 2 == 0 {
                        let _ = self.client.read_file(&c, "/workspace/ff").await;
                    } else {
                        let _ = self.client.write_file(&c, "/workspace/ff", "x").await;
                    }
                };
                if tokio::time::timeout(Duration::from_secs(10), attempt)
                    .await
                    .is_err()
                {
                    return None;
                }
                answered += 1;
            }
            let _ = tokio::time::timeout(Duration::from_secs(20), race).await;
            Some(answered)
        });
        Ok(match answered {
            Some(n) => Outcome::Ok(format!("answered {n}")),
            None => Outcome::Hung,
        })
    }
}

/// An API answer as an outcome: success, the OS error behind a refusal when the agent names
/// one (`... (os error 13)`), else the HTTP status.
fn api_outcome<T>(result: Result<T, ClientError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok(String::new()),
        Err(ClientError::Api {
            status, message, ..
        }) => message
            .rsplit_once("(os error ")
            .and_then(|(_, rest)| rest.trim_end_matches(')').parse().ok())
            .map_or(Outcome::Http(status), Outcome::Errno),
        Err(_) => Outcome::Hung,
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for (id, _) in std::mem::take(&mut self.sandboxes) {
            let _ = self.runtime.block_on(self.client.delete(&id));
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
