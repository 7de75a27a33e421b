"""The unmodified `judge0` SDK (PyPI, the official Python client) against airlockd's Judge0 API:
verdicts, limits, batches and base64, each submission in a fresh sandbox."""

import uuid

import judge0
import pytest
from judge0 import Status, Submission

PYTHON, JAVASCRIPT, C, CPP, BASH = 71, 63, 50, 54, 46


def run(client, **attributes) -> Submission:
    return judge0.run(client=client, submissions=Submission(**attributes))


def test_sdk_reads_about_languages_and_config_as_from_judge0(client):
    # The SDK resolves aliases only for version 1.13.1 and reads every /config_info key.
    assert client.get_about()["version"] == "1.13.1"
    ids = {language.id for language in client.get_languages()}
    assert {PYTHON, JAVASCRIPT, C, CPP, BASH} <= ids
    assert client.get_language_id(judge0.PYTHON) == PYTHON
    config = client.get_config_info()
    assert config.max_submission_batch_size == 20
    assert config.enable_network is False


def test_sdk_python_with_matching_output_is_accepted(client):
    done = run(client, source_code="print(input()[::-1])", language=judge0.PYTHON,
               stdin="hello judge", expected_output="egduj olleh")
    assert done.status == Status.ACCEPTED, (done.status, done.stderr, done.message)
    assert done.stdout == "egduj olleh\n"
    assert uuid.UUID(str(done.token)).version == 4
    assert done.time is not None and done.time >= 0
    assert done.memory is not None and done.memory > 0
    assert done.exit_code == 0 and done.exit_signal is None
    assert done.finished_at >= done.created_at


def test_sdk_different_output_is_wrong_answer(client):
    done = run(client, source_code="console.log(1 + 1)", language=judge0.JAVASCRIPT,
               expected_output="3")
    assert done.status == Status.WRONG_ANSWER
    assert done.stdout == "2\n"


def test_sdk_trailing_whitespace_is_ignored_as_judge0_does(client):
    done = run(client, source_code='printf "a  \\nb\\n\\n\\n"', language=BASH,
               expected_output="a\nb")
    assert done.status == Status.ACCEPTED, (done.stdout, done.stderr)


def test_sdk_c_that_does_not_compile_is_a_compilation_error(client):
    done = run(client, source_code="int main(void) { return undeclared; }", language=C)
    assert done.status == Status.COMPILATION_ERROR
    assert "undeclared" in done.compile_output
    assert done.stdout is None and done.time is None and done.memory is None


def test_sdk_c_and_cpp_compile_and_run_with_arguments(client):
    c = run(client, language=C, command_line_arguments="x y",
            source_code='#include <stdio.h>\nint main(int c, char **v) { printf("%d %s\\n", c, v[2]); }')
    assert c.status == Status.ACCEPTED, c.compile_output
    assert c.stdout == "3 y\n"
    cpp = run(client, language=CPP, compiler_options="-O2 -std=c++17",
              source_code='#include <iostream>\nint main() { std::cout << __cplusplus << "\\n"; }')
    assert cpp.status == Status.ACCEPTED, cpp.compile_output
    assert cpp.stdout == "201703\n"


def test_sdk_busy_loop_past_the_cpu_limit_is_time_limit_exceeded(client):
    done = run(client, source_code="while True:\n    pass\n", language=judge0.PYTHON,
               cpu_time_limit=1, cpu_extra_time=0.5, wall_time_limit=20)
    assert done.status == Status.TIME_LIMIT_EXCEEDED
    # Killed for its CPU time (or, on a machine too busy to give it 1.5 s of CPU in 20 s,
    # for the wall clock).
    assert done.time > 1.0 or done.wall_time > 20


def test_sdk_sleep_past_the_wall_limit_is_time_limit_exceeded(client):
    done = run(client, source_code="import time\ntime.sleep(30)\n", language=judge0.PYTHON,
               wall_time_limit=2, cpu_extra_time=0)
    assert done.status == Status.TIME_LIMIT_EXCEEDED
    assert done.wall_time >= 2.0
    assert done.time < 1.0  # asleep, not computing


def test_sdk_memory_past_the_limit_is_killed_and_within_it_accepted(client):
    program = ("import sys\nblock = bytearray(int(sys.argv[1]) * 1024 * 1024)\n"
               "for i in range(0, len(block), 4096):\n    block[i] = 1\nprint('done')\n")
    over = run(client, source_code=program, language=judge0.PYTHON,
               command_line_arguments="200", memory_limit=64000)
    # The memory cgroup's OOM kill: isolate's "SG 9", which Judge0 reports as Runtime Error (Other).
    assert over.status == Status.RUNTIME_ERROR_OTHER, (over.status, over.stdout, over.message)
    assert over.exit_signal == 9
    assert over.stdout is None
    assert over.memory <= 64000
    within = run(client, source_code=program, language=judge0.PYTHON,
                 command_line_arguments="20", memory_limit=64000)
    assert within.status == Status.ACCEPTED, (within.status, within.message)
    assert 20 * 1024 <= within.memory <= 64000


