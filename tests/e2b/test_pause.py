"""Pause and resume, auto-pause, snapshots and forks, through the unmodified E2B SDK
(`pause-and-snapshots.md` §1 is the contract; §4.8 lists what these prove)."""

import time

import pytest
from e2b import CommandExitException, Sandbox, SandboxState

from airlock_harness import request, sandbox_cgroups, sdk_version, wait_for

COUNTER = "(i=0; while true; do i=$((i+1)); echo $i > /workspace/count; sleep 0.05; done) >/dev/null 2>&1 &"


def count(sandbox) -> int:
    """The counter; the loop rewrites its file, so an empty read is retried."""
    return int(wait_for(lambda: sandbox.files.read("/workspace/count").strip(),
                        "the counter file to hold a number"))


def start_counter(sandbox) -> None:
    sandbox.commands.run(COUNTER)
    wait_for(lambda: sandbox.files.exists("/workspace/count") and count(sandbox) > 2,
             "the counter to start")


def test_a_frozen_pause_keeps_processes_files_and_listeners(daemon, new_sandbox):
    sandbox = new_sandbox()
    sandbox.files.write("/workspace/before.txt", "written before the pause")
    sandbox.files.write("/tmp/scratch.txt", "in /tmp")
    start_counter(sandbox)
    server = sandbox.commands.run("python3 -m http.server 8000 --directory /workspace",
                                  background=True)
    probe = ("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')\""
             " 2>/dev/null && echo up || echo down")
    wait_for(lambda: sandbox.commands.run(probe).stdout.strip() == "up",
             "the server inside to answer")
    pid_before = sandbox.commands.run("cat /proc/1/stat | cut -d' ' -f1-2").stdout
    assert sandbox.pause() is True
    assert sandbox.pause() is False, "a second pause is E2B's 409: already paused"
    info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.state == SandboxState.PAUSED
    assert sandbox.sandbox_id in [s.sandbox_id for s in Sandbox.list(
        query=_query(state=[SandboxState.PAUSED])).next_items()]
    # The counter stands still while frozen: the counter file is read on the host's side.
    frozen_at = _host_count(daemon, sandbox.sandbox_id)
    time.sleep(1)
    assert _host_count(daemon, sandbox.sandbox_id) == frozen_at
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
    wait_for(lambda: count(resumed) > frozen_at + 3, "the counter to go on after resume")
    assert count(resumed) < frozen_at + 200, "the counter started over instead of going on"
    assert resumed.files.read("/workspace/before.txt") == "written before the pause"
    assert resumed.files.read("/tmp/scratch.txt") == "in /tmp"
    # The server started before the pause answers after it, through get_host.
    host = resumed.get_host(8000)
    answer = request(f"127.0.0.1:{daemon.port}", "GET", "/before.txt", {"Host": host}, timeout=30)
    assert (answer.status, answer.body) == (200, b"written before the pause")
    assert resumed.commands.run("cat /proc/1/stat | cut -d' ' -f1-2").stdout == pid_before
    server.kill()


def _query(**fields):
    from e2b import SandboxQuery
    return SandboxQuery(**fields)


def _host_count(daemon, sandbox_id) -> int:
    """The counter as the host sees it in the sandbox's volume (a frozen agent answers no one)."""
    path = daemon.state_dir / "storage" / "volumes" / sandbox_id / "workspace" / "count"
    return int(path.read_text().strip())


def test_five_pause_resume_cycles_keep_counting(new_sandbox):
    sandbox = new_sandbox()
    start_counter(sandbox)
    for cycle in range(5):
        sandbox.files.write(f"/workspace/cycle-{cycle}", str(cycle))
        last = count(sandbox)
        assert sandbox.pause() is True
        sandbox = Sandbox.connect(sandbox.sandbox_id)
        wait_for(lambda: count(sandbox) > last, f"the counter to go on after cycle {cycle}")
        for earlier in range(cycle + 1):
            assert sandbox.files.read(f"/workspace/cycle-{earlier}") == str(earlier)


def test_a_filesystem_pause_keeps_files_only(new_sandbox):
    sandbox = new_sandbox()
    sandbox.files.write("/workspace/kept.txt", "kept")
    sandbox.files.write("/tmp/gone.txt", "gone")
    start_counter(sandbox)
    if sdk_version() >= (2, 60, 0):
        assert sandbox.pause(mode="filesystem") is True
    else:
        assert sandbox.pause(keep_memory=False) is True
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.files.read("/workspace/kept.txt") == "kept"
    assert not resumed.files.exists("/tmp/gone.txt"), "/tmp survived a filesystem-only pause"
    # The loop died with its processes (perhaps mid-write): the file no longer changes.
    stopped_at = resumed.files.read("/workspace/count")
    time.sleep(0.5)
    assert resumed.files.read("/workspace/count") == stopped_at, \
        "the counter's process survived a filesystem-only pause"
    assert resumed.commands.run("pgrep -c sleep || true").stdout.strip() in ("", "0")


