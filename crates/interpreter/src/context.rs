//! Contexts: one kernel each, with its language and working directory. A context runs one
//! execution at a time (a second waits for the first); restart and remove kill its kernel
//! even while an execution runs, which then ends with an error that says so.
//!
//! Each language has one default context, made on first use, except python's, which the
//! service starts before its first request (a kernel start takes seconds).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedMutexGuard, watch};

use crate::Kernel;
use crate::kernel::{KernelError, KillReason, Launch};
use crate::languages::{KernelSpec, Kernels};
use crate::wire::ContextInfo;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a context cannot be made or used.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("no kernel for language {language:?} in this sandbox (kernels for: {available})")]
    NoKernel { language: String, available: String },
    #[error("cwd {0:?} is not a directory in the sandbox")]
    BadCwd(String),
    #[error("Context {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// One context.
pub struct Context {
    pub info: ContextInfo,
    spec: KernelSpec,
    cwd: PathBuf,
    /// Held by the running execution.
    exec: Arc<tokio::sync::Mutex<()>>,
    kernel: Mutex<Option<Arc<Kernel>>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// What an execution runs on: the kernel, the context's turn, and a note when the kernel
/// had died while idle and was started again.
#[derive(Debug)]
pub struct Turn {
    pub kernel: Arc<Kernel>,
    pub guard: OwnedMutexGuard<()>,
    pub restarted_after: Option<String>,
}

impl Context {
    pub fn language(&self) -> &str {
        &self.info.language
    }

    /// Waits for the context's turn and makes sure it has a live kernel.
    pub async fn turn(&self, service: &Service) -> Result<Turn, ContextError> {
        let guard = self.exec.clone().lock_owned().await;
        let current = lock(&self.kernel).clone();
        let mut restarted_after = None;
        if let Some(kernel) = current {
            match kernel.exited() {
                None => {
                    return Ok(Turn {
                        kernel,
                        guard,
                        restarted_after,
                    });
                }
                Some(how) => {
                    restarted_after = Some(format!(
                        "the {} kernel {how} while idle; it was started again, and the state of this context is lost",
                        self.info.language
                    ));
                }
            }
        }
        let kernel = Arc::new(service.start_kernel(&self.spec, &self.cwd).await?);
        *lock(&self.kernel) = Some(kernel.clone());
        Ok(Turn {
            kernel,
            guard,
            restarted_after,
        })
    }

    /// Drops `kernel` from the context if it is still the current one (after it died during
    /// an execution, which has reported it); the next execution starts a new one.
    pub fn forget(&self, kernel: &Arc<Kernel>) {
        let mut current = lock(&self.kernel);
        if current.as_ref().is_some_and(|k| Arc::ptr_eq(k, kernel)) {
            *current = None;
        }
    }

    async fn kill(&self, reason: KillReason) {
        let current = lock(&self.kernel).take();
        if let Some(kernel) = current {
            kernel.kill(reason).await;
        }
    }

    /// Kills the kernel (an execution in progress ends with `ContextRestarting`), then starts
    /// a new one in its turn.
    pub async fn restart(&self, service: &Service) -> Result<(), ContextError> {
        self.kill(KillReason::Restart).await;
        let _guard = self.exec.lock().await;
        self.kill(KillReason::Restart).await;
        let kernel = service.start_kernel(&self.spec, &self.cwd).await?;
        *lock(&self.kernel) = Some(Arc::new(kernel));
        Ok(())
    }
}

/// The state of the default python kernel, for `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warmth {
    Starting,
    Ready,
    Failed(String),
}

/// The contexts and what starting a kernel needs.
#[derive(Debug)]
pub struct Service {
    kernels: Kernels,
    default_cwd: PathBuf,
    runtime_dir: PathBuf,
    kernel_env: Vec<(String, String)>,
    contexts: Mutex<Contexts>,
    /// Serialises the creation of default contexts.
    defaults_lock: tokio::sync::Mutex<()>,
    warmth: watch::Sender<Warmth>,
}

#[derive(Debug, Default)]
struct Contexts {
    /// In creation order, for `GET /contexts`.
    order: Vec<String>,
    by_id: HashMap<String, Arc<Context>>,
    /// language → the id of its default context.
    defaults: HashMap<String, String>,
}

