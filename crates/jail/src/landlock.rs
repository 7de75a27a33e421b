//! Landlock, through the raw syscalls: a read-only view everywhere, writes only where the plan
//! allows, and (ABI 6) signals and abstract Unix sockets scoped to the sandbox.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use airlock_policy::LandlockPlan;

use crate::sys;

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const REMOVE_DIR: u64 = 1 << 4;
const REMOVE_FILE: u64 = 1 << 5;
const MAKE_CHAR: u64 = 1 << 6;
const MAKE_DIR: u64 = 1 << 7;
const MAKE_REG: u64 = 1 << 8;
const MAKE_SOCK: u64 = 1 << 9;
const MAKE_FIFO: u64 = 1 << 10;
const MAKE_BLOCK: u64 = 1 << 11;
const MAKE_SYM: u64 = 1 << 12;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;

const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

const READ: u64 = EXECUTE | READ_FILE | READ_DIR;
/// Rights that apply to a file rather than a directory.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

/// Why Landlock could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error(
        "Landlock is not supported by this kernel (needs Linux 5.13 with landlock in the lsm= list)"
    )]
    Unsupported,
    #[error("creating the Landlock ruleset failed")]
    CreateRuleset(#[source] io::Error),
    #[error("adding the Landlock rule for {path} failed")]
    AddRule {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("enforcing the Landlock ruleset failed")]
    RestrictSelf(#[source] io::Error),
}

/// The kernel's Landlock ABI version, or `None` when Landlock is off.
pub fn abi_version() -> Option<u32> {
    // SAFETY: with a null attribute, size 0 and the VERSION flag, the call only returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(ret).ok().filter(|&v| v > 0)
}

/// Every filesystem right the kernel of `abi` knows.
fn handled_fs(abi: u32) -> u64 {
    let mut rights = EXECUTE
        | WRITE_FILE
        | READ_FILE
        | READ_DIR
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_CHAR
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_BLOCK
        | MAKE_SYM;
    if abi >= 2 {
        rights |= REFER;
    }
    if abi >= 3 {
        rights |= TRUNCATE;
    }
    if abi >= 5 {
        rights |= IOCTL_DEV;
    }
    rights
}

/// Rights granted on writable trees. Device nodes cannot be created there: MAKE_CHAR and
/// MAKE_BLOCK stay denied.
fn write_tree_rights(abi: u32) -> u64 {
    handled_fs(abi) & !(MAKE_CHAR | MAKE_BLOCK)
}

/// What [`apply`] enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub abi: u32,
    pub scoped: bool,
}

