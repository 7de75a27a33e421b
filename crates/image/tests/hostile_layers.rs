//! The layer applier against hostile layers and a well-formed one, as root (the store's
//! case: image owners and `trusted.*` xattrs need it). Every hostile layer is applied in a
//! scratch tree by `airlock_image::fuzzing::apply_confined`, which compares everything outside
//! the layer's directory before and after: each test asserts that nothing changed there and
//! no device node or FIFO exists inside, then what the applier did or refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use airlock_image::fuzzing::{CANARY, Confined, TarWriter, apply_confined, hostile_layers};
use airlock_image::layer::{ApplyError, Limits, Refusal};

fn is_root() -> bool {
    airlock_jail::host::effective_uid() == 0
}

fn layer(name: &str) -> Vec<u8> {
    hostile_layers()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no hostile layer {name}"))
        .1
}

fn confined(name: &str, limits: &Limits) -> Confined {
    let confined = apply_confined(&layer(name), limits);
    assert!(
        confined.escapes.is_empty(),
        "{name} wrote outside its directory: {:?}",
        confined.escapes
    );
    assert!(
        confined.specials.is_empty(),
        "{name} created special files: {:?}",
        confined.specials
    );
    confined
}

fn refusal(confined: &Confined) -> (String, Refusal) {
    match &confined.result {
        Err(ApplyError::Refused { entry, problem, .. }) => (entry.to_string(), problem.clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn xattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let file = fs::File::open(path).unwrap();
    airlock_jail::beneath::get_xattr(file.as_fd(), name).unwrap()
}

#[test]
fn test_every_hostile_layer_writes_nothing_outside() {
    for (name, _) in hostile_layers() {
        let limits = Limits {
            max_entries: 1000,
            ..Limits::default()
        };
        let _ = confined(name, &limits);
    }
}

#[test]
fn test_symlink_escape_then_write_lands_inside() {
    let c = confined("symlink-escape-then-write", &Limits::default());
    // `esc -> ../../..` resolves to the layer root, so `esc/escaped` is the root's `escaped`.
    assert_eq!(fs::read(c.root.join("escaped")).unwrap(), b"x");
    // `abs -> /tmp` points at a directory this layer lacks: the write is refused, by name.
    let (entry, problem) = refusal(&c);
    assert_eq!(entry, "abs/airlock-layer-canary");
    assert_eq!(problem, Refusal::ParentNotDirectory);
    assert!(fs::symlink_metadata(CANARY).is_err());
}

#[test]
fn test_symlink_chain_escape_clamped_to_root() {
    let c = confined("symlink-chain-escape", &Limits::default());
    c.result.as_ref().unwrap();
    assert_eq!(fs::read(c.root.join("escaped")).unwrap(), b"x");
}

#[test]
fn test_hard_links_outside_refused() {
    for name in ["hard-link-absolute", "hard-link-through-symlink"] {
        let c = confined(name, &Limits::default());
        assert!(matches!(refusal(&c).1, Refusal::LinkTarget(_)), "{name}");
    }
    let c = confined("hard-link-dot-dot", &Limits::default());
    assert_eq!(refusal(&c).1, Refusal::DotDot);
    assert_eq!(fs::metadata("/etc/passwd").unwrap().nlink(), 1);
}

#[test]
fn test_dot_dot_paths_refused_by_name() {
    let c = confined("dot-dot-path", &Limits::default());
    assert_eq!(refusal(&c), ("../escaped".to_owned(), Refusal::DotDot));
    let c = confined("dot-dot-inside-path", &Limits::default());
    assert_eq!(refusal(&c), ("a/../../escaped".to_owned(), Refusal::DotDot));
}

#[test]
fn test_absolute_paths_normalised_inside() {
    let c = confined("absolute-path", &Limits::default());
    c.result.as_ref().unwrap();
    assert_eq!(
        fs::read(c.root.join("tmp/airlock-layer-canary")).unwrap(),
        b"x"
    );
    assert_eq!(
        fs::read(c.root.join("etc/airlock-layer-canary")).unwrap(),
        b"x"
    );
    assert!(fs::symlink_metadata("/etc/airlock-layer-canary").is_err());
}

#[test]
fn test_whiteout_of_dot_dot_refused() {
    let c = confined("whiteout-of-dot-dot", &Limits::default());
    assert!(matches!(refusal(&c), (entry, Refusal::BadWhiteout(_)) if entry == "dir/.wh..."));
}

#[test]
fn test_opaque_markers_become_xattrs() {
    if !is_root() {
        return;
    }
    let c = confined("opaque-at-root-and-below", &Limits::default());
    c.result.as_ref().unwrap();
    assert_eq!(
        xattr(&c.root.join("deep/er"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert!(!c.root.join("deep/er/.wh..wh..opq").exists());
}

#[test]
fn test_devices_and_fifos_skipped_with_warnings() {
    let c = confined("device-node", &Limits::default());
    let report = c.result.as_ref().unwrap();
    let skipped = |report: &airlock_image::layer::LayerReport| {
        report
            .warnings
            .iter()
            .filter(|w| w.contains("device node or FIFO"))
            .count()
    };
    assert_eq!(skipped(report), 3);
    assert!(report.warnings.iter().any(|w| w.contains("dev/kmsg")));
    assert!(fs::symlink_metadata(c.root.join("dev/kmsg")).is_err());
    let c = confined("fifo", &Limits::default());
    assert_eq!(skipped(c.result.as_ref().unwrap()), 1);
    assert!(fs::symlink_metadata(c.root.join("pipe")).is_err());
}

#[test]
fn test_directory_replaced_by_symlink_then_written_below() {
    let c = confined("dir-replaced-by-symlink-then-write", &Limits::default());
    c.result.as_ref().unwrap();
    assert!(
        fs::symlink_metadata(c.root.join("d"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // `d/escaped` followed the new link to the layer root, never above it.
    assert_eq!(fs::read(c.root.join("escaped")).unwrap(), b"x");
    assert!(c.root.join("sub").is_dir());
    assert!(!c.root.join("inside").exists());
}

#[test]
fn test_file_replaced_by_symlink_then_rewritten() {
    let c = confined("file-replaced-by-symlink-then-write", &Limits::default());
    c.result.as_ref().unwrap();
    let meta = fs::symlink_metadata(c.root.join("f")).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(fs::read(c.root.join("f")).unwrap(), b"overwrite");
    assert!(fs::symlink_metadata(CANARY).is_err());
}

#[test]
fn test_trusted_xattr_refused() {
    let c = confined("trusted-xattr", &Limits::default());
    assert_eq!(
        refusal(&c).1,
        Refusal::OverlayXattr("trusted.overlay.opaque".to_owned())
    );
}

#[test]
fn test_limits_name_the_entry() {
    let c = confined("overlong-path", &Limits::default());
    assert!(matches!(
        refusal(&c).1,
        Refusal::PathTooLong { max: 4096, .. }
    ));
    let c = confined("overlong-component", &Limits::default());
    assert_eq!(refusal(&c).1, Refusal::NameTooLong);
    let c = confined(
        "huge-file-count",
        &Limits {
            max_entries: 1000,
            ..Limits::default()
        },
    );
    match &c.result {
        Err(ApplyError::TooManyEntries { entry, max: 1000 }) => {
            assert_eq!(entry.to_string(), "f1000")
        }
        other => panic!("{other:?}"),
    }
    let c = confined(
        "huge-file-count",
        &Limits {
            max_layer_bytes: 100 * 512,
            ..Limits::default()
        },
    );
    assert!(
        matches!(
            &c.result,
            Err(ApplyError::TooLarge {
                max_bytes: 51200,
                ..
            })
        ),
        "{:?}",
        c.result
    );
    let c = confined("huge-file-count", &Limits::default());
    assert_eq!(c.result.as_ref().unwrap().entries, 2000);
}

#[test]
fn test_bad_headers_refused() {
    if is_root() {
        let c = confined("high-uid", &Limits::default());
        assert_eq!(
            refusal(&c).1,
            Refusal::Id {
                what: "uid",
                id: 4_294_967_294
            }
        );
    }
    let c = confined("nul-in-symlink-target", &Limits::default());
    assert_eq!(refusal(&c).1, Refusal::Nul);
    let c = confined("pax-size-mismatch", &Limits::default());
    assert!(matches!(
        refusal(&c).1,
        Refusal::PaxSize {
            pax: 999_999_999,
            header: 1
        }
    ));
}

#[test]
fn test_well_formed_layer_keeps_metadata() {
    if !is_root() {
        return;
    }
    let mut tar = TarWriter::new();
    tar.dir("./")
        .dir("etc")
        .file("etc/.wh.motd", b"")
        .dir("usr/share/doc")
        .file("usr/share/doc/.wh..wh..opq", b"")
        .file("usr/share/doc/new", b"new")
        .pax(&[
            ("uid", b"1000"),
            ("gid", b"1001"),
            ("mtime", b"1600000000.5"),
        ])
        .entry(b'0', b"bin/su", b"", 0o4755, b"#!/bin/sh\n")
        .pax(&[
            ("SCHILY.xattr.user.note", b"kept"),
            ("SCHILY.xattr.security.selinux", b"x"),
        ])
        .file("etc/conf", b"c")
        .hard_link("etc/conf-link", "etc/conf")
        .symlink("etc/abs", "/usr/share/doc/new")
        .entry(b'5', b"tmp", b"", 0o1777, b"");
    let c = apply_confined(&tar.finish(), &Limits::default());
    assert!(c.escapes.is_empty() && c.specials.is_empty());
    let report = c.result.as_ref().unwrap();
    assert_eq!(report.warning_count, 1, "{:?}", report.warnings);
    let motd = fs::symlink_metadata(c.root.join("etc/motd")).unwrap();
    assert!(motd.file_type().is_char_device() && motd.rdev() == 0);
    assert_eq!(
        xattr(&c.root.join("usr/share/doc"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    let su = fs::metadata(c.root.join("bin/su")).unwrap();
    assert_eq!(
        (su.uid(), su.gid(), su.mode() & 0o7777, su.mtime()),
        (1000, 1001, 0o4755, 1_600_000_000)
    );
    assert_eq!(su.mtime_nsec(), 500_000_000);
    assert_eq!(fs::metadata(c.root.join("etc/conf")).unwrap().nlink(), 2);
    assert_eq!(
        xattr(&c.root.join("etc/conf"), "user.note").as_deref(),
        Some(&b"kept"[..])
    );
    assert_eq!(
        fs::read_link(c.root.join("etc/abs")).unwrap().to_str(),
        Some("/usr/share/doc/new")
    );
    let tmp = fs::metadata(c.root.join("tmp")).unwrap();
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
    assert_eq!(tmp.mtime(), 1_700_000_000);
    assert_eq!(fs::metadata(&c.root).unwrap().mode() & 0o7777, 0o755);
}

#[test]
fn test_whiteout_then_directory_is_opaque() {
    if !is_root() {
        return;
    }
    let mut tar = TarWriter::new();
    tar.file(".wh.opt", b"")
        .dir("opt")
        .file("opt/new", b"n")
        .file("keep", b"k")
        .file(".wh.keep", b"");
    let c = apply_confined(&tar.finish(), &Limits::default());
    c.result.as_ref().unwrap();
    // `opt` was deleted from lower layers and made anew: nothing below shows through.
    assert_eq!(
        xattr(&c.root.join("opt"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    // A whiteout only hides lower layers: this layer's `keep` stays.
    assert_eq!(fs::read(c.root.join("keep")).unwrap(), b"k");
}
