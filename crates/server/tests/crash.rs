//! `kill -9` of the daemon in the middle of 50 concurrent creates: after a restart, every
//! sandbox is either running and listed, or gone without a trace (no process, cgroup or
//! directory). Needs root and the sandbox binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use airlock_api::v1::{CreateSandboxRequest, ExecRequest};
use common::TestDaemon;

const COUNT: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_kill_9_during_50_creates_leaves_running_or_nothing() {
    common::require_binaries();
    let mut first = TestDaemon::start("crash", &[]);
    first.keep_state = true;
    let _cleanup = common::CleanupOnPanic {
        state_dir: first.state_dir.clone(),
    };
    let client = first.client();
    let daemon_pid = first.pid();

    // Watch the daemon's children (sandbox helpers) so that even those of creates that never
    // answered can be checked afterwards.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                seen.extend(common::children_of(daemon_pid));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            seen.extend(common::children_of(daemon_pid));
            seen
        })
    };

    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..COUNT {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let result = client.create(&CreateSandboxRequest::default()).await;
            done.fetch_add(1, Ordering::Relaxed);
            result.ok().map(|created| created.sandbox.id)
        }));
    }
    // Kill once some creates have answered and others are still in flight.
    while done.load(Ordering::Relaxed) < 10 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Kill first, then stop the watcher: its last scan must not delay the kill until every
    // create has finished.
    first.kill9();
    stop.store(true, Ordering::Relaxed);
    let children = watcher.join().unwrap();
    let mut answered = Vec::new();
    for task in tasks {
        if let Some(id) = task.await.unwrap() {
            answered.push(id);
        }
    }
    assert!(!answered.is_empty());
    assert!(
        answered.len() < COUNT,
        "every create finished before the kill"
    );

    // What the dead daemon had recorded: every id it ever started, with helpers if known.
    let recorded: HashMap<String, Option<(i32, u64)>> = common::stored_helpers(&first.state_dir)
        .into_iter()
        .collect();
    let mut ids: BTreeSet<String> = recorded.keys().cloned().collect();
    ids.extend(answered.iter().cloned());
    for entry in std::fs::read_dir(first.state_dir.join("sandboxes"))
        .unwrap()
        .flatten()
    {
        ids.insert(entry.file_name().to_string_lossy().into_owned());
    }

    let second = TestDaemon::start_in(&first.state_dir, &first.key, &[]);
    let client = second.client();
    let listed: BTreeSet<String> = client
        .list(&[], &Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    // A create that answered 201 was committed after its record was durable: it survives.
    for id in &answered {
        assert!(listed.contains(id), "the answered create {id} was lost");
    }
    eprintln!(
        "{} creates answered, {} rows recorded, {} ids known, {} listed after restart",
        answered.len(),
        recorded.len(),
        ids.len(),
        listed.len()
    );
    let mut listed_helpers = Vec::new();
    for id in &ids {
        if listed.contains(id) {
            // Running and listed: usable.
            let out = client
                .exec_collect(
                    id,
                    &ExecRequest {
                        argv: Some(vec!["echo".into(), "alive".into()]),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(out.stdout, b"alive\n", "listed sandbox {id} is not usable");
            listed_helpers.extend(recorded.get(id).copied().flatten());
        } else {
            common::assert_sandbox_gone(&second.state_dir, id, recorded.get(id).copied().flatten());
        }
    }
    // Every helper the dead daemon started is either a listed sandbox's or gone.
    for (pid, ticks) in children {
        if !listed_helpers.contains(&(pid, ticks)) {
            assert!(
                !common::process_alive(pid, Some(ticks)),
                "helper {pid} of an unlisted sandbox still runs"
            );
        }
    }
    // Nothing listed that the store did not know about, and no stray directory.
    assert!(listed.is_subset(&ids));
    let dirs: BTreeSet<String> = std::fs::read_dir(second.state_dir.join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, listed, "directories and listed sandboxes differ");
    drop(first);
}
