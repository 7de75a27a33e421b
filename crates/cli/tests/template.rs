//! `airlock template build|ls|get|rm` against `airlock serve`, as root: a Dockerfile with FROM
//! (an image the build pulls from Debian's docker-registry on loopback), USER, RUN, COPY (a
//! .dockerignore'd context, --chown), ENV, WORKDIR and CMD becomes a template whose sandbox
//! has the files, environment, working directory and user, and runs the start command; an
//! unchanged rebuild is all cache hits; a failing RUN names its step, its Dockerfile line and
//! its output; a refused line names its line number; a RUN sees no network but loopback.
//! The registry rig and the test images are the image crate's (crates/image/tests/common,
//! scripts/test-images.sh). A second test drives `/v1/images` (pull, remove, prune with a
//! sandbox's lease), `sandbox create --image`, and a template built `FROM` another template;
//! a third, `airlockd --base-image`; a fourth, a RUN that reaches a package mirror on loopback
//! only with a build policy that allows it (through the egress proxy), and a template's limits and
//! default policy applying to its sandboxes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;
#[path = "../../image/tests/common/mod.rs"]
mod rig;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use rig::Registry;

/// `airlock serve` with its own state directory and a small disk scratch image.
struct Daemon {
    child: Child,
    url: String,
    key: String,
    state: PathBuf,
}

impl Daemon {
    fn start(tag: &str) -> Daemon {
        Daemon::start_with(tag, |_| {}, &[])
    }