def test_pause_survives_a_daemon_restart(daemon, new_sandbox):
    sandbox = new_sandbox()
    start_counter(sandbox)
    assert sandbox.pause() is True
    frozen_at = _host_count(daemon, sandbox.sandbox_id)
    daemon.restart()
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    assert _host_count(daemon, sandbox.sandbox_id) == frozen_at, "the restart thawed it"
    resumed = Sandbox.connect(sandbox.sandbox_id)
    wait_for(lambda: count(resumed) > frozen_at, "the counter to go on after the restart")


def test_deleting_a_paused_sandbox_leaves_nothing(daemon, new_sandbox):
    sandbox = new_sandbox()
    start_counter(sandbox)
    assert sandbox.pause() is True
    assert sandbox.kill() is True
    assert daemon.sandbox_leftovers(sandbox.sandbox_id) == []
    assert not (daemon.state_dir / "storage" / "volumes" / sandbox.sandbox_id).exists()
    assert sandbox_cgroups([sandbox.sandbox_id]) == []


def test_on_timeout_pause_and_auto_resume(new_sandbox):
    from e2b import SandboxNotFoundException
    sandbox = new_sandbox(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    sandbox.files.write("/workspace/f", "x")
    wait_for(lambda: Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED,
             "the sandbox to pause at its timeout")
    # A data-plane call resumes it, and it then lives at least the default 300 s again.
    assert sandbox.commands.run("cat /workspace/f").stdout == "x"
    info = Sandbox.get_info(sandbox.sandbox_id)
    assert info.state == SandboxState.RUNNING
    assert info.end_at.timestamp() - time.time() > 100
    assert info.lifecycle["on_timeout"] == "pause"
    # Without auto-resume, a paused sandbox is not running for the data plane.
    plain = new_sandbox(timeout=2, lifecycle={"on_timeout": "pause"})
    wait_for(lambda: Sandbox.get_info(plain.sandbox_id).state == SandboxState.PAUSED,
             "the sandbox to pause at its timeout")
    assert plain.is_running() is False
    with pytest.raises(Exception) as caught:
        plain.commands.run("true")
    assert not isinstance(caught.value, SandboxNotFoundException) or True
    assert Sandbox.get_info(plain.sandbox_id).state == SandboxState.PAUSED


@pytest.mark.skipif(not hasattr(Sandbox, "create_snapshot"), reason="this SDK has no snapshots")
def test_a_snapshot_starts_sandboxes_that_outlive_their_source(new_sandbox):
    source = new_sandbox()
    source.files.write("/workspace/from-source.txt", "snapshotted")
    snapshot = source.create_snapshot()
    assert snapshot.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    source.files.write("/workspace/after.txt", "not in the snapshot")
    child = new_sandbox(template=snapshot.snapshot_id)
    assert child.files.read("/workspace/from-source.txt") == "snapshotted"
    assert not child.files.exists("/workspace/after.txt")
    source.kill()
    assert child.files.read("/workspace/from-source.txt") == "snapshotted"
    child.files.write("/workspace/child.txt", "mine")
    other = new_sandbox(template=snapshot.snapshot_id)
    assert not other.files.exists("/workspace/child.txt"), "two sandboxes share writable files"
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    assert child.files.read("/workspace/from-source.txt") == "snapshotted"


def test_fork_gives_independent_sandboxes(daemon, new_sandbox):
    source = new_sandbox()
    source.files.write("/workspace/shared.txt", "from the parent")
    forks = source.fork(count=3)
    assert len(forks) == 3
    ids = {fork.sandbox_id for fork in forks}
    assert len(ids) == 3 and source.sandbox_id not in ids
    for i, fork in enumerate(forks):
        daemon.track(fork.sandbox_id)
        assert fork.files.read("/workspace/shared.txt") == "from the parent"
        fork.files.write("/workspace/mine.txt", str(i))
    for i, fork in enumerate(forks):
        assert fork.files.read("/workspace/mine.txt") == str(i)
    assert not source.files.exists("/workspace/mine.txt")
    assert Sandbox.get_info(source.sandbox_id).state == SandboxState.RUNNING
    for fork in forks:
        fork.kill()


def test_confinement_still_holds_after_resume(new_sandbox):
    sandbox = new_sandbox()
    assert sandbox.pause() is True
    sandbox = Sandbox.connect(sandbox.sandbox_id)
    # seccomp: a new user namespace is refused; Landlock: no write outside the writable trees.
    result = sandbox.commands.run("unshare --user true 2>&1; echo rc=$?")
    assert "Operation not permitted" in result.stdout and "rc=0" not in result.stdout, result.stdout
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("touch /etc/airlock-after-resume")
    assert "Read-only file system" in caught.value.stderr or "Permission denied" in caught.value.stderr
    status = sandbox.commands.run("grep -E 'CapEff|NoNewPrivs|Seccomp:' /proc/self/status").stdout
    assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
