//! Repository workspaces end to end, with real git: a smart-HTTP server on loopback
//! (`git http-backend` behind HTTPS and a token, `airlock_server::testing::GitServer`) and a
//! fake GitHub-compatible forge. The daemon clones through the sandbox's egress proxy, the
//! sandbox's git fetches and pushes through it with a placeholder, the upstream sees the real
//! token, and the token is nowhere inside (checked from inside, with grep). Pushes to another
//! branch or repository are refused by the proxy and audited; pull requests get the right
//! head and base; a second sandbox comes from the cache, on its own branch, with objects of
//! its own. Needs root and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;
#[allow(
    unused_imports,
    dead_code,
    reason = "this test uses the test PKI alone"
)]
#[path = "common/upstream.rs"]
mod upstream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use airlock_api::v1::{
    CreateSandboxRequest, ErrorCode, ExecRequest, GitWorkspace, PullRequestRequest, Workspace,
};
use airlock_server::client::{Client, ClientError};
use airlock_server::testing::{FakeForge, GitServer};
use common::TestDaemon;

const TOKEN: &str = "forge-token-3c9e5a17b2d84f60";
const URL: &str = "https://git.test/acme/app.git";

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=upstream",
            "-c",
            "user.email=u@test",
            "-c",
            "init.defaultBranch=main",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The forge's world: `root/acme/app.git` (main and develop), served over HTTPS with `TOKEN`,
/// and the forge API over it.
struct World {
    dir: PathBuf,
    root: PathBuf,
    tls: Arc<rustls::ServerConfig>,
    server: GitServer,
    forge: FakeForge,
    flags: Vec<String>,
}

