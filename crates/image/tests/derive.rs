//! Images a template build makes (as root): an upper directory in overlay form, owned by a
//! sandbox's host id range, captured as a layer tar, added on top of an imported image, and
//! read back through the layer stack as the container tier would see it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use airlock_api::ImageConfig;
use airlock_image::capture::{HostIds, capture_upper};
use airlock_image::stack::{Found, LayerStack};
use airlock_image::{Derivation, ImportOptions};
use common::{Scratch, images};

const BASE: u32 = 0x7000_0000 + 7 * 65_536;

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

fn whiteout(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    let status = std::process::Command::new("mknod")
        .arg(path)
        .args(["c", "0", "0"])
        .status()
        .unwrap();
    assert!(status.success(), "mknod {name:?}");
}

fn set_xattr(path: &Path, name: &str, value: &str) {
    let status = std::process::Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(path)
        .status();
    match status {
        Ok(s) if s.success() => {}
        _ => {
            // setfattr (Debian's attr) may be missing: write it with Python instead.
            let status = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import os,sys; os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode(), follow_symlinks=False)",
                ])
                .arg(path)
                .args([name, value])
                .status()
                .unwrap();
            assert!(status.success(), "setxattr {name} on {}", path.display());
        }
    }
}

/// An upper directory as a RUN that wrote files, deleted /etc/motd and replaced /opt/keep
/// would leave it.
fn upper(dir: &Path) {
    for sub in ["app", "etc", "opt/keep"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("app/hello"), "hello\n").unwrap();
    std::fs::hard_link(dir.join("app/hello"), dir.join("app/again")).unwrap();
    std::os::unix::fs::symlink("/app/hello", dir.join("app/link")).unwrap();
    std::fs::write(dir.join("opt/keep/new"), "new\n").unwrap();
    set_xattr(&dir.join("opt/keep"), "trusted.overlay.opaque", "y");
    set_xattr(&dir.join("app/hello"), "user.note", "kept");
    set_xattr(&dir.join("app"), "trusted.overlay.impure", "y");
    whiteout(&dir.join("etc/motd"));
    for path in [
        "",
        "app",
        "app/hello",
        "app/link",
        "etc",
        "opt",
        "opt/keep",
        "opt/keep/new",
    ] {
        chown(&dir.join(path), BASE, BASE);
    }
    chown(&dir.join("app/hello"), BASE + 1000, BASE + 1000);
    chown(&dir.join("etc/motd"), BASE, BASE);
}

