//! Languages: E2B's names, the kernel that serves each (a Jupyter kernelspec found where
//! Jupyter looks: `$JUPYTER_PATH`, then the user's and the system's data directories), and
//! the code that sets and restores an execution's `env_vars` in each.

use std::collections::BTreeMap;
use std::path::PathBuf;

use jupyter_protocol::JupyterKernelspec;
use jupyter_zmq_client::KernelspecDir;

/// The languages E2B's SDKs name, and the kernelspec names that serve them by convention.
const KNOWN: &[(&str, &[&str])] = &[
    ("python", &["python3", "python"]),
    ("javascript", &["deno", "javascript"]),
    ("typescript", &["deno", "typescript"]),
    ("bash", &["bash"]),
    ("r", &["ir"]),
    ("java", &["java"]),
];

/// E2B's normalisation of a request's language: trimmed, lower-cased, `js` and `ts` spelled
/// out, python when absent or empty.
pub fn normalize(language: Option<&str>) -> String {
    let language = language.unwrap_or("").trim().to_lowercase();
    match language.as_str() {
        "" => "python".to_owned(),
        "js" => "javascript".to_owned(),
        "ts" => "typescript".to_owned(),
        _ => language,
    }
}

/// How a kernel is started and interrupted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// The kernelspec's name (`python3`, `bash`, ...).
    pub name: String,
    /// `{connection_file}` stands for the connection file's path.
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `message`: an `interrupt_request` on the control channel; otherwise SIGINT.
    pub interrupt_by_message: bool,
    /// Where it was found (for messages).
    pub path: Option<PathBuf>,
}

impl KernelSpec {
    fn from_dir(dir: KernelspecDir) -> KernelSpec {
        let python = dir.kernelspec.language.eq_ignore_ascii_case("python");
        let JupyterKernelspec {
            argv,
            env,
            interrupt_mode,
            ..
        } = dir.kernelspec;
        let mut env: BTreeMap<String, String> = env.unwrap_or_default().into_iter().collect();
        // Results' text/plain without ANSI colours (Deno colours its inspect output), as
        // E2B's kernels give it; ipykernel's colours are off in its startup file instead.
        if !python && std::env::var_os("NO_COLOR").is_none() {
            env.entry("NO_COLOR".to_owned())
                .or_insert_with(|| "1".to_owned());
        }
        KernelSpec {
            name: dir.kernel_name,
            argv,
            env,
            interrupt_by_message: interrupt_mode.as_deref() == Some("message"),
            path: Some(dir.path),
        }
    }

    /// ipykernel through `python3` on `PATH`, for hosts whose ipykernel installed no
    /// kernelspec (a pip install into a venv, for one).
    fn fallback_python() -> KernelSpec {
        KernelSpec {
            name: "python3".to_owned(),
            argv: [
                "python3",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
            ]
            .map(str::to_owned)
            .to_vec(),
            env: BTreeMap::new(),
            interrupt_by_message: false,
            path: None,
        }
    }
}

/// The kernelspecs found when the service started.
#[derive(Debug, Clone, Default)]
pub struct Kernels {
    specs: Vec<(String, KernelSpec)>,
}

impl Kernels {
    /// Reads every kernelspec where Jupyter looks for them.
    pub async fn discover() -> Kernels {
        let found = jupyter_zmq_client::list_kernelspecs().await;
        Kernels::from_specs(found.into_iter().map(|dir| {
            let language = dir.kernelspec.language.to_lowercase();
            (language, KernelSpec::from_dir(dir))
        }))
    }

    /// From `(language, spec)` pairs; the first of a name wins, as in Jupyter's search order.
    pub fn from_specs(specs: impl IntoIterator<Item = (String, KernelSpec)>) -> Kernels {
        let mut kept: Vec<(String, KernelSpec)> = Vec::new();
        for (language, spec) in specs {
            if !kept.iter().any(|(_, k)| k.name == spec.name) {
                kept.push((language, spec));
            }
        }
        Kernels { specs: kept }
    }

