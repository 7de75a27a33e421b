//! What the suite plants on the host for the attacks to aim at: a scratch directory, fake
//! home directories with credentials, listening sockets (the "sinks"), a set-uid binary. All
//! of it is created under names unique to this run and removed when [`Fixtures`] is dropped.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;

/// Credentials planted in the fake home, world-readable on purpose: file modes must not be
/// what keeps them from the sandbox.
pub const HOME_SECRETS: &[(&str, &str)] = &[
    (
        ".ssh/id_ed25519",
        "-----BEGIN OPENSSH PRIVATE KEY----- seceval\n",
    ),
    (
        ".aws/credentials",
        "[default]\naws_secret_access_key = seceval\n",
    ),
    (
        ".config/gh/hosts.yml",
        "github.com:\n  oauth_token: gho_seceval\n",
    ),
    (".netrc", "machine example.com login x password seceval\n"),
    (
        ".docker/config.json",
        "{\"auths\":{\"x\":{\"auth\":\"c2VjZXZhbA==\"}}}\n",
    ),
    (".bashrc", "# seceval\n"),
];

/// The host objects of one run.
#[derive(Debug)]
pub struct Fixtures {
    pub scratch: PathBuf,
    pub home: PathBuf,
    pub late_home: PathBuf,
    host_tmp: PathBuf,
    run_socket: PathBuf,
    /// Anything that reached a sink, counted across all of them.
    events: Arc<AtomicU64>,
    /// Bytes that reached the test upstream behind the egress proxy.
    upstream_bytes: Arc<AtomicU64>,
    values: BTreeMap<String, String>,
    counter: AtomicU64,
    /// The container tier's test image layer and its fingerprint when it was made.
    image_layer: Option<(PathBuf, Vec<String>)>,
}

/// Where the container tier's test image has the probe.
pub const IMAGE_PROBE: &str = "/usr/bin/airlock-probe";

/// Every entry below `dir` with its type, mode, owner, size, mtime and, for small files, its
/// contents: any write or deletion through to the layer changes it.
fn fingerprint(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut prints = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            prints.push(format!("{} missing", path.display()));
            continue;
        };
        let contents = if meta.is_file() && meta.len() < 4096 {
            fs::read(&path).unwrap_or_default()
        } else {
            Vec::new()
        };
        prints.push(format!(
            "{} {:o} {}:{} {} {} {:?}",
            path.display(),
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.len(),
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
            contents
        ));
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    prints.sort();
    prints
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

fn write_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    set_mode(path, mode)
}

impl Fixtures {
    /// The scratch directory and the values every case may use.
    pub fn new(probe: &Path) -> anyhow::Result<Fixtures> {
        let tag = format!("airlock-seceval-{}", std::process::id());
        let scratch = PathBuf::from("/var/tmp").join(&tag);
        let _ = fs::remove_dir_all(&scratch);
        fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
        set_mode(&scratch, 0o1777)?;
        write_file(&scratch.join("victim"), "fixture\n", 0o666)?;
        let mut fixtures = Fixtures {
            home: PathBuf::from("/home").join(&tag),
            late_home: PathBuf::from("/home").join(format!("{tag}-late")),
            host_tmp: PathBuf::from("/tmp").join(&tag),
            run_socket: PathBuf::from("/run").join(format!("{tag}.sock")),
            scratch,
            events: Arc::default(),
            upstream_bytes: Arc::default(),
            values: BTreeMap::new(),
            counter: AtomicU64::new(0),
            image_layer: None,
        };
        let scratch_text = fixtures.scratch.display().to_string();
        for (name, value) in [
            ("probe", probe.display().to_string()),
            ("scratch", scratch_text.clone()),
            ("victim", format!("{scratch_text}/victim")),
            ("hostpid", std::process::id().to_string()),
            ("home", fixtures.home.display().to_string()),
            (
                "late",
                fixtures.late_home.join(".netrc").display().to_string(),
            ),
            ("ready", format!("{scratch_text}/late-ready")),
            ("blockdev", block_device()),
        ] {
            fixtures.values.insert(name.to_owned(), value);
        }
        Ok(fixtures)
    }

    pub fn set(&mut self, name: &str, value: String) {
        self.values.insert(name.to_owned(), value);
    }

