//! A create request's body, read and checked as Judge0 does, with Judge0's error shape:
//! `422 {"attribute": ["message", ...]}` and Rails' messages.
//!
//! Values are read as Rails casts them: numbers from JSON numbers or numeric strings (the
//! Python SDK sends `memory_limit` as a float), booleans from `true`/`false` or `"true"`,
//! `"false"`, `1`, `0`, and `null` as absent (the default). Unlike Judge0, which drops
//! attributes it does not know, an unknown attribute is an error naming it: a misspelt limit
//! would otherwise be silently replaced by its default. The official SDK sends only known
//! attributes.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::config::{Judge0Config, Limits};
use super::encoding::decode_base64;
use super::submission::{Params, Texts};

/// Judge0's validation errors: attribute → messages.
pub type FieldErrors = BTreeMap<String, Vec<String>>;

/// A request that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSubmission {
    pub params: Params,
    pub texts: Texts,
}

/// The attributes a create request may carry (Judge0's permitted parameters).
const ATTRIBUTES: [&str; 20] = [
    "source_code",
    "language_id",
    "compiler_options",
    "command_line_arguments",
    "number_of_runs",
    "stdin",
    "expected_output",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
];

/// Reads one submission. `base64` is the `base64_encoded` query parameter: it applies to
/// `source_code`, `stdin` and `expected_output`; `additional_files` is always base64.
pub fn parse_submission(
    body: &Value,
    base64: bool,
    config: &Judge0Config,
) -> Result<NewSubmission, FieldErrors> {
    let Some(object) = body.as_object() else {
        return Err(one("submission", "must be a JSON object"));
    };
    let mut reader = Reader {
        object,
        errors: FieldErrors::new(),
    };
    for key in object.keys() {
        if !ATTRIBUTES.contains(&key.as_str()) {
            reader.error(key, "is not a submission attribute");
        }
    }
    let limits = &config.limits;
    let texts = Texts {
        source_code: reader.text("source_code", base64),
        stdin: reader.text("stdin", base64),
        expected_output: reader.text("expected_output", base64),
        additional_files: reader.text("additional_files", true),
        ..Texts::default()
    };
    let language_id = reader.number("language_id");
    let params = Params {
        language_id: 0,
        compiler_options: reader.string("compiler_options"),
        command_line_arguments: reader.string("command_line_arguments"),
        number_of_runs: reader.whole("number_of_runs", limits.number_of_runs),
        cpu_time_limit: reader.float("cpu_time_limit", limits.cpu_time_limit),
        cpu_extra_time: reader.float("cpu_extra_time", limits.cpu_extra_time),
        wall_time_limit: reader.float("wall_time_limit", limits.wall_time_limit),
        memory_limit: reader.whole("memory_limit", limits.memory_limit),
        stack_limit: reader.whole("stack_limit", limits.stack_limit),
        max_processes_and_or_threads: reader.whole(
            "max_processes_and_or_threads",
            limits.max_processes_and_or_threads,
        ),
        enable_per_process_and_thread_time_limit: reader
            .flag("enable_per_process_and_thread_time_limit"),
        enable_per_process_and_thread_memory_limit: reader
            .flag("enable_per_process_and_thread_memory_limit"),
        max_file_size: reader.whole("max_file_size", limits.max_file_size),
        redirect_stderr_to_stdout: reader.flag("redirect_stderr_to_stdout"),
        callback_url: reader.string("callback_url"),
        enable_network: reader.flag("enable_network"),
    };
    let mut submission = NewSubmission { params, texts };
    check(&mut reader, &mut submission, language_id, config);
    if reader.errors.is_empty() {
        Ok(submission)
    } else {
        Err(reader.errors)
    }
}

fn one(attribute: &str, message: &str) -> FieldErrors {
    FieldErrors::from([(attribute.to_owned(), vec![message.to_owned()])])
}

struct Reader<'a> {
    object: &'a Map<String, Value>,
    errors: FieldErrors,
}

