//! The layer applier's invariants, shared by the cargo-fuzz target (`crates/image/fuzz`), the
//! bounded stable fuzzer (`tests/fuzz_layers.rs`) and the hostile-layer tests: a raw tar
//! writer that can say anything (`..`, absolute paths, devices), the corpus of hostile layers,
//! and [`apply_confined`], which applies a layer in a fresh scratch tree and reports anything
//! that appeared outside the layer's directory.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layer::{self, ApplyError, Decompressed, LayerReport, Limits, Ownership};
use crate::oci::LayerCompression;

/// An absolute path that hostile layers aim at; it must never exist after an apply.
pub const CANARY: &str = "/tmp/airlock-layer-canary";

/// Builds tar streams header by header, without the checks of `tar::Builder` (which refuses
/// `..`), so that tests can write what an attacker would.
#[derive(Debug, Default, Clone)]
pub struct TarWriter {
    out: Vec<u8>,
}

impl TarWriter {
    pub fn new() -> TarWriter {
        TarWriter::default()
    }

    fn header(&mut self, kind: u8, path: &[u8], link: &[u8], mode: u32, size: u64) {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_size(size);
        header.set_entry_type(tar::EntryType::new(kind));
        let old = header.as_old_mut();
        let n = path.len().min(100);
        old.name[..n].copy_from_slice(&path[..n]);
        let n = link.len().min(100);
        old.linkname[..n].copy_from_slice(&link[..n]);
        header.set_cksum();
        self.out.extend_from_slice(header.as_bytes());
    }

    fn data(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
    }

    /// Any entry; a path or link longer than 100 bytes gets a GNU long-name entry first.
    pub fn entry(
        &mut self,
        kind: u8,
        path: &[u8],
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) -> &mut TarWriter {
        if path.len() > 100 {
            self.header(b'L', b"././@LongLink", b"", 0o644, path.len() as u64 + 1);
            let mut name = path.to_vec();
            name.push(0);
            self.data(&name);
        }
        if link.len() > 100 {
            self.header(b'K', b"././@LongLink", b"", 0o644, link.len() as u64 + 1);
            let mut name = link.to_vec();
            name.push(0);
            self.data(&name);
        }
        self.header(kind, path, link, mode, data.len() as u64);
        self.data(data);
        self
    }

    pub fn file(&mut self, path: &str, data: &[u8]) -> &mut TarWriter {
        self.entry(b'0', path.as_bytes(), b"", 0o644, data)
    }

    pub fn dir(&mut self, path: &str) -> &mut TarWriter {
        self.entry(b'5', path.as_bytes(), b"", 0o755, b"")
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut TarWriter {
        self.entry(b'2', path.as_bytes(), target.as_bytes(), 0o777, b"")
    }

    pub fn hard_link(&mut self, path: &str, target: &str) -> &mut TarWriter {
        self.entry(b'1', path.as_bytes(), target.as_bytes(), 0o644, b"")
    }

    /// A PAX extended header for the next entry.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut TarWriter {
        let mut body = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where len counts itself.
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len.to_string().len() + rest > len {
                len += 1;
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        self.header(b'x', b"././@PaxHeader", b"", 0o644, body.len() as u64);
        self.data(&body);
        self
    }

    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.out.clone();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }
}