    /// The kernel for a normalised language: the conventional kernelspec name first, then a
    /// kernelspec of that name, then one whose `language` it is. Python falls back on
    /// `python3 -m ipykernel_launcher`.
    pub fn for_language(&self, language: &str) -> Option<KernelSpec> {
        let by_name = |name: &str| self.specs.iter().find(|(_, s)| s.name == name);
        let conventional = KNOWN
            .iter()
            .find(|(known, _)| *known == language)
            .and_then(|(_, names)| names.iter().find_map(|name| by_name(name)));
        conventional
            .or_else(|| by_name(language))
            .or_else(|| self.specs.iter().find(|(l, _)| l == language))
            .map(|(_, spec)| spec.clone())
            .or_else(|| (language == "python").then(KernelSpec::fallback_python))
    }

    /// The languages that have a kernel here, for messages and the README's claim.
    pub fn languages(&self) -> Vec<String> {
        let mut languages: Vec<String> = KNOWN
            .iter()
            .filter(|(language, _)| self.for_language(language).is_some())
            .map(|(language, _)| (*language).to_owned())
            .collect();
        if !languages.iter().any(|l| l == "python") {
            languages.insert(0, "python".to_owned());
        }
        languages
    }
}

/// Why an execution's `env_vars` cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("env_vars: a variable name must be non-empty and hold no '=' or NUL, got {0:?}")]
    BadName(String),
    #[error(
        "env_vars: {0:?} is not a shell variable name (letters, digits and '_', not first a digit)"
    )]
    NotShellName(String),
    #[error("env_vars: a value may not hold NUL (variable {0:?})")]
    Nul(String),
    #[error("env_vars are not supported in {0} contexts")]
    Unsupported(String),
}

/// The two snippets that set an execution's variables and put the old values back, run
/// silently before and after it. Values travel as escaped literals, never interpolated raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSnippets {
    pub set: String,
    pub restore: String,
}

