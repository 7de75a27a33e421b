use super::*;

#[test]
fn test_repo_urls_are_normalized_or_refused_with_the_reason() {
    let url = RepoUrl::parse("https://GitHub.com/acme/widgets.git/").unwrap();
    assert_eq!(url.url, "https://github.com/acme/widgets.git");
    assert_eq!(
        (url.host.as_str(), url.port, url.tls),
        ("github.com", 443, true)
    );
    assert_eq!(url.path, "/acme/widgets.git");
    assert_eq!(
        url.endpoints(),
        [
            "/acme/widgets.git/info/refs",
            "/acme/widgets.git/git-upload-pack",
            "/acme/widgets.git/git-receive-pack"
        ]
    );
    assert_eq!(
        url.owner_repo(),
        Some(("acme".to_owned(), "widgets".to_owned()))
    );
    let local = RepoUrl::parse("http://git.test:8080/a/b").unwrap();
    assert_eq!(
        (local.url.as_str(), local.port),
        ("http://git.test:8080/a/b", 8080)
    );
    assert_eq!(
        RepoUrl::parse("http://git.test:80/a").unwrap().url,
        "http://git.test/a"
    );
    assert_eq!(
        RepoUrl::parse("http://git.test/a/b/c")
            .unwrap()
            .owner_repo(),
        None
    );
    for (bad, why) in [
        ("git@github.com:acme/w.git", "https://"),
        ("ssh://github.com/acme/w.git", "https://"),
        ("file:///srv/repo", "https://"),
        ("ext::sh -c id", "https://"),
        ("https://github.com", "no path"),
        ("https://github.com/", "plain segments"),
        ("https://user:token@github.com/a/b", "credentials"),
        ("https://github.com/a/../b", "plain segments"),
        ("https://github.com/a/b?x=1", "plain segments"),
        ("https://github.com/a/b%2f", "plain segments"),
        ("https://github.com/a/*", "plain segments"),
        ("https://github.com:0/a", "port"),
        ("https://github.com:99999/a", "port"),
        ("https:///a", "host"),
    ] {
        let error = RepoUrl::parse(bad).unwrap_err().to_string();
        assert!(error.contains(why), "{bad}: {error}");
    }
}

#[test]
fn test_url_and_ref_split_at_the_last_at_after_the_host() {
    assert_eq!(
        split_url_ref("https://h.test/a/b.git@v1.2"),
        ("https://h.test/a/b.git", Some("v1.2"))
    );
    assert_eq!(
        split_url_ref("https://h.test/a/b.git"),
        ("https://h.test/a/b.git", None)
    );
    // An `@` in the authority is not a ref (and the URL is refused later, for its credentials).
    assert_eq!(
        split_url_ref("https://u@h.test/a"),
        ("https://u@h.test/a", None)
    );
    assert_eq!(
        split_url_ref("https://u@h.test/a@main"),
        ("https://u@h.test/a", Some("main"))
    );
}

#[test]
fn test_branch_and_ref_names_follow_git() {
    for good in ["main", "agent/1", "feature-x_y.2", "airlock/sbx0123"] {
        check_branch(good).unwrap();
        check_ref(good).unwrap();
    }
    check_ref("0123abcd").unwrap();
    for bad in [
        "",
        "-f",
        "--upload-pack=x",
        "a..b",
        "a b",
        "a:b",
        "a^",
        "a~1",
        "a?",
        "a*",
        "a[",
        "a\\b",
        ".hidden",
        "a/.b",
        "a/",
        "/a",
        "a.lock",
        "a//b",
        "a@{1}",
        "@",
        "a.",
        "a\nb",
    ] {
        assert!(check_branch(bad).is_err(), "{bad:?}");
        assert!(check_ref(bad).is_err(), "{bad:?}");
    }
    assert!(check_branch("HEAD").is_err());
}

#[test]
fn test_grant_repository_adds_the_rule_and_credential_as_a_valid_policy() {
    let repo = RepoUrl::parse("https://git.test/acme/app.git").unwrap();
    let mut doc = PolicyDocument {
        version: 1,
        ..PolicyDocument::default()
    };
    let credential = GitCredential {
        source: CredentialSourceSpec::Env("FORGE_TOKEN".into()),
        username: DEFAULT_USERNAME.into(),
    };
    grant_repository(&mut doc, &repo, "agent-1", Some(&credential)).unwrap();
    let policy = airlock_policy::Policy::from_document(&doc).unwrap();
    let plan = airlock_policy::egress_plan(&policy);
    assert_eq!(plan.mode, airlock_policy::egress::NetworkMode::Proxy);
    let rule = &plan.rules[0];
    assert_eq!(rule.name, ACCESS_NAME);
    assert_eq!(rule.ports, [443]);
    assert_eq!(
        rule.git_push_refs.as_deref(),
        Some(&["refs/heads/agent-1".to_owned()][..])
    );
    let credential = &plan.credentials[0];
    assert_eq!(credential.env, PLACEHOLDER_ENV);
    assert_eq!(credential.endpoints[0].http.paths, repo.endpoints());

    // Twice is refused (the names are reserved), and so is a policy with the full network.
    assert_eq!(
        grant_repository(&mut doc, &repo, "agent-1", None),
        Err(GitError::NameTaken)
    );
    let mut full = PolicyDocument {
        version: 1,
        ..PolicyDocument::default()
    };
    full.network.mode = Some(NetworkMode::Full);
    assert_eq!(
        grant_repository(&mut full, &repo, "agent-1", None),
        Err(GitError::FullNetwork)
    );
    assert_eq!(
        grant_repository(&mut PolicyDocument::default(), &repo, "a..b", None),
        Err(GitError::BadBranch("a..b".into()))
    );
}

#[test]
fn test_basic_header_carries_the_placeholder() {
    // base64("x-access-token:ph") = eC1hY2Nlc3MtdG9rZW46cGg=
    assert_eq!(
        basic_header("x-access-token", "ph"),
        "Basic eC1hY2Nlc3MtdG9rZW46cGg="
    );
}