    /// Plants the fake homes: one with every credential, one left empty until a case writes a
    /// credential into it after its sandbox started.
    pub fn plant_home(&self) -> anyhow::Result<()> {
        for (name, contents) in HOME_SECRETS {
            write_file(&self.home.join(name), contents, 0o644)?;
        }
        for dir in [&self.home, &self.late_home] {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            set_mode(dir, 0o755)?;
        }
        Ok(())
    }

    /// Where the late credential and the marker the probe waits for go.
    pub fn late_secret_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.late_home.join(".netrc"),
            self.scratch.join("late-ready"),
        )
    }

    /// Removes the late credential and marker, so the next attempt starts like the first.
    pub fn reset_late_secret(&self) {
        let _ = fs::remove_file(self.late_home.join(".netrc"));
        let _ = fs::remove_file(self.scratch.join("late-ready"));
    }

    /// A set-user-id root copy of the probe that only the sandbox's user 1000 may execute, in
    /// a host workspace (`{suidws}`) whose parent only root can enter, so that no host user
    /// gains a set-uid root binary while the suite runs. Inside, the idmapped workspace shows
    /// it as the sandbox's root's, group 1000 (each sandbox has host ids of its own, so a
    /// host-side group could not name "the sandbox's user 1000").
    pub fn plant_setuid(&mut self, probe: &Path) -> anyhow::Result<()> {
        let private = self.scratch.join("private");
        fs::create_dir_all(&private)?;
        set_mode(&private, 0o700)?;
        let workspace = private.join("suid-ws");
        fs::create_dir_all(&workspace)?;
        set_mode(&workspace, 0o755)?;
        let target = workspace.join("probe-suid");
        fs::copy(probe, &target)
            .with_context(|| format!("copying the probe to {}", target.display()))?;
        set_mode(&target, 0o700)?;
        std::os::unix::fs::chown(&target, Some(0), Some(1000))
            .with_context(|| format!("chown {}", target.display()))?;
        set_mode(&target, 0o4710)?;
        self.set("suidws", workspace.display().to_string());
        Ok(())
    }

    /// The container tier's test image: one layer with the probe at [`IMAGE_PROBE`], an
    /// `/etc/passwd`, `/etc/group`, a `/usr/bin/env` to aim writes at and a marker in
    /// `/home`, but no `/etc/shadow` (a host secret has no copy here); and a hostile variant
    /// whose second layer plants symbolic links where Airlock mounts its filesystems.
    /// `{image}`, `{hostileimage}` and `{imagelayer}` name them.
    pub fn build_image(&mut self, probe: &Path) -> anyhow::Result<()> {
        let dir = self.scratch.join("image");
        let base = dir.join("layers/base");
        let hostile = dir.join("layers/hostile");
        for sub in [
            "usr/bin",
            "etc",
            "home/agent",
            "root",
            "tmp",
            "bin",
            "var/tmp",
        ] {
            fs::create_dir_all(base.join(sub))?;
        }
        fs::create_dir_all(&hostile)?;
        for path in [&dir, &dir.join("layers"), &base, &hostile] {
            set_mode(path, 0o755)?;
        }
        let target = base.join(IMAGE_PROBE.trim_start_matches('/'));
        if fs::hard_link(probe, &target).is_err() {
            fs::copy(probe, &target)
                .with_context(|| format!("copying the probe to {}", target.display()))?;
        }
        write_file(&base.join("usr/bin/env"), "#!/bin/sh\n# seceval\n", 0o755)?;
        write_file(
            &base.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n",
            0o644,
        )?;
        write_file(&base.join("etc/group"), "root:x:0:\nagent:x:1000:\n", 0o644)?;
        write_file(&base.join("home/seceval-kept"), "image\n", 0o644)?;
        std::os::unix::fs::chown(base.join("home/agent"), Some(1000), Some(1000))?;
        set_mode(&base.join("root"), 0o700)?;
        set_mode(&base.join("tmp"), 0o1777)?;
        set_mode(&base.join("var/tmp"), 0o1777)?;
        for (link, points_to) in [
            ("proc", "/"),
            ("tmp", "/etc"),
            ("dev", "/home"),
            ("workspace", "/usr"),
            ("sys", "../.."),
            ("run", "/etc"),
        ] {
            std::os::unix::fs::symlink(points_to, hostile.join(link))?;
        }
        let describe = |name: &str, layers: &[&Path]| -> anyhow::Result<String> {
            let image = airlock_api::ImageRootfs {
                digest: format!("sha256:seceval-{name}"),
                layers: layers.iter().map(|l| l.to_path_buf()).collect(),
                config: airlock_api::ImageConfig {
                    env: vec!["PATH=/usr/bin:/bin".into()],
                    ..airlock_api::ImageConfig::default()
                },
            };
            let path = dir.join(format!("{name}.json"));
            fs::write(&path, serde_json::to_vec(&image)?)?;
            Ok(path.display().to_string())
        };
        let image = describe("image", &[&base])?;
        let hostile_image = describe("hostile", &[&base, &hostile])?;
        self.set("image", image);
        self.set("hostileimage", hostile_image);
        self.set("imagelayer", base.display().to_string());
        self.image_layer = Some((base.clone(), fingerprint(&base)));
        Ok(())
    }

    /// The container tier's test image layer, once [`Fixtures::build_image`] made it.
    pub fn image_layer_dir(&self) -> Option<&Path> {
        self.image_layer.as_ref().map(|(dir, _)| dir.as_path())
    }

    /// Whether the test image's layer is as [`Fixtures::build_image`] left it.
    pub fn image_layer_untouched(&self) -> bool {
        self.image_layer
            .as_ref()
            .is_some_and(|(layer, print)| fingerprint(layer) == *print)
    }

    /// Starts every host-side sink and records where it listens.
    pub fn start_sinks(&mut self) -> anyhow::Result<()> {
        let tcp = TcpListener::bind("127.0.0.1:0").context("binding a loopback TCP sink")?;
        self.set("tcp", tcp.local_addr()?.to_string());
        self.count_tcp(tcp);
        if let Ok(tcp6) = TcpListener::bind("[::1]:0") {
            self.set("tcp6", tcp6.local_addr()?.to_string());
            self.count_tcp(tcp6);
        }
        let udp = UdpSocket::bind("127.0.0.1:0").context("binding a loopback UDP sink")?;
        self.set("udp", udp.local_addr()?.to_string());
        let events = self.events.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, peer)) = udp.recv_from(&mut buf) {
                events.fetch_add(1, Ordering::SeqCst);
                let _ = udp.send_to(&buf[..n], peer);
            }
        });
        // One name per run of the fixtures: each tier sets up its own, and the listener of an
        // earlier tier keeps its name bound.
        static INSTANCE: AtomicU64 = AtomicU64::new(0);
        let abstract_name = format!(
            "airlock-seceval-{}-{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        );
        self.count_unix(abstract_listener(&abstract_name)?);
        self.set("abstract", format!("@{abstract_name}"));
        fs::create_dir_all(&self.host_tmp)?;
        for (name, path) in [
            ("runsock", self.run_socket.clone()),
            ("tmpsock", self.host_tmp.join("agent.sock")),
            ("worldsock", self.scratch.join("world.sock")),
        ] {
            let _ = fs::remove_file(&path);
            let listener =
                UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
            set_mode(&path, 0o777)?;
            self.count_unix(listener);
            self.set(name, path.display().to_string());
        }
        Ok(())
    }

    /// The egress proxy's test upstream (`{upstream}`): answers any request with 200 and counts
    /// the bytes it receives, so that a case can show nothing got through a tunnel.
    pub fn start_upstream(&mut self) -> anyhow::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the test upstream")?;
        self.set("upstream", listener.local_addr()?.to_string());
        let received = self.upstream_bytes.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let received = received.clone();
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        received.fetch_add(n as u64, Ordering::SeqCst);
                        head.extend_from_slice(&buf[..n]);
                        // A TLS record (a tunnelled ClientHello) gets five bytes back at once.
                        if head.first() == Some(&0x16) {
                            let _ = std::io::Write::write_all(&mut stream, b"sink\n");
                            break;
                        }
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            let _ = std::io::Write::write_all(
                                &mut stream,
                                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nsink\n",
                            );
                            break;
                        }
                    }
                });
            }
        });
        Ok(())
    }

    /// How many bytes the test upstream has received so far.
    pub fn upstream_bytes(&self) -> u64 {
        self.upstream_bytes.load(Ordering::SeqCst)
    }

    /// A listener on the host's own non-loopback IPv4 address (for `{lan}`), if it has one.
    pub fn start_lan_sink(&mut self) -> anyhow::Result<()> {
        let address = host_global_ipv4().context("the host has no global IPv4 address")?;
        let listener = TcpListener::bind((address.as_str(), 0))
            .with_context(|| format!("binding {address}:0"))?;
        self.set("lan", listener.local_addr()?.to_string());
        self.count_tcp(listener);
        Ok(())
    }

    fn count_tcp(&self, listener: TcpListener) {
        let events = self.events.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                events.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
    }

    fn count_unix(&self, listener: UnixListener) {
        let events = self.events.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                events.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
    }

    /// How many connections and datagrams the host sinks have seen so far.
    pub fn sink_events(&self) -> u64 {
        self.events.load(Ordering::SeqCst)
    }

    /// Fresh values for one attempt: a marker, a free port, a DNS label, a host workspace.
    pub fn per_attempt(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let mut values = self.values.clone();
        values.insert("marker".into(), format!("airlock-seceval-marker-{pid}-{n}"));
        values.insert("label".into(), format!("exfil-{pid}-{n}.attacker.test"));
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        values.insert("port".into(), port.to_string());
        let workspace = self.scratch.join(format!("ws-{n}"));
        values.insert("hostws".into(), workspace.display().to_string());
        Ok(values)
    }

    /// Creates the host workspace of an attempt when the attempt names it.
    pub fn prepare_workspace(
        values: &BTreeMap<String, String>,
        args: &[String],
    ) -> anyhow::Result<()> {
        if let Some(workspace) = values.get("hostws")
            && args.iter().any(|a| a.contains(workspace.as_str()))
        {
            let path = Path::new(workspace);
            fs::create_dir_all(path.join(".git/hooks"))?;
            write_file(&path.join(".git/hooks/pre-commit"), "#!/bin/sh\n", 0o755)?;
            write_file(&path.join(".git/config"), "[core]\n", 0o644)?;
        }
        Ok(())
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        for dir in [&self.scratch, &self.home, &self.late_home, &self.host_tmp] {
            let _ = fs::remove_dir_all(dir);
        }
        let _ = fs::remove_file(&self.run_socket);
    }
}

