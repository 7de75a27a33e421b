use super::*;

fn file_with(json: &str) -> (PathBuf, Result<Languages, LanguagesError>) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "airlock-judge0-languages-{}-{n}.json",
        std::process::id()
    ));
    std::fs::write(&path, json).unwrap();
    let loaded = Languages::load(Some(&path));
    let _ = std::fs::remove_file(&path);
    (path, loaded)
}

fn error_of(json: &str) -> String {
    match file_with(json).1 {
        Ok(_) => panic!("accepted {json}"),
        Err(err) => {
            crate::error::ApiError::from_chain(airlock_api::v1::ErrorCode::Internal, &err).message
        }
    }
}

#[test]
fn test_defaults_list_only_what_this_host_has() {
    let table = Languages::load(None).unwrap();
    for language in table.all() {
        assert!(
            language.requires.iter().all(|p| p.exists()),
            "{} needs {:?}",
            language.name,
            language.requires
        );
    }
    // /bin/bash and /bin/cat exist on every host the suite runs on.
    assert_eq!(table.get(46).map(|l| l.name.as_str()), Some("Bash (5.0.0)"));
    assert_eq!(table.get(43).map(|l| l.name.as_str()), Some("Plain Text"));
    let names: Vec<&str> = table.active().iter().map(|l| l.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "listed by name, as Judge0 does");
}

#[test]
fn test_compile_command_substitutes_options() {
    let c = Language {
        id: 50,
        name: "C".into(),
        is_archived: false,
        source_file: Some("main.c".into()),
        compile_cmd: Some("gcc %s main.c -o 100%%".into()),
        run_cmd: Some("./a.out".into()),
        requires: Vec::new(),
    };
    assert_eq!(
        c.compile_command("-O2 -lm").as_deref(),
        Some("gcc -O2 -lm main.c -o 100%")
    );
    assert_eq!(
        c.compile_command("").as_deref(),
        Some("gcc  main.c -o 100%")
    );
}

#[test]
fn test_operator_file_adds_and_replaces_by_id() {
    let (_, loaded) = file_with(
        r#"{"languages": [
            {"id": 46, "name": "Bash (operator)", "source_file": "s.sh", "run_cmd": "/bin/bash s.sh"},
            {"id": 1000, "name": "Shell", "source_file": "s.sh", "run_cmd": "/bin/sh s.sh",
             "requires": ["/bin/sh"]},
            {"id": 43, "name": "Plain Text", "source_file": "t", "run_cmd": "/bin/cat t", "is_archived": true}
        ]}"#,
    );
    let table = loaded.unwrap();
    assert_eq!(table.get(46).unwrap().name, "Bash (operator)");
    assert_eq!(
        table.get(1000).unwrap().run_cmd.as_deref(),
        Some("/bin/sh s.sh")
    );
    assert!(table.all().iter().any(|l| l.id == 43));
    assert!(!table.active().iter().any(|l| l.id == 43), "archived");
    let (_, replaced) = file_with(
        r#"{"replace_defaults": true, "languages": [
            {"id": 7, "name": "Only", "source_file": "x", "run_cmd": "/bin/true"}]}"#,
    );
    let ids: Vec<u32> = replaced.unwrap().all().iter().map(|l| l.id).collect();
    assert_eq!(ids, vec![7]);
}

#[test]
fn test_operator_file_problems_are_named() {
    for (json, wanted) in [
        (
            r#"{"languages": [{"id": 1, "name": "x"}]}"#,
            "language 1: source_file is required",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "../a", "run_cmd": "a"}]}"#,
            "must be a plain file name",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "a"}]}"#,
            "language 1: run_cmd is required",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "a", "run_cmd": "a", "compile_cmd": "cc %d a"}]}"#,
            "compile_cmd takes only `%s`",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "a", "run_cmd": "a", "requires": ["/nonexistent/cc"]}]}"#,
            "requires /nonexistent/cc, which is not an executable file",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "a", "run_cmd": "a", "requires": ["cc"]}]}"#,
            "paths must be absolute",
        ),
        (
            r#"{"languages": [{"id": 0, "name": "x", "source_file": "a", "run_cmd": "a"}]}"#,
            "id must be between 1 and 2147483647",
        ),
        (
            r#"{"languages": [{"id": 2, "name": "x", "source_file": "a", "run_cmd": "a"},
                              {"id": 2, "name": "y", "source_file": "a", "run_cmd": "a"}]}"#,
            "language 2: listed twice",
        ),
        (
            r#"{"languages": [{"id": 1, "name": "x", "source_file": "a", "run_cmd": "a", "run": "b"}]}"#,
            "unknown field `run`",
        ),
        (r#"{"language": []}"#, "unknown field `language`"),
        (r#"{"languages": [}"#, "is not a valid language file"),
    ] {
        let message = error_of(json);
        assert!(message.contains(wanted), "{json}: {message}");
        assert!(message.starts_with("--judge0-languages: "), "{message}");
    }
}
