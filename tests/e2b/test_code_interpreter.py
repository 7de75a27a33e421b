"""E2B's code interpreter (template `code-interpreter-v1`, port 49999) through the unmodified
`e2b-code-interpreter` SDK: streamed output, rich results, errors, contexts (one execution at
a time each), restarts and removals that kill the kernel, a dead kernel restarted, env vars,
the client's timeout as an interrupt, magics and `!pip install`, bash, javascript and
typescript contexts.

The template runs the host's kernels on the process tier: ipykernel with matplotlib and
pandas from Debian, bash_kernel when installed, Deno's kernel for javascript and typescript when
installed (scripts/e2b-tests.sh installs all of them)."""

import base64
import json
import struct
import subprocess
from pathlib import Path

import pytest

e2b_code_interpreter = pytest.importorskip("e2b_code_interpreter")
from e2b_code_interpreter import Sandbox  # noqa: E402

TEMPLATE = "code-interpreter-v1"


def bash_kernel_installed() -> bool:
    # The sandbox sees the host's root, so the host's kernelspecs are the template's.
    found = subprocess.run(
        ["/usr/bin/python3", "-c", "import bash_kernel"], capture_output=True, check=False
    )
    return found.returncode == 0


@pytest.fixture
def new_interpreter(daemon):
    made = []

    def create(**options):
        options.setdefault("timeout", 600)
        sandbox = Sandbox.create(**options)
        daemon.track(sandbox.sandbox_id)
        made.append(sandbox)
        return sandbox

    yield create
    for sandbox in made:
        try:
            sandbox.kill()
        except Exception:  # noqa: BLE001 - a failed kill shows up in the session's leak check
            pass


@pytest.fixture
def interpreter(new_interpreter):
    return new_interpreter()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_interpreter_default_template_is_code_interpreter(interpreter):
    assert interpreter.get_info().template_id == TEMPLATE
    # The 49999 server answers its health check through the data plane.
    execution = interpreter.run_code("1 + 1")
    assert execution.text == "2"
    assert execution.error is None


def test_interpreter_stdout_and_stderr_reach_the_callbacks(interpreter):
    out, err = [], []
    execution = interpreter.run_code(
        "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n",
        on_stdout=lambda m: out.append(m.line),
        on_stderr=lambda m: err.append(m.line),
    )
    assert "".join(out) == "to stdout\n"
    assert "".join(err) == "to stderr\n"
    assert execution.logs.stdout == ["to stdout\n"]
    assert execution.logs.stderr == ["to stderr\n"]
    assert execution.execution_count is not None


def test_interpreter_results_main_and_displayed(interpreter):
    seen = []
    execution = interpreter.run_code(
        "from IPython.display import display, Markdown\n"
        "display(Markdown('**bold**'))\n"
        "{'a': 1, 'b': [1, 2]}\n",
        on_result=seen.append,
    )
    assert execution.error is None
    assert len(execution.results) == 2
    shown, main = execution.results
    assert not shown.is_main_result and shown.markdown == "**bold**"
    assert main.is_main_result
    assert main.text == "{'a': 1, 'b': [1, 2]}"
    assert main.json == {"a": 1, "b": [1, 2]}
    assert len(seen) == 2
    # A str result loses one pair of quotes, as E2B's server does.
    assert interpreter.run_code("'abc'").text == "abc"


def test_interpreter_matplotlib_figure_is_a_png_of_its_size(interpreter):
    execution = interpreter.run_code(
        # The inline backend crops to the drawn area unless told not to.
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('growth')\n"
        "plt.show()\n",
        timeout=240,
    )
    assert execution.error is None, execution.error
    pngs = [r for r in execution.results if r.png]
    assert len(pngs) == 1, execution.results
    assert png_size(base64.b64decode(pngs[0].png)) == (400, 300)
    chart = pngs[0].chart
    assert chart is not None, "a line plot comes with its chart data"
    assert getattr(chart.type, "value", chart.type) == "line"
    assert chart.title == "growth"
    points = chart.elements[0].points
    assert [tuple(p) for p in points] == [(1, 1), (2, 4), (3, 9)]


def test_interpreter_dataframe_is_html_and_data(interpreter):
    execution = interpreter.run_code(
        "import pandas as pd\npd.DataFrame({'x': [1, 2], 'y': ['a', 'b']})\n", timeout=240
    )
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert result.is_main_result
    assert "<table" in result.html and "<td>a</td>" in result.html
    assert result.data == {"x": [1, 2], "y": ["a", "b"]}