impl World {
    async fn start(tag: &str) -> World {
        let dir = common::scratch_dir(&format!("git-{tag}"));
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "-q"]);
        std::fs::write(work.join("README"), "the app\n").unwrap();
        std::fs::create_dir_all(work.join("src")).unwrap();
        std::fs::write(work.join("src/app.py"), "print('hello')\n").unwrap();
        git(&work, &["add", "."]);
        git(&work, &["commit", "-q", "-m", "first"]);
        git(&work, &["branch", "develop"]);
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("acme")).unwrap();
        git(
            &dir,
            &[
                "clone",
                "-q",
                "--bare",
                work.to_str().unwrap(),
                root.join("acme/app.git").to_str().unwrap(),
            ],
        );
        git(
            &dir,
            &[
                "clone",
                "-q",
                "--bare",
                work.to_str().unwrap(),
                root.join("acme/other.git").to_str().unwrap(),
            ],
        );
        let pki = upstream::test_pki();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pki.key_der.clone().into());
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), key)
        .unwrap();
        let tls = Arc::new(tls);
        let server = GitServer::start(&root, Some(TOKEN.to_owned()), Some(tls.clone()))
            .await
            .unwrap();
        let forge = FakeForge::start(TOKEN.to_owned(), &root).await.unwrap();
        std::fs::write(dir.join("ca.pem"), &pki.ca_pem).unwrap();
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
        let flags = vec![
            "--test-egress-resolve".to_owned(),
            format!("git.test={}", server.address),
            "--test-egress-roots".to_owned(),
            dir.join("ca.pem").display().to_string(),
            "--forge-api".to_owned(),
            forge.url(),
            "--forge-git-host".to_owned(),
            "git.test".to_owned(),
            "--forge-token-file".to_owned(),
            dir.join("token").display().to_string(),
        ];
        World {
            dir,
            root,
            tls,
            server,
            forge,
            flags,
        }
    }

    fn daemon(&self, tag: &str) -> TestDaemon {
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        TestDaemon::start(tag, &flags)
    }

    fn upstream(&self, args: &[&str]) -> String {
        git(&self.root.join("acme/app.git"), args)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn repository(branch: Option<&str>, reference: Option<&str>) -> CreateSandboxRequest {
    CreateSandboxRequest {
        workspace: Workspace::Git {
            git: GitWorkspace {
                url: URL.to_owned(),
                reference: reference.map(str::to_owned),
                branch: branch.map(str::to_owned),
            },
        },
        ..CreateSandboxRequest::default()
    }
}

async fn sh(client: &Client, id: &str, command: &str) -> String {
    let request = ExecRequest {
        shell: Some(command.to_owned()),
        timeout_ms: Some(300_000),
        ..ExecRequest::default()
    };
    let output = client.exec_collect(id, &request).await.unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
    .trim()
    .to_owned()
}

const COMMIT: &str = "git -c user.name=agent -c user.email=agent@test commit -q";

fn api_code(err: ClientError) -> (ErrorCode, String) {
    match err {
        ClientError::Api { code, message, .. } => (code, message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_repository_sandbox_pushes_only_its_branch_and_opens_a_pull_request() {
    common::require_binaries();
    let world = World::start("flow").await;
    let daemon = world.daemon("git-flow");
    let client = daemon.client();
    let main = world.upstream(&["rev-parse", "main"]);
    let created = client
        .create(&repository(Some("agent-1"), None))
        .await
        .unwrap();
    let id = created.sandbox.id;
    assert_eq!(
        created
            .sandbox
            .metadata
            .get("airlock.git.url")
            .map(String::as_str),
        Some(URL)
    );
    assert_eq!(
        created
            .sandbox
            .metadata
            .get("airlock.git.branch")
            .map(String::as_str),
        Some("agent-1")
    );

    // The clone: the sandbox's own branch at main's commit, the files checked out.
    assert_eq!(
        sh(&client, &id, "cd /workspace && git branch --show-current").await,
        "agent-1"
    );
    assert_eq!(
        sh(&client, &id, "cd /workspace && git rev-parse HEAD").await,
        main
    );
    assert_eq!(
        sh(&client, &id, "cat /workspace/src/app.py").await,
        "print('hello')"
    );
    assert_eq!(
        sh(
            &client,
            &id,
            "cd /workspace && git status --porcelain | wc -l"
        )
        .await,
        "0",
        "a clean tree"
    );
    assert_eq!(
        sh(
            &client,
            &id,
            "test -e /workspace/.git/objects/info/alternates && echo shared || echo own"
        )
        .await,
        "own"
    );

    // Commit and push from inside: the upstream gets the commit, and the real token.
    let pushed = sh(
        &client,
        &id,
        &format!("cd /workspace && echo more >> README && {COMMIT} -am change && git push -q 2>&1; echo rc=$?"),
    )
    .await;
    assert!(pushed.ends_with("rc=0"), "{pushed}");
    let head = sh(&client, &id, "cd /workspace && git rev-parse HEAD").await;
    assert_eq!(world.upstream(&["rev-parse", "agent-1"]), head);
    let expected = format!(
        "Basic {}",
        base64_encode(&format!("x-access-token:{TOKEN}"))
    );
    let receive: Vec<_> = world
        .server
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("/git-receive-pack"))
        .collect();
    assert!(!receive.is_empty());
    assert!(
        receive
            .iter()
            .all(|s| s.authorization.as_deref() == Some(expected.as_str())),
        "the upstream saw the real token: {receive:?}"
    );

    // Another branch, another repository: refused by the proxy, the upstream unchanged.
    let other_branch = sh(
        &client,
        &id,
        "cd /workspace && git push origin HEAD:refs/heads/main 2>&1; echo rc=$?",
    )
    .await;
    assert!(
        !other_branch.ends_with("rc=0") && other_branch.contains("403"),
        "{other_branch}"
    );
    assert_eq!(world.upstream(&["rev-parse", "main"]), main);
    let other_repo = sh(
        &client,
        &id,
        "cd /workspace && git push https://git.test/acme/other.git HEAD:refs/heads/agent-1 2>&1; echo rc=$?",
    )
    .await;
    assert!(
        !other_repo.ends_with("rc=0") && other_repo.contains("403"),
        "{other_repo}"
    );
    assert!(
        git(
            &world.root.join("acme/other.git"),
            &["branch", "--list", "agent-1"]
        )
        .is_empty()
    );
    let events = client.events(&id, None, None).await.unwrap().events;
    let denied: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "egress" && e.outcome == "denied")
        .collect();
    assert!(
        denied
            .iter()
            .any(|e| e.code.as_deref() == Some("git_push_denied")
                && e.detail
                    .as_deref()
                    .is_some_and(|d| d.contains("refs/heads/main"))),
        "{denied:?}"
    );
    assert!(
        denied.iter().any(|e| e
            .path
            .as_deref()
            .is_some_and(|p| p.starts_with("/acme/other.git/"))),
        "{denied:?}"
    );

    // The token is nowhere inside: environment, files, git config, /proc; the placeholder is.
    // The pattern travels in halves and is searched from a file, so that no command line
    // inside holds the token itself (grep would find its own).
    let (front, back) = TOKEN.split_at(10);
    let found = sh(
        &client,
        &id,
        &format!(
            "a={front}; b={back}; printf %s \"$a$b\" > /tmp/.pattern; \
             {{ env; git -C /workspace config --list --show-origin; \
             cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; \
             grep -rsa -F -f /tmp/.pattern --exclude=.pattern /workspace /tmp /run/airlock /etc 2>/dev/null; }} \
             | grep -c -F -f /tmp/.pattern"
        ),
    )
    .await;
    assert_eq!(found, "0", "the token leaked into the sandbox");
    // The control: the same search finds what the sandbox does hold, the placeholder.
    let control = sh(
        &client,
        &id,
        "printf %s \"$AIRLOCK_GIT_TOKEN\" > /tmp/.pattern; \
         { env; git -C /workspace config --list; } | grep -c -F -f /tmp/.pattern",
    )
    .await;
    assert_eq!(
        control, "1",
        "the search finds the placeholder in the environment"
    );
    let header = sh(
        &client,
        &id,
        &format!("git -C /workspace config --get http.{URL}.extraheader"),
    )
    .await;
    let placeholder = sh(&client, &id, "printf %s \"$AIRLOCK_GIT_TOKEN\"").await;
    assert!(placeholder.starts_with("airlock-cred-"), "{placeholder}");
    assert_eq!(
        header,
        format!(
            "Authorization: Basic {}",
            base64_encode(&format!("x-access-token:{placeholder}"))
        )
    );

    // The daemon's push and pull request: the branch on the forge, the right head and base.
    sh(
        &client,
        &id,
        &format!("cd /workspace && echo again >> README && {COMMIT} -am again"),
    )
    .await;
    let head = sh(&client, &id, "cd /workspace && git rev-parse HEAD").await;
    let pull = client
        .pull_request(
            &id,
            &PullRequestRequest {
                title: "Agent work".into(),
                body: Some("Done by an agent.".into()),
                base: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (pull.head.as_str(), pull.base.as_str()),
        ("agent-1", "main")
    );
    assert_eq!(pull.push.commit, head);
    assert_eq!(world.upstream(&["rev-parse", "agent-1"]), head);
    assert!(
        pull.url
            .ends_with(&format!("/acme/app/pull/{}", pull.number)),
        "{}",
        pull.url
    );
    let calls = world.forge.seen();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].path, "/repos/acme/app/pulls");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let body: serde_json::Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(
        (body["head"].as_str(), body["base"].as_str()),
        (Some("agent-1"), Some("main"))
    );
    assert_eq!(body["title"], "Agent work");
    // An explicit base that the forge does not have: its refusal is a conflict.
    let refused = client
        .pull_request(
            &id,
            &PullRequestRequest {
                title: "again".into(),
                body: None,
                base: Some("release".into()),
            },
        )
        .await
        .unwrap_err();
    let (code, message) = api_code(refused);
    assert_eq!(code, ErrorCode::Conflict, "{message}");
    assert!(message.contains("release"), "{message}");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_sandboxes_of_one_repository_share_the_cache_not_objects() {
    common::require_binaries();
    let world = World::start("cache").await;
    let daemon = world.daemon("git-cache");
    let client = daemon.client();
    let first = client
        .create(&repository(Some("agent-1"), Some("develop")))
        .await
        .unwrap()
        .sandbox
        .id;
    // The first sandbox ruins its own copy of the objects; the cache must not care.
    let ruined = sh(
        &client,
        &first,
        "cd /workspace/.git/objects/pack && for f in *; do chmod u+w $f; : > $f; done; git -C /workspace fsck >/dev/null 2>&1 && echo intact || echo ruined",
    )
    .await;
    assert_eq!(ruined, "ruined");
    // Three more, at once, each on its own branch (one left to its default).
    let creates: Vec<_> = ["agent-2", "agent-3"]
        .iter()
        .map(|branch| {
            let client = daemon.client();
            let request = repository(Some(branch), None);
            tokio::spawn(async move { client.create(&request).await })
        })
        .collect();
    let mut ids = vec![first.clone()];
    for created in creates {
        ids.push(created.await.unwrap().unwrap().sandbox.id);
    }
    let default = client
        .create(&repository(None, None))
        .await
        .unwrap()
        .sandbox;
    let default_branch = format!("airlock/{}", default.id);
    assert_eq!(default.metadata["airlock.git.branch"], default_branch);
    ids.push(default.id.clone());

    let mut filter = BTreeMap::new();
    filter.insert("airlock.git.url".to_owned(), URL.to_owned());
    let listed = client.list(&[], &filter).await.unwrap();
    let mut branches: Vec<String> = listed
        .iter()
        .map(|s| s.metadata["airlock.git.branch"].clone())
        .collect();
    branches.sort();
    let mut expected = vec![
        "agent-1".to_owned(),
        "agent-2".to_owned(),
        "agent-3".to_owned(),
        default_branch.clone(),
    ];
    expected.sort();
    assert_eq!(branches, expected);

    for id in &ids[1..] {
        assert_eq!(
            sh(
                &client,
                id,
                "git -C /workspace fsck >/dev/null 2>&1 && echo intact"
            )
            .await,
            "intact"
        );
    }
    let mirrors: Vec<PathBuf> = std::fs::read_dir(daemon.state_dir.join("git-cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "git"))
        .collect();
    assert_eq!(mirrors.len(), 1, "one mirror for one URL: {mirrors:?}");
    git(&mirrors[0], &["fsck", "--no-progress"]);
    // The first came from a new mirror; the others from the cache.
    let mut from_cache = 0;
    for id in &ids {
        let logs = client.logs(id).await.unwrap();
        let cloned: Vec<_> = logs
            .events
            .iter()
            .filter(|e| e.kind == "git_cloned")
            .collect();
        assert_eq!(cloned.len(), 1, "{id}: {cloned:?}");
        if cloned[0].message.contains("from the cache") {
            from_cache += 1;
        } else {
            assert_eq!(
                id, &first,
                "only the first clones cold: {}",
                cloned[0].message
            );
        }
    }
    assert_eq!(from_cache, ids.len() - 1);
    // The first started from develop, the others from the default branch.
    let develop = world.upstream(&["rev-parse", "develop"]);
    let logs = client.logs(&first).await.unwrap();
    assert!(
        logs.events
            .iter()
            .any(|e| e.kind == "git_cloned" && e.message.contains(&develop)),
        "{:?}",
        logs.events
    );

    // Each pushes to its own branch only: agent-2 cannot push over agent-3's.
    let second = &ids[1];
    let own = sh(
        &client,
        second,
        &format!("cd /workspace && {COMMIT} --allow-empty -m two && git push -q 2>&1; echo rc=$?"),
    )
    .await;
    assert!(own.ends_with("rc=0"), "{own}");
    let theirs = sh(
        &client,
        second,
        "cd /workspace && git push origin HEAD:refs/heads/agent-3 2>&1; echo rc=$?",
    )
    .await;
    assert!(theirs.contains("403"), "{theirs}");
    assert!(
        git(
            &world.root.join("acme/app.git"),
            &["branch", "--list", "agent-3"]
        )
        .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_repository_requests_are_checked_with_clear_errors() {
    common::require_binaries();
    let world = World::start("errors").await;
    let daemon = world.daemon("git-errors");
    let client = daemon.client();
    let mut bad = repository(Some("agent-1"), None);
    bad.workspace = Workspace::Git {
        git: GitWorkspace {
            url: "https://user:secret@git.test/acme/app.git".into(),
            reference: None,
            branch: None,
        },
    };
    let (code, message) = api_code(client.create(&bad).await.unwrap_err());
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.contains("credentials"), "{message}");
    let (code, message) = api_code(
        client
            .create(&repository(Some("a..b"), None))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.contains("a..b"), "{message}");
    let (code, message) = api_code(
        client
            .create(&repository(Some("agent-1"), Some("no-such-branch")))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, ErrorCode::Unprocessable);
    assert!(message.contains("no-such-branch"), "{message}");
    // A repository the proxy cannot reach (no resolver entry): the clone fails, nothing stays.
    let mut unknown = repository(Some("agent-1"), None);
    unknown.workspace = Workspace::Git {
        git: GitWorkspace {
            url: "https://nowhere.test/acme/app.git".into(),
            reference: None,
            branch: None,
        },
    };
    let (code, message) = api_code(client.create(&unknown).await.unwrap_err());
    assert_eq!(code, ErrorCode::Unprocessable, "{message}");
    assert!(message.contains("nowhere.test"), "{message}");
    assert!(client.list(&[], &BTreeMap::new()).await.unwrap().is_empty());
    // Git operations on a sandbox without a repository.
    let plain = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let (code, _) = api_code(client.git_push(&plain, false).await.unwrap_err());
    assert_eq!(code, ErrorCode::Conflict);
    // A daemon without a forge (and a server that takes anonymous pushes) opens no pull
    // request, and gives its sandboxes no credential.
    let open = GitServer::start(&world.root, None, Some(world.tls.clone()))
        .await
        .unwrap();
    let bare = TestDaemon::start(
        "git-noforge",
        &[
            "--test-egress-resolve",
            &format!("git.test={}", open.address),
            "--test-egress-roots",
            world.dir.join("ca.pem").to_str().unwrap(),
        ],
    );
    let bare_client = bare.client();
    let id = bare_client
        .create(&repository(Some("agent-9"), None))
        .await
        .unwrap()
        .sandbox
        .id;
    let request = PullRequestRequest {
        title: "t".into(),
        body: None,
        base: None,
    };
    let (code, message) = api_code(bare_client.pull_request(&id, &request).await.unwrap_err());
    assert_eq!(code, ErrorCode::Unprocessable);
    assert!(message.contains("--forge-api"), "{message}");
    assert_eq!(
        sh(
            &bare_client,
            &id,
            "printf %s \"${AIRLOCK_GIT_TOKEN:-none}\""
        )
        .await,
        "none"
    );
    assert!(open.seen().iter().all(|s| s.authorization.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_repository_create_goes_cold_beside_a_warm_pool() {
    common::require_binaries();
    let world = World::start("pool").await;
    let mut flags: Vec<&str> = world.flags.iter().map(String::as_str).collect();
    flags.extend(["--warm-pool", "base=1"]);
    let daemon = TestDaemon::start("git-pool", &flags);
    let client = daemon.client();
    let filled = common::eventually(std::time::Duration::from_secs(60), || async {
        client.pool("base").await.unwrap().ready == 1
    })
    .await;
    assert!(filled, "{:?}", client.pool("base").await.unwrap());
    let members = |client: Client| async move {
        client
            .list_including(&[], &BTreeMap::new(), true)
            .await
            .unwrap()
            .into_iter()
            .filter(|sandbox| sandbox.pool)
            .map(|sandbox| sandbox.id)
            .collect::<Vec<_>>()
    };
    let waiting = members(daemon.client()).await;

    // A member has an empty workspace and no repository access: the repository's create is
    // cold, and gets its clone.
    let created = client
        .create(&repository(Some("agent-pool"), None))
        .await
        .unwrap()
        .sandbox;
    assert!(!waiting.contains(&created.id), "a pool member served it");
    assert_eq!(
        sh(
            &client,
            &created.id,
            "cd /workspace && git branch --show-current && cat src/app.py"
        )
        .await,
        "agent-pool\nprint('hello')"
    );
    assert_eq!(client.pool("base").await.unwrap().claims_total, 0);

    // The pool does serve a create it can (so the one above was its choice, not its absence).
    let plain = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox;
    assert!(waiting.contains(&plain.id), "{waiting:?} {}", plain.id);
    assert_eq!(client.pool("base").await.unwrap().claims_total, 1);
}
