//! Reading a policy: YAML with line and column (or a JSON document from the API), `extends`
//! merged, every section validated. The result, a [`Policy`], is what the compiler, `explain`
//! and the prover accept, so none of them sees an unchecked document.

use std::collections::HashMap;
use std::fmt;

use airlock_api::policy::PolicyDocument;
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::{DefaultMessageFormatter, MessageFormatter};

use crate::profiles;
use crate::settings::{self, Settings};
use crate::validate;

/// The largest policy read. A policy is a page of text; the bound keeps the parser's work small.
pub const MAX_POLICY_BYTES: usize = 1 << 20;

/// One step of a field path: a field or map key, or a list index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Where a value sits in a document, as `network.egress[0].host` or `filesystem.rules["~/x"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// This path and one more field or key.
    pub fn key(&self, key: &str) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        FieldPath(segs)
    }

    /// This path and one more index.
    pub fn index(&self, index: usize) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        FieldPath(segs)
    }

    fn parent(&self) -> Option<Self> {
        let mut segs = self.0.clone();
        segs.pop()?;
        Some(FieldPath(segs))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(key) if is_identifier(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                }
                Seg::Key(key) => write!(f, "[{key:?}]")?,
                Seg::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

fn is_identifier(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One thing wrong with a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file name, `builtin:NAME` for a profile, or `policy` for a document from the API.
    pub source: String,
    /// 1-based line and column of the offending value, when the document was YAML.
    pub line: Option<u64>,
    pub column: Option<u64>,
    /// The field, when known (`network.egress[0].host`).
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, ":{line}:{column}")?;
        }
        f.write_str(": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", printable(&self.field))?;
        }
        f.write_str(&printable(&self.message))
    }
}

/// `text` with control characters escaped: a problem is one line, whatever a document holds.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Why a document is not a policy: every problem found, in document order where possible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<Problem>),
}

impl PolicyError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            PolicyError::Invalid(problems) => problems,
        }
    }
}

/// Positions of the values of a YAML document, by field path.
#[derive(Debug, Clone, Default)]
pub struct SpanIndex {
    positions: HashMap<FieldPath, (u64, u64)>,
}

impl SpanIndex {
    /// Indexes `text`, as far as it parses. Aliases count as plain values.
    pub fn build(text: &str) -> SpanIndex {
        enum Frame {
            Map {
                path: FieldPath,
                key: Option<String>,
            },
            Seq {
                path: FieldPath,
                next: usize,
            },
        }
        let mut index = SpanIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut seen_root = false;
        for event in Parser::new_from_str(text) {
            let Ok((event, span)) = event else { break };
            let position = (span.start.line() as u64, span.start.col() as u64 + 1);
            let starts_node = matches!(
                event,
                Event::Scalar(..)
                    | Event::SequenceStart(..)
                    | Event::MappingStart(..)
                    | Event::Alias(_)
            );
            if starts_node {
                // The path of this node, or None when it is a mapping key.
                let path = match stack.last_mut() {
                    None if seen_root => break,
                    None => {
                        seen_root = true;
                        Some(FieldPath::root())
                    }
                    Some(Frame::Seq { path, next }) => {
                        *next += 1;
                        Some(path.index(*next - 1))
                    }
                    Some(Frame::Map {
                        path,
                        key: Some(key),
                    }) => Some(path.key(key)),
                    Some(Frame::Map {
                        key: key @ None, ..
                    }) => {
                        *key = Some(match &event {
                            Event::Scalar(text, ..) => text.to_string(),
                            _ => "?".to_owned(),
                        });
                        None
                    }
                };
                let is_value = path.is_some();
                let path = path.unwrap_or_default();
                if is_value {
                    index.positions.entry(path.clone()).or_insert(position);
                }
                match event {
                    Event::SequenceStart(..) => stack.push(Frame::Seq { path, next: 0 }),
                    Event::MappingStart(..) => stack.push(Frame::Map { path, key: None }),
                    _ if is_value => clear_key(&mut stack),
                    _ => {}
                }
            } else if matches!(event, Event::SequenceEnd | Event::MappingEnd) {
                stack.pop();
                clear_key(&mut stack);
            }
        }
        return index;

        fn clear_key(stack: &mut [Frame]) {
            if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                *key = None;
            }
        }
    }

    /// The position of `path`, or of its nearest ancestor that has one.
    pub fn position(&self, path: &FieldPath) -> Option<(u64, u64)> {
        let mut path = path.clone();
        loop {
            if let Some(position) = self.positions.get(&path) {
                return Some(*position);
            }
            path = path.parent()?;
        }
    }
}

