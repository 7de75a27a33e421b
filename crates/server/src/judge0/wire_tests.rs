use serde_json::json;

use super::*;
use crate::judge0::callback::CallbackPolicy;
use crate::judge0::config::LIMITS;
use crate::judge0::languages::{Language, Languages, MULTI_FILE_PROGRAM};

fn language(id: u32, name: &str, compile: Option<&str>, archived: bool) -> Language {
    Language {
        id,
        name: name.into(),
        is_archived: archived,
        source_file: Some("main".into()),
        compile_cmd: compile.map(str::to_owned),
        run_cmd: Some("./main".into()),
        requires: Vec::new(),
    }
}

pub(crate) fn config() -> Judge0Config {
    let mut project = language(89, MULTI_FILE_PROGRAM, None, false);
    project.source_file = None;
    project.run_cmd = None;
    Judge0Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 1,
        max_queue: 10,
        limits: LIMITS,
        languages: Languages::of(vec![
            language(71, "Python (3.8.1)", None, false),
            language(50, "C (GCC 9.2.0)", Some("gcc %s main.c"), false),
            language(1, "Old", None, true),
            project,
        ]),
        callbacks: CallbackPolicy::new(&["hooks.example.com".to_owned()], false).unwrap(),
        network_policy: None,
        additional_files: true,
        retention_ms: 1000,
    }
}

fn errors(body: serde_json::Value) -> FieldErrors {
    parse_submission(&body, false, &config()).unwrap_err()
}

fn messages(errors: &FieldErrors, key: &str) -> Vec<String> {
    errors.get(key).cloned().unwrap_or_default()
}

#[test]
fn test_parse_fills_judge0_defaults() {
    let parsed = parse_submission(
        &json!({"source_code": "print(1)", "language_id": 71}),
        false,
        &config(),
    )
    .unwrap();
    let p = &parsed.params;
    assert_eq!(p.language_id, 71);
    assert_eq!(
        (p.cpu_time_limit, p.cpu_extra_time, p.wall_time_limit),
        (5.0, 1.0, 10.0)
    );
    assert_eq!((p.memory_limit, p.stack_limit), (128_000, 64_000));
    assert_eq!(
        (
            p.max_processes_and_or_threads,
            p.max_file_size,
            p.number_of_runs
        ),
        (60, 1024, 1)
    );
    assert!(!p.enable_network && !p.redirect_stderr_to_stdout);
    assert_eq!(parsed.texts.source_code.as_deref(), Some(&b"print(1)"[..]));
    assert_eq!(parsed.texts.stdin, None);
}

#[test]
fn test_parse_casts_values_as_rails_does() {
    let parsed = parse_submission(
        &json!({
            "source_code": "cHJpbnQoMSk=\n", "language_id": "71", "memory_limit": 64000.0,
            "cpu_time_limit": "2.5", "redirect_stderr_to_stdout": "true", "stdin": "",
            "expected_output": null, "enable_network": false, "max_file_size": 10.9,
        }),
        true,
        &config(),
    )
    .unwrap();
    assert_eq!(parsed.texts.source_code.as_deref(), Some(&b"print(1)"[..]));
    assert_eq!(parsed.texts.stdin, None, "empty is absent");
    assert_eq!(parsed.params.memory_limit, 64_000);
    assert_eq!(parsed.params.cpu_time_limit, 2.5);
    assert_eq!(parsed.params.max_file_size, 10, "truncated");
    assert!(parsed.params.redirect_stderr_to_stdout);
}

