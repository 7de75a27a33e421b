//! The submission queue: the store's `judge0_submissions` rows in state `In Queue`, taken
//! oldest first by `--judge0-workers` worker tasks (the bounded concurrency). A worker claims
//! a row in one transaction, runs it, and stores the outcome; `wait=true` requests wait for
//! that; callbacks go out after it. At start-up, rows still `Processing` (their daemon
//! stopped or crashed mid-run) go back to the queue and their sandboxes are deleted, so
//! nothing is lost and nothing runs twice at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use super::runner::Runner;
use super::submission::{Fields, Submission};
use crate::lifecycle::Daemon;
use crate::store::{StoreError, now_ms};

/// A worker with nothing to do looks at the queue again at least this often (a safety net
/// behind the wake-ups).
const IDLE_RECHECK: Duration = Duration::from_secs(1);
/// How often finished submissions past `--judge0-retention` are deleted.
const TRIM_PERIOD: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Queue {
    runner: Runner,
    wake: Notify,
    /// `wait=true` requests, by token, told when their submission has finished.
    waiters: Mutex<HashMap<String, Vec<oneshot::Sender<()>>>>,
    working: AtomicUsize,
}

impl Queue {
    /// Requeues what a previous daemon left `Processing`, deletes its sandboxes, and starts
    /// the workers and the retention trim. Call after the lifecycle's `recover`.
    pub async fn start(runner: Runner) -> Result<Arc<Queue>, StoreError> {
        let store = runner.daemon.store.clone();
        let (tokens, mut orphans) = tokio::task::spawn_blocking(move || store.judge0_requeue())
            .await
            .unwrap_or_else(|e| Err(StoreError::BadState(format!("requeue task: {e}"))))?;
        // A daemon stopped between creating a run's sandbox and recording it leaves one that
        // only its metadata ties to the submission.
        if !tokens.is_empty() {
            let listed = runner
                .daemon
                .list(&[], &std::collections::BTreeMap::new())
                .unwrap_or_default();
            orphans.extend(listed.into_iter().filter_map(|sandbox| {
                let token = sandbox.metadata.get(super::runner::TOKEN_METADATA)?;
                tokens.contains(token).then_some(sandbox.id)
            }));
            orphans.sort();
            orphans.dedup();
        }
        for sandbox in orphans {
            // Re-adopted as a running sandbox by `recover`; its run starts over.
            let _ = runner.daemon.delete(&sandbox).await;
        }
        let queue = Arc::new(Queue {
            runner,
            wake: Notify::new(),
            waiters: Mutex::new(HashMap::new()),
            working: AtomicUsize::new(0),
        });
        for _ in 0..queue.runner.config.workers {
            tokio::spawn(queue.clone().work());
        }
        tokio::spawn(queue.clone().trim());
        Ok(queue)
    }

    fn daemon(&self) -> &Arc<Daemon> {
        &self.runner.daemon
    }

    /// How many workers there are and how many are running a submission.
    pub fn workers(&self) -> (usize, usize) {
        (
            self.runner.config.workers,
            self.working.load(Ordering::Relaxed),
        )
    }

    /// Queues submissions (all or none); false when the queue is full.
    pub async fn enqueue(&self, submissions: Vec<Submission>) -> Result<bool, StoreError> {
        let store = self.daemon().store.clone();
        let max = self.runner.config.max_queue;
        let count = submissions.len();
        let queued = tokio::task::spawn_blocking(move || store.judge0_enqueue(&submissions, max))
            .await
            .unwrap_or_else(|e| Err(StoreError::BadState(format!("enqueue task: {e}"))))?;
        if queued {
            for _ in 0..count.min(self.runner.config.workers) {
                self.wake.notify_one();
            }
        }
        Ok(queued)
    }

    /// A receiver told when `token` finishes. Register before queuing it.
    pub fn waiter(&self, token: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiters().entry(token.to_owned()).or_default().push(tx);
        rx
    }

    /// Drops the waiters of submissions that never got queued.
    pub fn forget(&self, token: &str) {
        self.waiters().remove(token);
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<oneshot::Sender<()>>>> {
        self.waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn work(self: Arc<Self>) {
        loop {
            let store = self.daemon().store.clone();
            let claimed = tokio::task::spawn_blocking(move || store.judge0_claim()).await;
            let submission = match claimed {
                Ok(Ok(Some(submission))) => submission,
                Ok(Ok(None)) => {
                    let _ = tokio::time::timeout(IDLE_RECHECK, self.wake.notified()).await;
                    continue;
                }
                Ok(Err(err)) => {
                    eprintln!("airlockd: judge0: cannot take a submission from the queue: {err}");
                    tokio::time::sleep(IDLE_RECHECK).await;
                    continue;
                }
                Err(_) => continue,
            };
            self.working.fetch_add(1, Ordering::Relaxed);
            let finished = self.process(submission).await;
            self.working.fetch_sub(1, Ordering::Relaxed);
            if let Some(submission) = finished {
                self.finished(submission);
            }
        }
    }

    /// Runs a claimed submission and stores its outcome; `None` if storing failed (it stays
    /// `Processing` and the next daemon runs it again).
    async fn process(&self, submission: Submission) -> Option<Submission> {
        let token = submission.token.clone();
        let store = self.daemon().store.clone();
        let record_sandbox = |sandbox: Option<&str>| {
            if let Err(err) = store.judge0_set_sandbox(&token, sandbox) {
                eprintln!("airlockd: judge0: cannot record the sandbox of {token}: {err}");
            }
        };
        let finished = self.runner.run(submission, record_sandbox).await;
        let store = self.daemon().store.clone();
        let stored = finished.clone();
        match tokio::task::spawn_blocking(move || store.judge0_finish(&stored)).await {
            Ok(Ok(())) => Some(finished),
            Ok(Err(err)) => {
                eprintln!(
                    "airlockd: judge0: cannot store the outcome of {}: {err}",
                    finished.token
                );
                None
            }
            Err(_) => None,
        }
    }

    fn finished(&self, submission: Submission) {
        for waiter in self.waiters().remove(&submission.token).unwrap_or_default() {
            let _ = waiter.send(());
        }
        let Some(url) = submission.params.callback_url.clone() else {
            return;
        };
        let policy = self.runner.config.callbacks.clone();
        let daemon = self.daemon().clone();
        tokio::spawn(async move {
            // Judge0's callback body: the default fields, base64-encoded.
            let Ok(body) = submission.render(&Fields::defaults(), true, None) else {
                return;
            };
            let body = bytes::Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
            let message = match policy.check(&url) {
                Err(refused) => format!("callback to {url} refused: {refused}"),
                Ok(checked) => match policy.deliver(&checked, body).await {
                    Ok(status) => format!("callback to {url} answered {status}"),
                    Err(err) => format!(
                        "callback to {url} failed: {}",
                        crate::error::ApiError::from_chain(
                            airlock_api::v1::ErrorCode::Internal,
                            &err
                        )
                        .message
                    ),
                },
            };
            let _ = daemon.store.record_event(None, "judge0_callback", &message);
        });
    }

    async fn trim(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(TRIM_PERIOD);
        loop {
            ticks.tick().await;
            let store = self.daemon().store.clone();
            let cutoff = now_ms().saturating_sub(self.runner.config.retention_ms);
            if let Ok(Err(err)) =
                tokio::task::spawn_blocking(move || store.judge0_trim(cutoff)).await
            {
                eprintln!("airlockd: judge0: cannot trim finished submissions: {err}");
            }
        }
    }
}
