//! An image's `User` (`name[:group]`, `uid[:gid]`, or a mix) resolved against the image's own
//! `/etc/passwd` and `/etc/group`, as runc and Docker resolve it. Pure: the jail reads the two
//! files inside the sandbox's root (bounded, regular files only) and hands their text here.
//! The files are the image's, so untrusted: malformed lines are skipped, ids are range-checked
//! and the number of supplementary groups is bounded.

use airlock_api::sandbox::MAX_SANDBOX_ID;

/// The most supplementary groups a resolved user gets.
pub const MAX_GROUPS: usize = 64;
/// The most bytes of `/etc/passwd` or `/etc/group` that are read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// The user a sandbox's workload runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    /// The home directory of the user's `/etc/passwd` entry, if it has one.
    pub home: Option<String>,
    /// Supplementary groups: those of `/etc/group` that list the user by name, when the spec
    /// names no group.
    pub groups: Vec<u32>,
}

/// Why an image's user cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserLookupError {
    #[error("user `{0}` is not in the image's /etc/passwd")]
    NoSuchUser(String),
    #[error("group `{0}` is not in the image's /etc/group")]
    NoSuchGroup(String),
    #[error("id {0} is outside the sandbox's range 0..=65535")]
    OutOfRange(u64),
    #[error("`{0}` is not a user: give name[:group] or uid[:gid]")]
    BadSpec(String),
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u64,
    gid: u64,
    home: &'a str,
}

fn passwd_entries(text: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    text.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0].is_empty() || fields[0].starts_with(['#', '+', '-']) {
            return None;
        }
        Some(PasswdEntry {
            name: fields[0],
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: fields[5],
        })
    })
}

struct GroupEntry<'a> {
    name: &'a str,
    gid: u64,
    members: &'a str,
}

fn group_entries(text: &str) -> impl Iterator<Item = GroupEntry<'_>> {
    text.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || fields[0].is_empty() || fields[0].starts_with(['#', '+', '-']) {
            return None;
        }
        Some(GroupEntry {
            name: fields[0],
            gid: fields[2].parse().ok()?,
            members: fields[3],
        })
    })
}

fn in_range(id: u64) -> Result<u32, UserLookupError> {
    u32::try_from(id)
        .ok()
        .filter(|id| *id <= MAX_SANDBOX_ID)
        .ok_or(UserLookupError::OutOfRange(id))
}

