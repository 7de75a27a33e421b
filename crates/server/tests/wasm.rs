//! The wasm tier through the daemon: templates `wasm-js` and `wasm-python` run the worker
//! (crates/wasm) inside the sandbox's jail, `POST /v1/sandboxes/{id}/eval` reaches it, and a
//! policy the tier cannot honour is refused at create. Needs root, `cargo build --workspace`, `scripts/sandbox-binaries.sh`
//! and the guest modules (scripts/wasm-guests.sh, then `airlock-wasm precompile`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;
#[path = "common/upstream.rs"]
#[allow(
    dead_code,
    unused_imports,
    reason = "shared with the egress tests; only the HTTP upstream is used here"
)]
mod upstream;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{CreateSandboxRequest, ErrorCode, EvalErrorKind, EvalLanguage, EvalRequest};
use common::TestDaemon;
use serde_json::json;

fn eval(language: EvalLanguage, code: &str) -> EvalRequest {
    EvalRequest {
        language,
        code: code.to_owned(),
        timeout_ms: None,
        context_id: None,
    }
}

fn template(name: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: Some(name.to_owned()),
        ..Default::default()
    }
}

#[tokio::test]
async fn test_wasm_templates_evaluate_javascript_and_python_inside_the_jail() {
    common::require_binaries();
    let daemon = TestDaemon::start("wasm-eval", &[]);
    let client = daemon.client();
    let js = client
        .create(&template("wasm-js"))
        .await
        .unwrap()
        .sandbox
        .id;
    let answer = client
        .eval(
            &js,
            &eval(
                EvalLanguage::Javascript,
                "console.log('hi'); [1, 2, 3].map(x => x * x)",
            ),
        )
        .await
        .unwrap();
    assert_eq!(answer.error, None, "{answer:?}");
    assert_eq!(answer.result, Some(json!([1, 4, 9])));
    assert_eq!(answer.stdout, "hi\n");
    let no_python = client
        .eval(&js, &eval(EvalLanguage::Python, "1"))
        .await
        .unwrap();
    assert_eq!(
        no_python.error.map(|e| e.kind),
        Some(EvalErrorKind::Invalid)
    );
    // Started again on its files, the sandbox has its worker again.
    client
        .pause(&js, airlock_api::v1::PauseMode::Filesystem)
        .await
        .unwrap();
    client.resume(&js, None).await.unwrap();
    let resumed = client
        .eval(&js, &eval(EvalLanguage::Javascript, "6 * 7"))
        .await
        .unwrap();
    assert_eq!(resumed.result, Some(json!(42)), "{resumed:?}");

    let py = client
        .create(&template("wasm-python"))
        .await
        .unwrap()
        .sandbox
        .id;
    let answer = client
        .eval(
            &py,
            &eval(
                EvalLanguage::Python,
                "open('/workspace/note.txt', 'w').write('from python')\nsum(range(5))",
            ),
        )
        .await
        .unwrap();
    assert_eq!(answer.error, None, "{answer:?}");
    assert_eq!(answer.result, Some(json!(10)));
    // The preopened workspace is the sandbox's workspace: the file API sees the guest's file.
    let file = client.read_file(&py, "/workspace/note.txt").await.unwrap();
    assert_eq!(file, b"from python");
    let outside = client
        .eval(
            &py,
            &eval(EvalLanguage::Python, "open('/etc/hostname').read()"),
        )
        .await
        .unwrap();
    assert_eq!(
        outside.error.map(|e| e.kind),
        Some(EvalErrorKind::Exception)
    );
    let looping = client
        .eval(
            &py,
            &EvalRequest {
                timeout_ms: Some(300),
                ..eval(EvalLanguage::Python, "while True: pass")
            },
        )
        .await
        .unwrap();
    assert_eq!(looping.error.map(|e| e.kind), Some(EvalErrorKind::Timeout));
    // The worker is a process of the sandbox: in its cgroup and in its own pid namespace.
    let worker = sandbox_pids(&py)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("airlock-wasm\0serve"))
        })
        .expect("the worker runs in the sandbox's cgroup");
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    assert_ne!(
        ns(&worker),
        ns("self"),
        "the worker is in the sandbox's pid namespace"
    );
    assert_view_holds_only_the_worker_needs(&client, &py, &worker, &daemon).await;
    // No processes on the wasm tier: the native exec is refused too.
    let exec = client
        .exec_collect(
            &py,
            &airlock_api::v1::ExecRequest {
                shell: Some("id".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        exec.to_string().contains("not available on the wasm tier"),
        "{exec}"
    );
    let events = client.events(&py, None, None).await.unwrap();
    let evals = events.events.iter().filter(|e| e.kind == "eval").count();
    assert!(evals >= 3, "every evaluation is audited: {events:?}");

    // A process-tier sandbox has no eval.
    let plain = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let err = client
        .eval(&plain, &eval(EvalLanguage::Javascript, "1"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    for id in [js, py, plain] {
        client.delete(&id).await.unwrap();
    }
}

#[tokio::test]
async fn test_wasm_template_refuses_a_policy_it_cannot_honour() {
    common::require_binaries();
    let daemon = TestDaemon::start("wasm-policy", &[]);
    let client = daemon.client();
    for (policy, reason) in [
        (
            json!({"version": 1, "network": {"mode": "full"}}),
            "sockets",
        ),
        (
            json!({"version": 1, "filesystem": {"rules": {"/tmp": "rw"}}}),
            "writable path outside",
        ),
        (
            json!({"version": 1, "process": {"syscalls": {"allow_extra": ["ptrace"]}}}),
            "processes",
        ),
        (
            json!({"version": 1, "filesystem": {"rules": {":workspace/secret": "deny"}}}),
            "hole inside",
        ),
    ] {
        let policy: PolicyDocument = serde_json::from_value(policy.clone()).unwrap();
        let err = client
            .create(&CreateSandboxRequest {
                policy: Some(Box::new(policy)),
                ..template("wasm-python")
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
        assert!(err.to_string().contains(reason), "{reason}: {err}");
    }
    let listed = client.list(&[], &Default::default()).await.unwrap();
    assert!(
        listed.is_empty(),
        "a refused create leaves nothing: {listed:?}"
    );
}

#[tokio::test]
async fn test_wasm_fetch_goes_through_the_egress_proxy_and_its_rules() {
    common::require_binaries();
    let seen = upstream::SeenLog::default();
    let http = upstream::start_http_upstream(seen.clone()).await;
    let resolve = format!("allowed.test={http},other.test={http}");
    let daemon = TestDaemon::start("wasm-fetch", &["--test-egress-resolve", &resolve]);
    let client = daemon.client();
    let policy: PolicyDocument = serde_json::from_value(json!({
        "version": 1,
        "network": {"mode": "proxy", "egress": [
            {"name": "plain", "host": "allowed.test", "ports": [80], "methods": ["GET"]}
        ]},
    }))
    .unwrap();
    let id = client
        .create(&CreateSandboxRequest {
            policy: Some(Box::new(policy)),
            ..template("wasm-js")
        })
        .await
        .unwrap()
        .sandbox
        .id;
    let code = |url: &str| {
        format!(
            "(async () => {{ const r = await fetch('{url}'); return {{status: r.status, body: await r.text(), refusal: r.headers.get('x-airlock-error')}}; }})()"
        )
    };
    let allowed = client
        .eval(
            &id,
            &eval(EvalLanguage::Javascript, &code("http://allowed.test/hello")),
        )
        .await
        .unwrap();
    assert_eq!(allowed.error, None, "{allowed:?}");
    let result = allowed.result.unwrap();
    assert_eq!(result["status"], 200, "{result}");
    assert!(
        result["body"].as_str().unwrap().contains("hello from http"),
        "{result}"
    );
    let refused = client
        .eval(
            &id,
            &eval(EvalLanguage::Javascript, &code("http://other.test/secret")),
        )
        .await
        .unwrap();
    let result = refused.result.unwrap();
    assert_eq!(
        result["status"], 403,
        "a host without a rule is refused: {result}"
    );
    let targets: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.target.clone())
        .collect();
    assert!(targets.iter().any(|t| t.contains("/hello")), "{targets:?}");
    assert!(
        !targets.iter().any(|t| t.contains("/secret")),
        "the refused request reached the upstream: {targets:?}"
    );
    // The proxy audited both requests, and the daemon both evaluations.
    let events = client.events(&id, None, None).await.unwrap();
    let egress: Vec<&str> = events
        .events
        .iter()
        .filter(|e| e.kind == "egress")
        .map(|e| e.outcome.as_str())
        .collect();
    assert!(
        egress.contains(&"allowed") && egress.contains(&"denied"),
        "{events:?}"
    );
    client.delete(&id).await.unwrap();
}

/// The top-level names a wasm sandbox's view has: Airlock's own mount points and `/opt`,
/// which holds the worker and the guest modules. Nothing else of the host.
const WASM_VIEW: &[&str] = &["dev", "opt", "proc", "run", "sys", "tmp", "workspace"];

/// What an engine escape would find: the worker's own root (as the kernel resolves its
/// paths), and the same view listed and opened through the agent beside it.
async fn assert_view_holds_only_the_worker_needs(
    client: &airlock_server::client::Client,
    id: &str,
    worker: &str,
    daemon: &TestDaemon,
) {
    let names = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let root = format!("/proc/{worker}/root");
    assert_eq!(names(&root), WASM_VIEW, "the worker's root");
    assert_eq!(
        names(&format!("{root}/opt/airlock")),
        ["airlock-wasm", "wasm-guests"]
    );
    let state = daemon.state_dir.display().to_string();
    for hidden in [
        "/etc/passwd",
        "/usr/bin",
        "/home",
        "/root",
        "/bin/sh",
        &state,
    ] {
        assert!(
            !std::path::Path::new(&format!("{root}{hidden}")).exists(),
            "{hidden} is in the worker's view"
        );
    }
    // No sysfs: it would describe the host's devices.
    assert_eq!(names(&format!("{root}/sys")), Vec::<String>::new());
    let mounts = std::fs::read_to_string(format!("/proc/{worker}/mountinfo")).unwrap();
    for line in mounts.lines() {
        let point = line.split(' ').nth(4).unwrap();
        assert!(
            point == "/"
                || WASM_VIEW
                    .iter()
                    .any(|top| point.starts_with(&format!("/{top}"))),
            "the worker's mount namespace has {point}: {mounts}"
        );
    }
    let listed = client.list_dir(id, "/", 1).await.unwrap();
    let mut through_agent: Vec<String> = listed.entries.into_iter().map(|e| e.name).collect();
    through_agent.sort();
    assert_eq!(through_agent, WASM_VIEW, "the view the agent lists");
    for hidden in ["/etc/passwd", "/usr", "/home", &state] {
        let err = client.stat(id, hidden).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{hidden}: {err}");
    }
    let module = client
        .stat(id, "/opt/airlock/wasm-guests/python-3.12.0.wasm")
        .await
        .unwrap();
    assert!(module.size_bytes > 1 << 20, "{module:?}");
    client
        .write_file(id, "/opt/airlock/planted", b"x".to_vec())
        .await
        .expect_err("the worker's directory is read-only");
}

/// Every pid in sandbox `id`'s cgroups (and their children).
fn sandbox_pids(id: &str) -> Vec<String> {
    let mut pids = Vec::new();
    let mut dirs = common::sandbox_cgroups(id);
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(procs.lines().map(str::to_owned));
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
    }
    pids
}

#[tokio::test]
async fn test_wasm_https_fetch_uses_a_connect_tunnel_and_the_proxys_credentials() {
    common::require_binaries();
    const SECRET: &str = "wasm-secret-7c41";
    let seen = upstream::SeenLog::default();
    let pki = upstream::test_pki();
    let https = upstream::start_https_upstream(seen.clone(), &pki).await;
    let dir = common::scratch_dir("wasm-https");
    std::fs::write(dir.join("ca.pem"), &pki.ca_pem).unwrap();
    std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
    let resolve = format!("api.test={https},other.test={https}");
    let roots = dir.join("ca.pem").display().to_string();
    let daemon = TestDaemon::start(
        "wasm-https",
        &[
            "--test-egress-resolve",
            &resolve,
            "--test-egress-roots",
            &roots,
        ],
    );
    let client = daemon.client();
    let yaml = format!(
        "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - {{name: api, host: api.test, ports: [443]}}\ncredentials:\n  - name: api\n    source: {{file: {}}}\n    env: API_TOKEN\n    inject: bearer\n    endpoints: [{{host: api.test, port: 443, methods: [GET], paths: [/secure]}}]\n",
        dir.join("secret").display()
    );
    let policy = airlock_policy::Policy::from_yaml("wasm-https.yaml", &yaml)
        .unwrap()
        .document()
        .clone();
    let id = client
        .create(&CreateSandboxRequest {
            policy: Some(Box::new(policy)),
            ..template("wasm-python")
        })
        .await
        .unwrap()
        .sandbox
        .id;
    // Python: the placeholder is in the guest's environment, the secret never is; the proxy
    // intercepts the tunnel with the sandbox's CA and puts the secret in.
    let code = "import os\ntoken = os.environ['API_TOKEN']\nr = fetch('https://api.test/secure', headers={'Authorization': 'Bearer ' + token})\n[r.status, r.text(), token]";
    let answer = client
        .eval(&id, &eval(EvalLanguage::Python, code))
        .await
        .unwrap();
    assert_eq!(answer.error, None, "{answer:?}");
    let result = answer.result.unwrap();
    assert_eq!(result[0], 200, "{result}");
    assert_eq!(result[1], "hello from https /secure", "{result}");
    assert!(!result[2].as_str().unwrap().contains(SECRET), "{result}");
    let upstream_auth = seen
        .lock()
        .unwrap()
        .iter()
        .find(|s| s.target == "/secure")
        .and_then(|s| s.headers.get("authorization").cloned());
    assert_eq!(upstream_auth, Some(format!("Bearer {SECRET}")));
    // JavaScript: a host without a rule is refused at the CONNECT, by host.
    let refused = client
        .eval(
            &id,
            &eval(
                EvalLanguage::Javascript,
                "(async () => { const r = await fetch('https://other.test/x'); return [r.status, r.headers.get('x-airlock-error')]; })()",
            ),
        )
        .await
        .unwrap();
    assert_eq!(refused.error, None, "{refused:?}");
    assert_eq!(refused.result.unwrap()[0], 403);
    assert!(!seen.lock().unwrap().iter().any(|s| s.target == "/x"));
    client.delete(&id).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