/// Writes the late credential, then the marker the probe waits for.
pub fn plant_late_secret((secret, ready): &(PathBuf, PathBuf)) -> anyhow::Result<()> {
    write_file(secret, "machine late password seceval\n", 0o644)?;
    write_file(ready, "", 0o644)
}

/// A block device node of the host (its disk, if it has one of the usual names).
fn block_device() -> String {
    ["vda", "sda", "nvme0n1", "xvda", "mmcblk0", "loop0"]
        .iter()
        .map(|name| format!("/dev/{name}"))
        .find(|path| Path::new(path).exists())
        .unwrap_or_else(|| "/dev/vda".to_owned())
}

fn abstract_listener(name: &str) -> anyhow::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixListener::bind_addr(&address)
        .with_context(|| format!("binding the abstract socket @{name}"))
}

/// The host's own address on its default route: the source address the kernel picks for a
/// destination off the box (connecting a UDP socket sends no packet).
fn host_global_ipv4() -> Option<String> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("203.0.113.1:9").ok()?;
    let address = socket.local_addr().ok()?.ip();
    (!address.is_loopback() && !address.is_unspecified()).then(|| address.to_string())
}

/// Replaces every `{name}` in `text` with its value; an unknown name is an error naming it.
pub fn expand(
    text: &str,
    values: &BTreeMap<String, String>,
    policies: &BTreeMap<String, PathBuf>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('}')
            .with_context(|| format!("unclosed placeholder in `{text}`"))?;
        let name = &after[..end];
        let value = match name.strip_prefix("policy:") {
            Some(policy) => policies.get(policy).map(|p| p.display().to_string()),
            None => values.get(name).cloned(),
        };
        out.push_str(
            &value.with_context(|| format!("`{{{name}}}` is not available on this host"))?,
        );
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Reads a file that may not exist yet as text (for logs of the fake servers).
pub fn read_text(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    text
}
