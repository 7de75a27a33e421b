//! `proxy` network mode: the runtime runs one egress proxy per sandbox, outside it, and shows
//! the sandbox the proxy's socket and trust bundles in a directory bound at `EGRESS_DIR`.
//!
//! Secrets are read here, on the host, and handed to the proxy only; the sandbox's environment
//! gets opaque placeholders (`airlock_egress::generate_placeholder`).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_egress::{
    AuditSink, Placeholders, Proxy, ProxyOptions, SandboxProxySetup, Secrets, TestResolver, Webhook,
};
use airlock_policy::egress::{CredentialSource, EgressPlan, NetworkMode};
use airlock_policy::{
    EGRESS_CA, EGRESS_DIR, EGRESS_SOCKET, EGRESS_TRUST_BUNDLE, EgressSetup, Plan,
};

/// The loopback port inside a `proxy`-mode sandbox that `HTTP_PROXY` names.
pub const RELAY_PORT: u16 = 3128;

/// Why the egress proxy could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EgressSetupError {
    #[error("credential {name}: environment variable {var} is not set on the host")]
    MissingEnv { name: String, var: String },
    #[error("credential {name}: cannot read {}", path.display())]
    UnreadableFile {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare the egress directory {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the egress proxy refused the policy")]
    Proxy(#[from] airlock_egress::EgressError),
    #[error("cannot generate a credential placeholder")]
    Placeholder(#[from] airlock_egress::CredentialError),
    #[error("cannot start the egress proxy's thread")]
    Thread(#[source] std::io::Error),
}

/// Knobs of a session besides the plan. Tests set `test_resolver`; nothing in production does.
#[derive(Debug, Default)]
pub struct EgressOptions {
    /// TESTS ONLY: resolve names with this table (see `airlock_egress::TestResolver`).
    pub test_resolver: Option<Arc<TestResolver>>,
    /// TESTS ONLY: more roots to verify upstream certificates with.
    pub extra_upstream_roots_pem: Vec<String>,
    pub reviewer_webhook: Option<Webhook>,
    /// Where audit lines go (JSON, one per line).
    pub audit_log: Option<PathBuf>,
    /// Where audit lines go, instead of `audit_log` (the daemon writes two logs).
    pub audit_sink: Option<AuditSink>,
    /// The placeholders a restarted supervisor must keep (the sandbox's environment holds
    /// them); fresh ones otherwise.
    pub placeholders: Option<Placeholders>,
}

/// A running egress proxy for one sandbox. Dropping it stops the proxy and removes its
/// directory.
#[derive(Debug)]
pub struct EgressSession {
    proxy: Proxy,
    /// Its `host_dir` is the session's directory, removed on drop.
    setup: EgressSetup,
    env: Vec<(String, String)>,
    placeholders: Placeholders,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Reads each credential's value where the policy says it lives on the host.
pub fn read_secrets(plan: &EgressPlan) -> Result<Secrets, EgressSetupError> {
    let mut secrets = Secrets::new();
    for credential in &plan.credentials {
        let value = match &credential.source {
            CredentialSource::Env { var } => {
                std::env::var(var).map_err(|_| EgressSetupError::MissingEnv {
                    name: credential.name.clone(),
                    var: var.clone(),
                })?
            }
            CredentialSource::File { path } => std::fs::read_to_string(path)
                .map(|text| text.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|source| EgressSetupError::UnreadableFile {
                    name: credential.name.clone(),
                    path: path.clone(),
                    source,
                })?,
        };
        secrets.insert(credential.name.clone(), value);
    }
    Ok(secrets)
}

fn directory(path: &Path, mode: u32) -> Result<(), EgressSetupError> {
    let err = |source| EgressSetupError::Directory {
        path: path.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)
}

impl EgressSession {
    /// Starts the proxy for `plan` (which must be `proxy` mode) in `parent/egress`. `parent`
    /// must be private to the caller (0700): the socket in it accepts anyone who can reach it,
    /// and only the sandbox may. With `runtime`, the proxy runs on it; otherwise on a thread of
    /// its own.
    pub fn start(
        sandbox_id: &str,
        plan: &EgressPlan,
        parent: &Path,
        options: EgressOptions,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<EgressSession, EgressSetupError> {
        debug_assert_eq!(plan.mode, NetworkMode::Proxy);
        let dir = parent.join("egress");
        // Readable by the sandbox's unprivileged root, which sees only this directory. A
        // restarted supervisor finds it in place, bound into the sandbox: it is reused.
        if !dir.is_dir() {
            directory(&dir, 0o755)?;
        }
        let secrets = read_secrets(plan)?;
        let mut placeholders = options.placeholders.clone().unwrap_or_default();
        for credential in &plan.credentials {
            if !placeholders.contains_key(&credential.name) {
                placeholders.insert(
                    credential.name.clone(),
                    airlock_egress::generate_placeholder(&credential.name)?,
                );
            }
        }
        let audit = match (&options.audit_sink, &options.audit_log) {
            (Some(sink), _) => sink.clone(),
            (None, Some(path)) => {
                AuditSink::file(path).map_err(|e| EgressSetupError::Directory {
                    path: path.clone(),
                    source: std::io::Error::other(e),
                })?
            }
            (None, None) => AuditSink::discard(),
        };
        let proxy = Proxy::new(
            sandbox_id,
            plan,
            &secrets,
            &placeholders,
            audit,
            ProxyOptions {
                test_resolver: options.test_resolver,
                trust_bundle: None,
                extra_upstream_roots_pem: options.extra_upstream_roots_pem,
                reviewer_webhook: options.reviewer_webhook,
            },
        )?;
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .and_then(|()| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                })
                .map_err(|source| EgressSetupError::Directory { path, source })
        };
        write(EGRESS_CA, proxy.ca_certificate_pem())?;
        write(EGRESS_TRUST_BUNDLE, &proxy.trust_bundle_pem()?)?;
        let socket = dir.join(EGRESS_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).map_err(|source| {
            EgressSetupError::Directory {
                path: socket.clone(),
                source,
            }
        })?;
        // The sandbox's root is an unprivileged host uid; connect() needs write permission.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).map_err(
            |source| EgressSetupError::Directory {
                path: socket.clone(),
                source,
            },
        )?;
        listener
            .set_nonblocking(true)
            .map_err(|source| EgressSetupError::Directory {
                path: socket.clone(),
                source,
            })?;
        let thread = serve(proxy.clone(), listener, runtime)?;
        let inside = |name: &str| format!("{EGRESS_DIR}/{name}");
        let env = airlock_egress::sandbox_environment(
            plan,
            &placeholders,
            &SandboxProxySetup {
                proxy_port: RELAY_PORT,
                trust_bundle_path: &inside(EGRESS_TRUST_BUNDLE),
                ca_certificate_path: &inside(EGRESS_CA),
            },
        );
        Ok(EgressSession {
            proxy,
            setup: EgressSetup {
                host_dir: dir,
                relay_port: RELAY_PORT,
            },
            env,
            placeholders,
            thread,
        })
    }

    /// Points `plan` at this proxy: the view attachment and the sandbox's environment (proxy
    /// variables, trust bundle variables, credential placeholders).
    pub fn attach(&self, plan: &mut Plan) {
        plan.egress = Some(self.setup.clone());
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        plan.process
            .env
            .retain(|(key, _)| !names.contains(&key.as_str()));
        plan.process.env.extend(self.env.iter().cloned());
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    pub fn placeholders(&self) -> &Placeholders {
        &self.placeholders
    }
}

fn serve(
    proxy: Proxy,
    listener: std::os::unix::net::UnixListener,
    runtime: Option<tokio::runtime::Handle>,
) -> Result<Option<std::thread::JoinHandle<()>>, EgressSetupError> {
    if let Some(handle) = runtime {
        let _guard = handle.enter();
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(EgressSetupError::Thread)?;
        handle.spawn(async move { proxy.serve(listener).await });
        return Ok(None);
    }
    let thread = std::thread::Builder::new()
        .name("egress-proxy".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(listener) = tokio::net::UnixListener::from_std(listener) {
                    proxy.serve(listener).await;
                }
            });
        })
        .map_err(EgressSetupError::Thread)?;
    Ok(Some(thread))
}

impl Drop for EgressSession {
    fn drop(&mut self) {
        self.proxy.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.setup.host_dir);
    }
}
