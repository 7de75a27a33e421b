//! The language table: Judge0 CE 1.13.1's ids and names, each with the file its source goes
//! to and the commands that compile and run it on this host. The defaults cover what a
//! Debian host may have; each is listed only when the programs it needs exist. An operator's
//! file (`--judge0-languages FILE`, JSON) adds entries or replaces defaults by id, and is
//! checked strictly: every problem is an error that names the entry and the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The language whose submissions are a zip of files with `compile` and `run` scripts.
pub const MULTI_FILE_PROGRAM: &str = "Multi-file program";

/// One language.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Language {
    pub id: u32,
    pub name: String,
    #[serde(default)]
    pub is_archived: bool,
    /// The file the source code is written to, in the working directory. Absent only for
    /// the multi-file program.
    #[serde(default)]
    pub source_file: Option<String>,
    /// A shell command; `%s` is replaced by the submission's compiler options.
    #[serde(default)]
    pub compile_cmd: Option<String>,
    /// A shell command; the submission's command-line arguments are appended.
    #[serde(default)]
    pub run_cmd: Option<String>,
    /// Absolute paths of the programs the commands need; the language is offered only
    /// when all exist. Not part of Judge0's API.
    #[serde(default, skip_serializing)]
    pub requires: Vec<PathBuf>,
}

impl Language {
    /// Judge0's rule: the multi-file program is the language with this name.
    pub fn is_project(&self) -> bool {
        self.name == MULTI_FILE_PROGRAM
    }

    /// The compile command with the (already filtered) compiler options in place of `%s`.
    pub fn compile_command(&self, options: &str) -> Option<String> {
        self.compile_cmd.as_deref().map(|cmd| {
            cmd.replace("%%", "\u{0}")
                .replace("%s", options)
                .replace('\u{0}', "%")
        })
    }
}

/// The operator's file: `{"languages": [...], "replace_defaults": false}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LanguageFile {
    languages: Vec<Language>,
    #[serde(default)]
    replace_defaults: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LanguagesError {
    #[error("--judge0-languages: cannot read {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("--judge0-languages: {0} is not a valid language file")]
    Parse(PathBuf, #[source] serde_json::Error),
    #[error("--judge0-languages: {file}: language {id}: {problem}")]
    Invalid {
        file: PathBuf,
        id: u32,
        problem: String,
    },
}

/// The table the daemon serves.
#[derive(Debug, Clone, Default)]
pub struct Languages {
    by_id: BTreeMap<u32, Language>,
}

impl Languages {
    /// The defaults this host can run, then the operator's file over them.
    pub fn load(file: Option<&Path>) -> Result<Languages, LanguagesError> {
        let mut by_id: BTreeMap<u32, Language> = defaults()
            .into_iter()
            .filter(|l| l.requires.iter().all(|p| is_executable(p)))
            .map(|l| (l.id, l))
            .collect();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| LanguagesError::Read(path.to_owned(), e))?;
            let parsed: LanguageFile = serde_json::from_str(&text)
                .map_err(|e| LanguagesError::Parse(path.to_owned(), e))?;
            if parsed.replace_defaults {
                by_id.clear();
            }
            let mut seen = std::collections::BTreeSet::new();
            for language in parsed.languages {
                let invalid = |problem: String| LanguagesError::Invalid {
                    file: path.to_owned(),
                    id: language.id,
                    problem,
                };
                if !seen.insert(language.id) {
                    return Err(invalid("listed twice".to_owned()));
                }
                if let Some(problem) = problem(&language) {
                    return Err(invalid(problem));
                }
                if let Some(missing) = language.requires.iter().find(|p| !is_executable(p)) {
                    return Err(invalid(format!(
                        "requires {}, which is not an executable file on this host",
                        missing.display()
                    )));
                }
                by_id.insert(language.id, language);
            }
        }
        Ok(Languages { by_id })
    }

    /// A table of exactly these languages (tests).
    pub fn of(languages: Vec<Language>) -> Languages {
        Languages {
            by_id: languages.into_iter().map(|l| (l.id, l)).collect(),
        }
    }

    pub fn get(&self, id: u32) -> Option<&Language> {
        self.by_id.get(&id)
    }

    /// Every language, archived ones too, by name (`GET /languages/all`).
    pub fn all(&self) -> Vec<&Language> {
        let mut all: Vec<&Language> = self.by_id.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        all
    }

    /// The languages submissions may use, by name (`GET /languages`).
    pub fn active(&self) -> Vec<&Language> {
        self.all().into_iter().filter(|l| !l.is_archived).collect()
    }
}

/// What is wrong with an entry, if anything.
fn problem(language: &Language) -> Option<String> {
    if language.id == 0 || language.id > i32::MAX as u32 {
        return Some("id must be between 1 and 2147483647".to_owned());
    }
    if language.name.trim().is_empty() || language.name.chars().any(char::is_control) {
        return Some("name must be non-empty, without control characters".to_owned());
    }
    match (&language.source_file, language.is_project()) {
        (Some(_), true) => {
            return Some(format!(
                "source_file must be absent for the {MULTI_FILE_PROGRAM:?} (its files come in additional_files)"
            ));
        }
        (None, false) => return Some("source_file is required".to_owned()),
        (Some(file), false) if !plain_file_name(file) => {
            return Some(format!(
                "source_file {file:?} must be a plain file name (no `/`, not `.` or `..`)"
            ));
        }
        _ => {}
    }
    if language.run_cmd.is_none() && !language.is_project() {
        return Some("run_cmd is required".to_owned());
    }
    for (field, command) in [
        ("compile_cmd", &language.compile_cmd),
        ("run_cmd", &language.run_cmd),
    ] {
        let Some(command) = command else { continue };
        if command.trim().is_empty() || command.contains(['\0', '\n']) {
            return Some(format!("{field} must be a non-empty command on one line"));
        }
        let directives = command.replace("%%", "");
        if field == "run_cmd" && directives.contains('%') {
            return Some("run_cmd takes no `%` directives (write `%%` for a percent sign)".into());
        }
        if field == "compile_cmd" && directives.replace("%s", "").contains('%') {
            return Some(
                "compile_cmd takes only `%s` (the compiler options); write `%%` for a percent sign"
                    .into(),
            );
        }
    }
    if let Some(relative) = language.requires.iter().find(|p| !p.is_absolute()) {
        return Some(format!(
            "requires {}: paths must be absolute",
            relative.display()
        ));
    }
    None
}

fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains(['/', '\0', '\n'])
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Judge0 CE 1.13.1's ids and names for the toolchains a Debian host may have. Clients
/// hard-code the ids (71, 63, 54, 50, 62, ...), so the names stay Judge0's even where the
/// host's version differs; the commands (`GET /languages/{id}`) show what really runs.
fn defaults() -> Vec<Language> {
    let entry =
        |id: u32, name: &str, source: &str, compile: Option<&str>, run: &str, requires: &[&str]| {
            Language {
                id,
                name: name.to_owned(),
                is_archived: false,
                source_file: Some(source.to_owned()),
                compile_cmd: compile.map(str::to_owned),
                run_cmd: Some(run.to_owned()),
                requires: requires.iter().map(PathBuf::from).collect(),
            }
        };
    let gcc = |id, version: &str| {
        entry(
            id,
            &format!("C (GCC {version})"),
            "main.c",
            Some("/usr/bin/gcc %s main.c"),
            "./a.out",
            &["/usr/bin/gcc"],
        )
    };
    let gxx = |id, version: &str| {
        entry(
            id,
            &format!("C++ (GCC {version})"),
            "main.cpp",
            Some("/usr/bin/g++ %s main.cpp"),
            "./a.out",
            &["/usr/bin/g++"],
        )
    };
    let mut table = vec![
        entry(
            43,
            "Plain Text",
            "text.txt",
            None,
            "/bin/cat text.txt",
            &["/bin/cat"],
        ),
        entry(
            44,
            "Executable",
            "a.out",
            None,
            "/bin/chmod +x a.out && ./a.out",
            &["/bin/chmod"],
        ),
        entry(
            45,
            "Assembly (NASM 2.14.02)",
            "main.asm",
            Some("/usr/bin/nasm -f elf64 %s main.asm && /usr/bin/ld main.o"),
            "./a.out",
            &["/usr/bin/nasm", "/usr/bin/ld"],
        ),
        entry(
            46,
            "Bash (5.0.0)",
            "script.sh",
            None,
            "/bin/bash script.sh",
            &["/bin/bash"],
        ),
        gcc(48, "7.4.0"),
        gcc(49, "8.3.0"),
        gcc(50, "9.2.0"),
        gxx(52, "7.4.0"),
        gxx(53, "8.3.0"),
        gxx(54, "9.2.0"),
        entry(
            60,
            "Go (1.13.5)",
            "main.go",
            Some("GOCACHE=/tmp/.cache/go-build /usr/bin/go build %s main.go"),
            "./main",
            &["/usr/bin/go"],
        ),
        entry(
            62,
            "Java (OpenJDK 13.0.1)",
            "Main.java",
            Some("/usr/bin/javac %s Main.java"),
            "/usr/bin/java Main",
            &["/usr/bin/javac", "/usr/bin/java"],
        ),
        entry(
            63,
            "JavaScript (Node.js 12.14.0)",
            "script.js",
            None,
            "/usr/bin/node script.js",
            &["/usr/bin/node"],
        ),
        entry(
            64,
            "Lua (5.3.5)",
            "script.lua",
            Some("/usr/bin/luac5.3 %s script.lua"),
            "/usr/bin/lua5.3 ./luac.out",
            &["/usr/bin/luac5.3", "/usr/bin/lua5.3"],
        ),
        entry(
            68,
            "PHP (7.4.1)",
            "script.php",
            None,
            "/usr/bin/php script.php",
            &["/usr/bin/php"],
        ),
        entry(
            70,
            "Python (2.7.17)",
            "script.py",
            None,
            "/usr/bin/python2 script.py",
            &["/usr/bin/python2"],
        ),
        entry(
            71,
            "Python (3.8.1)",
            "script.py",
            None,
            "/usr/bin/python3 script.py",
            &["/usr/bin/python3"],
        ),
        entry(
            72,
            "Ruby (2.7.0)",
            "script.rb",
            None,
            "/usr/bin/ruby script.rb",
            &["/usr/bin/ruby"],
        ),
        entry(
            73,
            "Rust (1.40.0)",
            "main.rs",
            Some("/usr/bin/rustc %s main.rs"),
            "./main",
            &["/usr/bin/rustc"],
        ),
        entry(
            82,
            "SQL (SQLite 3.27.2)",
            "script.sql",
            None,
            "/bin/cat script.sql | /usr/bin/sqlite3 db.sqlite",
            &["/usr/bin/sqlite3"],
        ),
        entry(
            85,
            "Perl (5.28.1)",
            "script.pl",
            None,
            "/usr/bin/perl script.pl",
            &["/usr/bin/perl"],
        ),
    ];
    table.push(Language {
        id: 89,
        name: MULTI_FILE_PROGRAM.to_owned(),
        is_archived: false,
        source_file: None,
        compile_cmd: None,
        run_cmd: None,
        requires: vec![PathBuf::from("/usr/bin/unzip")],
    });
    table
}

#[cfg(test)]
#[path = "languages_tests.rs"]
mod tests;