impl Service {
    pub fn new(
        kernels: Kernels,
        default_cwd: PathBuf,
        runtime_dir: PathBuf,
        kernel_env: Vec<(String, String)>,
    ) -> Service {
        Service {
            kernels,
            default_cwd,
            runtime_dir,
            kernel_env,
            contexts: Mutex::new(Contexts::default()),
            defaults_lock: tokio::sync::Mutex::new(()),
            warmth: watch::Sender::new(Warmth::Starting),
        }
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    pub fn warmth(&self) -> Warmth {
        self.warmth.borrow().clone()
    }

    async fn start_kernel(&self, spec: &KernelSpec, cwd: &Path) -> Result<Kernel, KernelError> {
        let launch = Launch {
            cwd,
            env: &self.kernel_env,
            runtime_dir: &self.runtime_dir,
        };
        Kernel::start(spec, &launch).await
    }

    fn insert(&self, context: Context, default: bool) -> Arc<Context> {
        let context = Arc::new(context);
        let mut contexts = lock(&self.contexts);
        let id = context.info.id.clone();
        contexts.order.push(id.clone());
        if default {
            contexts
                .defaults
                .insert(context.info.language.clone(), id.clone());
        }
        contexts.by_id.insert(id, context.clone());
        context
    }

    fn prepare(&self, language: &str, cwd: Option<&str>) -> Result<Context, ContextError> {
        let spec = self
            .kernels
            .for_language(language)
            .ok_or_else(|| ContextError::NoKernel {
                language: language.to_owned(),
                available: self.kernels.languages().join(", "),
            })?;
        let cwd = match cwd {
            Some(cwd) if !cwd.is_empty() => {
                let path = PathBuf::from(cwd);
                if !path.is_dir() {
                    return Err(ContextError::BadCwd(cwd.to_owned()));
                }
                path
            }
            _ => self.default_cwd.clone(),
        };
        Ok(Context {
            info: ContextInfo {
                id: uuid::Uuid::new_v4().to_string(),
                language: language.to_owned(),
                cwd: cwd.display().to_string(),
            },
            spec,
            cwd,
            exec: Arc::new(tokio::sync::Mutex::new(())),
            kernel: Mutex::new(None),
        })
    }

    /// `POST /contexts`: a new context whose kernel is running when this returns.
    pub async fn create(
        &self,
        language: &str,
        cwd: Option<&str>,
    ) -> Result<Arc<Context>, ContextError> {
        let context = self.prepare(language, cwd)?;
        let kernel = self.start_kernel(&context.spec, &context.cwd).await?;
        *lock(&context.kernel) = Some(Arc::new(kernel));
        Ok(self.insert(context, false))
    }

    /// The default context of `language`, made (without a kernel yet) on first use.
    pub async fn default_context(&self, language: &str) -> Result<Arc<Context>, ContextError> {
        let _creating = self.defaults_lock.lock().await;
        if let Some(context) = self.default_if_made(language) {
            return Ok(context);
        }
        let context = self.prepare(language, None)?;
        Ok(self.insert(context, true))
    }

    fn default_if_made(&self, language: &str) -> Option<Arc<Context>> {
        let contexts = lock(&self.contexts);
        let id = contexts.defaults.get(language)?;
        contexts.by_id.get(id).cloned()
    }

    /// Makes the python default context and starts its kernel, holding the context's turn
    /// so that an early execution waits for this kernel instead of starting another.
    pub async fn warm_up(&self) {
        let result = async {
            let context = self.default_context("python").await?;
            drop(context.turn(self).await?);
            Ok::<(), ContextError>(())
        }
        .await;
        self.warmth.send_replace(match result {
            Ok(()) => Warmth::Ready,
            Err(err) => Warmth::Failed(error_chain(&err)),
        });
    }

    pub fn get(&self, id: &str) -> Result<Arc<Context>, ContextError> {
        lock(&self.contexts)
            .by_id
            .get(id)
            .cloned()
            .ok_or_else(|| ContextError::NotFound(id.to_owned()))
    }

    pub fn list(&self) -> Vec<ContextInfo> {
        let contexts = lock(&self.contexts);
        contexts
            .order
            .iter()
            .filter_map(|id| contexts.by_id.get(id))
            .map(|c| c.info.clone())
            .collect()
    }

    /// `DELETE /contexts/{id}`: the kernel is killed (an execution in progress ends with
    /// `ContextRemoved`).
    pub async fn remove(&self, id: &str) -> Result<(), ContextError> {
        let context = {
            let mut contexts = lock(&self.contexts);
            let context = contexts
                .by_id
                .remove(id)
                .ok_or_else(|| ContextError::NotFound(id.to_owned()))?;
            contexts.order.retain(|other| other != id);
            contexts.defaults.retain(|_, other| other != id);
            context
        };
        context.kill(KillReason::Remove).await;
        Ok(())
    }

    /// Kills every kernel (the service is stopping).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Context>> = lock(&self.contexts).by_id.values().cloned().collect();
        for context in all {
            context.kill(KillReason::Shutdown).await;
        }
    }
}

/// An error and its causes on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