/// A document and where it came from, for problem reports.
#[derive(Debug, Clone)]
pub struct SourceDoc {
    pub name: String,
    pub document: PolicyDocument,
    pub index: Option<SpanIndex>,
}

impl SourceDoc {
    pub fn problem(&self, field: &FieldPath, message: impl Into<String>) -> Problem {
        let position = self.index.as_ref().and_then(|index| index.position(field));
        Problem {
            source: self.name.clone(),
            line: position.map(|p| p.0),
            column: position.map(|p| p.1),
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// Parses YAML into a document, with the positions of its values.
pub fn parse_yaml(name: &str, text: &str) -> Result<SourceDoc, PolicyError> {
    let problem = |line, column, message: String| {
        PolicyError::Invalid(vec![Problem {
            source: name.to_owned(),
            line,
            column,
            field: String::new(),
            message,
        }])
    };
    if text.len() > MAX_POLICY_BYTES {
        return Err(problem(
            None,
            None,
            format!("larger than {MAX_POLICY_BYTES} bytes; a policy is a page of text"),
        ));
    }
    if text.trim().is_empty() {
        return Err(problem(
            Some(1),
            Some(1),
            "empty document; a policy starts with `version: 1`".into(),
        ));
    }
    match serde_saphyr::from_str::<PolicyDocument>(text) {
        Ok(document) => Ok(SourceDoc {
            name: name.to_owned(),
            document,
            index: Some(SpanIndex::build(text)),
        }),
        Err(err) => {
            let err = err.without_snippet();
            let location = err.location().filter(|l| l.line() > 0);
            let message = DefaultMessageFormatter.format_message(err);
            Err(problem(
                location.map(|l| l.line()),
                location.map(|l| l.column()),
                message.replace(['\n', '\r'], " "),
            ))
        }
    }
}

/// A validated policy with its `extends` merged in: what everything else takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    merged: PolicyDocument,
    profiles: Vec<String>,
    source: String,
}

impl Policy {
    /// Reads a YAML policy. Problems carry `name:LINE:COLUMN`.
    pub fn from_yaml(name: &str, text: &str) -> Result<Policy, PolicyError> {
        Self::from_source(parse_yaml(name, text)?)
    }

    /// Checks a document received as data (the API's create call, hot reload). Problems name
    /// the field but no position.
    pub fn from_document(document: &PolicyDocument) -> Result<Policy, PolicyError> {
        Self::from_source(SourceDoc {
            name: "policy".into(),
            document: document.clone(),
            index: None,
        })
    }

    fn from_source(doc: SourceDoc) -> Result<Policy, PolicyError> {
        let mut problems = Vec::new();
        let mut layers = Vec::new();
        let mut names = Vec::new();
        for (i, name) in doc.document.extends.iter().enumerate() {
            match profiles::load(name, &mut Vec::new()) {
                Ok(mut loaded) => {
                    names.extend(
                        loaded
                            .iter()
                            .map(|l| l.name.trim_start_matches("builtin:").to_owned()),
                    );
                    layers.append(&mut loaded);
                }
                Err(message) => {
                    problems.push(doc.problem(&FieldPath::root().key("extends").index(i), message));
                }
            }
        }
        let mut merged = PolicyDocument {
            version: airlock_api::policy::POLICY_VERSION,
            ..PolicyDocument::default()
        };
        for layer in &layers {
            profiles::merge(&mut merged, &layer.document);
        }
        profiles::merge(&mut merged, &doc.document);
        for layer in &layers {
            problems.extend(validate::check(layer, &merged));
        }
        problems.extend(validate::check(&doc, &merged));
        if !problems.is_empty() {
            problems.sort_by_key(|p| (p.source != doc.name, p.line.is_none(), p.line, p.column));
            return Err(PolicyError::Invalid(problems));
        }
        let mut profiles: Vec<String> = Vec::new();
        for name in names {
            if !profiles.contains(&name) {
                profiles.push(name);
            }
        }
        Ok(Policy {
            merged,
            profiles,
            source: doc.name,
        })
    }

    /// The merged document: `extends` applied and emptied.
    pub fn document(&self) -> &PolicyDocument {
        &self.merged
    }

    /// The profiles merged in, in order (including those a profile extends).
    pub fn profiles(&self) -> &[String] {
        &self.profiles
    }

    /// Where the policy was read from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The values that become `SandboxConfig` fields: tier, user, limits, timeout.
    pub fn settings(&self) -> Settings {
        settings::settings(&self.merged)
    }
}

#[cfg(test)]
#[path = "document_tests.rs"]
mod tests;