/// Hostile layers, by name. Each must leave everything outside its directory untouched; the
/// tests in `tests/hostile_layers.rs` check each one's specific outcome too.
pub fn hostile_layers() -> Vec<(&'static str, Vec<u8>)> {
    let mut layers = Vec::new();
    let mut add = |name, tar: &mut TarWriter| layers.push((name, tar.finish()));
    add(
        "symlink-escape-then-write",
        TarWriter::new()
            .symlink("esc", "../../..")
            .file("esc/escaped", b"x")
            .symlink("abs", "/tmp")
            .file("abs/airlock-layer-canary", b"x"),
    );
    add(
        "symlink-chain-escape",
        TarWriter::new()
            .dir("a")
            .symlink("a/b", "../..")
            .symlink("c", "a/b/../..")
            .file("c/escaped", b"x"),
    );
    add(
        "hard-link-absolute",
        TarWriter::new().hard_link("passwd", "/etc/passwd"),
    );
    add(
        "hard-link-dot-dot",
        TarWriter::new().hard_link("up", "../../../outside/sentinel"),
    );
    add(
        "hard-link-through-symlink",
        TarWriter::new()
            .symlink("etc", "/etc")
            .hard_link("shadow", "etc/shadow"),
    );
    add("dot-dot-path", TarWriter::new().file("../escaped", b"x"));
    add(
        "dot-dot-inside-path",
        TarWriter::new().dir("a").file("a/../../escaped", b"x"),
    );
    add(
        "absolute-path",
        TarWriter::new()
            .file(CANARY, b"x")
            .file("/etc/airlock-layer-canary", b"x"),
    );
    add(
        "whiteout-of-dot-dot",
        TarWriter::new().file("dir/.wh...", b"").file(".wh..", b""),
    );
    add(
        "opaque-at-root-and-below",
        TarWriter::new()
            .file(".wh..wh..opq", b"")
            .file("deep/er/.wh..wh..opq", b""),
    );
    add(
        "device-node",
        TarWriter::new()
            .entry(b'3', b"dev/kmsg", b"", 0o600, b"")
            .entry(b'4', b"dev/sda", b"", 0o600, b"")
            .entry(b'3', b"null0", b"", 0o600, b""),
    );
    add(
        "fifo",
        TarWriter::new().entry(b'6', b"pipe", b"", 0o600, b""),
    );
    add(
        "dir-replaced-by-symlink-then-write",
        TarWriter::new()
            .dir("d")
            .file("d/inside", b"1")
            .symlink("d", "../../..")
            .file("d/escaped", b"x")
            .dir("d/sub"),
    );
    add(
        "file-replaced-by-symlink-then-write",
        TarWriter::new()
            .file("f", b"1")
            .symlink("f", CANARY)
            .file("f", b"overwrite"),
    );
    add(
        "trusted-xattr",
        TarWriter::new()
            .pax(&[("SCHILY.xattr.trusted.overlay.opaque", b"y")])
            .dir("forged"),
    );
    add(
        "overlong-path",
        TarWriter::new().file(&"a/".repeat(2100), b"x"),
    );
    add(
        "overlong-component",
        TarWriter::new().file(&"n".repeat(300), b"x"),
    );
    add(
        "high-uid",
        TarWriter::new()
            .pax(&[("uid", b"4294967294")])
            .file("owned", b"x"),
    );
    let mut many = TarWriter::new();
    for i in 0..2000 {
        many.file(&format!("f{i}"), b"");
    }
    add("huge-file-count", &mut many);
    add(
        "nul-in-symlink-target",
        TarWriter::new()
            .pax(&[("linkpath", b"/tmp\0x")])
            .symlink("n", "x"),
    );
    add(
        "pax-size-mismatch",
        TarWriter::new()
            .pax(&[("size", b"999999999")])
            .file("s", b"x"),
    );
    layers
}

static SCRATCH: AtomicU64 = AtomicU64::new(0);

/// What [`apply_confined`] found.
#[derive(Debug)]
pub struct Confined {
    pub result: Result<LayerReport, ApplyError>,
    /// Paths that appeared or changed outside the layer directory (must be empty).
    pub escapes: Vec<String>,
    /// Special files inside the layer other than whiteouts (must be empty).
    pub specials: Vec<String>,
    /// The layer directory (removed when this value drops).
    pub root: PathBuf,
    scratch: PathBuf,
}