fn is_numeric(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Resolves `spec` (`None`: `default`, the numeric user the caller configured) against the
/// image's files (`None` when the image has no such file).
pub fn resolve(
    spec: Option<&str>,
    default: (u32, u32),
    passwd: Option<&str>,
    group: Option<&str>,
) -> Result<ResolvedUser, UserLookupError> {
    let passwd = passwd.unwrap_or("");
    let group = group.unwrap_or("");
    let (user_part, group_part) = match spec {
        None => (None, None),
        Some(spec) => {
            let (user, group) = match spec.split_once(':') {
                Some((user, group)) => (user, Some(group)),
                None => (spec, None),
            };
            if user.is_empty() || group.is_some_and(str::is_empty) || spec.contains('\0') {
                return Err(UserLookupError::BadSpec(spec.to_owned()));
            }
            (Some(user), group)
        }
    };
    let entry = match user_part {
        None => passwd_entries(passwd).find(|e| e.uid == u64::from(default.0)),
        Some(user) if is_numeric(user) => {
            let uid: u64 = user
                .parse()
                .map_err(|_| UserLookupError::OutOfRange(u64::MAX))?;
            passwd_entries(passwd).find(|e| e.uid == uid)
        }
        Some(name) => Some(
            passwd_entries(passwd)
                .find(|e| e.name == name)
                .ok_or_else(|| UserLookupError::NoSuchUser(name.to_owned()))?,
        ),
    };
    let uid = match user_part {
        None => default.0,
        Some(user) if is_numeric(user) => in_range(
            user.parse()
                .map_err(|_| UserLookupError::OutOfRange(u64::MAX))?,
        )?,
        Some(_) => in_range(entry.as_ref().map_or(0, |e| e.uid))?,
    };
    let gid = match group_part {
        Some(group_name) if is_numeric(group_name) => in_range(
            group_name
                .parse()
                .map_err(|_| UserLookupError::OutOfRange(u64::MAX))?,
        )?,
        Some(group_name) => in_range(
            group_entries(group)
                .find(|g| g.name == group_name)
                .ok_or_else(|| UserLookupError::NoSuchGroup(group_name.to_owned()))?
                .gid,
        )?,
        // A numeric user without an entry gets group 0, as with Docker.
        None if user_part.is_none() => default.1,
        None => in_range(entry.as_ref().map_or(0, |e| e.gid))?,
    };
    let mut groups = Vec::new();
    if group_part.is_none()
        && let Some(entry) = &entry
    {
        for candidate in group_entries(group) {
            if groups.len() == MAX_GROUPS {
                break;
            }
            let member = candidate.members.split(',').any(|m| m.trim() == entry.name);
            if member
                && let Ok(id) = in_range(candidate.gid)
                && id != gid
                && !groups.contains(&id)
            {
                groups.push(id);
            }
        }
    }
    Ok(ResolvedUser {
        uid,
        gid,
        home: entry
            .as_ref()
            .map(|e| e.home.to_owned())
            .filter(|h| h.starts_with('/')),
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
        # a comment\n\
        broken line\n\
        alice:x:1000:1000:Alice:/home/alice:/bin/sh\n\
        bob:x:1001:100::/home/bob:/bin/sh\n\
        huge:x:70000:70000::/:/bin/sh\n\
        nohome:x:1002:1002::relative:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:alice,bob\nusers:x:100:\nalice:x:1000:\n\
        wheel:x:10:alice\nbig:x:99999:alice\n";

    fn lookup(spec: Option<&str>) -> Result<ResolvedUser, UserLookupError> {
        resolve(spec, (0, 0), Some(PASSWD), Some(GROUP))
    }

    #[test]
    fn test_image_user_name_takes_its_ids_home_and_groups() {
        let alice = lookup(Some("alice")).unwrap();
        assert_eq!((alice.uid, alice.gid), (1000, 1000));
        assert_eq!(alice.home.as_deref(), Some("/home/alice"));
        assert_eq!(
            alice.groups,
            vec![50, 10],
            "out-of-range gid 99999 is skipped"
        );
    }

    #[test]
    fn test_image_user_group_part_wins_and_drops_supplementary_groups() {
        let named = lookup(Some("alice:staff")).unwrap();
        assert_eq!((named.uid, named.gid, named.groups.len()), (1000, 50, 0));
        let numeric = lookup(Some("bob:7")).unwrap();
        assert_eq!((numeric.uid, numeric.gid), (1001, 7));
    }

    #[test]
    fn test_image_user_numeric_without_entry_gets_group_zero() {
        let user = lookup(Some("4242")).unwrap();
        assert_eq!((user.uid, user.gid, user.home), (4242, 0, None));
        let known = lookup(Some("1001")).unwrap();
        assert_eq!((known.gid, known.home.as_deref()), (100, Some("/home/bob")));
    }

    #[test]
    fn test_image_user_default_keeps_the_callers_ids_and_finds_home() {
        let user = resolve(None, (1000, 5), Some(PASSWD), Some(GROUP)).unwrap();
        assert_eq!((user.uid, user.gid), (1000, 5));
        assert_eq!(user.home.as_deref(), Some("/home/alice"));
        let root = resolve(None, (0, 0), None, None).unwrap();
        assert_eq!((root.uid, root.gid, root.home), (0, 0, None));
    }

    #[test]
    fn test_image_user_errors_name_the_problem() {
        assert_eq!(
            lookup(Some("mallory")),
            Err(UserLookupError::NoSuchUser("mallory".into()))
        );
        assert_eq!(
            lookup(Some("alice:nogroup")),
            Err(UserLookupError::NoSuchGroup("nogroup".into()))
        );
        assert_eq!(
            lookup(Some("huge")),
            Err(UserLookupError::OutOfRange(70000))
        );
        assert_eq!(
            lookup(Some("99999999999999999999999")),
            Err(UserLookupError::OutOfRange(u64::MAX))
        );
        for bad in ["", ":x", "alice:"] {
            assert_eq!(lookup(Some(bad)), Err(UserLookupError::BadSpec(bad.into())));
        }
        assert_eq!(lookup(Some("nohome")).unwrap().home, None);
    }
}
