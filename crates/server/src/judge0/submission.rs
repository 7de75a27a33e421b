//! A submission as the daemon keeps it, and its rendering as Judge0 answers: the attributes a
//! `fields` list selects, texts in base64 (Ruby's `encode64`) or UTF-8, SQL decimals as
//! strings, times as `2024-04-18T10:00:00.123Z`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::encoding::{decimal, ruby_encode64};
use super::status::Status;
use crate::e2b::time::format_ms;

/// What a submission asked for, with Judge0's defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub language_id: u32,
    pub compiler_options: Option<String>,
    pub command_line_arguments: Option<String>,
    pub number_of_runs: u64,
    /// Seconds.
    pub cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub wall_time_limit: f64,
    /// KB.
    pub memory_limit: u64,
    pub stack_limit: u64,
    pub max_processes_and_or_threads: u64,
    pub enable_per_process_and_thread_time_limit: bool,
    pub enable_per_process_and_thread_memory_limit: bool,
    /// KB.
    pub max_file_size: u64,
    pub redirect_stderr_to_stdout: bool,
    pub callback_url: Option<String>,
    pub enable_network: bool,
}

/// What running a submission gave (besides its texts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// CPU seconds (the average over runs).
    pub time: Option<f64>,
    pub wall_time: Option<f64>,
    /// Peak memory, KB (the average over runs).
    pub memory: Option<u64>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub message: Option<String>,
}

/// The byte attributes. Judge0 stores an empty text as `null`; so does this.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Texts {
    pub source_code: Option<Vec<u8>>,
    pub stdin: Option<Vec<u8>>,
    pub expected_output: Option<Vec<u8>>,
    /// A zip archive.
    pub additional_files: Option<Vec<u8>>,
    pub stdout: Option<Vec<u8>>,
    pub stderr: Option<Vec<u8>>,
    pub compile_output: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub token: String,
    pub status: Status,
    pub params: Params,
    pub texts: Texts,
    pub outcome: Outcome,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
}

/// Every attribute `fields=*` returns: the submission's columns, `status` and `language`.
pub const ALL_FIELDS: [&str; 35] = [
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "stdout",
    "status_id",
    "created_at",
    "finished_at",
    "time",
    "memory",
    "stderr",
    "token",
    "number_of_runs",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "compile_output",
    "exit_code",
    "exit_signal",
    "message",
    "wall_time",
    "compiler_options",
    "command_line_arguments",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
    "status",
    "language",
];

/// What an answer carries without `fields`.
pub const DEFAULT_FIELDS: [&str; 8] = [
    "token",
    "time",
    "memory",
    "stdout",
    "stderr",
    "compile_output",
    "message",
    "status",
];

/// A `fields` selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields(BTreeSet<&'static str>);

impl Fields {
    /// Judge0's rule: comma-separated names, `*` for all; unknown names are an error (400
    /// `invalid fields: [a, b]`); none left means the default fields.
    pub fn parse(requested: Option<&str>) -> Result<Fields, String> {
        let mut chosen = BTreeSet::new();
        let mut invalid = Vec::new();
        let mut all = false;
        for name in requested.unwrap_or("").split(',').filter(|n| !n.is_empty()) {
            if name == "*" {
                all = true;
            } else if let Some(known) = ALL_FIELDS.iter().find(|f| **f == name) {
                chosen.insert(*known);
            } else {
                invalid.push(name.to_owned());
            }
        }
        if !invalid.is_empty() {
            return Err(format!("invalid fields: [{}]", invalid.join(", ")));
        }
        if all {
            return Ok(Fields(ALL_FIELDS.into_iter().collect()));
        }
        if chosen.is_empty() {
            return Ok(Fields::defaults());
        }
        Ok(Fields(chosen))
    }

    pub fn defaults() -> Fields {
        Fields(DEFAULT_FIELDS.into_iter().collect())
    }

    pub fn token_only() -> Fields {
        Fields(["token"].into_iter().collect())
    }
}

/// The answer's texts are not UTF-8 and `base64_encoded` was not asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUtf8;

pub const NOT_UTF8: &str = "some attributes for this submission cannot be converted to UTF-8, use base64_encoded=true query parameter";

