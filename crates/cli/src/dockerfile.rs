//! The Dockerfile subset `airlock template build` turns into build steps: `FROM` (one stage,
//! an image or `scratch`), `RUN`, `COPY` (`--chown`, `--chmod`), `ENV`, `WORKDIR`, `USER`,
//! `ARG`, `LABEL`, `EXPOSE`, `CMD` and `ENTRYPOINT` (which become the template's start
//! command). Anything else (`ADD`, `VOLUME`, `HEALTHCHECK`, `SHELL`, `ONBUILD`, a second
//! `FROM`, `COPY --from`, `RUN --mount`, heredocs, ...) is refused with its line number.
//!
//! `$VAR` and `${VAR}` (with `:-default` and `:+alternative`) are expanded from `ARG`s and
//! `ENV`s in every instruction but `RUN`, `CMD` and `ENTRYPOINT`, whose shell expands them
//! inside the sandbox, as Docker does.

use std::collections::BTreeMap;

/// A refused or malformed line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    Run(String),
    /// One source each (a `COPY` of several sources is several steps, as E2B's are).
    Copy {
        source: String,
        destination: String,
        chown: Option<String>,
        chmod: Option<String>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

/// `CMD` or `ENTRYPOINT`: whether in the exec form, and its words (one for the shell form).
type Command = (bool, Vec<String>);

/// A parsed Dockerfile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dockerfile {
    /// `None` for `FROM scratch`.
    pub from: Option<String>,
    /// Each with the line it came from.
    pub steps: Vec<(usize, Instruction)>,
    /// `ENTRYPOINT` and `CMD` as one shell command.
    pub start_cmd: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub exposed: Vec<String>,
}

fn error(line: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        message: message.into(),
    }
}

/// A shell word for `/bin/sh -c`: quoted unless it is plainly safe.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The logical lines (continuations joined), each with its first line's number.
fn logical_lines(text: &str) -> Result<Vec<(usize, String)>, ParseError> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    let mut directives = true;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = raw.trim();
        if directives
            && let Some(directive) = trimmed.strip_prefix('#')
            && let Some((key, value)) = directive.split_once('=')
        {
            let key = key.trim().to_ascii_lowercase();
            if key == "escape" && value.trim() != "\\" {
                return Err(error(
                    number,
                    "only the default escape character `\\` is supported",
                ));
            }
            if ["escape", "syntax", "check"].contains(&key.as_str()) {
                continue;
            }
        }
        directives = false;
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        let (continues, body) = match raw.trim_end().strip_suffix('\\') {
            Some(body) => (true, body),
            None => (false, raw),
        };
        let entry = current.get_or_insert_with(|| (number, String::new()));
        if !entry.1.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body.trim());
        if !continues {
            out.extend(current.take());
        }
    }
    out.extend(current.take().filter(|(_, l)| !l.is_empty()));
    Ok(out)
}

