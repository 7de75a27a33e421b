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


class _ToolUpstream:
    """A loopback HTTP endpoint declared as a tool: it echoes the JSON body it got and whether
    the operator's header came with it (never the header itself)."""

    def __init__(self):
        import http.server
        import json
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the standard library's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
                seen.append((self.path, self.headers.get("X-Api-Key"), body))
                answer = json.dumps({"echo": body, "authorized": self.headers.get("X-Api-Key") == "s3cret"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/lookup"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_tools_are_called_from_node_and_python_commands_and_audited(daemon, new_sandbox):
    import json

    upstream = _ToolUpstream()
    try:
        # E2B's create has no tools field: the `airlock.tools` metadata key declares them.
        tools = [{"kind": "http", "name": "lookup", "url": upstream.url,
                  "headers": {"X-Api-Key": "s3cret"}}]
        sandbox = new_sandbox(template="wasm-python", metadata={"airlock.tools": json.dumps(tools)})
        sandbox_id = sandbox.sandbox_id
        assert "airlock.tools" not in sandbox.get_info().metadata, "the key (and its secret) is not kept"
        node = sandbox.commands.run(
            "node -e 'tools.lookup({q: \"node\"}).then(v => console.log(JSON.stringify(v)))'")
        assert json.loads(node.stdout) == {"echo": {"q": "node"}, "authorized": True}
        python = sandbox.commands.run(
            "python -c \"import airlock; v = airlock.tools.lookup({'q': 'py'}); print(v['echo']['q'], v['authorized'])\"")
        assert python.stdout == "py True\n"
        assert [(path, key, body) for path, key, body in upstream.seen] == [
            ("/lookup", "s3cret", {"q": "node"}), ("/lookup", "s3cret", {"q": "py"})]
        with pytest.raises(CommandExitException) as caught:
            sandbox.commands.run("python -c 'tools.delete_everything()'")
        assert "no tool 'delete_everything'" in caught.value.stderr
        events = daemon.api("GET", f"/v1/sandboxes/{sandbox_id}/events").json()["events"]
        tools = [e for e in events if e["kind"] == "tool"]
        assert [(e["method"], e["outcome"]) for e in tools] == [("lookup", "ok"), ("lookup", "ok")]
        assert all("s3cret" not in json.dumps(e) for e in events)
    finally:
        upstream.close()
