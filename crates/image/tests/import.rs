//! Imports of each archive kind (root: the store keeps image owners): OCI layouts as a
//! directory and as a tar, `docker save` archives written by skopeo (plain and gzipped), and
//! plain rootfs tarballs, all through the verified ingest that pulls use.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use airlock_image::{ImageStore, ImportError, ImportKind, ImportOptions, ImportReport};
use common::{Scratch, images};

fn skopeo(source: &str, destination: &str) {
    let policy = common::skopeo_policy();
    let status = Command::new("skopeo")
        .arg("--policy")
        .arg(&policy)
        .args(["copy", "--quiet"])
        // A docker-archive is written with a new manifest; an OCI layout keeps the digests.
        .args(
            destination
                .starts_with("oci:")
                .then_some("--preserve-digests"),
        )
        .args([source, destination])
        .status()
        .unwrap();
    assert!(status.success(), "skopeo copy {source} {destination}");
}

fn import(store: &ImageStore, path: &Path, tag: Option<&str>) -> Result<ImportReport, ImportError> {
    store.import(
        path,
        &ImportOptions {
            tag: tag.map(str::to_owned),
        },
        None,
    )
}

fn layout(tag: &str) -> String {
    format!("oci:{}:{tag}", images().join("layouts/busybox").display())
}

