//! Filesystem rule paths: the tokens `:workspace`, `:tmp` and `~`, and where a path lands in
//! the sandbox's view.

/// The workspace and the private scratch area, inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
pub const TMP: &str = "/tmp";
/// Mount points Airlock provides itself; no rule may change what is below them.
const PROVIDED: &[&str] = &["proc", "sys", "dev", "run"];

/// What a rule path starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    Workspace,
    Tmp,
    /// `~`: the sandbox user's `HOME` inside the sandbox.
    Home,
    /// An absolute path in the view.
    Absolute,
}

/// A parsed rule path: a root and the components below it, without `.`, `..` or empty ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPath {
    pub root: Root,
    pub components: Vec<String>,
}

/// Parses a rule path. `*` may be a whole component; whether a rule allows it is the caller's
/// decision.
pub fn parse(text: &str) -> Result<PolicyPath, String> {
    if text.is_empty() {
        return Err("empty path".into());
    }
    if text.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let (root, rest) = if let Some(rest) = text.strip_prefix(":workspace") {
        (Root::Workspace, rest)
    } else if let Some(rest) = text.strip_prefix(":tmp") {
        (Root::Tmp, rest)
    } else if let Some(rest) = text.strip_prefix('~') {
        (Root::Home, rest)
    } else if text.starts_with(':') {
        let token = text.split('/').next().unwrap_or(text);
        return Err(format!(
            "unknown path token `{token}` (known: :workspace, :tmp, ~)"
        ));
    } else if text.starts_with('/') {
        (Root::Absolute, text)
    } else {
        return Err(format!(
            "`{text}` must be absolute or start with :workspace, :tmp or ~"
        ));
    };
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(match root {
            Root::Home => {
                format!("`{text}`: only `~` (the sandbox user's home) is supported, not `~user`")
            }
            _ => format!("`{text}`: a token is followed by `/` or nothing"),
        });
    }
    let mut components = Vec::new();
    for component in rest.split('/').filter(|c| !c.is_empty()) {
        if component == "." || component == ".." {
            return Err(format!("`{text}` contains `{component}`"));
        }
        if component.contains('*') && component != "*" {
            return Err(format!(
                "`{text}`: `*` may only stand for one whole component"
            ));
        }
        components.push(component.to_owned());
    }
    let mut path = PolicyPath { root, components };
    // `/workspace/...` and `/tmp/...` are the same places as the tokens.
    if root == Root::Absolute {
        let first = path.components.first().map(String::as_str);
        let token = match first {
            Some("workspace") => Some(Root::Workspace),
            Some("tmp") => Some(Root::Tmp),
            _ => None,
        };
        if let Some(token) = token {
            path.root = token;
            path.components.remove(0);
        }
    }
    Ok(path)
}

impl PolicyPath {
    /// The root itself (`:workspace`, `~`, `/`).
    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    pub fn has_star(&self) -> bool {
        self.components.iter().any(|c| c == "*")
    }

    /// The absolute path in the sandbox, with `~` standing for `home`.
    pub fn resolve(&self, home: &str) -> String {
        let base = match self.root {
            Root::Workspace => WORKSPACE,
            Root::Tmp => TMP,
            Root::Home => home.trim_end_matches('/'),
            Root::Absolute => "",
        };
        let mut out = base.to_owned();
        for component in &self.components {
            out.push('/');
            out.push_str(component);
        }
        if out.is_empty() { "/".to_owned() } else { out }
    }

    /// Whether the path lies below one of the directories Airlock mounts itself.
    pub fn is_provided(&self) -> bool {
        self.root == Root::Absolute
            && self
                .components
                .first()
                .is_some_and(|first| PROVIDED.contains(&first.as_str()))
    }
}

/// Where an absolute sandbox path lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `/workspace` or below.
    Workspace,
    /// `/tmp` or below.
    Tmp,
    /// Below a directory Airlock provides (`/proc`, `/sys`, `/dev`, `/run`).
    Provided,
    /// The read-only host view.
    Host,
}

/// The area of an absolute sandbox path, and whether it is that area's root.
pub fn area(path: &str) -> (Area, bool) {
    let mut components = path.split('/').filter(|c| !c.is_empty());
    let first = components.next();
    let is_root = components.next().is_none();
    match first {
        Some("workspace") => (Area::Workspace, is_root),
        Some("tmp") => (Area::Tmp, is_root),
        Some(first) if PROVIDED.contains(&first) => (Area::Provided, is_root),
        _ => (Area::Host, first.is_none()),
    }
}

/// Whether mask pattern `pattern` (`*` = one component) covers `path` or an ancestor of it.
pub fn pattern_covers(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    let path: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    pattern.len() <= path.len() && pattern.iter().zip(&path).all(|(p, c)| *p == "*" || p == c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_tokens_resolve_in_the_sandbox() {
        let path = parse(":workspace/.git/hooks").unwrap();
        assert_eq!(path.root, Root::Workspace);
        assert_eq!(path.resolve("/tmp"), "/workspace/.git/hooks");
        assert_eq!(
            parse("~/.ssh").unwrap().resolve("/home/agent"),
            "/home/agent/.ssh"
        );
        assert_eq!(parse("~").unwrap().resolve("/tmp"), "/tmp");
        assert_eq!(parse("/tmp/x").unwrap().root, Root::Tmp);
        assert_eq!(parse("/").unwrap().resolve("/tmp"), "/");
        assert_eq!(parse("/etc//ssl/").unwrap().resolve("/tmp"), "/etc/ssl");
        assert!(parse("/proc/1").unwrap().is_provided());
        assert!(parse("/home/*/.aws").unwrap().has_star());
    }

    #[test]
    fn test_bad_paths_are_named() {
        for (bad, says) in [
            ("", "empty"),
            ("etc", "absolute"),
            (":home/x", "unknown path token `:home`"),
            ("~root/x", "~user"),
            (":workspacex", "followed by"),
            ("/a/../b", "`..`"),
            ("/a/*.env", "whole component"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn test_areas_and_pattern_coverage() {
        assert_eq!(area("/workspace"), (Area::Workspace, true));
        assert_eq!(area("/workspace/a"), (Area::Workspace, false));
        assert_eq!(area("/tmp/.cache"), (Area::Tmp, false));
        assert_eq!(area("/dev/shm"), (Area::Provided, false));
        assert_eq!(area("/etc/passwd"), (Area::Host, false));
        assert_eq!(area("/"), (Area::Host, true));
        assert!(pattern_covers("/home/*/.ssh", "/home/a/.ssh/id_rsa"));
        assert!(!pattern_covers("/home/*/.ssh", "/home/a"));
    }
}
