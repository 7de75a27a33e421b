"""Commands through the unmodified e2b SDK: output, exit codes, environment, cwd, user,
streaming callbacks, background commands, stdin, the command timeout and PTYs."""

import threading

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    PtySize,
    Sandbox,
    TimeoutException,
)

from airlock_harness import wait_for


def test_create_run_and_kill_with_the_sdk_defaults(daemon):
    sandbox = Sandbox.create()  # default template and lifetime
    daemon.track(sandbox.sandbox_id)
    try:
        assert sandbox.sandbox_id
        assert sandbox.is_running()
        result = sandbox.commands.run("echo hello")
        assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "", 0)
    finally:
        assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id) is False, "a second kill finds no sandbox"


def test_stdout_and_stderr_arrive_apart_and_intact(sandbox):
    result = sandbox.commands.run("printf 'to out\\n'; printf 'to err\\n' >&2; printf 'żółw ✓'")
    assert result.stdout == "to out\nżółw ✓"
    assert result.stderr == "to err\n"


def test_large_output_arrives_whole(sandbox):
    result = sandbox.commands.run("seq 1 100000")
    assert result.stdout == "".join(f"{i}\n" for i in range(1, 100001))


@pytest.mark.parametrize("code", [1, 3, 42, 255])
def test_a_failing_command_raises_with_its_exit_code_and_output(sandbox, code):
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run(f"echo before; echo oops >&2; exit {code}")
    assert caught.value.exit_code == code
    assert caught.value.stdout == "before\n"
    assert caught.value.stderr == "oops\n"


def test_a_missing_program_exits_127(sandbox):
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("no-such-program-airlock")
    assert caught.value.exit_code == 127
    assert "no-such-program-airlock" in caught.value.stderr


def test_a_command_killed_by_a_signal_reports_minus_one(sandbox):
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("echo started; kill -9 $$")
    assert caught.value.exit_code == -1, "envd reports -1 for a process a signal ended"
    assert caught.value.stdout == "started\n"


def test_an_oom_killed_command_says_so_and_the_sandbox_lives_on(sandbox):
    # 3 GiB touched against the sandbox's 2 GiB: the OOM killer must pick the command, never
    # the agent, and the end event's error says why it died.
    sandbox.files.write("/workspace/kept", "still here")
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("python3 -c 'b = bytearray(3 << 30)'")
    assert caught.value.exit_code != 0
    assert "out of memory" in (caught.value.error or ""), caught.value
    assert sandbox.commands.run("echo alive").stdout == "alive\n"
    assert sandbox.files.read("/workspace/kept") == "still here"


def test_sandbox_envs_and_command_envs_reach_the_process(new_sandbox):
    sandbox = new_sandbox(envs={"FROM_CREATE": "created value", "SHADOWED": "sandbox"})
    result = sandbox.commands.run(
        'echo "$FROM_CREATE|$FROM_RUN|$SHADOWED"', envs={"FROM_RUN": "run value", "SHADOWED": "command"})
    assert result.stdout == "created value|run value|command\n"
    # The command's own envs do not stick to the sandbox.
    assert sandbox.commands.run('echo "$FROM_CREATE|${FROM_RUN-unset}|$SHADOWED"').stdout == \
        "created value|unset|sandbox\n"


def test_cwd_is_honoured_and_a_missing_one_is_refused(sandbox):
    sandbox.files.make_dir("/tmp/work dir/inner")
    assert sandbox.commands.run("pwd", cwd="/tmp/work dir/inner").stdout == "/tmp/work dir/inner\n"
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("pwd", cwd="/tmp/no-such-dir-airlock")


def test_user_root_runs_as_root_and_an_unknown_user_is_refused(sandbox):
    assert sandbox.commands.run("id -un; id -u", user="root").stdout == "root\n0\n"
    with pytest.raises(AuthenticationException) as caught:
        sandbox.commands.run("true", user="no-such-user-airlock")
    assert "no-such-user-airlock" in str(caught.value)