#[test]
fn test_captured_upper_directory_becomes_an_overlay_layer_on_its_parent() {
    let scratch = Scratch::new("derive");
    let store = scratch.store();
    let report = store
        .import(
            &images().join("busybox.tar"),
            &ImportOptions {
                tag: Some("airlock/busybox:derive".into()),
            },
            None,
        )
        .unwrap();
    let base = report.images[0].digest.clone();
    let up = scratch.0.join("upper");
    std::fs::create_dir(&up).unwrap();
    upper(&up);
    let tar_path = scratch.0.join("layer.tar");
    let file = std::fs::File::create(&tar_path).unwrap();
    let ids = HostIds {
        uid_base: BASE,
        gid_base: BASE,
    };
    let (_, captured) = capture_upper(&up, ids, file).unwrap();
    assert!(captured.warnings.is_empty(), "{:?}", captured.warnings);

    let config = ImageConfig {
        env: vec!["PATH=/bin".into(), "STEP=1".into()],
        working_dir: Some("/app".into()),
        user: Some("app".into()),
        ..ImageConfig::default()
    };
    let derivation = Derivation {
        config: config.clone(),
        created_by: "RUN test".into(),
    };
    let digest = store
        .derive(
            Some(&base),
            std::slice::from_ref(&tar_path),
            &derivation,
            "test:one",
        )
        .unwrap();
    // Deterministic: the same parent, layer and config are the same image.
    let again = store
        .derive(
            Some(&base),
            std::slice::from_ref(&tar_path),
            &derivation,
            "test:two",
        )
        .unwrap();
    assert_eq!(digest, again);
    let rootfs = store.resolve(&digest).unwrap();
    assert_eq!(rootfs.layers.len(), 2);
    assert_eq!(rootfs.config, config);

    // The new layer's directory is in overlay form with the image's own ids.
    let layer = &rootfs.layers[1];
    let motd = std::fs::symlink_metadata(layer.join("etc/motd")).unwrap();
    assert!(
        motd.file_type().is_char_device() && motd.rdev() == 0,
        "a whiteout"
    );
    let hello = std::fs::symlink_metadata(layer.join("app/hello")).unwrap();
    assert_eq!((hello.uid(), hello.gid(), hello.nlink()), (1000, 1000, 2));
    assert_eq!(
        std::fs::read_link(layer.join("app/link")).unwrap(),
        Path::new("/app/hello")
    );
    let dir = std::fs::symlink_metadata(layer.join("opt/keep")).unwrap();
    assert_eq!((dir.uid(), dir.gid()), (0, 0));

    // What the container tier's overlay shows, read through the stack.
    let stack = LayerStack::new(&rootfs.layers);
    assert_eq!(stack.resolve("/etc/motd", true).unwrap().1, Found::Missing);
    assert!(matches!(
        stack.resolve("/etc/passwd", true).unwrap().1,
        Found::File(_)
    ));
    assert_eq!(
        stack.resolve("/opt/keep/one", true).unwrap().1,
        Found::Missing,
        "opaque"
    );
    assert!(matches!(
        stack.resolve("/opt/keep/new", true).unwrap().1,
        Found::File(_)
    ));
    assert_eq!(
        stack.read_file("/app/link", 100).as_deref(),
        Some(&b"hello\n"[..]),
        "a symlink followed inside the image"
    );
    assert_eq!(
        stack.resolve("/bin/sh", false).unwrap().1,
        Found::Symlink("busybox".into())
    );
    let (resolved, found) = stack.resolve("/bin/../app/./hello", true).unwrap();
    assert_eq!(resolved, "/app/hello");
    assert!(matches!(found, Found::File(_)));
    let (resolved, found) = stack.resolve("/app/missing/deeper", true).unwrap();
    assert_eq!(
        (resolved.as_str(), found),
        ("/app/missing/deeper", Found::Missing)
    );
    assert_eq!(stack.user("app").unwrap().uid, 1000);
    assert!(stack.user("nobody-here").is_err());

    // The leases keep it from prune until both are released.
    store.release("test:one").unwrap();
    assert!(store.prune().unwrap().manifests.is_empty());
    store.release("test:two").unwrap();
    store.remove("airlock/busybox:derive").unwrap();
    assert_eq!(store.prune().unwrap().manifests.len(), 2);
}