    /// With `prepare` run on the state directory first and `args` added to `airlock serve`.
    fn start_with(tag: &str, prepare: impl FnOnce(&Path), args: &[&str]) -> Daemon {
        let state = PathBuf::from(format!(
            "/var/tmp/airlock-cli-template-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&state);
        let keys = Command::new(common::airlock_bin())
            .args(["keys", "--state-dir"])
            .arg(&state)
            .args(["create", "template-test"])
            .output()
            .unwrap();
        assert!(keys.status.success(), "{keys:?}");
        let key = String::from_utf8(keys.stdout).unwrap().trim().to_owned();
        prepare(&state);
        let mut child = Command::new(common::airlock_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--storage-size",
                "2GiB",
                "--state-dir",
            ])
            .arg(&state)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Daemon {
            child,
            url: format!("http://{addr}"),
            key,
            state,
        }
    }

    fn airlock(&self, args: &[&str]) -> Output {
        Command::new(common::airlock_bin())
            .args(args)
            .env("AIRLOCK_URL", &self.url)
            .env("AIRLOCK_API_KEY", &self.key)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> Output {
        let output = self.airlock(args);
        assert!(
            output.status.success(),
            "airlock {args:?}: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        output
    }

    /// `sh -c script` in a sandbox; its stdout.
    fn exec(&self, id: &str, script: &str) -> String {
        let output = self.ok(&["exec", id, "--", "/bin/sh", "-c", script]);
        String::from_utf8(output.stdout).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let listed = self.airlock(&["sandbox", "ls", "--json"]);
        let sandboxes: Vec<serde_json::Value> =
            serde_json::from_slice(&listed.stdout).unwrap_or_default();
        for sandbox in sandboxes {
            if let Some(id) = sandbox["id"].as_str() {
                let _ = self.airlock(&["sandbox", "rm", id]);
            }
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let storage = self.state.join("storage");
        if Command::new("mountpoint")
            .arg("-q")
            .arg(&storage)
            .status()
            .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&storage).status();
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn test_template_build_from_a_dockerfile_then_create_from_it() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let daemon = Daemon::start("build");
    let context = rig::Scratch::new("template-context");
    let dir = &context.0;
    // The base image runs as 1000:1000 in /tmp: the Dockerfile takes root first.
    let dockerfile = format!(
        "# a comment\nARG GREETING=hello\nFROM {host}/airlock/busybox:gzip\nUSER root\n\
         RUN mkdir -p /srv && cat /proc/net/dev > /srv/net.txt && rm /etc/motd && echo ran-step-$((1+1))\n\
         COPY app /srv/app\nCOPY --chown=app:app app/data.txt /home/app/\n\
         ENV GREETING=${{GREETING}} STAGE=built\nUSER app\nWORKDIR /srv/work\n\
         RUN echo \"$GREETING from $(id -un) in $(pwd)\" > built.txt\n\
         LABEL org.opencontainers.image.description=\"a test template\"\nEXPOSE 8080\n\
         CMD [\"/bin/sh\", \"-c\", \"echo started in $(pwd) as $(id -un) > /tmp/started; exec sleep 3600\"]\n",
        host = registry.host()
    );
    write(
        dir,
        &[
            ("Dockerfile", &dockerfile),
            ("app/main.sh", "echo main\n"),
            ("app/data.txt", "data\n"),
            ("app/secret.txt", "do not copy\n"),
            (".dockerignore", "**/secret.txt\n"),
        ],
    );
    let context_arg = dir.to_str().unwrap();
    let built = daemon.ok(&[
        "template",
        "build",
        "web:v1",
        context_arg,
        "--ready-cmd",
        "test -f /tmp/started",
    ]);
    let log = stdout(&built);
    assert!(
        log.contains("[base] pulling"),
        "the FROM image is pulled: {log}"
    );
    assert!(
        log.contains("ran-step-2"),
        "RUN output is in the log: {log}"
    );
    let summary = stderr(&built);
    assert!(summary.contains("template web:v1 is ready"), "{summary}");

    // An unchanged rebuild: every step is a cache hit, and the image is the same.
    let again = daemon.ok(&[
        "template",
        "build",
        "web:v1",
        context_arg,
        "--ready-cmd",
        "test -f /tmp/started",
    ]);
    let relog = stdout(&again);
    assert!(!relog.contains("ran-step-2"), "no RUN ran: {relog}");
    assert_eq!(relog.matches("CACHED").count(), 8, "{relog}");
    let image_of = |text: &str| {
        text.split("is ready: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap()
            .to_owned()
    };
    assert_eq!(image_of(&stderr(&again)), image_of(&summary));
    assert!(
        stderr(&again).contains("(8 of 9 steps cached)"),
        "{}",
        stderr(&again)
    );

    let listed = stdout(&daemon.ok(&["template", "ls"]));
    assert!(listed.contains("web:v1"), "{listed}");
    let template: serde_json::Value =
        serde_json::from_slice(&daemon.ok(&["template", "get", "web"]).stdout).unwrap();
    assert_eq!(template["description"], "a test template");
    assert!(
        template["start_cmd"]
            .as_str()
            .unwrap()
            .contains("/tmp/started")
    );

    // A sandbox of the template: proven from inside.
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "web"]))
        .trim()
        .to_owned();
    let seen = daemon.exec(
        &id,
        "cat /srv/app/main.sh /home/app/data.txt /srv/work/built.txt /tmp/started; \
         stat -c '%U %a' /home/app/data.txt /srv/app/main.sh; echo \"$GREETING $STAGE\"; \
         id -un; ls /srv/app; ls /etc/motd 2>&1; grep -c : /srv/net.txt; grep -o '^ *[a-z0-9]*:' /srv/net.txt",
    );
    let expected = [
        "echo main",
        "data",
        "hello from app in /srv/work",
        "started in /srv/work as app",
        "app 644",
        "root 644",
        "hello built",
        "app",
        "data.txt",
        "main.sh",
        "ls: /etc/motd: No such file or directory",
        "1",
        "lo:",
    ];
    let lines: Vec<&str> = seen.lines().map(str::trim).collect();
    assert_eq!(lines, expected, "inside the sandbox:\n{seen}");
    daemon.ok(&["sandbox", "rm", &id]);

    // A RUN that fails: its step, its Dockerfile line and its output.
    let failing = dir.join("Failing.dockerfile");
    std::fs::write(
        &failing,
        format!(
            "FROM {}/airlock/busybox:gzip\nUSER root\nRUN echo failing-$((6*7)) && exit 3\n",
            registry.host()
        ),
    )
    .unwrap();
    let failed = daemon.airlock(&[
        "template",
        "build",
        "broken",
        context_arg,
        "-f",
        failing.to_str().unwrap(),
    ]);
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert!(
        stdout(&failed).contains("failing-42"),
        "{}",
        stdout(&failed)
    );
    let why = stderr(&failed);
    assert!(why.contains("failed at step 2"), "{why}");
    assert!(why.contains("Failing.dockerfile:3"), "{why}");
    assert!(why.contains("exit code 3"), "{why}");
    assert!(
        !stdout(&daemon.ok(&["template", "ls"])).contains("broken"),
        "a failed build makes no template"
    );

    // A refused instruction, by its line.
    let refused = dir.join("Refused.dockerfile");
    std::fs::write(&refused, "FROM scratch\n\nADD https://example.com/x /x\n").unwrap();
    let output = daemon.airlock(&[
        "template",
        "build",
        "refused",
        context_arg,
        "-f",
        refused.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(125));
    let message = stderr(&output);
    assert!(
        message.contains("Refused.dockerfile:3: ADD is not supported"),
        "{message}"
    );

    daemon.ok(&["template", "rm", "web"]);
    assert!(!stdout(&daemon.ok(&["template", "ls"])).contains("web:v1"));
    let gone = daemon.airlock(&["template", "get", "web:v1"]);
    assert!(stderr(&gone).contains("not_found"), "{}", stderr(&gone));
}

impl Daemon {
    /// `curl` of the daemon's API with the key: the status and the body.
    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut command = Command::new("curl");
        command
            .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method])
            .args(["-H", &format!("X-API-Key: {}", self.key)])
            .arg(format!("{}{path}", self.url));
        if let Some(body) = body {
            command.args(["-H", "Content-Type: application/json", "--data", body]);
        }
        let output = command.output().expect("curl must be installed");
        let text = String::from_utf8(output.stdout).unwrap();
        let (body, status) = text.rsplit_once('\n').unwrap();
        (status.trim().parse().unwrap(), body.to_owned())
    }
}

