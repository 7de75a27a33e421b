"""The wasm tier through the unmodified e2b SDK: templates wasm-python and wasm-js run
`python …` and `node …` in the sandbox's isolate engine, refuse everything else with a clear
error, and share the preopened workspace with the files API."""

import pytest
from e2b import CommandExitException


def test_python_commands_run_in_the_engine_and_see_the_workspace(new_sandbox):
    sandbox = new_sandbox(template="wasm-python")
    result = sandbox.commands.run("python3 -c 'import sys; print(sys.platform, 6 * 7)'")
    assert (result.stdout, result.exit_code) == ("wasi 42\n", 0)
    sandbox.files.write("/workspace/job.py", "import json\nprint(json.dumps({'ok': True}))\n")
    result = sandbox.commands.run("python /workspace/job.py")
    assert result.stdout == '{"ok": true}\n'
    sandbox.commands.run("python -c \"open('/workspace/out.txt', 'w').write('written by wasm')\"")
    assert sandbox.files.read("/workspace/out.txt") == "written by wasm"
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("python -c 'raise SystemExit(open(\"/etc/passwd\").read())'")
    assert "No such file or directory" in caught.value.stderr


def test_node_commands_run_in_quickjs(new_sandbox):
    sandbox = new_sandbox(template="wasm-js")
    result = sandbox.commands.run("node -e 'console.log([1, 2, 3].map(x => x * 2).join(\",\"))'")
    assert (result.stdout, result.exit_code) == ("2,4,6\n", 0)
    sandbox.files.write("/workspace/app.js", "console.log('from a file'); console.error('warned');")
    result = sandbox.commands.run("node app.js", cwd="/workspace")
    assert (result.stdout, result.stderr) == ("from a file\n", "warned\n")
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("node -e 'throw new Error(\"boom\")'")
    assert caught.value.exit_code == 1
    assert "boom" in caught.value.stderr


@pytest.mark.parametrize("command", ["ls -la", "pip install requests", "echo hi | cat", "bash"])
def test_anything_else_is_not_available_on_the_wasm_tier(new_sandbox, command):
    sandbox = new_sandbox(template="wasm-js")
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run(command)
    assert caught.value.exit_code == 127
    assert "not available on the wasm tier" in caught.value.stderr


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_mcp_eval_runs_javascript_and_python(daemon, transport):
    pytest.importorskip("mcp")
    from test_mcp import run, session, structured

    async def scenario():
        async with session(daemon, transport) as s:
            js = structured(await s.call_tool("eval", {"language": "javascript", "code": "[1, 2].map(x => x + 1)"}))
            assert js["result"] == [2, 3] and js["error"] is None
            py = structured(await s.call_tool("eval", {"language": "python", "code": "print('p')\nsum(range(4))"}))
            assert (py["result"], py["stdout"]) == (6, "p\n")
            timed = structured(await s.call_tool(
                "eval", {"language": "javascript", "code": "for(;;){}", "timeout_ms": 200}))
            assert timed["error"]["kind"] == "timeout"

    run(scenario)