impl Drop for Confined {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (u64, u64, u64)>, skip: &[&Path]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if skip.contains(&path.as_path()) {
            continue;
        }
        if let Ok(meta) = fs::symlink_metadata(&path) {
            out.insert(path.clone(), (meta.ino(), meta.size(), meta.nlink()));
            if meta.is_dir() {
                walk(&path, out, skip);
            }
        }
    }
}

/// Applies the (possibly compressed) layer `input` into `<scratch>/l1/l2/l3/root` (scratch on
/// `/dev/shm` when it exists), beside an
/// `outside/sentinel` file, and compares everything outside `root` before and after.
pub fn apply_confined(input: &[u8], limits: &Limits) -> Confined {
    // A tmpfs when there is one: thousands of scratch trees a second, none on the disk.
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let scratch = base.join(format!(
        "airlock-layer-check-{}-{}",
        std::process::id(),
        SCRATCH.fetch_add(1, Ordering::Relaxed)
    ));
    let root = scratch.join("l1/l2/l3/root");
    let trash = scratch.join("trash");
    let _ = fs::remove_dir_all(&scratch);
    for dir in [&root, &trash, &scratch.join("l1/l2/l3/outside")] {
        let _ = fs::create_dir_all(dir);
    }
    let _ = fs::write(scratch.join("l1/l2/l3/outside/sentinel"), b"sentinel");
    let skip = [root.as_path(), trash.as_path()];
    let mut before = BTreeMap::new();
    walk(&scratch, &mut before, &skip);
    let canary_before = fs::symlink_metadata(CANARY).is_ok();
    let result = match (fs::File::open(&root), fs::File::open(&trash)) {
        (Ok(root_dir), Ok(trash_dir)) => Decompressed::new(input, LayerCompression::None)
            .map_err(ApplyError::Read)
            .and_then(|mut stream| {
                let applied = layer::apply(
                    &mut stream,
                    root_dir.as_fd(),
                    trash_dir.as_fd(),
                    limits,
                    Ownership::for_this_process(),
                );
                // Drain what the tar did not read, as the store does for the diff id.
                let _ = std::io::copy(&mut stream.by_ref().take(64 << 20), &mut std::io::sink());
                applied
            }),
        (Err(e), _) | (_, Err(e)) => Err(ApplyError::Read(e)),
    };
    let mut after = BTreeMap::new();
    walk(&scratch, &mut after, &skip);
    let mut escapes: Vec<String> = after
        .iter()
        .filter(|(path, state)| before.get(*path) != Some(state))
        .map(|(path, _)| path.display().to_string())
        .collect();
    if fs::read(scratch.join("l1/l2/l3/outside/sentinel"))
        .ok()
        .as_deref()
        != Some(b"sentinel")
    {
        escapes.push("outside/sentinel changed".to_owned());
    }
    if !canary_before && fs::symlink_metadata(CANARY).is_ok() {
        escapes.push(CANARY.to_owned());
        let _ = fs::remove_file(CANARY);
    }
    let mut inside = BTreeMap::new();
    walk(&root, &mut inside, &[]);
    let specials = inside
        .keys()
        .filter(|path| {
            fs::symlink_metadata(path).is_ok_and(|m| {
                let t = m.file_type();
                t.is_block_device()
                    || t.is_fifo()
                    || t.is_socket()
                    || (t.is_char_device() && m.rdev() != 0)
            })
        })
        .map(|path| path.display().to_string())
        .collect();
    Confined {
        result,
        escapes,
        specials,
        root,
        scratch,
    }
}

