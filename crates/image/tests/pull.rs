//! Pulls from Debian's docker-registry on loopback, through the library (root: the store keeps
//! image owners). The images come from scripts/test-images.sh and are pushed with skopeo.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use airlock_image::registry::auth::Credentials;
use airlock_image::{ImageStore, PullError, PullOptions, Reference};
use common::{Front, Gate, Registry, Scratch, images, runtime};

/// The digest the layout's index.json gives `tag`.
fn layout_digest(layout: &str, tag: &str) -> String {
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(images().join("layouts").join(layout).join("index.json")).unwrap(),
    )
    .unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn pull(store: &ImageStore, reference: &str) -> Result<airlock_image::PullReport, PullError> {
    let reference = Reference::parse(reference).unwrap();
    runtime().block_on(store.pull(&reference, &PullOptions::default(), None))
}

fn xattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap();
    airlock_jail::beneath::get_xattr(file.as_fd(), name).unwrap()
}

#[test]
fn test_pull_gzip_zstd_and_plain_share_one_unpacked_layer() {
    let registry = Registry::start();
    for tag in ["gzip", "zstd", "plain"] {
        registry.push("busybox", tag, &format!("airlock/busybox:{tag}"));
    }
    let scratch = Scratch::new("pull");
    let store = scratch.store();
    let host = registry.host();
    let gzip = pull(&store, &format!("{host}/airlock/busybox:gzip")).unwrap();
    assert_eq!(gzip.digest, layout_digest("busybox", "gzip"));
    assert_eq!(gzip.name, format!("{host}/airlock/busybox:gzip"));
    assert_eq!(gzip.layers.len(), 1);
    assert!(gzip.layers[0].unpacked && gzip.layers[0].downloaded_bytes > 0);
    // The same tar in another compression: a new blob, verified, but the layer is not unpacked again.
    for tag in ["zstd", "plain"] {
        let other = pull(&store, &format!("{host}/airlock/busybox:{tag}")).unwrap();
        assert_eq!(other.digest, layout_digest("busybox", tag));
        assert_eq!(other.layers[0].diff_id, gzip.layers[0].diff_id, "{tag}");
        assert!(
            other.layers[0].downloaded_bytes > 0 && !other.layers[0].unpacked,
            "{tag}"
        );
    }
    let rootfs = store
        .resolve(&format!("{host}/airlock/busybox:zstd"))
        .unwrap();
    assert_eq!(
        rootfs.layers,
        store
            .resolve(&format!("{host}/airlock/busybox:gzip"))
            .unwrap()
            .layers
    );
    let busybox = std::fs::metadata(rootfs.layers[0].join("bin/busybox")).unwrap();
    assert!(busybox.is_file() && busybox.mode() & 0o111 != 0 && busybox.uid() == 0);
    assert_eq!(
        std::fs::read_link(rootfs.layers[0].join("bin/sh"))
            .unwrap()
            .to_str(),
        Some("busybox")
    );
    assert_eq!(
        std::fs::metadata(rootfs.layers[0].join("tmp"))
            .unwrap()
            .mode()
            & 0o7777,
        0o1777
    );
    assert_eq!(
        rootfs.config.env,
        vec!["PATH=/bin", "AIRLOCK_IMAGE=busybox"]
    );
    assert_eq!(rootfs.config.working_dir.as_deref(), Some("/tmp"));
    assert_eq!(rootfs.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(rootfs.config.entrypoint, vec!["/bin/sh", "-c"]);
    assert_eq!(rootfs.config.cmd, vec!["echo hello from the image"]);
    // By digest too, with or without a name.
    let by_digest = store.resolve(&gzip.digest).unwrap();
    assert_eq!(by_digest.digest, gzip.digest);
    assert!(
        store
            .resolve(&format!("{host}/airlock/busybox@{}", gzip.digest))
            .is_ok()
    );
    // A second pull of a stored image fetches no layer.
    let again = pull(&store, &format!("{host}/airlock/busybox:gzip")).unwrap();
    assert!(
        again
            .layers
            .iter()
            .all(|l| l.downloaded_bytes == 0 && !l.unpacked)
    );
}

#[test]
fn test_pull_layered_image_in_overlay_form() {
    let registry = Registry::start();
    registry.push("busybox", "layered", "airlock/busybox:layered");
    let scratch = Scratch::new("layered");
    let store = scratch.store();
    let report = pull(
        &store,
        &format!("{}/airlock/busybox:layered", registry.host()),
    )
    .unwrap();
    assert_eq!(report.layers.len(), 2);
    let rootfs = store.resolve(&report.name).unwrap();
    let top = &rootfs.layers[1];
    let motd = std::fs::symlink_metadata(top.join("etc/motd")).unwrap();
    assert!(
        motd.file_type().is_char_device() && motd.rdev() == 0,
        "etc/motd is a whiteout"
    );
    assert!(
        rootfs.layers[0].join("etc/motd").is_file(),
        "the lower layer is untouched"
    );
    assert_eq!(
        xattr(&top.join("opt/keep"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(
        std::fs::metadata(top.join("opt/keep/new")).unwrap().nlink(),
        2
    );
    assert_eq!(
        std::fs::read_link(top.join("opt/passwd-link"))
            .unwrap()
            .to_str(),
        Some("/etc/passwd")
    );
}

#[test]
fn test_pull_index_resolves_linux_amd64() {
    let registry = Registry::start();
    registry.push("busybox", "multi", "airlock/busybox:multi");
    let scratch = Scratch::new("index");
    let store = scratch.store();
    let report = pull(
        &store,
        &format!("{}/airlock/busybox:multi", registry.host()),
    )
    .unwrap();
    assert_eq!(report.digest, layout_digest("busybox", "gzip"));
    let index_digest = report.index_digest.clone().unwrap();
    assert_eq!(index_digest, layout_digest("busybox", "multi"));
    let rootfs = store.resolve(&index_digest).unwrap();
    assert_eq!(rootfs.digest, report.digest);
    assert!(rootfs.layers[0].join("bin/busybox").exists());
    assert!(!rootfs.layers[0].join("ARM64").exists());
    // Pulled by the index's digest: the same image, recorded under name@digest.
    let by_digest = pull(
        &store,
        &format!("{}/airlock/busybox@{index_digest}", registry.host()),
    )
    .unwrap();
    assert_eq!(by_digest.digest, report.digest);
    assert!(by_digest.layers.iter().all(|l| l.downloaded_bytes == 0));
}

#[test]
fn test_pull_bearer_token_and_basic_auth() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let credentials = Credentials {
        user: "alice".into(),
        password: "wonderland".into(),
    };
    let token = Front::start(
        registry.port,
        Gate::Token {
            user: "alice".into(),
            password: "wonderland".into(),
            token: "t0k3n".into(),
        },
    );
    let scratch = Scratch::new("auth");
    let store = scratch.store();
    let reference =
        Reference::parse(&format!("127.0.0.1:{}/airlock/busybox:gzip", token.port)).unwrap();
    let rt = runtime();
    // Anonymous: the token service refuses, and the error says where credentials go.
    let anonymous = PullOptions {
        credentials: Some(Credentials {
            user: "alice".into(),
            password: "wrong".into(),
        }),
        ..PullOptions::default()
    };
    let error = rt
        .block_on(store.pull(&reference, &anonymous, None))
        .unwrap_err();
    assert!(
        airlock_jail::error_chain(&error).contains("HTTP 401"),
        "{}",
        airlock_jail::error_chain(&error)
    );
    let options = PullOptions {
        credentials: Some(credentials.clone()),
        ..PullOptions::default()
    };
    let report = rt.block_on(store.pull(&reference, &options, None)).unwrap();
    assert_eq!(report.digest, layout_digest("busybox", "gzip"));
    assert!(token.tokens.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert!(
        token.refused.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the first request met the challenge"
    );

    let basic = Front::start(
        registry.port,
        Gate::Basic {
            user: "alice".into(),
            password: "wonderland".into(),
        },
    );
    let reference =
        Reference::parse(&format!("127.0.0.1:{}/airlock/busybox:gzip", basic.port)).unwrap();
    let error = rt
        .block_on(store.pull(&reference, &anonymous, None))
        .unwrap_err();
    assert!(
        matches!(
            error,
            PullError::Registry {
                source: airlock_image::registry::RegistryError::Unauthorized { .. },
                ..
            }
        ),
        "{error:?}"
    );
    let report = rt.block_on(store.pull(&reference, &options, None)).unwrap();
    assert_eq!(report.digest, layout_digest("busybox", "gzip"));
}

#[test]
fn test_pull_plain_http_only_loopback_or_insecure() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    // The registry reached through a non-loopback address of this machine.
    let Some(address) = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .ok()
        .and_then(|s| s.local_addr().ok())
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback())
    else {
        eprintln!("no non-loopback address on this machine; nothing to check");
        return;
    };
    let listener = std::net::TcpListener::bind((address, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = registry.port;
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    return;
                };
                let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || std::io::copy(&mut c2, &mut s2));
                let (mut s, mut c) = (server, client);
                let _ = std::io::copy(&mut s, &mut c);
                let _ = c.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    let scratch = Scratch::new("insecure");
    let store = scratch.store();
    let reference = Reference::parse(&format!("{address}:{port}/airlock/busybox:gzip")).unwrap();
    let rt = runtime();
    let error = rt
        .block_on(store.pull(&reference, &PullOptions::default(), None))
        .unwrap_err();
    assert!(
        airlock_jail::error_chain(&error).contains("TLS"),
        "{}",
        airlock_jail::error_chain(&error)
    );
    let insecure = PullOptions {
        insecure: true,
        ..PullOptions::default()
    };
    let report = rt
        .block_on(store.pull(&reference, &insecure, None))
        .unwrap();
    assert_eq!(report.digest, layout_digest("busybox", "gzip"));
}

#[test]
fn test_concurrent_pulls_unpack_each_layer_once() {
    let registry = Registry::start();
    registry.push("busybox", "layered", "airlock/busybox:layered");
    let scratch = Scratch::new("concurrent");
    // Two stores on one root: two connections and two sets of locks, as two processes have.
    let first = scratch.store();
    let second = scratch.store();
    let reference =
        Reference::parse(&format!("{}/airlock/busybox:layered", registry.host())).unwrap();
    let rt = runtime();
    let (a, b) = rt.block_on(async {
        let options = PullOptions::default();
        tokio::join!(
            first.pull(&reference, &options, None),
            second.pull(&reference, &options, None)
        )
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    for position in 0..2 {
        let unpacks = [&a, &b]
            .iter()
            .filter(|r| r.layers[position].unpacked)
            .count();
        let downloads = [&a, &b]
            .iter()
            .filter(|r| r.layers[position].downloaded_bytes > 0)
            .count();
        assert_eq!(
            (unpacks, downloads),
            (1, 1),
            "layer {position}: one download and one unpack"
        );
    }
    assert_eq!(
        first.resolve(&a.name).unwrap(),
        second.resolve(&b.name).unwrap()
    );
    let leftovers: Vec<_> = std::fs::read_dir(first.root().join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn test_prune_keeps_what_is_referenced() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    registry.push("busybox", "layered", "airlock/busybox:layered");
    let scratch = Scratch::new("prune");
    let store = scratch.store();
    let host = registry.host();
    let gzip = pull(&store, &format!("{host}/airlock/busybox:gzip")).unwrap();
    let layered = pull(&store, &format!("{host}/airlock/busybox:layered")).unwrap();
    let shared = store.resolve(&gzip.name).unwrap().layers[0].clone();
    let only_layered = store.resolve(&layered.name).unwrap().layers[1].clone();
    // A lease keeps an image whose name is gone; prune waits for nothing else.
    let leased = store.resolve_leased(&layered.name, "sandbox-1").unwrap();
    assert_eq!(
        store.remove(&layered.name).unwrap(),
        vec![layered.name.clone()]
    );
    let report = store.prune().unwrap();
    assert!(
        report.manifests.is_empty() && report.layers == 0,
        "{report:?}"
    );
    assert!(only_layered.is_dir() && leased.layers[1] == only_layered);
    assert_eq!(store.release("sandbox-1").unwrap(), 1);
    let report = store.prune().unwrap();
    assert_eq!(report.manifests, vec![layered.digest.clone()]);
    assert_eq!((report.layers, report.blobs), (1, 1), "{report:?}");
    assert!(!only_layered.exists());
    assert!(
        shared.join("bin/busybox").is_file(),
        "the shared layer stays"
    );
    assert!(store.resolve(&gzip.name).is_ok());
    assert!(matches!(
        store.resolve(&layered.name),
        Err(airlock_image::StoreError::NotFound(_))
    ));
    // Removing the last name, then pruning, empties the store.
    store.remove(&gzip.digest).unwrap();
    store.prune().unwrap();
    assert!(store.list().unwrap().is_empty());
    for sub in ["blobs/sha256", "layers/sha256", "tmp"] {
        assert_eq!(
            std::fs::read_dir(store.root().join(sub)).unwrap().count(),
            0,
            "{sub}"
        );
    }
}
