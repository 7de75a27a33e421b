//! Test images for the container tier, built at test time from what the host has: Debian's
//! busybox-static (`/usr/bin/busybox` or `/bin/busybox`, one static binary) unpacked into a
//! layer directory with one symlink per applet (what `busybox --install -s` makes), the
//! static `airlock-probe` at `/usr/bin/airlock-probe`, and a `/etc/passwd` and `/etc/group`
//! with a user of the image's own. Layers are written as the image store writes them: as
//! root, with the image's ids as host ids and whiteouts in overlay form.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Scratch, set_mode};

/// The path of the probe inside a test image.
pub const PROBE: &str = "/usr/bin/airlock-probe";

pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
    alice:x:1000:1000:Alice:/home/alice:/bin/sh\n\
    bob:x:1001:1001:Bob:/home/bob:/bin/sh\n";
pub const GROUP: &str = "root:x:0:\nalice:x:1000:\nbob:x:1001:\nstaff:x:50:alice,bob\n";

/// Debian's static busybox on this host.
pub fn busybox() -> PathBuf {
    ["/usr/bin/busybox", "/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox is missing: apt-get install busybox-static")
}

/// A hard link where possible: a copy written here could meet ETXTBSY when executed while a
/// concurrent test's fork still holds the descriptor it was written through.
fn install(source: &Path, target: &Path) {
    if fs::hard_link(source, target).is_err() {
        fs::copy(source, target).unwrap();
        set_mode(target, 0o755);
    }
}

/// An image under construction: layer directories in `dir/layers`, lowest first.
pub struct TestImage {
    pub dir: PathBuf,
    pub layers: Vec<PathBuf>,
}

impl TestImage {
    /// A one-layer busybox image with the probe and the image's users.
    pub fn busybox(scratch: &Scratch, name: &str) -> TestImage {
        let dir = scratch.workspace(name);
        let mut image = TestImage {
            dir,
            layers: Vec::new(),
        };
        let base = image.add_layer();
        for sub in [
            "bin",
            "usr/bin",
            "etc",
            "home/alice",
            "home/bob",
            "root",
            "var/tmp",
        ] {
            fs::create_dir_all(base.join(sub)).unwrap();
        }
        install(&busybox(), &base.join("bin/busybox"));
        // The host's copy: executing the fresh one could meet ETXTBSY while a concurrent test's
        // fork still holds the descriptor it was written through.
        let list = Command::new(busybox())
            .arg("--list")
            .output()
            .expect("busybox --list");
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" && !base.join("bin").join(applet).exists() {
                symlink("busybox", base.join("bin").join(applet)).unwrap();
            }
        }
        install(
            Path::new(&scratch.probe()),
            &base.join("usr/bin/airlock-probe"),
        );
        fs::write(base.join("etc/passwd"), PASSWD).unwrap();
        fs::write(base.join("etc/group"), GROUP).unwrap();
        fs::write(base.join("etc/motd"), "from the image\n").unwrap();
        std::os::unix::fs::chown(base.join("home/alice"), Some(1000), Some(1000)).unwrap();
        std::os::unix::fs::chown(base.join("home/bob"), Some(1001), Some(1001)).unwrap();
        set_mode(&base.join("root"), 0o700);
        set_mode(&base.join("var/tmp"), 0o1777);
        image
    }

    /// A new, empty layer on top; returns its directory.
    pub fn add_layer(&mut self) -> PathBuf {
        let layer = self
            .dir
            .join("layers")
            .join(format!("{:03}", self.layers.len()));
        fs::create_dir_all(&layer).unwrap();
        set_mode(&layer, 0o755);
        self.layers.push(layer.clone());
        layer
    }

    pub fn top(&self) -> &Path {
        self.layers.last().expect("a layer")
    }

    /// Deletes `path` (relative) from the layers below, as an overlay whiteout in the top.
    pub fn whiteout(&self, path: &str) {
        let target = self.top().join(path);
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        let status = Command::new("mknod")
            .arg(&target)
            .args(["c", "0", "0"])
            .status()
            .unwrap();
        assert!(status.success(), "mknod whiteout");
    }

    /// Writes the image description `airlock run --image` reads, with this config.
    pub fn describe(&self, name: &str, config: serde_json::Value) -> String {
        let description = serde_json::json!({
            "digest": format!("sha256:test-{name}"),
            "layers": self.layers,
            "config": config,
        });
        let path = self.dir.join(format!("{name}.json"));
        fs::write(&path, serde_json::to_vec_pretty(&description).unwrap()).unwrap();
        path.display().to_string()
    }

    /// A description with an empty config (no env, user, entrypoint or cmd).
    pub fn plain(&self) -> String {
        self.describe("plain", config(&[], None, None, &[], &[]))
    }
}

/// An image config, as `ImageConfig` serialises it.
pub fn config(
    env: &[&str],
    working_dir: Option<&str>,
    user: Option<&str>,
    entrypoint: &[&str],
    cmd: &[&str],
) -> serde_json::Value {
    serde_json::json!({
        "env": env,
        "working_dir": working_dir,
        "user": user,
        "entrypoint": entrypoint,
        "cmd": cmd,
    })
}