/// Rewrites the checksum of every header a tar reader would reach, so that mutated headers
/// are parsed instead of failing their checksum.
pub fn fix_checksums(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut at = 0usize;
    while at + 512 <= out.len() {
        let block = &mut out[at..at + 512];
        if block.iter().all(|&b| b == 0) {
            at += 512;
            continue;
        }
        let mut header = tar::Header::new_old();
        header.as_mut_bytes().copy_from_slice(block);
        header.set_cksum();
        block.copy_from_slice(header.as_bytes());
        let size = header.entry_size().unwrap_or(0).min(out.len() as u64) as usize;
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

/// How an input ended, so that a fuzzer can show it reaches past the tar parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Refused,
    Malformed,
    Other,
}

/// For a libFuzzer target, whose panic hook (libfuzzer-sys's) aborts on every panic before
/// any `catch_unwind`: the zstd decoder's panics unwind instead (the layer reader turns them
/// into [`layer::MalformedZstd`] errors), and every other panic still aborts. Call once.
pub fn let_decoder_panics_unwind() {
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_decoder = info
            .location()
            .is_some_and(|at| at.file().contains(layer::DECODER_SOURCE));
        if !in_decoder {
            abort(info);
        }
    }));
}

/// The fuzz invariant: whatever the bytes, no panic, nothing outside the layer directory,
/// and no device node or FIFO inside it.
pub fn check_one(data: &[u8]) -> Outcome {
    let limits = Limits {
        max_layer_bytes: 16 << 20,
        max_entries: 4096,
        max_path_bytes: 4096,
    };
    let confined = apply_confined(&fix_checksums(data), &limits);
    assert!(
        confined.escapes.is_empty(),
        "wrote outside the layer: {:?}",
        confined.escapes
    );
    assert!(
        confined.specials.is_empty(),
        "created special files: {:?}",
        confined.specials
    );
    match &confined.result {
        Ok(_) => Outcome::Applied,
        Err(ApplyError::Refused { .. }) => Outcome::Refused,
        Err(ApplyError::Malformed { .. }) => Outcome::Malformed,
        Err(_) => Outcome::Other,
    }
}

/// Fragments worth splicing into tar headers.
pub const DICTIONARY: &[&[u8]] = &[
    b"../",
    b"..",
    b"/",
    b"./",
    b".wh.",
    b".wh..wh..opq",
    b".wh..wh.plnk",
    b"/tmp/airlock-layer-canary",
    b"../../../",
    b"esc/",
    b"d/",
    b"\0",
    b"ustar ",
    b"SCHILY.xattr.trusted.",
    b"SCHILY.xattr.user.a",
    b"30 linkpath=/tmp/airlock-layer-canary\n",
];

/// A small deterministic generator (xorshift64*), so that a stable run is reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One tar-aware mutation of `input`: a bit flip, a dictionary word written into a header's
/// name or link field, a new entry type, a block spliced from another seed, a duplicated or
/// dropped block. [`check_one`] fixes the checksums afterwards.
pub fn mutate(input: &[u8], seeds: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(3) {
        let blocks = out.len() / 512;
        if blocks == 0 {
            out.extend_from_slice(seeds[rng.below(seeds.len())]);
            continue;
        }
        let block = rng.below(blocks) * 512;
        match rng.below(7) {
            0 => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 | 2 => {
                let word = DICTIONARY[rng.below(DICTIONARY.len())];
                let (field, len) = if rng.below(2) == 0 {
                    (0, 100)
                } else {
                    (157, 100)
                };
                let at = block + field + rng.below(len);
                for (i, b) in word.iter().enumerate() {
                    if at + i < (block + field + len).min(out.len()) {
                        out[at + i] = *b;
                    }
                }
            }
            3 => out[block + 156] = b"0125346xLKgS7\0"[rng.below(14)],
            4 => {
                let other = seeds[rng.below(seeds.len())];
                if other.len() >= 512 {
                    let from = rng.below(other.len() / 512) * 512;
                    out[block..block + 512].copy_from_slice(&other[from..from + 512]);
                }
            }
            5 => {
                let copy = out[block..(block + 512 * (1 + rng.below(4))).min(out.len())].to_vec();
                out.splice(block..block, copy);
            }
            _ => out.truncate(block),
        }
    }
    out.truncate(256 * 1024);
    out
}