def test_interpreter_exception_has_name_value_and_traceback(interpreter):
    errors = []
    execution = interpreter.run_code(
        "def inner():\n    return 1 / 0\n\ninner()\n", on_error=errors.append
    )
    error = execution.error
    assert error is not None
    assert error.name == "ZeroDivisionError"
    assert error.value == "division by zero"
    assert "inner()" in error.traceback and "1 / 0" in error.traceback
    assert "\x1b[" not in error.traceback, "tracebacks come without colours"
    assert errors and errors[0].name == "ZeroDivisionError"


def test_interpreter_contexts_keep_state_apart(interpreter):
    first = interpreter.create_code_context()
    second = interpreter.create_code_context(cwd="/tmp")
    assert first.id != second.id and first.language == "python"
    assert second.cwd == "/tmp"
    interpreter.run_code("shared = 'first'", context=first)
    assert interpreter.run_code("shared", context=first).text == "first"
    missing = interpreter.run_code("shared", context=second)
    assert missing.error is not None and missing.error.name == "NameError"
    assert interpreter.run_code("import os; os.getcwd()", context=second).text == "/tmp"
    listed = {c.id for c in interpreter.list_code_contexts()}
    assert {first.id, second.id} <= listed
    interpreter.remove_code_context(second)
    assert second.id not in {c.id for c in interpreter.list_code_contexts()}
    with pytest.raises(Exception, match="not found"):
        interpreter.run_code("1", context=second)


def test_interpreter_restart_forgets_state(interpreter):
    context = interpreter.create_code_context()
    interpreter.run_code("kept = 41", context=context)
    assert interpreter.run_code("kept + 1", context=context).text == "42"
    interpreter.restart_code_context(context)
    after = interpreter.run_code("kept", context=context)
    assert after.error is not None and after.error.name == "NameError"


def test_interpreter_env_vars_per_execution_and_per_sandbox(new_interpreter, tag):
    sandbox = new_interpreter(envs={"SANDBOX_WIDE": tag})
    code = "import os; print(os.environ.get('PER_RUN', 'unset'), os.environ.get('SANDBOX_WIDE', 'unset'))"
    # Quotes, a backslash and a newline arrive as they were sent (no code injection).
    value = "it's \"quoted\" \\ and\nmore"
    with_var = sandbox.run_code(code, envs={"PER_RUN": value})
    assert with_var.error is None, with_var.error
    assert "".join(with_var.logs.stdout) == f"{value} {tag}\n"
    # Per-execution variables end with their execution.
    assert sandbox.run_code(code).logs.stdout == [f"unset {tag}\n"]


def test_interpreter_client_timeout_interrupts_the_kernel(interpreter):
    context = interpreter.create_code_context()
    interpreter.run_code("ticks = 0", context=context)
    with pytest.raises(Exception) as raised:
        interpreter.run_code(
            "import time\nwhile True:\n    ticks += 1\n    time.sleep(0.01)\n",
            context=context,
            timeout=3,
        )
    assert "timed out" in str(raised.value).lower() or "timeout" in type(raised.value).__name__.lower()
    # Had the loop not been interrupted, this would wait for the context forever.
    first = interpreter.run_code("ticks", context=context, timeout=120)
    assert first.error is None and int(first.text) > 0
    second = interpreter.run_code("ticks", context=context, timeout=120)
    assert second.text == first.text, "the loop still runs"


def test_interpreter_magics_work(interpreter):
    execution = interpreter.run_code("%cd /tmp\nimport os\nos.getcwd()")
    assert execution.text == "/tmp"
    shell = interpreter.run_code("!echo from-the-shell")
    # IPython runs `!` commands on a terminal, hence the carriage return.
    assert "".join(shell.logs.stdout).strip() == "from-the-shell"


def test_interpreter_bad_requests_get_e2bs_answers(interpreter):
    from e2b.exceptions import InvalidArgumentException

    context = interpreter.create_code_context()
    with pytest.raises(InvalidArgumentException):
        interpreter.run_code("1", context=context, language="python")
    with pytest.raises(Exception, match="not found"):
        interpreter.restart_code_context("no-such-context")