impl Reader<'_> {
    fn error(&mut self, attribute: &str, message: impl Into<String>) {
        self.errors
            .entry(attribute.to_owned())
            .or_default()
            .push(message.into());
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    fn string(&mut self, key: &str) -> Option<String> {
        match self.value(key)? {
            Value::String(text) => Some(text.clone()),
            _ => {
                self.error(key, "must be a string");
                None
            }
        }
    }

    /// A text attribute as bytes; an empty one is absent, as Judge0 stores it.
    fn text(&mut self, key: &str, base64: bool) -> Option<Vec<u8>> {
        let text = self.string(key)?;
        let bytes = if base64 {
            match decode_base64(&text) {
                Ok(bytes) => bytes,
                Err(err) => {
                    self.error(key, err.to_string());
                    return None;
                }
            }
        } else {
            text.into_bytes()
        };
        (!bytes.is_empty()).then_some(bytes)
    }

    /// A number as Rails' numericality check reads it; `None` when absent or blank.
    fn number(&mut self, key: &str) -> Option<f64> {
        let parsed = match self.value(key)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) if s.trim().is_empty() => return None,
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        match parsed.filter(|n| n.is_finite()) {
            Some(n) => Some(n),
            None => {
                self.error(key, "is not a number");
                None
            }
        }
    }

    fn float(&mut self, key: &str, default: f64) -> f64 {
        self.number(key).unwrap_or(default)
    }

    /// An integer column: Rails truncates what it stores (a checked bound comes first). A
    /// negative value gets the attribute's lower bound's message here.
    fn whole(&mut self, key: &str, default: u64) -> u64 {
        match self.number(key) {
            None => default,
            Some(n) if n < 0.0 => {
                let low = match key {
                    "number_of_runs" | "max_processes_and_or_threads" => "than 0",
                    "memory_limit" => "than or equal to 2048",
                    _ => "than or equal to 0",
                };
                self.error(key, format!("must be greater {low}"));
                default
            }
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "Rails' integer cast truncates; the value is non-negative and bounded below"
            )]
            Some(n) => n.min(u64::MAX as f64) as u64,
        }
    }

    fn flag(&mut self, key: &str) -> bool {
        match self.value(key) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if s == "true" || s == "1" => true,
            Some(Value::String(s)) if s == "false" || s == "0" || s.is_empty() => false,
            Some(Value::Number(n)) if n.as_u64() == Some(1) => true,
            Some(Value::Number(n)) if n.as_u64() == Some(0) => false,
            Some(_) => {
                self.error(key, "must be true or false");
                false
            }
        }
    }
}