#[test]
fn test_daemon_images_then_a_template_from_a_template() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let daemon = Daemon::start("images");
    let reference = format!("{}/airlock/busybox:gzip", registry.host());

    // A pull through the daemon: progress lines, then one `done` with the digest.
    let (status, stream) = daemon.curl(
        "POST",
        "/v1/images/pull",
        Some(&format!(r#"{{"reference": "{reference}"}}"#)),
    );
    assert_eq!(status, 200, "{stream}");
    let last: serde_json::Value = serde_json::from_str(stream.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "done", "{stream}");
    let digest = last["digest"].as_str().unwrap().to_owned();
    assert!(digest.starts_with("sha256:"), "{last}");
    let (status, listed) = daemon.curl("GET", "/v1/images", None);
    assert_eq!(status, 200);
    assert!(listed.contains(&digest), "{listed}");

    // A sandbox of the bare image: the container tier, the image's files, not the host's.
    let id = stdout(&daemon.ok(&["sandbox", "create", "--image", &reference]))
        .trim()
        .to_owned();
    let info: serde_json::Value =
        serde_json::from_slice(&daemon.ok(&["sandbox", "get", &id]).stdout).unwrap();
    assert_eq!(info["tier"], "container", "{info}");
    let state = daemon.state.display().to_string();
    let seen = daemon.exec(
        &id,
        &format!(
            "test -x /bin/busybox && echo busybox; ls {state} 2>&1 | grep -c 'No such file'; \
             id -un; touch /etc/written 2>&1; true"
        ),
    );
    // The image's user (app), on a root that is writable for root only (not read-only).
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        [
            "busybox",
            "1",
            "app",
            "touch: /etc/written: Permission denied"
        ]
    );

    // Without its name the image stays while the sandbox leases it, and goes with it.
    let encoded = reference.replace('/', "%2F");
    assert_eq!(
        daemon
            .curl("DELETE", &format!("/v1/images/{encoded}"), None)
            .0,
        200
    );
    let (status, pruned) = daemon.curl("POST", "/v1/images/prune", None);
    assert_eq!(status, 200, "{pruned}");
    assert!(
        !pruned.contains(&digest),
        "a leased image was pruned: {pruned}"
    );
    assert_eq!(daemon.exec(&id, "grep -c ^app: /etc/passwd").trim(), "1");
    assert_eq!(
        daemon.curl("GET", &format!("/v1/images/{digest}"), None).0,
        200
    );
    daemon.ok(&["sandbox", "rm", &id]);
    let (_, pruned) = daemon.curl("POST", "/v1/images/prune", None);
    assert!(pruned.contains(&digest), "{pruned}");
    assert_eq!(
        daemon.curl("GET", &format!("/v1/images/{digest}"), None).0,
        404
    );

    // FROM a template: the child has the parent's layers under its own.
    let context = rig::Scratch::new("template-chain");
    let dir = &context.0;
    write(
        dir,
        &[
            (
                "Parent.dockerfile",
                &format!("FROM {reference}\nUSER root\nRUN echo one > /one\n"),
            ),
            (
                "Child.dockerfile",
                "FROM parent:v1\nRUN cat /one > /two && echo two >> /two\n",
            ),
        ],
    );
    let context_arg = dir.to_str().unwrap();
    let parent = dir.join("Parent.dockerfile");
    daemon.ok(&[
        "template",
        "build",
        "parent:v1",
        context_arg,
        "-f",
        parent.to_str().unwrap(),
    ]);
    let child = dir.join("Child.dockerfile");
    daemon.ok(&[
        "template",
        "build",
        "child",
        context_arg,
        "-f",
        child.to_str().unwrap(),
    ]);
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "child"]))
        .trim()
        .to_owned();
    assert_eq!(daemon.exec(&id, "cat /two; id -u"), "one\ntwo\n0\n");
    daemon.ok(&["sandbox", "rm", &id]);
    // A warm pool of the image-built template: the member runs on the image, and a create of
    // the template claims it.
    let (status, body) = daemon.curl("PUT", "/v1/templates/child/pool", Some(r#"{"size": 1}"#));
    assert_eq!(status, 200, "{body}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let member = loop {
        let (_, listed) = daemon.curl("GET", "/v1/sandboxes?include=pool", None);
        let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
        let pooled: Vec<String> = listed["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["pool"] == true)
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        if let [member] = pooled.as_slice() {
            break member.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never filled: {listed}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "child"]))
        .trim()
        .to_owned();
    assert_eq!(id, member, "the create claimed the member");
    assert_eq!(daemon.exec(&id, "cat /two"), "one\ntwo\n");
    daemon.ok(&["sandbox", "rm", &id]);
    let (status, body) = daemon.curl("PUT", "/v1/templates/child/pool", Some(r#"{"size": 0}"#));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn test_base_image_puts_the_base_template_on_the_container_tier() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let reference = format!("{}/airlock/busybox:gzip", registry.host());
    // The image goes into the daemon's store before it starts, which checks it is there.
    let pull_into = |state: &Path| {
        let pulled = Command::new(common::airlock_bin())
            .args(["image", "pull", "--store"])
            .arg(state.join("images"))
            .arg(&reference)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(pulled.status.success(), "{pulled:?}");
    };
    let daemon = Daemon::start_with("base", pull_into, &["--base-image", &reference]);
    let id = stdout(&daemon.ok(&["sandbox", "create"])).trim().to_owned();
    let info: serde_json::Value =
        serde_json::from_slice(&daemon.ok(&["sandbox", "get", &id]).stdout).unwrap();
    assert_eq!(info["tier"], "container", "{info}");
    assert_eq!(info["template"], "base", "{info}");
    let state = daemon.state.display().to_string();
    let seen = daemon.exec(
        &id,
        &format!("test -x /bin/busybox && echo busybox; ls {state} 2>&1 | grep -c 'No such file'"),
    );
    assert_eq!(seen.lines().collect::<Vec<_>>(), ["busybox", "1"]);
    daemon.ok(&["sandbox", "rm", &id]);
}

/// A package mirror on loopback: every request gets `body`; the request lines are counted.
fn mirror(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, served)
}

#[test]
fn test_template_run_reaches_a_mirror_only_through_its_build_policy() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let (port, served) = mirror("mirror-package\n");
    let resolve = format!("mirror.test=127.0.0.1:{port}");
    let daemon = Daemon::start_with("mirror", |_| {}, &["--test-egress-resolve", &resolve]);
    let context = rig::Scratch::new("template-mirror");
    let dir = &context.0;
    let fetch = "RUN wget -q -O /pkg http://mirror.test/pkg && cat /pkg";
    write(
        dir,
        &[
            (
                "Dockerfile",
                &format!(
                    "FROM {}/airlock/busybox:gzip\nUSER root\n{fetch}\n",
                    registry.host()
                ),
            ),
            (
                "build.yaml",
                "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - name: mirror\n      host: mirror.test\n      ports: [80]\n      methods: [GET]\n",
            ),
        ],
    );
    let context_arg = dir.to_str().unwrap();
    // Without a build policy the RUN has no network: the build fails, the mirror sees nothing.
    let refused = daemon.airlock(&["template", "build", "offline", context_arg]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("failed at step 2"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 0);

    let policy = dir.join("build.yaml");
    let built = daemon.ok(&[
        "template",
        "build",
        "mirrored",
        context_arg,
        "--policy",
        policy.to_str().unwrap(),
        "--memory",
        "300MiB",
    ]);
    assert!(
        stdout(&built).contains("mirror-package"),
        "{}",
        stdout(&built)
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "mirrored"]))
        .trim()
        .to_owned();
    assert_eq!(daemon.exec(&id, "cat /pkg"), "mirror-package\n");
    // The template's defaults: its limits apply; the build policy is the RUNs' alone, so the
    // sandbox has no network.
    let info: serde_json::Value =
        serde_json::from_slice(&daemon.ok(&["sandbox", "get", &id]).stdout).unwrap();
    assert_eq!(info["resources"]["memory_bytes"], 300 << 20, "{info}");
    let offline = daemon.exec(
        &id,
        "wget -q -O - http://mirror.test/pkg 2>&1 >/dev/null | head -1; true",
    );
    assert!(!offline.contains("mirror-package"), "{offline}");
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
    daemon.ok(&["sandbox", "rm", &id]);

    // A template whose sandboxes get the policy by default (its RUN comes from the cache).
    let online = daemon.ok(&[
        "template",
        "build",
        "online",
        context_arg,
        "--policy",
        policy.to_str().unwrap(),
        "--sandbox-policy",
        policy.to_str().unwrap(),
    ]);
    assert!(stdout(&online).contains("CACHED"), "{}", stdout(&online));
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "online"]))
        .trim()
        .to_owned();
    assert_eq!(
        daemon.exec(&id, "wget -q -O - http://mirror.test/pkg"),
        "mirror-package\n"
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 2);
    daemon.ok(&["sandbox", "rm", &id]);

    // A warm pool of it: each member starts with its own egress proxy (whose audit log it
    // opens before the claim does), and a claimed member reaches the mirror through it.
    daemon.ok(&["sandbox", "pool", "online", "--size", "1"]);
    let ready = (0..600).any(|_| {
        let status: serde_json::Value =
            serde_json::from_slice(&daemon.ok(&["sandbox", "pool", "online"]).stdout).unwrap();
        status["ready"] == 1 || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            false
        }
    });
    let status = stdout(&daemon.ok(&["sandbox", "pool", "online"]));
    assert!(
        ready,
        "the pool of a template with a proxy policy never filled: {status}"
    );
    let id = stdout(&daemon.ok(&["sandbox", "create", "--template", "online"]))
        .trim()
        .to_owned();
    let logs = stdout(&daemon.ok(&["sandbox", "logs", &id]));
    assert!(logs.contains("warm pool"), "served by the member: {logs}");
    assert_eq!(
        daemon.exec(&id, "wget -q -O - http://mirror.test/pkg"),
        "mirror-package\n"
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 3);
    daemon.ok(&["sandbox", "pool", "online", "--size", "0"]);
    daemon.ok(&["sandbox", "rm", &id]);
}
