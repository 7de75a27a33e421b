//! `child::reap_any` reaps any child of the process, so it is tested alone in its own process.

use std::ffi::OsString;
use std::path::Path;

use airlock_jail::child::{ChildSpec, Stdio, reap_any, spawn};

#[test]
fn reap_any_returns_each_exited_child_once_then_none() {
    let argv: Vec<OsString> = ["sh", "-c", "exit 7"].iter().map(OsString::from).collect();
    let child = spawn(&ChildSpec {
        program: Path::new("/bin/sh"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pipes { stdin: false },
        cgroup_procs: None,
    })
    .unwrap();
    let (pid, status) = loop {
        if let Some(reaped) = reap_any() {
            break reaped;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert_eq!(pid, child.pid);
    assert_eq!(status.code(), Some(7));
    assert!(reap_any().is_none(), "no child is left");
}
