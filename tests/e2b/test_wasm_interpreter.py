"""The code interpreter's `run_code` on the wasm tier through the unmodified
`e2b-code-interpreter` SDK: on a `wasm-python` sandbox the daemon answers port 49999 itself,
each context being a kept instance of the sandbox's worker (CPython for WASI, or QuickJS), so
state survives between `run_code` calls in one context and two contexts are independent."""

import pytest

e2b_code_interpreter = pytest.importorskip("e2b_code_interpreter")
from e2b_code_interpreter import Sandbox  # noqa: E402


@pytest.fixture
def wasm_interpreter(daemon):
    sandbox = Sandbox.create(template="wasm-python", timeout=600)
    daemon.track(sandbox.sandbox_id)
    yield sandbox
    sandbox.kill()


def test_wasm_run_code_keeps_state_per_context(daemon, wasm_interpreter):
    sandbox = wasm_interpreter
    sandbox.run_code("shared = 'default'")
    assert sandbox.run_code("shared").text == "default"
    first = sandbox.create_code_context()
    second = sandbox.create_code_context()
    assert first.id != second.id and first.language == "python"
    sandbox.run_code("x = 40", context=first)
    assert sandbox.run_code("x + 2", context=first).text == "42"
    missing = sandbox.run_code("x", context=second)
    assert missing.error is not None and missing.error.name == "NameError"
    assert "x" in missing.error.value
    shown = sandbox.run_code("import sys\nprint('hi')\n[1, None, sys.platform]", context=second)
    assert shown.logs.stdout == ["hi\n"]
    assert shown.text == "[1, None, 'wasi']"
    # The default context is a third, independent one.
    assert sandbox.run_code("shared", context=first).error.name == "NameError"
    assert {first.id, second.id} <= {c.id for c in sandbox.list_code_contexts()}

    # env_vars hold for their cell alone, as in a Jupyter kernel.
    cell = sandbox.run_code("import os\nos.environ.get('GREETING', 'unset')", envs={"GREETING": "hi"})
    assert cell.text == "hi"
    assert sandbox.run_code("os.environ.get('GREETING', 'unset')").text == "unset"

    sandbox.restart_code_context(first)
    assert sandbox.run_code("x", context=first).error.name == "NameError"
    sandbox.remove_code_context(second)
    assert second.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(Exception, match="not found"):
        sandbox.run_code("1", context=second)

    events = daemon.api("GET", f"/v1/sandboxes/{sandbox.sandbox_id}/events").json()["events"]
    assert sum(1 for e in events if e["kind"] == "eval") >= 8, "every cell is audited"


def test_wasm_run_code_javascript_context(wasm_interpreter):
    sandbox = wasm_interpreter
    js = sandbox.create_code_context(language="javascript")
    other = sandbox.create_code_context(language="javascript")
    sandbox.run_code("var n = 41; console.log('set')", context=js)
    result = sandbox.run_code("n + 1", context=js)
    assert result.text == "42"
    assert sandbox.run_code("typeof n", context=other).text == "undefined"
    failed = sandbox.run_code("throw new TypeError('nope')", context=js)
    assert failed.error is not None and "nope" in failed.error.value
    # The context survives its exception.
    assert sandbox.run_code("n", context=js).text == "41"
    with pytest.raises(Exception, match="not available for JavaScript"):
        sandbox.run_code("n", context=js, envs={"A": "1"})
