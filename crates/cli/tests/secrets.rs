//! Secrets under `airlock run`, proven from inside the sandbox with `airlock-probe` and paired
//! with controls outside: masks that follow symlinks, unlistable homes, hard links, secrets
//! written after the start, and the socket buffers that count against the memory limit. (The
//! rest of `airlock run`'s properties are in `sandbox.rs`.) Needs root, like `sandbox.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::fs;

use common::*;

/// The verdict of `airlock-probe read PATH` in a sandbox on `rootfs`.
fn read_in(rootfs: &std::path::Path, path: &str) -> String {
    let root = rootfs.to_str().unwrap();
    airlock(&["run", "--rootfs", root, "--", "/bin/probe", "read", path])
        .verdict()
        .to_owned()
}

#[test]
fn test_run_masks_follow_symlinks_inside_the_view_not_on_the_host() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-symlinked-home");
    fs::create_dir_all(rootfs.join("data/home/alice/.ssh")).unwrap();
    fs::write(rootfs.join("data/home/alice/.ssh/id_rsa"), "KEY").unwrap();
    // An absolute link: on the host it would point at the host's /data/home.
    std::os::unix::fs::symlink("/data/home", rootfs.join("home")).unwrap();
    assert_eq!(
        read_in(&rootfs, "/home/alice/.ssh/id_rsa"),
        "errno 13 EACCES"
    );
    fs::write(rootfs.join("data/home/alice/notes.txt"), "visible").unwrap();
    assert_eq!(
        read_in(&rootfs, "/home/alice/notes.txt"),
        "ok 7",
        "control: the rest of the home is readable"
    );
}

#[test]
fn test_run_socket_buffers_count_against_the_memory_limit() {
    let scratch = Scratch::new();
    let run = inside(&scratch, &["--memory", "64MiB"], &["unix-queue", "512"]);
    assert_eq!(run.code, 137, "{run:?}");
    assert!(run.stderr.contains("memory limit"), "{}", run.stderr);
    assert_eq!(
        outside(&scratch, &["unix-queue", "128"]),
        "ok queued 128 MiB",
        "control"
    );
}

#[test]
fn test_run_an_unlistable_home_is_masked_whole() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-0711-home");
    fs::create_dir_all(rootfs.join("home/carol")).unwrap();
    fs::write(rootfs.join("home/carol/.netrc"), "password SECRET").unwrap();
    set_mode(&rootfs.join("home/carol/.netrc"), 0o644);
    // Searchable but not listable: names can be opened, not enumerated.
    set_mode(&rootfs.join("home"), 0o711);
    assert_eq!(read_in(&rootfs, "/home/carol/.netrc"), "errno 13 EACCES");
    assert_eq!(
        outside(
            &scratch,
            &["read", rootfs.join("home/carol/.netrc").to_str().unwrap()]
        ),
        "ok 15"
    );
}

#[test]
fn test_run_a_hard_linked_secret_is_masked_under_every_name() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-hardlink");
    for user in ["dave", "erin"] {
        fs::create_dir_all(rootfs.join(format!("home/{user}"))).unwrap();
    }
    fs::write(rootfs.join("home/dave/.netrc"), "password SECRET").unwrap();
    set_mode(&rootfs.join("home/dave/.netrc"), 0o644);
    fs::hard_link(
        rootfs.join("home/dave/.netrc"),
        rootfs.join("home/erin/.netrc"),
    )
    .unwrap();
    for user in ["dave", "erin"] {
        let path = format!("/home/{user}/.netrc");
        assert_eq!(read_in(&rootfs, &path), "errno 13 EACCES", "{path}");
    }
}

