//! The policy pipeline's invariants, for fuzzers: any input either is refused with well-formed
//! problems, or becomes a policy that compiles, explains and proves consistently. Shared by
//! the cargo-fuzz target (`crates/policy/fuzz`) and the bounded stable run
//! (`crates/policy/tests/fuzz_policy.rs`). Panics on a broken invariant; that is the finding.

use airlock_api::{SandboxConfig, Tier, WorkspaceSource};

use crate::compile::{HostFacts, compile};
use crate::document::Policy;
use crate::document_compile::egress_plan;
use crate::egress::HostPattern;
use crate::explain::explain;
use crate::net;
use crate::prover::{diff, within};

/// Feeds one input through the whole pipeline and checks its invariants.
pub fn check_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policy = match Policy::from_yaml("fuzz.yaml", text) {
        Ok(policy) => policy,
        Err(err) => {
            // YAML breaks lines at `\n`, `\r` and `\r\n`; this counts a CRLF twice, an upper bound.
            let lines = text.matches(['\n', '\r']).count() as u64 + 1;
            assert!(!err.problems().is_empty(), "an error without problems");
            for problem in err.problems() {
                assert!(!problem.message.is_empty(), "an empty message");
                let shown = problem.to_string();
                assert!(
                    !shown.contains(['\n', '\r']),
                    "a multi-line problem: {shown:?}"
                );
                if let Some(line) = problem.line {
                    assert!(
                        line >= 1 && line <= lines,
                        "line {line} of {lines}: {problem}"
                    );
                }
            }
            return;
        }
    };
    let merged = policy.document();
    assert!(merged.extends.is_empty(), "extends survived the merge");
    let again = Policy::from_document(merged)
        .unwrap_or_else(|e| panic!("the merged document is invalid: {e}"));
    assert_eq!(again.document(), merged, "merging is not idempotent");
    assert!(diff(&policy, &policy).is_empty(), "a policy widens itself");
    assert!(
        within(&policy, &policy).is_ok(),
        "a policy is outside itself"
    );

    let plan = egress_plan(&policy);
    assert_eq!(plan.rules.len(), merged.network.egress.len());
    for credential in &plan.credentials {
        for endpoint in &credential.endpoints {
            let example = net::host_example(&endpoint.host.0);
            let covered = plan.rules.iter().any(|rule| {
                covers_example(&rule.host, &example) && rule.ports.contains(&endpoint.port)
            });
            assert!(covered, "credential endpoint {example} has no egress rule");
        }
    }

    let facts = HostFacts {
        caller_uid: 1000,
        caller_gid: 1000,
        state_dirs: vec!["/var/lib/airlock".into()],
    };
    for workspace in [
        WorkspaceSource::Fresh,
        WorkspaceSource::Host {
            path: "/src".into(),
        },
    ] {
        let mut config = SandboxConfig::new(vec!["/bin/true".into()]);
        config.workspace = workspace;
        policy.settings().apply(&mut config);
        config.policy = Some(Box::new(merged.clone()));
        if let Ok(compiled) = compile(&config, &facts) {
            for path in &compiled.view.read_only_paths {
                let top = path.components().nth(1);
                assert!(
                    matches!(
                        top.and_then(|c| c.as_os_str().to_str()),
                        Some("workspace" | "tmp")
                    ),
                    "a read-only bind outside the writable roots: {}",
                    path.display()
                );
            }
        }
        for tier in [Tier::Process, Tier::Container, Tier::Microvm] {
            assert!(!explain(&policy, tier, &config, &facts).is_empty());
        }
    }
}

fn covers_example(pattern: &HostPattern, example: &str) -> bool {
    pattern.matches(example) || net::host_covers(&pattern.0, example)
}

/// A small deterministic generator (xorshift64*), so that a stable run is reproducible. The
/// agent's and the daemon's stable fuzzing use it too.
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

/// Fragments worth splicing into a policy: keys, values and YAML syntax.
pub const DICTIONARY: &[&str] = &[
    "version: 1\n",
    "extends: [",
    "workspace",
    "networked-dev",
    "read-only",
    "filesystem:\n",
    "  rules:\n",
    "    \":workspace\": ",
    "    \"~/.ssh\": ",
    "/etc/shadow",
    ":tmp",
    "~",
    "ro",
    "rw",
    "deny",
    "  protected: [",
    "  protect_git: false\n",
    "process:\n",
    "  user: ",
    "\"1000:1000\"",
    "  syscalls:\n",
    "    deny_extra: [",
    "    allow_extra: [",
    "io_uring_setup",
    "keyctl",
    "kcmp",
    "resources:\n",
    "  memory: ",
    "512MiB",
    "max",
    "  pids: ",
    "  cpus: ",
    "1.5",
    "  timeout: ",
    "30s",
    "network:\n",
    "  mode: ",
    "proxy",
    "full",
    "none",
    "  egress:\n",
    "    - name: ",
    "      host: ",
    "*.example.com",
    "api.example.com",
    "169.254.169.254",
    "[::ffff:7f00:1]",
    "0x7f.1",
    "*",
    "      ports: [",
    "443",
    "0",
    "65535",
    "      access: ",
    "read-write",
    "      methods: [",
    "GET",
    "POST",
    "      paths: [",
    "\"/a/**\"",
    "      allowed_ips: [",
    "10.0.0.0/8",
    "      git_push_refs: [",
    "refs/heads/agent-*",
    "refs/../x",
    "fe80::/10",
    "credentials:\n",
    "  - name: ",
    "    source: {env: ",
    "    source: {file: ",
    "    env: ",
    "    inject: bearer\n",
    "    inject: {header: X-Key}\n",
    "    inject: {basic: {username: u}}\n",
    "    endpoints:\n",
    "      - host: ",
    "        port: ",
    "approvals:\n",
    "  unmatched: ask\n",
    "  timeout: ",
    "audit:\n",
    "  egress: all\n",
    "tier: ",
    "microvm",
    "container",
    ": ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\n",
    "  ",
    "&a ",
    "*a",
    "!!str ",
    "'",
    "\"",
    "#",
    "---\n",
    "...\n",
    "? ",
    "|\n",
    ">\n",
    "\t",
    "\\u0000",
    "é",
];

/// One mutation of `input`: a byte flip, an insertion from the dictionary, a deletion, a
/// splice with another seed, or a duplicated line.
pub fn mutate(input: &[u8], seeds: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = if out.is_empty() {
            0
        } else {
            rng.below(out.len() + 1)
        };
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 | 2 => {
                let word = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
                out.splice(at..at, word.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 => {
                let other = seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let to = (from + 1 + rng.below(64)).min(other.len());
                    out.splice(at..at, other[from..to].iter().copied());
                }
            }
            _ => {
                // Duplicate the line that holds `at`.
                let start = out[..at]
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                let end = out[at..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(out.len(), |i| at + i + 1);
                let line = out[start..end].to_vec();
                out.splice(start..start, line);
            }
        }
    }
    out.truncate(64 * 1024);
    out
}