@pytest.mark.skipif(not bash_kernel_installed(), reason="bash_kernel is not installed on the host")
def test_interpreter_bash_context(interpreter):
    execution = interpreter.run_code("echo hello-from-bash; KEPT=7", language="bash")
    assert execution.error is None, execution.error
    assert "".join(execution.logs.stdout).strip() == "hello-from-bash"
    assert "".join(interpreter.run_code("echo $KEPT", language="bash").logs.stdout).strip() == "7"
    context = interpreter.create_code_context(language="bash")
    assert context.language == "bash"
    alone = interpreter.run_code("echo ${KEPT:-none}", context=context)
    assert "".join(alone.logs.stdout).strip() == "none"
    env = interpreter.run_code("echo $PER_RUN", language="bash", envs={"PER_RUN": "x y"})
    assert "".join(env.logs.stdout).strip() == "x y"


def test_interpreter_raw_execute_streams_ndjson(daemon, interpreter):
    """The wire itself: lines in E2B's order, the status codes for bad input."""
    headers = {"Content-Type": "application/json", "E2b-Sandbox-Id": interpreter.sandbox_id,
               "E2b-Sandbox-Port": "49999"}
    body = json.dumps({"code": "print(1)\n2", "context_id": None, "language": None,
                       "env_vars": None}).encode()
    response = daemon.request("POST", "/execute", headers, body)
    assert response.status == 200, response.body
    types = [json.loads(line)["type"] for line in response.body.decode().splitlines()]
    assert types == ["number_of_executions", "stdout", "result", "end_of_execution"]
    both = json.dumps({"code": "1", "context_id": "x", "language": "python"}).encode()
    response = daemon.request("POST", "/execute", headers, both)
    assert response.status == 400
    assert response.body == b"Only one of context_id or language can be provided"
    assert daemon.request("GET", "/health", headers).json() == "OK"


def deno_kernel_installed() -> bool:
    return any(Path(d, "jupyter/kernels/deno/kernel.json").is_file()
               for d in ("/usr/local/share", "/usr/share"))


@pytest.mark.skipif(not deno_kernel_installed(), reason="Deno's Jupyter kernel is not installed on the host")
def test_interpreter_javascript_and_typescript_contexts(interpreter):
    js = interpreter.run_code("const seen = []; console.log('from js'); 6 * 7", language="javascript")
    assert js.error is None, js.error
    assert js.text == "42", "text/plain without colours"
    assert "".join(js.logs.stdout) == "from js\n"
    assert interpreter.run_code("seen.push(1); seen.length", language="js").text == "1"
    ts = interpreter.run_code("const n: number = 2; n + 1", language="typescript")
    assert ts.error is None and ts.text == "3"
    context = interpreter.create_code_context(language="javascript")
    assert interpreter.run_code("typeof seen", context=context).text == "undefined"
    env = interpreter.run_code("process.env.PER_RUN", language="javascript", envs={"PER_RUN": "it's js"})
    assert env.text == "it's js"
    failed = interpreter.run_code("throw new TypeError('from js')", language="javascript").error
    assert (failed.name, failed.value) == ("TypeError", "from js")
    assert failed.traceback.startswith("TypeError: from js")


def test_interpreter_one_execution_at_a_time_per_context(interpreter):
    import threading

    context = interpreter.create_code_context()
    interpreter.run_code("order = []", context=context)
    first = {}

    def long_one():
        first["execution"] = interpreter.run_code(
            "import time, pathlib\norder.append('first starts')\n"
            "pathlib.Path('/tmp/first-started').touch()\n"
            "time.sleep(1.5)\norder.append('first ends')\n",
            context=context)

    thread = threading.Thread(target=long_one)
    thread.start()
    from airlock_harness import wait_for
    wait_for(lambda: interpreter.files.exists("/tmp/first-started"), "the first execution to start")
    second = interpreter.run_code("order.append('second'); order", context=context)
    thread.join()
    assert first["execution"].error is None
    assert second.text == "['first starts', 'first ends', 'second']"


def test_interpreter_dead_kernel_is_reported_then_restarted(interpreter):
    context = interpreter.create_code_context()
    interpreter.run_code("before = 1", context=context)
    died = interpreter.run_code("import os\nos._exit(3)", context=context)
    assert died.error is not None, "the kernel's death is an error"
    after = interpreter.run_code("import os\n'before' in globals(), os.getpid() > 0", context=context)
    assert after.error is None and after.text == "(False, True)"


