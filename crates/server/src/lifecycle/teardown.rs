//! Deletes answer before the kernel has finished tearing a sandbox down. A delete kills every
//! process of the sandbox and removes its row before it answers; waiting for the helper to
//! end (the kernel dismantling the sandbox's namespaces), removing the cgroup, the scratch
//! volume and the directory go on in the background. So that nobody can tell, a list waits for
//! every teardown that began before it, and a graceful stop for all of them. A create, which
//! sees nothing of another sandbox (its id and cgroup name are new), waits only when
//! `--max-sandboxes` would otherwise be exceeded by sandboxes still being torn down: they hold
//! host resources until they are gone, and the limit counts them.

use std::collections::BTreeSet;

use tokio::sync::watch;

/// Teardowns in flight, by the order they began in.
#[derive(Debug, Default)]
struct InFlight {
    next: u64,
    running: BTreeSet<u64>,
}

#[derive(Debug)]
pub(super) struct Teardowns {
    state: watch::Sender<InFlight>,
}

impl Default for Teardowns {
    fn default() -> Teardowns {
        Teardowns {
            state: watch::Sender::new(InFlight::default()),
        }
    }
}

/// One teardown's place; [`Teardowns::done`] gives it back.
#[derive(Debug)]
pub(super) struct Ticket(u64);

impl Teardowns {
    pub(super) fn begin(&self) -> Ticket {
        let mut ticket = 0;
        self.state.send_modify(|state| {
            ticket = state.next;
            state.next += 1;
            state.running.insert(ticket);
        });
        Ticket(ticket)
    }

    /// How many teardowns run now.
    pub(super) fn running(&self) -> usize {
        self.state.borrow().running.len()
    }

    pub(super) fn done(&self, ticket: Ticket) {
        self.state.send_modify(|state| {
            state.running.remove(&ticket.0);
        });
    }

    /// Returns once every teardown that had begun when it was called has ended (later ones are
    /// not waited for, so a steady stream of deletes cannot starve a create).
    pub(super) async fn settled(&self) {
        if let Some(wait) = self.wait_for_begun() {
            wait.await;
        }
    }

    /// What [`Teardowns::settled`] waits on, fixed when it is called: nothing when no
    /// teardown runs.
    fn wait_for_begun(&self) -> Option<impl Future<Output = ()> + use<>> {
        let mut receiver = {
            let state = self.state.borrow();
            if state.running.is_empty() {
                return None;
            }
            self.state.subscribe()
        };
        let before = receiver.borrow().next;
        Some(async move {
            let _ = receiver
                .wait_for(|state| state.running.first().is_none_or(|&first| first >= before))
                .await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn test_settled_waits_for_earlier_teardowns_only() {
        let teardowns = Teardowns::default();
        assert!(teardowns.wait_for_begun().is_none());
        let first = teardowns.begin();
        let waiting = tokio::spawn(teardowns.wait_for_begun().unwrap());
        // Begun after the waiter looked: not waited for.
        let later = teardowns.begin();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        teardowns.done(first);
        waiting.await.unwrap();
        let waiting = tokio::spawn(teardowns.wait_for_begun().unwrap());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        teardowns.done(later);
        waiting.await.unwrap();
        assert!(teardowns.wait_for_begun().is_none());
    }
}