fn is_shell_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A JSON string literal, which is also a valid Python, JavaScript and R string literal.
fn literal(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

/// A single-quoted shell word.
fn shell_word(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The snippets for `vars` in a context of `language`; `None` when there is nothing to set.
pub fn env_snippets(
    language: &str,
    vars: &BTreeMap<String, String>,
) -> Result<Option<EnvSnippets>, EnvError> {
    if vars.is_empty() {
        return Ok(None);
    }
    for (name, value) in vars {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(EnvError::BadName(name.clone()));
        }
        if value.contains('\0') {
            return Err(EnvError::Nul(name.clone()));
        }
        if language == "bash" && !is_shell_name(name) {
            return Err(EnvError::NotShellName(name.clone()));
        }
    }
    let object = serde_json::to_string(vars).unwrap_or_else(|_| "{}".to_owned());
    let names: Vec<String> = vars.keys().map(|k| literal(k)).collect();
    let names = format!("[{}]", names.join(", "));
    let snippets = match language {
        "python" => EnvSnippets {
            set: format!(
                "import os as __airlock_os\n__airlock_env = {{k: __airlock_os.environ.get(k) for k in {names}}}\n__airlock_os.environ.update({object})"
            ),
            restore: "for __airlock_k, __airlock_v in __airlock_env.items():\n    if __airlock_v is None:\n        __airlock_os.environ.pop(__airlock_k, None)\n    else:\n        __airlock_os.environ[__airlock_k] = __airlock_v\ndel __airlock_env, __airlock_k, __airlock_v, __airlock_os".to_owned(),
        },
        "javascript" | "typescript" => {
            let (global, cast) = if language == "typescript" {
                ("(globalThis as any)", " as string")
            } else {
                ("globalThis", "")
            };
            EnvSnippets {
                set: format!(
                    "{global}.__airlockEnv = Object.fromEntries({names}.map((k) => [k, process.env[k]]));\nObject.assign(process.env, {object});"
                ),
                restore: format!(
                    "for (const [k, v] of Object.entries({global}.__airlockEnv)) {{ if (v === undefined) {{ delete process.env[k]; }} else {{ process.env[k] = v{cast}; }} }}\ndelete {global}.__airlockEnv;"
                ),
            }
        }
        "bash" => {
            let mut set = String::new();
            let mut restore = String::new();
            for (name, value) in vars {
                set.push_str(&format!(
                    "if [ -n \"${{{name}+x}}\" ]; then __airlock_had_{name}=1; __airlock_old_{name}=\"${name}\"; else __airlock_had_{name}=; fi; export {name}={}\n",
                    shell_word(value)
                ));
                restore.push_str(&format!(
                    "if [ -n \"$__airlock_had_{name}\" ]; then export {name}=\"$__airlock_old_{name}\"; else unset {name}; fi; unset __airlock_had_{name} __airlock_old_{name}\n"
                ));
            }
            EnvSnippets { set, restore }
        }
        "r" => {
            let mut set = String::from(".airlock_env <- Sys.getenv(c(");
            set.push_str(&names[1..names.len() - 1]);
            set.push_str("), unset = NA)\n");
            for (name, value) in vars {
                set.push_str(&format!(
                    "do.call(Sys.setenv, setNames(list({}), {}))\n",
                    literal(value),
                    literal(name)
                ));
            }
            let restore = "for (.airlock_k in names(.airlock_env)) { if (is.na(.airlock_env[[.airlock_k]])) Sys.unsetenv(.airlock_k) else do.call(Sys.setenv, setNames(list(.airlock_env[[.airlock_k]]), .airlock_k)) }\nrm(.airlock_env, .airlock_k)".to_owned();
            EnvSnippets { set, restore }
        }
        other => return Err(EnvError::Unsupported(other.to_owned())),
    };
    Ok(Some(snippets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> KernelSpec {
        KernelSpec {
            name: name.to_owned(),
            argv: vec![name.to_owned()],
            env: BTreeMap::new(),
            interrupt_by_message: false,
            path: None,
        }
    }

    #[test]
    fn test_normalize_spells_out_and_defaults_to_python() {
        assert_eq!(normalize(None), "python");
        assert_eq!(normalize(Some("  ")), "python");
        assert_eq!(normalize(Some(" JS ")), "javascript");
        assert_eq!(normalize(Some("ts")), "typescript");
        assert_eq!(normalize(Some("Bash")), "bash");
    }

    #[test]
    fn test_kernels_for_language_prefers_conventional_name_then_language() {
        let kernels = Kernels::from_specs([
            ("python".to_owned(), spec("other-python")),
            ("python".to_owned(), spec("python3")),
            ("javascript".to_owned(), spec("node-kernel")),
            ("bash".to_owned(), spec("bash")),
            ("bash".to_owned(), spec("bash")),
        ]);
        assert_eq!(kernels.for_language("python").unwrap().name, "python3");
        assert_eq!(
            kernels.for_language("javascript").unwrap().name,
            "node-kernel"
        );
        assert_eq!(kernels.for_language("bash").unwrap().name, "bash");
        assert!(kernels.for_language("r").is_none());
        assert_eq!(kernels.languages(), ["python", "javascript", "bash"]);
    }

    #[test]
    fn test_kernels_python_falls_back_on_ipykernel_launcher() {
        let python = Kernels::default().for_language("python").unwrap();
        assert_eq!(python.argv[..3], ["python3", "-m", "ipykernel_launcher"]);
    }

    #[test]
    fn test_env_snippets_escape_values_as_literals() {
        let vars = BTreeMap::from([("A".to_owned(), "it's \"q\"\n\\".to_owned())]);
        let python = env_snippets("python", &vars).unwrap().unwrap();
        assert!(
            python.set.contains(r#"{"A":"it's \"q\"\n\\"}"#),
            "{}",
            python.set
        );
        let bash = env_snippets("bash", &vars).unwrap().unwrap();
        assert!(
            bash.set.contains(r#"export A='it'\''s "q""#),
            "{}",
            bash.set
        );
        let js = env_snippets("javascript", &vars).unwrap().unwrap();
        assert!(!js.restore.contains(" as string"), "{}", js.restore);
        let ts = env_snippets("typescript", &vars).unwrap().unwrap();
        assert!(ts.restore.contains(" as string"), "{}", ts.restore);
    }

    #[test]
    fn test_env_snippets_refuse_bad_names() {
        let bad = |name: &str, language: &str| {
            env_snippets(
                language,
                &BTreeMap::from([(name.to_owned(), "v".to_owned())]),
            )
        };
        assert_eq!(
            bad("A=B", "python"),
            Err(EnvError::BadName("A=B".to_owned()))
        );
        assert_eq!(bad("", "python"), Err(EnvError::BadName(String::new())));
        assert_eq!(
            bad("MY-VAR", "bash"),
            Err(EnvError::NotShellName("MY-VAR".to_owned()))
        );
        assert!(bad("MY-VAR", "python").is_ok());
        assert_eq!(
            bad("A", "java"),
            Err(EnvError::Unsupported("java".to_owned()))
        );
        assert_eq!(env_snippets("java", &BTreeMap::new()), Ok(None));
    }
}