def test_interpreter_restart_and_remove_kill_the_kernel(interpreter):
    context = interpreter.create_code_context()
    pid = int(interpreter.run_code("import os; os.getpid()", context=context).text)
    probe = f"import os\ntry:\n    os.kill({pid}, 0)\n    alive = True\nexcept ProcessLookupError:\n    alive = False\nalive"
    assert interpreter.run_code(probe).text == "True"
    interpreter.restart_code_context(context)
    assert interpreter.run_code(probe).text == "False"
    new_pid = int(interpreter.run_code("import os; os.getpid()", context=context).text)
    assert new_pid != pid
    interpreter.remove_code_context(context)
    probe = probe.replace(str(pid), str(new_pid))
    from airlock_harness import wait_for
    # A removed kernel is killed; its pid is reaped by the sandbox's init soon after.
    wait_for(lambda: interpreter.run_code(probe).text == "False", "the removed kernel to be gone")


def test_interpreter_pip_install_of_a_local_wheel(interpreter):
    """`!pip install` works (offline here: a wheel the sandbox builds itself)."""
    build = interpreter.run_code(
        "import zipfile, hashlib, base64\n"
        "files = {'airlock_probe_pkg.py': 'ANSWER = 42\\n',\n"
        "  'airlock_probe_pkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\\nName: airlock-probe-pkg\\nVersion: 1.0\\n',\n"
        "  'airlock_probe_pkg-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}\n"
        "record = []\n"
        "path = '/tmp/airlock_probe_pkg-1.0-py3-none-any.whl'\n"
        "with zipfile.ZipFile(path, 'w') as z:\n"
        "    for name, text in files.items():\n"
        "        z.writestr(name, text)\n"
        "        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()\n"
        "        record.append(f'{name},sha256={digest},{len(text)}')\n"
        "    record.append('airlock_probe_pkg-1.0.dist-info/RECORD,,')\n"
        "    z.writestr('airlock_probe_pkg-1.0.dist-info/RECORD', '\\n'.join(record) + '\\n')\n"
    )
    assert build.error is None, build.error
    install = interpreter.run_code("!pip install --no-index /tmp/airlock_probe_pkg-1.0-py3-none-any.whl",
                                   timeout=240)
    assert "Successfully installed airlock-probe-pkg-1.0" in "".join(install.logs.stdout), install.logs
    imported = interpreter.run_code("import airlock_probe_pkg\nairlock_probe_pkg.ANSWER")
    assert imported.error is None, imported.error
    assert imported.text == "42"


def test_interpreter_from_a_warm_pool(daemon, new_interpreter, tag):
    """A pool's member has its interpreter and warm kernel before the create; a create with
    env vars goes cold (a member's kernel could not see them)."""
    from airlock_harness import wait_for
    from test_pool import pool, pool_members, set_pool

    set_pool(daemon, 1, TEMPLATE)
    try:
        wait_for(lambda: pool(daemon, TEMPLATE)["ready"] == 1, "a full pool", timeout=300)
        members = pool_members(daemon)
        sandbox = new_interpreter()
        assert sandbox.sandbox_id in members, "served by a member"
        assert sandbox.run_code("1 + 1").text == "2"
        wait_for(lambda: pool(daemon, TEMPLATE)["ready"] == 1, "the pool refilled", timeout=300)
        members = pool_members(daemon)
        with_env = new_interpreter(envs={"POOLED_ENV": tag})
        assert with_env.sandbox_id not in members, "a create with env vars goes cold"
        assert with_env.run_code("import os; os.environ['POOLED_ENV']").text == tag
    finally:
        set_pool(daemon, 0, TEMPLATE)


def test_interpreter_serves_again_after_each_kind_of_resume(interpreter):
    """A frozen pause keeps the kernel and its state; a filesystem pause ends every process,
    so the resume starts the interpreter again: `run_code` answers from a fresh kernel."""
    from airlock_harness import sdk_version

    interpreter.run_code("kept = 41")
    assert interpreter.pause() is True
    frozen = Sandbox.connect(interpreter.sandbox_id)
    assert frozen.run_code("kept + 1").text == "42", "the kernel's state survives a frozen pause"

    if sdk_version() >= (2, 60, 0):
        assert frozen.pause(mode="filesystem") is True
    else:
        assert frozen.pause(keep_memory=False) is True
    restarted = Sandbox.connect(interpreter.sandbox_id)
    fresh = restarted.run_code("'kept' in globals(), 1 + 1")
    assert fresh.error is None, fresh.error
    assert fresh.text == "(False, 2)", "a fresh kernel answers after a filesystem resume"