def test_streaming_callbacks_see_every_chunk_in_order(sandbox):
    out, err = [], []
    result = sandbox.commands.run(
        "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.1; done",
        on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "".join(f"out{i}\n" for i in range(1, 6)) == result.stdout
    assert "".join(err) == "".join(f"err{i}\n" for i in range(1, 6)) == result.stderr
    assert len(out) > 1, "output was streamed, not delivered in one piece at the end"


def test_background_command_is_listed_and_killed(sandbox, tag):
    handle = sandbox.commands.run(f"sleep 600; echo never-{tag}", background=True)
    assert handle.pid > 0
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert handle.pid in listed
    assert listed[handle.pid].cmd == "/bin/bash"
    assert listed[handle.pid].args[-1] == f"sleep 600; echo never-{tag}"
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code == -1
    assert f"never-{tag}" not in caught.value.stdout
    wait_for(lambda: handle.pid not in {p.pid for p in sandbox.commands.list()},
             "the killed command to leave the list")
    assert sandbox.commands.kill(handle.pid) is False, "a second kill finds no process"


def test_connect_to_a_running_command_gets_its_later_output(sandbox, tag):
    gate = f"/tmp/gate-{tag}"
    handle = sandbox.commands.run(
        f"echo early; while [ ! -e {gate} ]; do sleep 0.05; done; echo late-{tag}; exit 7",
        background=True)
    attached = sandbox.commands.connect(handle.pid)
    assert attached.pid == handle.pid
    sandbox.files.write(gate, "")
    with pytest.raises(CommandExitException) as caught:
        attached.wait()
    assert caught.value.exit_code == 7
    assert caught.value.stdout.endswith(f"late-{tag}\n")
    with pytest.raises(CommandExitException) as original:
        handle.wait()
    assert original.value.stdout == f"early\nlate-{tag}\n"


def test_stdin_reaches_a_command_started_with_stdin(sandbox):
    handle = sandbox.commands.run("cat; echo done", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "first line\n")
    handle.send_stdin("second line\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "first line\nsecond line\ndone\n"


def test_without_stdin_a_reader_sees_end_of_file(sandbox):
    assert sandbox.commands.run("cat; echo eof").stdout == "eof\n"


def test_the_command_timeout_ends_the_command(sandbox, tag):
    marker = f"sleep 120 # {tag}"
    with pytest.raises((TimeoutException, CommandExitException)):
        sandbox.commands.run(marker, timeout=2)
    wait_for(lambda: not any(marker in " ".join(p.args) for p in sandbox.commands.list()),
             "the timed-out command to be killed in the sandbox")


def _pty_output(sandbox, handle):
    """Collects a PTY's output on a thread; returns (buffer, thread, result holder)."""
    output = bytearray()
    result = {}

    def pump():
        try:
            result["value"] = handle.wait(on_pty=output.extend)
        except Exception as error:  # noqa: BLE001 - reported by the test
            result["error"] = error

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return output, thread, result


def test_pty_runs_an_interactive_shell_and_resizes(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PTY_VAR": "in-pty"})
    output, thread, result = _pty_output(sandbox, handle)
    sandbox.pty.send_stdin(handle.pid, b"tty; echo \"var=$PTY_VAR term=$TERM\"; stty size\n")
    wait_for(lambda: b"24 80" in output, "the shell to report a 24x80 terminal")
    assert b"/dev/pts/" in output, "the shell's stdin is a terminal"
    assert b"var=in-pty term=xterm-256color" in output
    sandbox.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(handle.pid, b"stty size; echo calc=$((6*7))\n")
    wait_for(lambda: b"30 100" in output and b"calc=42" in output, "the resized terminal")
    sandbox.pty.send_stdin(handle.pid, b"exit 0\n")
    thread.join(60)
    assert not thread.is_alive(), "the PTY session ended after exit"
    assert "error" not in result, result.get("error")
    assert result["value"].exit_code == 0


def test_pty_session_can_be_killed(sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    output, thread, result = _pty_output(sandbox, handle)
    assert sandbox.pty.kill(handle.pid) is True
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), CommandExitException)
    assert result["error"].exit_code == -1