#[test]
fn test_capture_refuses_an_owner_outside_the_sandbox_range() {
    let scratch = Scratch::new("derive-foreign");
    let up = scratch.0.join("upper");
    std::fs::create_dir(&up).unwrap();
    std::fs::write(up.join("stray"), "x").unwrap();
    chown(&up.join("stray"), 12, 12);
    let err = capture_upper(
        &up,
        HostIds {
            uid_base: BASE,
            gid_base: BASE,
        },
        std::io::sink(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("stray"), "{err}");
    assert!(err.to_string().contains("host id 12"), "{err}");
}

/// A context tar as the E2B SDK uploads one: names relative to the context's root.
fn context(path: &Path) {
    use airlock_image::tarball::{Meta, TarWriter};
    let mut tar = TarWriter::new(std::fs::File::create(path).unwrap());
    let meta = |mode| Meta {
        mode,
        uid: 501,
        gid: 20,
        mtime: 1_700_000_000,
    };
    tar.file("requirements.txt", meta(0o644), 6, &b"flask\n"[..], &[])
        .unwrap();
    tar.dir("app", meta(0o755), &[]).unwrap();
    tar.file("app/main.py", meta(0o644), 12, &b"print('hi')\n"[..], &[])
        .unwrap();
    tar.hard_link("app/same.py", "app/main.py", meta(0o644))
        .unwrap();
    tar.symlink("app/link.py", "main.py", meta(0o777)).unwrap();
    tar.dir("app/sub", meta(0o700), &[]).unwrap();
    tar.file("app/sub/data", meta(0o600), 1, &b"x"[..], &[])
        .unwrap();
    tar.finish().unwrap();
}

#[test]
fn test_copy_places_files_as_docker_does_through_the_images_symlinks() {
    use airlock_image::copy::{CopySpec, copy_layer};
    let scratch = Scratch::new("copy");
    let store = scratch.store();
    let report = store
        .import(
            &images().join("busybox.tar"),
            &ImportOptions {
                tag: Some("airlock/busybox:copy".into()),
            },
            None,
        )
        .unwrap();
    // A base with `/lib -> usr/lib`, as merged-/usr distributions have.
    let up = scratch.0.join("upper");
    std::fs::create_dir_all(up.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", up.join("lib")).unwrap();
    for path in ["", "usr", "usr/lib", "lib"] {
        chown(&up.join(path), BASE, BASE);
    }
    let ids = HostIds {
        uid_base: BASE,
        gid_base: BASE,
    };
    let base_tar = scratch.0.join("base.tar");
    capture_upper(&up, ids, std::fs::File::create(&base_tar).unwrap()).unwrap();
    let derivation = Derivation::default();
    let base = store
        .derive(
            Some(&report.images[0].digest),
            &[base_tar],
            &derivation,
            "copy:base",
        )
        .unwrap();
    let stack = LayerStack::new(&store.resolve(&base).unwrap().layers);
    let files = scratch.0.join("context.tar");
    context(&files);
    let mut layers = Vec::new();
    let copies = [
        ("app", "/srv/app", None),
        ("requirements.txt", "/lib/", None),
        ("app/main.py", "/opt/renamed.py", Some(0o700)),
        ("*.txt", "/etc/wanted", None),
    ];
    for (n, (source, destination, mode)) in copies.into_iter().enumerate() {
        let spec = CopySpec {
            source: source.into(),
            destination: destination.into(),
            owner: (1000, 1000),
            mode,
        };
        let out = scratch.0.join(format!("copy{n}.tar"));
        let (_, copied) =
            copy_layer(&files, &spec, &stack, std::fs::File::create(&out).unwrap()).unwrap();
        assert!(copied.warnings.is_empty(), "{:?}", copied.warnings);
        layers.push(out);
    }
    let built = store
        .derive(Some(&base), &layers, &derivation, "copy:built")
        .unwrap();
    let stack = LayerStack::new(&store.resolve(&built).unwrap().layers);
    let read = |path: &str| {
        stack
            .read_file(path, 100)
            .map(|b| String::from_utf8(b).unwrap())
    };
    // A directory's contents, not the directory itself.
    assert_eq!(read("/srv/app/main.py").as_deref(), Some("print('hi')\n"));
    assert_eq!(read("/srv/app/sub/data").as_deref(), Some("x"));
    assert_eq!(read("/srv/app/link.py").as_deref(), Some("print('hi')\n"));
    assert_eq!(read("/srv/app/app/main.py"), None);
    // Into a directory through the image's symlink: /lib/x is /usr/lib/x.
    assert_eq!(
        read("/usr/lib/requirements.txt").as_deref(),
        Some("flask\n")
    );
    assert!(
        matches!(stack.resolve("/lib", false).unwrap().1, Found::Symlink(_)),
        "the link survives"
    );
    assert_eq!(read("/opt/renamed.py").as_deref(), Some("print('hi')\n"));
    assert_eq!(
        read("/etc/wanted").as_deref(),
        Some("flask\n"),
        "a file to a file name"
    );
    let Found::File(host) = stack.resolve("/srv/app/same.py", true).unwrap().1 else {
        panic!("same.py is missing");
    };
    let same = std::fs::symlink_metadata(host).unwrap();
    assert_eq!(
        (same.uid(), same.gid(), same.nlink()),
        (1000, 1000, 2),
        "the owner given, a hard link kept"
    );
    let Found::File(host) = stack.resolve("/opt/renamed.py", true).unwrap().1 else {
        panic!("renamed.py is missing");
    };
    assert_eq!(
        std::fs::symlink_metadata(host).unwrap().mode() & 0o7777,
        0o700
    );

    // Nothing matches: the error says what.
    let spec = CopySpec {
        source: "missing/*".into(),
        destination: "/x".into(),
        owner: (0, 0),
        mode: None,
    };
    let err = copy_layer(&files, &spec, &stack, std::io::sink()).unwrap_err();
    assert!(err.to_string().contains("missing/*"), "{err}");
}
