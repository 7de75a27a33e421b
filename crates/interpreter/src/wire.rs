//! The bodies of E2B's code-interpreter protocol on port 49999, and the lines of the streamed
//! answer of `POST /execute`.
//!
//! Requests ignore unknown fields, unlike Airlock's own wire types: E2B's server (pydantic)
//! does, and the SDKs may add keys (`?source=` already rides on JS requests). Absent optional
//! values are left out of the answers, as E2B's server leaves out its `None`s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /execute`. The Python SDK sends every key, `null` included; the JS SDK omits them.
#[derive(Debug, Clone, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    /// Set for this execution only, then restored.
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CreateContextRequest {
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A context as `POST /contexts` and `GET /contexts` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// One line of the NDJSON answer of `POST /execute`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputLine {
    /// The execution count of this run (from the kernel's `execute_input`).
    NumberOfExecutions {
        execution_count: u64,
    },
    Stdout {
        text: String,
        timestamp: String,
    },
    Stderr {
        text: String,
        timestamp: String,
    },
    Result(Box<ResultLine>),
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    /// Sent after a quiet spell, so that a vanished client is noticed.
    Keepalive,
    EndOfExecution,
}

impl OutputLine {
    pub fn error(name: &str, value: impl Into<String>) -> OutputLine {
        OutputLine::Error {
            name: name.to_owned(),
            value: value.into(),
            traceback: String::new(),
        }
    }

    /// The line as sent: JSON and a newline.
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        line
    }
}

/// A rich result: the kernel's MIME bundle split into E2B's fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResultLine {
    /// The last expression's value (`execute_result`), not a `display()` call.
    pub is_main_result: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// Base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    /// Base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// `e2b/data`: a DataFrame's columns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// `e2b/chart`: a matplotlib figure's data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<Value>,
    /// Every other MIME type, as the kernel sent it (always present, `{}` when empty).
    pub extra: Map<String, Value>,
}

impl ResultLine {
    /// Splits a MIME bundle (`{"text/plain": ..., "image/png": ...}`) into E2B's fields.
    pub fn from_bundle(bundle: Map<String, Value>, is_main_result: bool) -> ResultLine {
        let mut line = ResultLine {
            is_main_result,
            ..ResultLine::default()
        };
        for (mime, value) in bundle {
            let text = || value.as_str().map(str::to_owned);
            match mime.as_str() {
                "text/plain" => line.text = text().map(|t| strip_quotes(&t).to_owned()),
                "text/html" => line.html = text(),
                "text/markdown" => line.markdown = text(),
                "image/svg+xml" => line.svg = text(),
                "image/png" => line.png = text().map(|t| t.replace('\n', "")),
                "image/jpeg" => line.jpeg = text().map(|t| t.replace('\n', "")),
                "application/pdf" => line.pdf = text(),
                "text/latex" => line.latex = text(),
                "application/javascript" => line.javascript = text(),
                "application/json" => line.json = Some(value),
                "e2b/data" => line.data = Some(value),
                "e2b/chart" => line.chart = Some(value),
                _ => {
                    line.extra.insert(mime, value);
                }
            }
        }
        line
    }
}

/// E2B's rule for `text/plain`: one pair of surrounding quotes goes, so that a Python string
/// result `'a'` reads `a`.
fn strip_quotes(text: &str) -> &str {
    for quote in ['\'', '"'] {
        if text.len() >= 2
            && let Some(inner) = text.strip_prefix(quote).and_then(|t| t.strip_suffix(quote))
        {
            return inner;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_output_line_result_flattens_fields_and_keeps_extra() {
        let bundle = json!({
            "text/plain": "'a'",
            "image/png": "iVBO\nRw==",
            "application/vnd.plotly.v1+json": {"data": []},
        });
        let Value::Object(bundle) = bundle else {
            panic!("not an object")
        };
        let line = OutputLine::Result(Box::new(ResultLine::from_bundle(bundle, true)));
        let encoded: Value = serde_json::from_slice(&line.encode()).unwrap();
        assert_eq!(
            encoded,
            json!({
                "type": "result",
                "is_main_result": true,
                "text": "a",
                "png": "iVBORw==",
                "extra": {"application/vnd.plotly.v1+json": {"data": []}},
            })
        );
    }

    #[test]
    fn test_output_line_unit_variants_encode_type_only() {
        assert_eq!(
            OutputLine::EndOfExecution.encode(),
            b"{\"type\":\"end_of_execution\"}\n"
        );
        assert_eq!(
            OutputLine::Keepalive.encode(),
            b"{\"type\":\"keepalive\"}\n"
        );
    }

    #[test]
    fn test_strip_quotes_one_pair_only() {
        assert_eq!(strip_quotes("'a'"), "a");
        assert_eq!(strip_quotes("\"'a'\""), "'a'");
        assert_eq!(strip_quotes("'"), "'");
        assert_eq!(strip_quotes("2"), "2");
        assert_eq!(strip_quotes("'a\""), "'a\"");
    }

    #[test]
    fn test_execute_request_takes_nulls_and_unknown_keys() {
        let request: ExecuteRequest = serde_json::from_value(json!({
            "code": "1+1", "context_id": null, "language": null, "env_vars": null, "later": 1
        }))
        .unwrap();
        assert_eq!(request.code, "1+1");
        assert!(request.context_id.is_none() && request.env_vars.is_none());
    }
}
