//! Who a request acts as (`Authorization: Basic base64(user:)` or `?username=`), looked up in
//! `/etc/passwd`, and how request paths resolve (`~` and relative paths against the home).

use std::path::{Path, PathBuf};

use base64::Engine;

use crate::connect::{Code, RpcError, RpcResult};

/// A user from `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl User {
    /// Whether this is the identity the agent runs as (no switch needed).
    pub fn is_current(&self) -> bool {
        self.uid == airlock_jail::child::current_ids().0
    }

    /// Resolves a request path: `~` and `~/x` against the home, relative paths too.
    pub fn resolve(&self, path: &str) -> PathBuf {
        if path == "~" {
            return self.home.clone();
        }
        if let Some(rest) = path.strip_prefix("~/") {
            // `~//x` is `x` in the home, not `/x`: joining an absolute path would replace it.
            return self.home.join(rest.trim_start_matches('/'));
        }
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.home.join(p)
        }
    }
}

/// Reads `/etc/passwd`-format text into users (malformed lines are skipped).
fn parse_passwd(text: &str) -> impl Iterator<Item = User> + '_ {
    text.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 {
            return None;
        }
        Some(User {
            name: fields[0].to_string(),
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: PathBuf::from(fields[5]),
        })
    })
}

fn passwd() -> String {
    std::fs::read_to_string("/etc/passwd").unwrap_or_default()
}

/// The agent's own user: named by its passwd entry (or its uid). Its home is `$HOME` from the
/// agent's environment, which is the sandbox's base environment (the passwd view inside a
/// sandbox is the host's), falling back to the passwd home, then `/`.
pub fn current_user() -> User {
    let (uid, gid) = airlock_jail::child::current_ids();
    let entry = parse_passwd(&passwd()).find(|u| u.uid == uid);
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| entry.as_ref().map(|u| u.home.clone()))
        .unwrap_or_else(|| PathBuf::from("/"));
    User {
        name: entry.map_or_else(|| uid.to_string(), |u| u.name),
        uid,
        gid,
        home,
    }
}

/// Looks a user up by name (or numeric uid).
pub fn lookup(name: &str) -> RpcResult<User> {
    let current = current_user();
    if name == current.name {
        return Ok(current);
    }
    let text = passwd();
    let found = parse_passwd(&text).find(|u| u.name == name).or_else(|| {
        let uid: u32 = name.parse().ok()?;
        parse_passwd(&text).find(|u| u.uid == uid)
    });
    found.ok_or_else(|| RpcError::new(Code::Unauthenticated, format!("invalid user: '{name}'")))
}

/// The user a request names: `Authorization: Basic base64("user:")` if present, else the
/// `username` query parameter, else the agent's own user.
pub fn from_request(authorization: Option<&str>, username: Option<&str>) -> RpcResult<User> {
    if let Some(auth) = authorization {
        let bad = || RpcError::new(Code::Unauthenticated, "malformed Authorization header");
        let encoded = auth
            .strip_prefix("Basic ")
            .or_else(|| auth.strip_prefix("basic "))
            .ok_or_else(bad)?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| bad())?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
        let name = decoded.split(':').next().unwrap_or("");
        if !name.is_empty() {
            return lookup(name);
        }
    }
    match username {
        Some(name) if !name.is_empty() => lookup(name),
        _ => Ok(current_user()),
    }
}

/// Name of a user id for file listings (the number when unknown).
pub fn user_name(uid: u32) -> String {
    parse_passwd(&passwd())
        .find(|u| u.uid == uid)
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// Name of a group id for file listings (the number when unknown).
pub fn group_name(gid: u32) -> String {
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id: u32 = fields.nth(1)?.parse().ok()?;
            Some((name, id))
        })
        .find(|(_, id)| *id == gid)
        .map_or_else(|| gid.to_string(), |(name, _)| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_parse_and_bad_ones_are_skipped() {
        let text =
            "root:x:0:0:root:/root:/bin/bash\nbroken\nuser:x:1000:1001::/home/user:/bin/sh\n";
        let users: Vec<User> = parse_passwd(text).collect();
        assert_eq!(users.len(), 2);
        assert_eq!(users[1].uid, 1000);
        assert_eq!(users[1].gid, 1001);
        assert_eq!(users[1].home, PathBuf::from("/home/user"));
    }

    #[test]
    fn paths_resolve_against_home() {
        let user = User {
            name: "u".into(),
            uid: 1,
            gid: 1,
            home: PathBuf::from("/home/u"),
        };
        assert_eq!(user.resolve("~"), PathBuf::from("/home/u"));
        assert_eq!(user.resolve("~/a b"), PathBuf::from("/home/u/a b"));
        // Found by fuzzing (fuzz/regressions/file_paths/tilde-double-slash).
        assert_eq!(user.resolve("~//etc/x"), PathBuf::from("/home/u/etc/x"));
        assert_eq!(user.resolve("rel/x"), PathBuf::from("/home/u/rel/x"));
        assert_eq!(user.resolve("/abs"), PathBuf::from("/abs"));
    }

    #[test]
    fn a_malformed_authorization_header_is_unauthenticated() {
        let err = from_request(Some("Bearer x"), None).unwrap_err();
        assert_eq!(err.code, Code::Unauthenticated);
        let err = from_request(Some("Basic bm8tc3VjaC11c2VyLXh5ejo="), None).unwrap_err();
        assert!(err.message.contains("no-such-user-xyz"), "{}", err.message);
    }
}