def test_sdk_fork_bomb_is_held_by_the_process_limit(client, daemon):
    # Forks until the pids cgroup refuses, then reports how many processes it holds.
    program = (
        "import os, time\nkids = 0\n"
        "while True:\n"
        "    try:\n        pid = os.fork()\n    except OSError as error:\n"
        "        print(kids, error.errno)\n        break\n"
        "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    kids += 1\n")
    done = run(client, source_code=program, language=judge0.PYTHON,
               max_processes_and_or_threads=12, wall_time_limit=15)
    assert done.status == Status.ACCEPTED, (done.status, done.stderr, done.message)
    kids, errno = map(int, done.stdout.split())
    assert errno == 11  # EAGAIN from the pids cgroup
    assert 1 <= kids < 12
    # A classic shell fork bomb ends within its limits and leaves the daemon working.
    bomb = run(client, source_code=":(){ :|:& };:\nsleep 2\n", language=BASH,
               max_processes_and_or_threads=30, wall_time_limit=5)
    assert bomb.status in (Status.ACCEPTED, Status.TIME_LIMIT_EXCEEDED, Status.RUNTIME_ERROR_NZEC)
    after = run(client, source_code="print('still here')", language=judge0.PYTHON)
    assert after.status == Status.ACCEPTED and after.stdout == "still here\n"


def test_sdk_runtime_errors_by_signal_and_exit_status(client):
    segv = run(client, language=C, source_code="int main(void) { volatile int *p = 0; return *p; }")
    assert segv.status == Status.RUNTIME_ERROR_SIGSEGV and segv.exit_signal == 11
    fpe = run(client, language=C,
              source_code="int main(int c, char **v) { volatile int zero = c - 1; return 7 / zero; }")
    assert fpe.status == Status.RUNTIME_ERROR_SIGFPE and fpe.exit_signal == 8
    abrt = run(client, language=C, source_code="#include <stdlib.h>\nint main(void) { abort(); }")
    assert abrt.status == Status.RUNTIME_ERROR_SIGABRT and abrt.exit_signal == 6
    # Past max_file_size (KB) the output file's write gets SIGXFSZ.
    xfsz = run(client, language=C, max_file_size=64,
               source_code='#include <stdio.h>\nint main(void) { for (int i = 0; i < 100000; i++) printf("0123456789\\n"); }')
    assert xfsz.status == Status.RUNTIME_ERROR_SIGXFSZ and xfsz.exit_signal == 25, (xfsz.status, xfsz.message)
    assert len(xfsz.stdout) <= 64 * 1024
    nzec = run(client, language=judge0.PYTHON, source_code="import sys\nprint('x', file=sys.stderr)\nsys.exit(3)")
    assert nzec.status == Status.RUNTIME_ERROR_NZEC
    assert nzec.exit_code == 3 and nzec.stderr == "x\n"


def test_sdk_batch_of_20_runs_every_submission_in_order(client):
    batch = []
    for i in range(20):
        language, source = [
            (judge0.PYTHON, f"print({i} * 2)"),
            (judge0.JAVASCRIPT, f"console.log({i} * 2)"),
            (BASH, f"echo $(( {i} * 2 ))"),
            (C, f'#include <stdio.h>\nint main(void) {{ printf("%d\\n", {i} * 2); }}'),
        ][i % 4]
        batch.append(Submission(source_code=source, language=language, expected_output=str(i * 2)))
    done = judge0.run(client=client, submissions=batch)
    assert [s.status for s in done] == [Status.ACCEPTED] * 20, [(s.status, s.stderr, s.compile_output) for s in done]
    assert [s.stdout for s in done] == [f"{i * 2}\n" for i in range(20)]
    assert len({s.token for s in done}) == 20


def test_sdk_base64_round_trips_unicode_and_binary(client):
    text = "héllo, 世界 🚀\n\ttabs and \"quotes\" and \\backslashes\n" * 20
    echo = run(client, source_code="import sys\nsys.stdout.write(sys.stdin.read())", language=judge0.PYTHON,
               stdin=text, expected_output=text)
    assert echo.status == Status.ACCEPTED
    assert echo.stdout == text
    # Bytes that are not UTF-8 travel as base64 too; the SDK decodes them with backslashreplace.
    binary = run(client, source_code="import sys\nsys.stdout.buffer.write(bytes([0xff, 0xfe, 0x41]))",
                 language=judge0.PYTHON)
    assert binary.status == Status.ACCEPTED
    assert binary.stdout == "\\xff\\xfeA"


@pytest.mark.parametrize("language", [judge0.PYTHON, judge0.JAVASCRIPT, BASH])
def test_sdk_network_is_off_by_default(client, daemon, language):
    host, port = daemon.addr.rsplit(":", 1)
    source = {
        judge0.PYTHON: f"import socket\ntry:\n    socket.create_connection(('{host}', {port}), 3)\n"
                       "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n",
        judge0.JAVASCRIPT: f"require('net').connect({port}, '{host}').on('connect', () => {{ console.log('connected'); process.exit(0) }})"
                           ".on('error', e => console.log('refused', e.code))",
        BASH: f"(exec 3<>/dev/tcp/{host}/{port}) 2>/dev/null && echo connected || echo refused",
    }[language]
    done = run(client, source_code=source, language=language)
    assert done.status == Status.ACCEPTED, (done.stderr, done.message)
    assert done.stdout.startswith("refused"), done.stdout


def test_sdk_submissions_see_none_of_the_daemons_environment(client):
    # Judge0's workers passed their own environment to submitted code (judge0/judge0#564).
    done = run(client, language=judge0.PYTHON,
               source_code="import os\nfor k, v in sorted(os.environ.items()):\n    print(k, v)")
    assert done.status == Status.ACCEPTED
    assert "daemon-secret-value" not in done.stdout
    names = {line.split(" ", 1)[0] for line in done.stdout.splitlines()}
    assert "JUDGE0_SUITE_DAEMON_SECRET" not in names and not any(n.startswith("AIRLOCK") for n in names), names
    assert {"HOME", "PATH"} <= names