/// Restricts the calling thread, and every process it later creates, to `plan`.
pub fn apply(plan: &LandlockPlan) -> Result<Applied, LandlockError> {
    let abi = abi_version().ok_or(LandlockError::Unsupported)?;
    let handled = handled_fs(abi);
    let scoped = if plan.scoped && abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    };
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }
    let attr = RulesetAttr {
        handled_access_fs: handled,
        handled_access_net: 0,
        scoped,
    };
    // Older kernels know a shorter struct; pass only the fields they understand.
    let size = if abi >= 6 {
        24usize
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` is valid for `size` bytes; the returned descriptor is new and ours.
    let fd = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, &attr, size, 0) };
    if fd < 0 {
        return Err(LandlockError::CreateRuleset(io::Error::last_os_error()));
    }
    // SAFETY: the kernel returned a fresh descriptor.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let mut rules = Rules {
        ruleset,
        opened: Vec::new(),
    };
    let mut listings = Listings::default();
    let except: Vec<Vec<String>> = plan
        .read_except
        .iter()
        .map(|pattern| {
            pattern
                .split('/')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect();
    let except = with_symlink_targets(except, &mut listings);
    for path in &plan.read {
        let relative: Vec<Vec<&str>> = except
            .iter()
            .filter_map(|pattern| {
                let pattern: Vec<&str> = pattern.iter().map(String::as_str).collect();
                strip_components(&pattern, path)
            })
            .collect();
        add_read_rules(&mut rules, &mut listings, path, PLANNED, &relative, handled)?;
    }
    for path in &plan.write_trees {
        rules.add(path, PLANNED, write_tree_rights(abi))?;
    }
    for path in &plan.write_files {
        rules.add(
            path,
            PLANNED,
            (READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV) & handled,
        )?;
    }
    rules.restrict()?;
    Ok(Applied {
        abi,
        scoped: scoped != 0,
    })
}

/// Most exclusion patterns a view may add through symlinks; a bound on symlink loops.
const MAX_EXCLUSIONS: usize = 256;

/// What a directory entry is, from the listing's `d_type` (no `stat` per entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Symlink,
    Other,
    Unknown,
}

/// A path of the plan itself: of unknown kind, and followed if it is a link.
const PLANNED: (Kind, bool) = (Kind::Unknown, true);

#[derive(Debug, Clone)]
struct Entry {
    name: OsString,
    kind: Kind,
}

/// The directories read during one [`apply`]: the exclusion walk and the rule walk read the
/// same ones (`/`, each home), and each syscall here is paid on every sandbox start.
#[derive(Default)]
struct Listings {
    /// `None`: the directory cannot be listed.
    listed: HashMap<PathBuf, Option<Vec<Entry>>>,
    /// Whether each path looked up in an unlistable directory exists and is a symlink.
    looked_up: HashMap<PathBuf, Option<bool>>,
    /// Unlistable directories whose names cannot be looked up either (no search permission).
    unsearchable: HashSet<PathBuf>,
}

impl Listings {
    fn list(&mut self, dir: &Path) -> Option<&[Entry]> {
        self.listed
            .entry(dir.to_path_buf())
            .or_insert_with(|| {
                let entries = std::fs::read_dir(dir).ok()?;
                let kind = |entry: &std::fs::DirEntry| match entry.file_type() {
                    Ok(kind) if kind.is_symlink() => Kind::Symlink,
                    Ok(kind) if kind.is_dir() => Kind::Dir,
                    Ok(_) => Kind::Other,
                    Err(_) => Kind::Unknown,
                };
                Some(
                    entries
                        .flatten()
                        .map(|entry| Entry {
                            kind: kind(&entry),
                            name: entry.file_name(),
                        })
                        .collect(),
                )
            })
            .as_deref()
    }

    /// Whether `dir/name` exists (`Some`) and is a symlink: from `dir`'s listing, or, when
    /// `dir` cannot be listed but may still be searched (mode 0711), from an `lstat`.
    fn is_symlink(&mut self, dir: &Path, name: &str) -> Option<bool> {
        if let Some(entries) = self.list(dir) {
            let entry = entries.iter().find(|entry| entry.name == name)?;
            return Some(entry.kind == Kind::Symlink);
        }
        if self.unsearchable.contains(dir) {
            return None;
        }
        let path = dir.join(name);
        if let Some(known) = self.looked_up.get(&path) {
            return *known;
        }
        let found = match std::fs::symlink_metadata(&path) {
            Ok(meta) => Some(meta.file_type().is_symlink()),
            Err(e) => {
                // No search permission on `dir` fails every name in it the same way.
                if e.raw_os_error() == Some(libc::EACCES) {
                    self.unsearchable.insert(dir.to_path_buf());
                }
                None
            }
        };
        self.looked_up.insert(path, found);
        found
    }
}

/// Adds, for every symlink met on the way along an exclusion pattern (`~/.config` pointing to
/// `~/dotfiles/config`, say), the same exclusion at the link's target, so that the target's own
/// path cannot grant what the pattern withholds.
fn with_symlink_targets(patterns: Vec<Vec<String>>, listings: &mut Listings) -> Vec<Vec<String>> {
    let mut all = patterns;
    let mut next_pattern = 0;
    while next_pattern < all.len() && all.len() < MAX_EXCLUSIONS {
        let pattern = all[next_pattern].clone();
        next_pattern += 1;
        let mut prefixes = vec![PathBuf::from("/")];
        for (depth, component) in pattern.iter().enumerate() {
            let mut next = Vec::new();
            let mut links = Vec::new();
            for base in &prefixes {
                if component == "*" {
                    for entry in listings.list(base).unwrap_or_default() {
                        if entry.kind == Kind::Symlink {
                            links.push(base.join(&entry.name));
                        }
                        next.push(base.join(&entry.name));
                    }
                } else if let Some(is_link) = listings.is_symlink(base, component) {
                    if is_link {
                        links.push(base.join(component));
                    }
                    next.push(base.join(component));
                }
            }
            for path in &links {
                let Ok(target) = std::fs::canonicalize(path) else {
                    continue;
                };
                let mut alias = normal_components(&target);
                alias.extend(pattern[depth + 1..].iter().cloned());
                if !alias.is_empty() && !all.contains(&alias) {
                    all.push(alias);
                }
            }
            prefixes = next;
        }
    }
    all
}

/// The names along `path`, without its root or any `.` and `..`.
fn normal_components(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            std::path::Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// `pattern` relative to `base`, if it lies beneath it.
fn strip_components<'a>(pattern: &[&'a str], base: &Path) -> Option<Vec<&'a str>> {
    let base = normal_components(base);
    if pattern.len() <= base.len() {
        return None;
    }
    let matches = base.iter().zip(pattern).all(|(b, p)| *p == "*" || p == b);
    matches.then(|| pattern[base.len()..].to_vec())
}

/// Allows reading beneath `dir`, except beneath the `except` patterns (relative to `dir`). A
/// Landlock rule covers a whole tree, so `dir` gets one only when nothing is excluded below it;
/// otherwise it may be listed, and each child is handled in turn. Names created later under a
/// split directory get no rule, so their contents cannot be read: a secret written on the host
/// after the sandbox started stays out of reach. A directory this process cannot list grants
/// nothing beneath it. Nothing lies beneath a file, so a file where a pattern expects a
/// directory (a plain `~/.config`) is read like any other.
fn add_read_rules(
    rules: &mut Rules,
    listings: &mut Listings,
    dir: &Path,
    target: (Kind, bool),
    except: &[Vec<&str>],
    handled: u64,
) -> Result<(), LandlockError> {
    if except.is_empty() || target.0 == Kind::Other {
        return rules.add(dir, target, READ & handled);
    }
    rules.add(dir, target, READ_DIR & handled)?;
    let Some(entries) = listings.list(dir).map(<[Entry]>::to_vec) else {
        return Ok(());
    };
    for entry in entries {
        // A symlink needs no rule: its target is reached, and ruled, through its own path. A
        // rule opened through the link would cover the target's whole tree instead.
        if entry.kind == Kind::Symlink {
            continue;
        }
        let name = entry.name.to_string_lossy();
        let below: Vec<Vec<&str>> = except
            .iter()
            .filter(|pattern| {
                pattern
                    .first()
                    .is_some_and(|first| *first == "*" || *first == name)
            })
            .map(|pattern| pattern[1..].to_vec())
            .collect();
        if below.iter().any(Vec::is_empty) {
            // This very entry is excluded.
            continue;
        }
        add_read_rules(
            rules,
            listings,
            &dir.join(&entry.name),
            (entry.kind, false),
            &below,
            handled,
        )?;
    }
    Ok(())
}

/// A ruleset being filled, and the descriptors its rules were added through.
struct Rules {
    ruleset: OwnedFd,
    /// Closed together once the ruleset is enforced: a few `close_range` calls, not one
    /// `close` per rule.
    opened: Vec<OwnedFd>,
}

impl Rules {
    /// Allows `rights` beneath `path`. A path that does not exist in this view is skipped:
    /// there is nothing there to allow. `kind` is what the path's directory listing said it
    /// is, and a link is followed only if `follow` (the plan's own paths); no `fstat` is needed
    /// unless the kernel refuses directory rights on a file.
    fn add(
        &mut self,
        path: &Path,
        (kind, follow): (Kind, bool),
        rights: u64,
    ) -> Result<(), LandlockError> {
        let err = |source| LandlockError::AddRule {
            path: path.display().to_string(),
            source,
        };
        let file_rights = rights & FILE_RIGHTS;
        let first = if kind == Kind::Dir || kind == Kind::Unknown {
            rights
        } else {
            file_rights
        };
        if first == 0 {
            // Only the right to list, on something listed as a file: nothing to allow.
            return Ok(());
        }
        let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
        let fd = match sys::open_path_with(path, nofollow) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) => {
                return Ok(());
            }
            Err(e) => return Err(err(e)),
        };
        match add_rule(&self.ruleset, &fd, first) {
            // Directory rights on something else (the listing was stale, or the plan names
            // a file): only the file's rights apply, as they would have with an `fstat`. None
            // of them (only the right to list) is no rule at all.
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    && first != file_rights
                    && !sys::fstat_is_dir(&fd).map_err(err)? =>
            {
                if file_rights != 0 {
                    add_rule(&self.ruleset, &fd, file_rights).map_err(err)?;
                }
            }
            other => other.map_err(err)?,
        }
        self.opened.push(fd);
        Ok(())
    }

    fn restrict(self) -> Result<(), LandlockError> {
        // SAFETY: `ruleset` is a live Landlock ruleset descriptor; flags 0.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0,
            )
        };
        if ret != 0 {
            return Err(LandlockError::RestrictSelf(io::Error::last_os_error()));
        }
        sys::close_all(self.opened);
        Ok(())
    }
}

fn add_rule(ruleset: &OwnedFd, fd: &OwnedFd, rights: u64) -> io::Result<()> {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let attr = PathBeneath {
        allowed_access: rights,
        parent_fd: fd.as_raw_fd(),
    };
    // SAFETY: `attr` is a valid packed landlock_path_beneath_attr and both descriptors are live.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr,
            0,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_landlock_rights_grow_with_abi() {
        assert_eq!(handled_fs(1) & (REFER | TRUNCATE | IOCTL_DEV), 0);
        assert_ne!(handled_fs(2) & REFER, 0);
        assert_ne!(handled_fs(3) & TRUNCATE, 0);
        assert_ne!(handled_fs(5) & IOCTL_DEV, 0);
    }

    #[test]
    fn test_landlock_exclusions_are_taken_relative_to_the_read_root() {
        let pattern = ["home", "*", ".ssh"];
        assert_eq!(
            strip_components(&pattern, Path::new("/")),
            Some(vec!["home", "*", ".ssh"])
        );
        assert_eq!(
            strip_components(&pattern, Path::new("/home")),
            Some(vec!["*", ".ssh"])
        );
        assert_eq!(
            strip_components(&pattern, Path::new("/home/alice")),
            Some(vec![".ssh"])
        );
        assert_eq!(strip_components(&pattern, Path::new("/usr")), None);
        assert_eq!(
            strip_components(&pattern, Path::new("/home/alice/.ssh")),
            None
        );
    }

    #[test]
    fn test_landlock_exclusions_follow_each_symlink_on_shared_prefixes() {
        // Two homes; one's `.config` is a link to its dotfiles. Every pattern through the link
        // (they share the prefixes the lookups are remembered by) gains its alias, and a
        // missing path adds nothing.
        let base = std::env::temp_dir().join(format!("airlock-ll-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for dir in ["home/alice/dotfiles/config", "home/bob/.config"] {
            std::fs::create_dir_all(base.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink("dotfiles/config", base.join("home/alice/.config")).unwrap();
        let patterns: Vec<Vec<String>> =
            ["home/*/.config/gh", "home/*/.config/gcloud", "home/*/.aws"]
                .into_iter()
                .map(|tail| normal_components(&base.join(tail)))
                .collect();
        let all = with_symlink_targets(patterns.clone(), &mut Listings::default());
        let canonical = base.canonicalize().unwrap();
        let mut expected = patterns;
        for tail in ["gh", "gcloud"] {
            expected.push(normal_components(
                &canonical.join("home/alice/dotfiles/config").join(tail),
            ));
        }
        assert_eq!(all, expected);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn test_landlock_writable_trees_cannot_make_devices() {
        let rights = write_tree_rights(7);
        assert_eq!(rights & (MAKE_CHAR | MAKE_BLOCK), 0);
        assert_ne!(rights & (MAKE_REG | MAKE_DIR | REMOVE_FILE | WRITE_FILE), 0);
    }
}
