//! Landlock, through the raw syscalls: a read-only view everywhere, writes only where the plan
//! allows, and (ABI 6) signals and abstract Unix sockets scoped to the sandbox.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

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
    let except = with_symlink_targets(except);
    for path in &plan.read {
        let relative: Vec<Vec<&str>> = except
            .iter()
            .filter_map(|pattern| {
                let pattern: Vec<&str> = pattern.iter().map(String::as_str).collect();
                strip_components(&pattern, path)
            })
            .collect();
        add_read_rules(&ruleset, path, &relative, handled)?;
    }
    for path in &plan.write_trees {
        add_rule(&ruleset, path, write_tree_rights(abi))?;
    }
    for path in &plan.write_files {
        add_rule(
            &ruleset,
            path,
            (READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV) & handled,
        )?;
    }
    // SAFETY: `ruleset` is a live Landlock ruleset descriptor; flags 0.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0) };
    if ret != 0 {
        return Err(LandlockError::RestrictSelf(io::Error::last_os_error()));
    }
    Ok(Applied {
        abi,
        scoped: scoped != 0,
    })
}

/// Most exclusion patterns a view may add through symlinks; a bound on symlink loops.
const MAX_EXCLUSIONS: usize = 256;

/// Adds, for every symlink met on the way along an exclusion pattern (`~/.config` pointing to
/// `~/dotfiles/config`, say), the same exclusion at the link's target, so that the target's own
/// path cannot grant what the pattern withholds.
fn with_symlink_targets(patterns: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let mut all = patterns;
    let mut listings: std::collections::HashMap<std::path::PathBuf, Vec<std::ffi::OsString>> =
        std::collections::HashMap::new();
    // Whether each path met is a symlink (`None`: missing). The patterns share their prefixes
    // (`/root`, every home), and each would otherwise stat them again.
    let mut kinds: std::collections::HashMap<std::path::PathBuf, Option<bool>> =
        std::collections::HashMap::new();
    let mut next_pattern = 0;
    while next_pattern < all.len() && all.len() < MAX_EXCLUSIONS {
        let pattern = all[next_pattern].clone();
        next_pattern += 1;
        let mut prefixes = vec![std::path::PathBuf::from("/")];
        for (depth, component) in pattern.iter().enumerate() {
            let mut next = Vec::new();
            for base in &prefixes {
                if component == "*" {
                    let names = listings.entry(base.clone()).or_insert_with(|| {
                        std::fs::read_dir(base)
                            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
                            .unwrap_or_default()
                    });
                    next.extend(names.iter().map(|name| base.join(name)));
                } else {
                    next.push(base.join(component));
                }
            }
            // One lstat per path: missing ones are dropped, links are resolved.
            let mut links = Vec::new();
            next.retain(|path| {
                let kind = *kinds.entry(path.clone()).or_insert_with(|| {
                    std::fs::symlink_metadata(path)
                        .ok()
                        .map(|meta| meta.file_type().is_symlink())
                });
                if kind == Some(true) {
                    links.push(path.clone());
                }
                kind.is_some()
            });
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
/// nothing beneath it.
fn add_read_rules(
    ruleset: &OwnedFd,
    dir: &Path,
    except: &[Vec<&str>],
    handled: u64,
) -> Result<(), LandlockError> {
    if except.is_empty() {
        return add_rule(ruleset, dir, READ & handled);
    }
    add_rule(ruleset, dir, READ_DIR & handled)?;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        // A symlink needs no rule: its target is reached, and ruled, through its own path. A
        // rule opened through the link would cover the target's whole tree instead.
        if entry.file_type().is_ok_and(|kind| kind.is_symlink()) {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
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
        add_read_rules(ruleset, &dir.join(&*name), &below, handled)?;
    }
    Ok(())
}

/// Allows `rights` beneath `path`. A path that does not exist in this view is skipped: there is
/// nothing there to allow.
fn add_rule(ruleset: &OwnedFd, path: &Path, rights: u64) -> Result<(), LandlockError> {
    let err = |source| LandlockError::AddRule {
        path: path.display().to_string(),
        source,
    };
    let fd = match sys::open_path(path) {
        Ok(fd) => fd,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let is_dir = sys::fstat_is_dir(&fd).map_err(err)?;
    let rights = if is_dir { rights } else { rights & FILE_RIGHTS };
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
        return Err(err(io::Error::last_os_error()));
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
        let all = with_symlink_targets(patterns.clone());
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
