//! A running sandbox's watcher: it ends the sandbox at its deadline or when its agent exits,
//! and records each OOM kill of a workload process as an event, as it happens.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use super::{Daemon, Live};
use crate::store::now_ms;

/// How long a notification may precede the kill it announces: v1 notifies when the cgroup
/// reaches its limit, before the OOM killer has picked its victim (or reclaim has made room).
const OOM_SETTLE: Duration = Duration::from_millis(500);
const OOM_SETTLE_STEP: Duration = Duration::from_millis(20);

/// The OOM kill count once it has moved past `before`, or, if it does not within
/// [`OOM_SETTLE`] (the kernel reclaimed enough instead), as it is then.
async fn settled_kills(oom: &airlock_runtime::OomWatch, before: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + OOM_SETTLE;
    loop {
        let kills = oom.kills();
        if kills > before || tokio::time::Instant::now() >= deadline {
            return kills;
        }
        tokio::time::sleep(OOM_SETTLE_STEP).await;
    }
}

impl Daemon {
    pub(super) async fn watch(
        self: Arc<Self>,
        id: String,
        live: Arc<Live>,
        mut deadline: watch::Receiver<u64>,
    ) {
        #[allow(
            deprecated,
            reason = "the safe constructor: the OwnedFd owns its descriptor for the AsyncFd's whole \
                      life, which is the I/O-safety condition the unsafe replacement asks for"
        )]
        let pidfd = live.record.pidfd().and_then(AsyncFd::new);
        let Ok(pidfd) = pidfd else {
            self.end(&id, "ended", "the sandbox was gone when its watch began")
                .await;
            return;
        };
        #[allow(
            deprecated,
            reason = "as for the pidfd: the watch owns its descriptor for the AsyncFd's whole life"
        )]
        let oom = live
            .cgroup()
            .workload_oom_watch()
            .and_then(AsyncFd::new)
            .ok();
        let mut oom_kills = live.cgroup().workload_oom_kills();
        loop {
            let deadline_ms = *deadline.borrow_and_update();
            if deadline_ms == u64::MAX {
                return;
            }
            let remaining = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
            let oom_signalled = async {
                match &oom {
                    Some(oom) => oom.readable().await.map(|mut ready| ready.clear_ready()),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Ok(()) = oom_signalled => {
                    if let Some(oom) = &oom {
                        oom.get_ref().drain();
                        let kills = settled_kills(oom.get_ref(), oom_kills).await;
                        oom_kills = self.record_oom_kills(&id, kills, oom_kills);
                    }
                }
                () = tokio::time::sleep(remaining) => {
                    if *deadline.borrow() == deadline_ms {
                        self.expire(&id).await;
                        return;
                    }
                }
                _ = pidfd.readable() => {
                    // A pause that stops the processes stops this watcher first: then the
                    // agent's exit is the pause's, not the sandbox's end.
                    if *deadline.borrow() != u64::MAX {
                        self.end(&id, "ended", "the sandbox's agent exited").await;
                    }
                    return;
                }
                changed = deadline.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Records an event when the OOM killer has ended workload processes since `before`; returns
    /// the new count.
    pub(super) fn record_oom_kills(&self, id: &str, kills: u64, before: u64) -> u64 {
        if kills > before {
            self.event(
                Some(id),
                "oom_kill",
                &format!(
                    "the OOM killer ended {} workload process(es) at the memory limit; the sandbox keeps running ({kills} so far)",
                    kills - before
                ),
            );
        }
        kills.max(before)
    }
}