#[test]
fn test_parse_reports_judge0_validation_messages() {
    let e = errors(json!({}));
    assert_eq!(messages(&e, "language_id"), ["can't be blank"]);
    assert_eq!(messages(&e, "source_code"), ["can't be blank"]);
    let e = errors(json!({"source_code": "  \n", "language_id": 150000}));
    assert_eq!(messages(&e, "source_code"), ["can't be blank"]);
    assert_eq!(
        messages(&e, "language_id"),
        ["language with id 150000 doesn't exist"]
    );
    let e = errors(json!({"source_code": "x", "language_id": 1}));
    assert_eq!(
        messages(&e, "language_id"),
        ["language with id 1 is archived and cannot be used anymore"]
    );
    let e = errors(json!({
        "source_code": "x", "language_id": 71, "wall_time_limit": 21, "cpu_time_limit": -1,
        "memory_limit": 1024, "number_of_runs": 0, "max_processes_and_or_threads": 121,
        "cpu_extra_time": 6, "stack_limit": 128001, "max_file_size": 4097,
    }));
    assert_eq!(
        messages(&e, "wall_time_limit"),
        ["must be less than or equal to 20.0"]
    );
    assert_eq!(
        messages(&e, "cpu_time_limit"),
        ["must be greater than or equal to 0"]
    );
    assert_eq!(
        messages(&e, "memory_limit"),
        ["must be greater than or equal to 2048"]
    );
    assert_eq!(messages(&e, "number_of_runs"), ["must be greater than 0"]);
    assert_eq!(
        messages(&e, "max_processes_and_or_threads"),
        ["must be less than or equal to 120"]
    );
    assert_eq!(
        messages(&e, "cpu_extra_time"),
        ["must be less than or equal to 5.0"]
    );
    assert_eq!(
        messages(&e, "stack_limit"),
        ["must be less than or equal to 128000"]
    );
    assert_eq!(
        messages(&e, "max_file_size"),
        ["must be less than or equal to 4096"]
    );
    let e = errors(json!({"source_code": "x", "language_id": 71, "memory_limit": -5}));
    assert_eq!(
        messages(&e, "memory_limit"),
        ["must be greater than or equal to 2048"]
    );
}

#[test]
fn test_parse_refuses_what_this_server_does_not_allow() {
    let e = errors(json!({
        "source_code": "x", "language_id": 71, "compiler_options": "-O2",
        "enable_per_process_and_thread_time_limit": true, "enable_network": true,
        "callback_url": "http://169.254.169.254/latest/meta-data",
        "command_line_arguments": "a".repeat(513),
    }));
    assert_eq!(
        messages(&e, "compiler_options"),
        ["setting compiler options is only allowed for compiled languages"]
    );
    assert_eq!(
        messages(&e, "enable_per_process_and_thread_time_limit"),
        ["this option cannot be enabled"]
    );
    assert_eq!(
        messages(&e, "enable_network"),
        ["enabling network is not allowed"]
    );
    assert!(messages(&e, "callback_url")[0].contains("not on this server's callback allow-list"));
    assert_eq!(
        messages(&e, "command_line_arguments"),
        ["is too long (maximum is 512 characters)"]
    );
    // A compiled language takes options; an allow-listed host takes callbacks.
    let ok = parse_submission(
        &json!({"source_code": "x", "language_id": 50, "compiler_options": "-O2",
                "callback_url": "https://hooks.example.com/j"}),
        false,
        &config(),
    )
    .unwrap();
    assert_eq!(ok.params.compiler_options.as_deref(), Some("-O2"));
}

#[test]
fn test_parse_rejects_unknown_attributes_and_wrong_types_by_name() {
    let e = errors(json!({
        "source_code": "x", "language_id": 71, "cpu_timelimit": 1, "memory_limit": "lots",
        "stdin": 5, "redirect_stderr_to_stdout": "maybe",
    }));
    assert_eq!(
        messages(&e, "cpu_timelimit"),
        ["is not a submission attribute"]
    );
    assert_eq!(messages(&e, "memory_limit"), ["is not a number"]);
    assert_eq!(messages(&e, "stdin"), ["must be a string"]);
    assert_eq!(
        messages(&e, "redirect_stderr_to_stdout"),
        ["must be true or false"]
    );
    let e = parse_submission(
        &json!({"source_code": "%%%", "language_id": 71}),
        true,
        &config(),
    )
    .unwrap_err();
    assert!(messages(&e, "source_code")[0].starts_with("is not valid base64"));
    assert_eq!(
        parse_submission(&json!([1]), false, &config()).unwrap_err(),
        FieldErrors::from([(
            "submission".to_owned(),
            vec!["must be a JSON object".to_owned()]
        )])
    );
}

#[test]
fn test_parse_multi_file_program_needs_files_not_source() {
    let e = errors(json!({"source_code": "x", "language_id": 89}));
    assert_eq!(messages(&e, "source_code"), ["must be blank"]);
    assert_eq!(messages(&e, "additional_files"), ["can't be blank"]);
    let ok = parse_submission(
        &json!({"language_id": 89, "additional_files": "UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA=="}),
        false,
        &config(),
    )
    .unwrap();
    assert_eq!(ok.texts.additional_files.map(|z| z.len()), Some(22));
}