#[test]
fn test_run_a_secret_written_after_the_start_stays_unreadable() {
    use std::io::{BufRead, BufReader, Read};
    let home = format!("/home/airlock-late-{}", std::process::id());
    fs::create_dir_all(format!("{home}/project")).unwrap();
    let script = format!(
        "echo started; while [ ! -e {home}/project/ready ]; do sleep 0.05; done; \
         cat {home}/.netrc; echo \"netrc=$?\"; cat {home}/project/notes.txt"
    );
    let mut child = std::process::Command::new(airlock_bin())
        .args(["run", "--timeout", "30s", "--", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "started\n");
    // The sandbox is running; only now does the secret appear, where no mask can be.
    fs::write(format!("{home}/.netrc"), "password LATE").unwrap();
    fs::write(format!("{home}/project/notes.txt"), "late but harmless\n").unwrap();
    fs::write(format!("{home}/project/ready"), "").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    fs::remove_dir_all(&home).unwrap();
    assert!(status.success(), "{rest}");
    assert!(!rest.contains("LATE"), "{rest}");
    assert!(rest.contains("netrc=1"), "{rest}");
    assert!(
        rest.ends_with("late but harmless\n"),
        "a new file in an existing directory is readable: {rest}"
    );
}

/// Starts `await-read` in a sandbox on `rootfs`, runs `after_start` once it is running, and
/// returns the verdict line for each path.
fn read_after_start(
    rootfs: &std::path::Path,
    paths: &[&str],
    after_start: impl FnOnce(),
) -> Vec<String> {
    use std::io::{BufRead, BufReader, Read};
    // Under /bin: a new top-level entry of the rootfs would not show in the running view.
    let ready = rootfs.join("bin/ready");
    let root = rootfs.to_str().unwrap();
    let mut args = vec![
        "run",
        "--rootfs",
        root,
        "--timeout",
        "30s",
        "--",
        "/bin/probe",
        "await-read",
        "/bin/ready",
    ];
    args.extend_from_slice(paths);
    let mut child = std::process::Command::new(airlock_bin())
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "started\n");
    after_start();
    fs::write(&ready, "").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    rest.lines()
        .filter(|l| l.starts_with('/'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn test_run_a_symlink_in_a_home_opens_no_way_to_later_secrets() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-linked-home");
    fs::create_dir_all(rootfs.join("home/alice/dotfiles/config")).unwrap();
    // A link to the root, and a dotfile manager's link for ~/.config.
    std::os::unix::fs::symlink("/", rootfs.join("home/alice/rootlink")).unwrap();
    std::os::unix::fs::symlink("dotfiles/config", rootfs.join("home/alice/.config")).unwrap();
    let verdicts = read_after_start(
        &rootfs,
        &[
            "/home/alice/.netrc",
            "/home/alice/rootlink/home/alice/.netrc",
            "/home/alice/.config/gh/hosts.yml",
            "/home/alice/dotfiles/config/gh/hosts.yml",
        ],
        || {
            fs::write(rootfs.join("home/alice/.netrc"), "password LATE").unwrap();
            fs::create_dir_all(rootfs.join("home/alice/dotfiles/config/gh")).unwrap();
            fs::write(
                rootfs.join("home/alice/dotfiles/config/gh/hosts.yml"),
                "token",
            )
            .unwrap();
        },
    );
    assert_eq!(verdicts.len(), 4, "{verdicts:?}");
    for verdict in &verdicts {
        assert!(verdict.ends_with(": errno 13"), "{verdicts:?}");
    }
}

#[test]
fn test_run_a_link_in_an_unlistable_home_still_excludes_its_target() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-unlistable-linked-home");
    fs::create_dir_all(rootfs.join("root")).unwrap();
    fs::create_dir_all(rootfs.join("srv/cfg")).unwrap();
    fs::write(rootfs.join("srv/cfg/notes.txt"), "visible").unwrap();
    // ~/.config lives outside the home, which the sandbox may search but not list: the link
    // is found by its name, and the secret's path under its target is excluded too.
    std::os::unix::fs::symlink("/srv/cfg", rootfs.join("root/.config")).unwrap();
    set_mode(&rootfs.join("root"), 0o711);
    let verdicts = read_after_start(
        &rootfs,
        &[
            "/srv/cfg/gh/hosts.yml",
            "/root/.config/gh/hosts.yml",
            "/srv/cfg/notes.txt",
        ],
        || {
            fs::create_dir_all(rootfs.join("srv/cfg/gh")).unwrap();
            fs::write(rootfs.join("srv/cfg/gh/hosts.yml"), "token").unwrap();
        },
    );
    assert_eq!(
        verdicts,
        [
            "/srv/cfg/gh/hosts.yml: errno 13",
            "/root/.config/gh/hosts.yml: errno 13",
            "/srv/cfg/notes.txt: ok 7",
        ],
        "the last is the control"
    );
}

#[test]
fn test_run_a_file_where_an_exclusion_expects_a_directory_is_read_as_a_file() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs-config-file");
    fs::create_dir_all(rootfs.join("home/alice")).unwrap();
    // `.config` is a file here, so `.config/gh` (an exclusion) cannot exist below it.
    fs::write(rootfs.join("home/alice/.config"), "plain").unwrap();
    set_mode(&rootfs.join("home/alice/.config"), 0o644);
    assert_eq!(read_in(&rootfs, "/home/alice/.config"), "ok 5");
}