/// Judge0's validations (`Submission` model), in its words.
fn check(
    reader: &mut Reader<'_>,
    submission: &mut NewSubmission,
    language_id: Option<f64>,
    config: &Judge0Config,
) {
    let p = &mut submission.params;
    let limits: &Limits = &config.limits;
    let language = match language_id {
        None if !reader.errors.contains_key("language_id") => {
            reader.error("language_id", "can't be blank");
            None
        }
        None => None,
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a language id is an integer column; out-of-range values match no language"
        )]
        Some(id) => {
            let id = if (0.0..=f64::from(u32::MAX)).contains(&id) {
                id as u32
            } else {
                0
            };
            p.language_id = id;
            match config.languages.get(id) {
                None => {
                    reader.error(
                        "language_id",
                        format!("language with id {id} doesn't exist"),
                    );
                    None
                }
                Some(l) if l.is_archived => {
                    reader.error(
                        "language_id",
                        format!("language with id {id} is archived and cannot be used anymore"),
                    );
                    None
                }
                Some(l) => Some(l.clone()),
            }
        }
    };
    let project = language.as_ref().is_some_and(|l| l.is_project());
    let t = &submission.texts;
    let blank = |bytes: &Option<Vec<u8>>| {
        bytes
            .as_ref()
            .is_none_or(|b| b.iter().all(u8::is_ascii_whitespace))
    };
    if project {
        if t.source_code.is_some() {
            reader.error("source_code", "must be blank");
        }
        if t.additional_files.is_none() {
            reader.error("additional_files", "can't be blank");
        }
    } else if blank(&t.source_code) && !reader.errors.contains_key("source_code") {
        reader.error("source_code", "can't be blank");
    }
    // Rails' numericality messages; float maxima print as Ruby prints them (`15.0`).
    let mut bound = |key: &str, low_ok: bool, low: &str, high_ok: bool, high: String| {
        if !low_ok {
            reader.error(key, format!("must be greater than {low}"));
        }
        if !high_ok {
            reader.error(key, format!("must be less than or equal to {high}"));
        }
    };
    bound(
        "number_of_runs",
        p.number_of_runs > 0,
        "0",
        p.number_of_runs <= limits.max_number_of_runs,
        limits.max_number_of_runs.to_string(),
    );
    for (key, value, min, max) in [
        (
            "cpu_time_limit",
            p.cpu_time_limit,
            0.0,
            limits.max_cpu_time_limit,
        ),
        (
            "cpu_extra_time",
            p.cpu_extra_time,
            0.0,
            limits.max_cpu_extra_time,
        ),
        (
            "wall_time_limit",
            p.wall_time_limit,
            1.0,
            limits.max_wall_time_limit,
        ),
    ] {
        bound(
            key,
            value >= min,
            &format!("or equal to {min}"),
            value <= max,
            format!("{max:?}"),
        );
    }
    for (key, value, min, max) in [
        (
            "memory_limit",
            p.memory_limit,
            2048,
            limits.max_memory_limit,
        ),
        ("stack_limit", p.stack_limit, 0, limits.max_stack_limit),
        (
            "max_file_size",
            p.max_file_size,
            0,
            limits.max_max_file_size,
        ),
    ] {
        bound(
            key,
            value >= min,
            &format!("or equal to {min}"),
            value <= max,
            max.to_string(),
        );
    }
    bound(
        "max_processes_and_or_threads",
        p.max_processes_and_or_threads > 0,
        "0",
        p.max_processes_and_or_threads <= limits.max_max_processes_and_or_threads,
        limits.max_max_processes_and_or_threads.to_string(),
    );
    for key in [
        "enable_per_process_and_thread_time_limit",
        "enable_per_process_and_thread_memory_limit",
    ] {
        let on = match key {
            "enable_per_process_and_thread_time_limit" => {
                p.enable_per_process_and_thread_time_limit
            }
            _ => p.enable_per_process_and_thread_memory_limit,
        };
        if on {
            reader.error(key, "this option cannot be enabled");
        }
    }
    for (key, value) in [
        ("compiler_options", &p.compiler_options),
        ("command_line_arguments", &p.command_line_arguments),
    ] {
        if value
            .as_ref()
            .is_some_and(|v| v.chars().count() > limits.max_option_chars)
        {
            reader.error(
                key,
                format!(
                    "is too long (maximum is {} characters)",
                    limits.max_option_chars
                ),
            );
        }
    }
    let present = |v: &Option<String>| v.as_ref().is_some_and(|v| !v.trim().is_empty());
    if present(&p.compiler_options) && language.as_ref().is_some_and(|l| l.compile_cmd.is_none()) {
        reader.error(
            "compiler_options",
            "setting compiler options is only allowed for compiled languages",
        );
    }
    if present(&p.callback_url) {
        let url = p.callback_url.clone().unwrap_or_default();
        if let Err(message) = config.callbacks.check(&url) {
            reader.error("callback_url", message);
        }
    } else {
        p.callback_url = None;
    }
    if submission.texts.additional_files.is_some() && !config.additional_files {
        reader.error(
            "additional_files",
            "setting additional files is not allowed",
        );
    }
    if p.enable_network && config.network_policy.is_none() {
        reader.error("enable_network", "enabling network is not allowed");
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