/// Expands `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR:+alternative}`; `\$` is a `$`.
fn expand(text: &str, vars: &BTreeMap<String, String>, line: usize) -> Result<String, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    while i < chars.len() {
        match chars[i] {
            '\\' if chars.get(i + 1) == Some(&'$') => {
                out.push('$');
                i += 2;
            }
            '$' if chars.get(i + 1) == Some(&'{') => {
                let close = chars[i..]
                    .iter()
                    .position(|c| *c == '}')
                    .ok_or_else(|| error(line, "a `${` without its `}`"))?;
                let inner: String = chars[i + 2..i + close].iter().collect();
                let (name, op) = match inner.find(":-").or_else(|| inner.find(":+")) {
                    Some(at) => (&inner[..at], Some((&inner[at..at + 2], &inner[at + 2..]))),
                    None => (inner.as_str(), None),
                };
                if name.is_empty() || !name.chars().all(is_name) {
                    return Err(error(line, format!("`${{{inner}}}` is not a variable")));
                }
                let value = vars.get(name).filter(|v| !v.is_empty());
                out.push_str(&match (op, value) {
                    (None, v) => v.cloned().unwrap_or_default(),
                    (Some((":-", default)), None) => default.to_owned(),
                    (Some((":-", _)), Some(v)) => v.clone(),
                    (Some((_, alternative)), Some(_)) => alternative.to_owned(),
                    (Some(_), None) => String::new(),
                });
                i += close + 1;
            }
            '$' if chars.get(i + 1).is_some_and(|c| is_name(*c)) => {
                let len = chars[i + 1..].iter().take_while(|c| is_name(**c)).count();
                let name: String = chars[i + 1..i + 1 + len].iter().collect();
                out.push_str(vars.get(&name).map_or("", String::as_str));
                i += len + 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Splits on whitespace, keeping quoted runs (`"a b"`, `'a b'`) and `\` escapes together.
fn words(text: &str, line: usize) -> Result<Vec<String>, ParseError> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some('\\') if c == '"' => word.extend(chars.next()),
                        Some(other) => word.push(other),
                        None => return Err(error(line, format!("an unclosed {c} quote"))),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// The exec form (`["a", "b"]`), if `args` is one.
fn exec_form(args: &str, line: usize) -> Result<Option<Vec<String>>, ParseError> {
    if !args.trim_start().starts_with('[') {
        return Ok(None);
    }
    match serde_json::from_str::<Vec<String>>(args.trim()) {
        Ok(list) => Ok(Some(list)),
        Err(_) => Err(error(line, "not a JSON array of strings (the exec form)")),
    }
}

/// `KEY=VALUE ...` pairs (or the legacy `KEY VALUE`).
fn pairs(args: &str, line: usize, what: &str) -> Result<Vec<(String, String)>, ParseError> {
    let list = words(args, line)?;
    if let [key, ..] = list.as_slice()
        && !key.contains('=')
    {
        let value = args.trim_start()[key.len()..].trim().to_owned();
        return Ok(vec![(key.clone(), value)]);
    }
    list.into_iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| error(line, format!("{what}: {pair:?} is not KEY=VALUE")))
        })
        .collect()
}

/// `--name=value` flags in front of the arguments; returns them and the rest.
fn flags<'a>(
    args: &'a str,
    allowed: &[&str],
    line: usize,
    what: &str,
) -> Result<(BTreeMap<String, String>, &'a str), ParseError> {
    let mut found = BTreeMap::new();
    let mut rest = args.trim_start();
    while let Some(flag) = rest.strip_prefix("--") {
        let end = flag.find(char::is_whitespace).unwrap_or(flag.len());
        let (name, value) = flag[..end].split_once('=').unwrap_or((&flag[..end], ""));
        if !allowed.contains(&name) {
            return Err(error(line, format!("{what} --{name} is not supported")));
        }
        found.insert(name.to_owned(), value.to_owned());
        rest = flag[end..].trim_start();
    }
    Ok((found, rest))
}

fn unsupported(word: &str) -> Option<&'static str> {
    Some(match word {
        "ADD" => "ADD is not supported: use COPY (and RUN to fetch or unpack)",
        "VOLUME" => "VOLUME is not supported: sandboxes have /workspace",
        "HEALTHCHECK" => {
            "HEALTHCHECK is not supported: give the template a ready check (--ready-cmd)"
        }
        "SHELL" => "SHELL is not supported: RUN uses /bin/sh -c",
        "ONBUILD" => "ONBUILD is not supported",
        "STOPSIGNAL" => "STOPSIGNAL is not supported",
        "MAINTAINER" => "MAINTAINER is not supported: use LABEL",
        _ => return None,
    })
}

/// Parses `text` with `build_args` (`--build-arg`) overriding `ARG` defaults.
pub fn parse(text: &str, build_args: &BTreeMap<String, String>) -> Result<Dockerfile, ParseError> {
    let mut file = Dockerfile::default();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut seen_from = false;
    let (mut entrypoint, mut cmd): (Option<Command>, Option<Command>) = (None, None);
    for (line, content) in logical_lines(text)? {
        let (word, args) = content
            .split_once(char::is_whitespace)
            .map_or((content.as_str(), ""), |(w, a)| (w, a.trim()));
        let word = word.to_ascii_uppercase();
        if args.contains("<<") && matches!(word.as_str(), "RUN" | "COPY") {
            return Err(error(
                line,
                format!("{word} with a heredoc (<<) is not supported"),
            ));
        }
        if let Some(message) = unsupported(&word) {
            return Err(error(line, message));
        }
        if !seen_from && !matches!(word.as_str(), "FROM" | "ARG") {
            return Err(error(line, format!("{word} before FROM")));
        }
        match word.as_str() {
            "FROM" => {
                if seen_from {
                    return Err(error(
                        line,
                        "a second FROM: multi-stage builds are not supported",
                    ));
                }
                seen_from = true;
                let (given, rest) = flags(args, &["platform"], line, "FROM")?;
                if given.get("platform").is_some_and(|p| p != "linux/amd64") {
                    return Err(error(line, "FROM --platform: only linux/amd64 runs here"));
                }
                let parts = words(&expand(rest, &vars, line)?, line)?;
                match parts.as_slice() {
                    [image] if image == "scratch" => file.from = None,
                    [image] => file.from = Some(image.clone()),
                    [_, as_word, _] if as_word.eq_ignore_ascii_case("as") => {
                        return Err(error(
                            line,
                            "FROM ... AS: multi-stage builds are not supported",
                        ));
                    }
                    _ => return Err(error(line, "FROM takes one image")),
                }
            }
            "ARG" => {
                for spec in words(args, line)? {
                    let (name, default) = match spec.split_once('=') {
                        Some((name, default)) => (name.to_owned(), Some(default.to_owned())),
                        None => (spec.clone(), None),
                    };
                    if name.is_empty() {
                        return Err(error(line, "ARG needs a name"));
                    }
                    let value = build_args
                        .get(&name)
                        .cloned()
                        .or(default)
                        .unwrap_or_default();
                    vars.insert(name, value);
                }
            }
            "RUN" => {
                let (_, rest) = flags(args, &[], line, "RUN")?;
                let command = match exec_form(rest, line)? {
                    Some(argv) => argv
                        .iter()
                        .map(|a| shell_quote(a))
                        .collect::<Vec<_>>()
                        .join(" "),
                    None => rest.to_owned(),
                };
                if command.trim().is_empty() {
                    return Err(error(line, "RUN needs a command"));
                }
                file.steps.push((line, Instruction::Run(command)));
            }
            "COPY" => {
                let (given, rest) = flags(args, &["chown", "chmod", "from", "link"], line, "COPY")?;
                if given.contains_key("from") {
                    return Err(error(
                        line,
                        "COPY --from is not supported (no multi-stage builds)",
                    ));
                }
                let expanded = expand(rest, &vars, line)?;
                let list = match exec_form(&expanded, line)? {
                    Some(list) => list,
                    None => words(&expanded, line)?,
                };
                let Some((destination, sources)) = list.split_last().filter(|(_, s)| !s.is_empty())
                else {
                    return Err(error(line, "COPY needs a source and a destination"));
                };
                for source in sources {
                    if source.starts_with('/') || source.split('/').any(|p| p == "..") {
                        return Err(error(
                            line,
                            format!("COPY source {source:?} leaves the build context"),
                        ));
                    }
                    file.steps.push((
                        line,
                        Instruction::Copy {
                            source: source.clone(),
                            destination: destination.clone(),
                            chown: given
                                .get("chown")
                                .map(|v| expand(v, &vars, line))
                                .transpose()?,
                            chmod: given.get("chmod").cloned(),
                        },
                    ));
                }
            }
            "ENV" => {
                let mut set = Vec::new();
                for (key, value) in pairs(args, line, "ENV")? {
                    let value = expand(&value, &vars, line)?;
                    vars.insert(key.clone(), value.clone());
                    set.push((key, value));
                }
                file.steps.push((line, Instruction::Env(set)));
            }
            "WORKDIR" | "USER" => {
                let value = expand(args, &vars, line)?;
                if value.trim().is_empty() {
                    return Err(error(line, format!("{word} needs a value")));
                }
                let value = value.trim().to_owned();
                file.steps.push((
                    line,
                    if word == "WORKDIR" {
                        Instruction::Workdir(value)
                    } else {
                        Instruction::User(value)
                    },
                ));
            }
            "LABEL" => {
                for (key, value) in pairs(args, line, "LABEL")? {
                    file.labels.insert(key, expand(&value, &vars, line)?);
                }
            }
            "EXPOSE" => file
                .exposed
                .extend(words(&expand(args, &vars, line)?, line)?),
            "CMD" | "ENTRYPOINT" => {
                let form = match exec_form(args, line)? {
                    Some(argv) => (true, argv),
                    None => (false, vec![args.to_owned()]),
                };
                if word == "CMD" {
                    cmd = Some(form);
                } else {
                    entrypoint = Some(form);
                }
            }
            other => {
                return Err(error(
                    line,
                    format!("{other} is not a Dockerfile instruction Airlock builds"),
                ));
            }
        }
    }
    if !seen_from {
        return Err(error(text.lines().count().max(1), "no FROM"));
    }
    let join = |(exec, argv): &Command| {
        if *exec {
            argv.iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            argv.join(" ")
        }
    };
    file.start_cmd = match (&entrypoint, &cmd) {
        (Some(entry @ (true, _)), Some(cmd)) => Some(format!("{} {}", join(entry), join(cmd))),
        (Some(entry), _) => Some(join(entry)),
        (None, Some(cmd)) => Some(join(cmd)),
        (None, None) => None,
    }
    .filter(|c| !c.trim().is_empty());
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Dockerfile {
        parse(text, &BTreeMap::new()).unwrap()
    }

    fn refused(text: &str) -> ParseError {
        parse(text, &BTreeMap::new()).unwrap_err()
    }

    #[test]
    fn test_dockerfile_subset_becomes_steps() {
        let text = "# syntax=docker/dockerfile:1\nARG BASE=busybox\nFROM ${BASE}:1\nARG WHO\nENV GREETING=\"hello there\" WHO=${WHO:-nobody}\n\
                    RUN echo $GREETING \\\n    && touch /x\nCOPY --chown=app:app --chmod=0644 a.txt b/ /srv/\nWORKDIR /srv/$WHO\nUSER app\n\
                    LABEL org.example=\"yes\"\nEXPOSE 8080/tcp\nENTRYPOINT [\"/bin/serve\", \"--port\"]\nCMD [\"8080\"]\n";
        let file = ok(text);
        assert_eq!(file.from.as_deref(), Some("busybox:1"));
        assert_eq!(file.start_cmd.as_deref(), Some("/bin/serve --port 8080"));
        assert_eq!(file.exposed, ["8080/tcp"]);
        assert_eq!(
            file.labels.get("org.example").map(String::as_str),
            Some("yes")
        );
        let steps: Vec<&Instruction> = file.steps.iter().map(|(_, s)| s).collect();
        assert_eq!(
            steps[0],
            &Instruction::Env(vec![
                ("GREETING".into(), "hello there".into()),
                ("WHO".into(), "nobody".into())
            ])
        );
        assert_eq!(
            steps[1],
            &Instruction::Run("echo $GREETING && touch /x".into())
        );
        assert_eq!(
            file.steps[1].0, 6,
            "a continued line keeps its first line's number"
        );
        assert!(
            matches!(steps[2], Instruction::Copy { source, destination, chown: Some(c), chmod: Some(m) }
            if source == "a.txt" && destination == "/srv/" && c == "app:app" && m == "0644")
        );
        assert!(matches!(steps[3], Instruction::Copy { source, .. } if source == "b/"));
        assert_eq!(steps[4], &Instruction::Workdir("/srv/nobody".into()));
        assert_eq!(steps[5], &Instruction::User("app".into()));
        let args = BTreeMap::from([("WHO".to_owned(), "me".to_owned())]);
        let with_arg = parse(text, &args).unwrap();
        assert_eq!(with_arg.steps[4].1, Instruction::Workdir("/srv/me".into()));
    }

    #[test]
    fn test_shell_forms_and_quoting() {
        let file =
            ok("FROM scratch\nRUN [\"sh\", \"-c\", \"echo 'a b'\"]\nCMD python3 -m http.server\n");
        assert_eq!(file.from, None);
        assert_eq!(
            file.steps[0].1,
            Instruction::Run(r"sh -c 'echo '\''a b'\'''".into())
        );
        assert_eq!(file.start_cmd.as_deref(), Some("python3 -m http.server"));
        let legacy = ok("FROM x\nENV PATH /usr/bin:/bin\n");
        assert_eq!(
            legacy.steps[0].1,
            Instruction::Env(vec![("PATH".into(), "/usr/bin:/bin".into())])
        );
    }

    #[test]
    fn test_refused_lines_name_their_line_number() {
        for (text, line, words) in [
            ("FROM a\nADD x /y\n", 2, "ADD"),
            ("FROM a\n\nRUN true\nFROM b\n", 4, "multi-stage"),
            ("FROM a AS build\n", 1, "multi-stage"),
            ("FROM a\nCOPY --from=build /x /y\n", 2, "--from"),
            (
                "FROM a\nRUN --mount=type=cache,target=/x true\n",
                2,
                "--mount",
            ),
            ("FROM a\nHEALTHCHECK CMD true\n", 2, "HEALTHCHECK"),
            ("FROM a\nRUN <<EOF\necho\nEOF\n", 2, "heredoc"),
            ("RUN true\n", 1, "before FROM"),
            ("FROM a\nCOPY ../secret /x\n", 2, "leaves the build context"),
            ("FROM a\nFROBNICATE\n", 2, "FROBNICATE"),
            ("# escape=`\nFROM a\n", 1, "escape"),
            ("FROM a\nENV x=\"open\n", 2, "quote"),
        ] {
            let err = refused(text);
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.message.contains(words), "{text:?}: {err}");
        }
    }
}