impl Submission {
    /// The JSON Judge0 answers with for `fields`; `language_name` is the language's name.
    pub fn render(
        &self,
        fields: &Fields,
        base64: bool,
        language_name: Option<&str>,
    ) -> Result<Value, NotUtf8> {
        let text = |bytes: &Option<Vec<u8>>| -> Result<Value, NotUtf8> {
            match bytes {
                None => Ok(Value::Null),
                Some(bytes) if base64 => Ok(Value::String(ruby_encode64(bytes))),
                Some(bytes) => std::str::from_utf8(bytes)
                    .map(|s| Value::String(s.to_owned()))
                    .map_err(|_| NotUtf8),
            }
        };
        let p = &self.params;
        let o = &self.outcome;
        let t = &self.texts;
        let mut out = Map::new();
        for field in &fields.0 {
            let value = match *field {
                "source_code" => text(&t.source_code)?,
                "language_id" => json!(p.language_id),
                "stdin" => text(&t.stdin)?,
                "expected_output" => text(&t.expected_output)?,
                "stdout" => text(&t.stdout)?,
                "status_id" => json!(self.status.id()),
                "created_at" => json!(format_ms(self.created_ms)),
                "finished_at" => json!(self.finished_ms.map(format_ms)),
                "time" => json!(o.time.map(decimal)),
                "memory" => json!(o.memory),
                "stderr" => text(&t.stderr)?,
                "token" => json!(self.token),
                "number_of_runs" => json!(p.number_of_runs),
                "cpu_time_limit" => json!(decimal(p.cpu_time_limit)),
                "cpu_extra_time" => json!(decimal(p.cpu_extra_time)),
                "wall_time_limit" => json!(decimal(p.wall_time_limit)),
                "memory_limit" => json!(p.memory_limit),
                "stack_limit" => json!(p.stack_limit),
                "max_processes_and_or_threads" => json!(p.max_processes_and_or_threads),
                "enable_per_process_and_thread_time_limit" => {
                    json!(p.enable_per_process_and_thread_time_limit)
                }
                "enable_per_process_and_thread_memory_limit" => {
                    json!(p.enable_per_process_and_thread_memory_limit)
                }
                "max_file_size" => json!(p.max_file_size),
                "compile_output" => text(&t.compile_output)?,
                "exit_code" => json!(o.exit_code),
                "exit_signal" => json!(o.exit_signal),
                "message" => {
                    let message = o.message.as_ref().map(|m| m.as_bytes().to_vec());
                    text(&message)?
                }
                "wall_time" => json!(o.wall_time.map(decimal)),
                "compiler_options" => json!(p.compiler_options),
                "command_line_arguments" => json!(p.command_line_arguments),
                "redirect_stderr_to_stdout" => json!(p.redirect_stderr_to_stdout),
                "callback_url" => json!(p.callback_url),
                // Always base64, whatever the query says (Judge0's serializer).
                "additional_files" => json!(t.additional_files.as_deref().map(ruby_encode64)),
                "enable_network" => json!(p.enable_network),
                "status" => json!(self.status.view()),
                "language" => json!({"id": p.language_id, "name": language_name}),
                _ => continue,
            };
            out.insert((*field).to_owned(), value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Submission {
        Submission {
            token: "5c2f0e0b-6e55-4b5e-9a86-3f0c2bb0d8a1".into(),
            status: Status::Accepted,
            params: Params {
                language_id: 71,
                compiler_options: None,
                command_line_arguments: None,
                number_of_runs: 1,
                cpu_time_limit: 5.0,
                cpu_extra_time: 1.0,
                wall_time_limit: 10.0,
                memory_limit: 128_000,
                stack_limit: 64_000,
                max_processes_and_or_threads: 60,
                enable_per_process_and_thread_time_limit: false,
                enable_per_process_and_thread_memory_limit: false,
                max_file_size: 1024,
                redirect_stderr_to_stdout: false,
                callback_url: None,
                enable_network: false,
            },
            texts: Texts {
                source_code: Some(b"print(1)".to_vec()),
                stdout: Some(b"1\n".to_vec()),
                ..Texts::default()
            },
            outcome: Outcome {
                time: Some(0.012),
                wall_time: Some(0.05),
                memory: Some(7000),
                exit_code: Some(0),
                exit_signal: None,
                message: None,
            },
            created_ms: 1_713_434_400_123,
            finished_ms: Some(1_713_434_401_000),
        }
    }

    #[test]
    fn test_default_fields_render_as_judge0() {
        let value = sample().render(&Fields::defaults(), false, None).unwrap();
        assert_eq!(
            value,
            json!({
                "token": "5c2f0e0b-6e55-4b5e-9a86-3f0c2bb0d8a1",
                "time": "0.012",
                "memory": 7000,
                "stdout": "1\n",
                "stderr": null,
                "compile_output": null,
                "message": null,
                "status": {"id": 3, "description": "Accepted"},
            })
        );
    }

    #[test]
    fn test_all_fields_render_types_and_base64() {
        let mut submission = sample();
        submission.outcome.message = Some("Exited with error status 1".into());
        submission.texts.stdout = Some(vec![0xff, 0xfe]);
        let value = submission
            .render(
                &Fields::parse(Some("*")).unwrap(),
                true,
                Some("Python (3.8.1)"),
            )
            .unwrap();
        let object = value.as_object().unwrap();
        assert_eq!(object.len(), ALL_FIELDS.len());
        assert_eq!(value["stdout"], json!("//4=\n"));
        assert_eq!(value["source_code"], json!("cHJpbnQoMSk=\n"));
        assert_eq!(
            value["message"],
            json!("RXhpdGVkIHdpdGggZXJyb3Igc3RhdHVzIDE=\n")
        );
        assert_eq!(value["cpu_time_limit"], json!("5.0"));
        assert_eq!(value["wall_time"], json!("0.05"));
        assert_eq!(value["created_at"], json!("2024-04-18T10:00:00.123Z"));
        assert_eq!(value["finished_at"], json!("2024-04-18T10:00:01.000Z"));
        assert_eq!(
            value["language"],
            json!({"id": 71, "name": "Python (3.8.1)"})
        );
        assert_eq!(value["status_id"], json!(3));
        assert_eq!(value["exit_signal"], json!(null));
        // Without base64, bytes that are not UTF-8 cannot be answered.
        assert_eq!(
            submission.render(&Fields::defaults(), false, None),
            Err(NotUtf8)
        );
    }

    #[test]
    fn test_fields_parse_like_judge0() {
        assert_eq!(Fields::parse(None).unwrap(), Fields::defaults());
        assert_eq!(Fields::parse(Some("")).unwrap(), Fields::defaults());
        let chosen = Fields::parse(Some("stdout,status_id")).unwrap();
        assert_eq!(chosen.0.len(), 2);
        assert_eq!(
            Fields::parse(Some("stdout,nope,x")).unwrap_err(),
            "invalid fields: [nope, x]"
        );
    }
}