fn tar_dir(dir: &Path, out: &Path) {
    let status = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn test_import_oci_layout_directory_and_tar() {
    let scratch = Scratch::new("import-oci");
    let store = scratch.store();
    // The whole test layout: every amd64 image, the index's amd64 entry deduplicated.
    let report = import(&store, &images().join("layouts/busybox"), None).unwrap();
    assert_eq!(report.kind, ImportKind::OciLayout);
    assert_eq!(report.images.len(), 4, "{report:?}");
    let unpacks: usize = report
        .images
        .iter()
        .flat_map(|i| &i.layers)
        .filter(|l| l.unpacked)
        .count();
    assert_eq!(
        unpacks, 2,
        "the busybox layer once, the layered image's second layer once"
    );
    for image in &report.images {
        assert_eq!(
            image.names,
            vec![image.digest.clone()],
            "short ref names are not references"
        );
        assert!(
            store.resolve(&image.digest).unwrap().layers[0]
                .join("bin/busybox")
                .is_file()
        );
    }
    // One image, named on import; then the same layout as a tar, into a fresh store.
    let one = scratch.0.join("one");
    skopeo(&layout("layered"), &format!("oci:{}:latest", one.display()));
    let named = import(&store, &one, Some("airlock/one:v1")).unwrap();
    assert_eq!(named.images[0].names, vec!["docker.io/airlock/one:v1"]);
    assert!(
        named.images[0]
            .layers
            .iter()
            .all(|l| !l.unpacked && l.downloaded_bytes == 0)
    );
    let tar = scratch.0.join("one.tar");
    tar_dir(&one, &tar);
    let fresh = Scratch::new("import-oci-tar");
    let fresh_store = fresh.store();
    let from_tar = import(&fresh_store, &tar, Some("airlock/one:v1")).unwrap();
    assert_eq!(from_tar.kind, ImportKind::OciLayout);
    assert_eq!(from_tar.images[0].digest, named.images[0].digest);
    let rootfs = fresh_store.resolve("airlock/one:v1").unwrap();
    let motd = std::fs::symlink_metadata(rootfs.layers[1].join("etc/motd")).unwrap();
    assert!(motd.file_type().is_char_device() && motd.rdev() == 0);
    assert!(matches!(
        import(&store, &images().join("layouts/busybox"), Some("x:y")),
        Err(ImportError::TagAmbiguous { .. })
    ));
}

#[test]
fn test_import_docker_save_plain_and_gzipped() {
    let scratch = Scratch::new("import-save");
    let store = scratch.store();
    let save = scratch.0.join("save.tar");
    skopeo(
        &layout("layered"),
        &format!("docker-archive:{}:airlock/saved:v1", save.display()),
    );
    let report = import(&store, &save, None).unwrap();
    assert_eq!(report.kind, ImportKind::DockerSave);
    assert_eq!(report.images[0].names, vec!["docker.io/airlock/saved:v1"]);
    assert_eq!(report.images[0].layers.len(), 2);
    let rootfs = store.resolve("airlock/saved:v1").unwrap();
    assert_eq!(rootfs.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(
        std::fs::metadata(rootfs.layers[1].join("opt/keep/new"))
            .unwrap()
            .nlink(),
        2
    );
    let gz = scratch.0.join("save.tar.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -c {} > {}", save.display(), gz.display()))
        .status()
        .unwrap();
    assert!(status.success());
    let again = import(&store, &gz, Some("airlock/saved:gz")).unwrap();
    assert_eq!(again.kind, ImportKind::DockerSave);
    assert_eq!(
        again.images[0].digest, report.images[0].digest,
        "the same content is the same image"
    );
    assert_eq!(store.resolve("airlock/saved:gz").unwrap(), rootfs);
    let leftovers = std::fs::read_dir(store.root().join("tmp")).unwrap().count();
    assert_eq!(leftovers, 0, "the decompressed copy is removed");
}

#[test]
fn test_import_rootfs_tarball_shares_the_layer() {
    let scratch = Scratch::new("import-rootfs");
    let store = scratch.store();
    let plain = import(
        &store,
        &images().join("busybox.tar"),
        Some("airlock/rootfs:plain"),
    )
    .unwrap();
    assert_eq!(plain.kind, ImportKind::RootfsTarball);
    assert!(plain.images[0].layers[0].unpacked);
    let rootfs = store.resolve("airlock/rootfs:plain").unwrap();
    assert!(rootfs.layers[0].join("bin/busybox").is_file());
    assert_eq!(rootfs.config, airlock_api::ImageConfig::default());
    let gz = scratch.0.join("rootfs.tar.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -c {} > {}",
            images().join("busybox.tar").display(),
            gz.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let gzipped = import(&store, &gz, None).unwrap();
    assert_eq!(gzipped.kind, ImportKind::RootfsTarball);
    let layer = &gzipped.images[0].layers[0];
    assert_eq!(layer.diff_id, plain.images[0].layers[0].diff_id);
    assert!(
        !layer.unpacked && layer.downloaded_bytes > 0,
        "a new blob, the same layer"
    );
    assert_eq!(
        gzipped.images[0].names,
        vec![gzipped.images[0].digest.clone()]
    );
    let details = store.inspect(&gzipped.images[0].digest).unwrap();
    assert_eq!(
        details.layers[0].media_type,
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
}

#[test]
fn test_import_corrupt_blob_refused_and_store_clean() {
    let scratch = Scratch::new("import-corrupt");
    let store = scratch.store();
    let one = scratch.0.join("one");
    skopeo(&layout("gzip"), &format!("oci:{}:latest", one.display()));
    let manifest: serde_json::Value = {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(one.join("index.json")).unwrap()).unwrap();
        let digest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
            .to_owned();
        serde_json::from_slice(&std::fs::read(one.join("blobs/sha256").join(digest)).unwrap())
            .unwrap()
    };
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_owned();
    let blob = one.join("blobs/sha256").join(&layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&blob, bytes).unwrap();
    let error = import(&store, &one, Some("airlock/corrupt:1")).unwrap_err();
    let text = airlock_jail::error_chain(&error);
    assert!(
        text.contains(&layer[..12]),
        "the error names the layer: {text}"
    );
    assert!(store.list().unwrap().is_empty());
    for sub in ["blobs/sha256", "layers/sha256", "tmp"] {
        assert_eq!(
            std::fs::read_dir(store.root().join(sub)).unwrap().count(),
            0,
            "{sub} after a refused import"
        );
    }
    assert!(matches!(
        import(&store, &scratch.0, None),
        Err(ImportError::NotLayout { .. })
    ));
}
