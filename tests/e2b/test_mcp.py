"""Airlock's MCP server through the Python `mcp` client package, on both transports: `airlock
mcp` over stdio, and the daemon's `/mcp` over streamable HTTP with the API key."""

import base64
import contextlib
import os
import struct
from pathlib import Path

import pytest

pytest.importorskip("mcp")
import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from airlock_harness import DEFAULT_AIRLOCKD  # noqa: E402

AIRLOCK = Path(os.environ.get("AIRLOCKD") or DEFAULT_AIRLOCKD).with_name("airlock")
TRANSPORTS = ["stdio", "http"]


@contextlib.asynccontextmanager
async def session(daemon, transport, tools=None, key=None):
    key = daemon.key if key is None else key
    if transport == "stdio":
        args = ["mcp"] + (["--tools", ",".join(tools)] if tools else [])
        env = {"AIRLOCK_URL": daemon.url, "AIRLOCK_API_KEY": key, "PATH": os.environ["PATH"]}
        params = StdioServerParameters(command=str(AIRLOCK), args=args, env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                yield s
    else:
        async with httpx2.AsyncClient(headers={"X-API-Key": key}, timeout=600) as http:
            async with streamable_http_client(f"{daemon.url}/mcp", http_client=http) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    yield s


def run(coroutine_function, *args):
    return anyio.run(coroutine_function, *args)


def structured(result):
    assert not result.is_error, result.content
    return result.structured_content


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mcp_sandbox_tools_end_to_end(daemon, transport):
    async def scenario():
        async with session(daemon, transport) as s:
            listed = await s.list_tools()
            names = {tool.name for tool in listed.tools}
            assert {"sandbox_create", "run_code", "run_command", "file_read", "file_write",
                    "sandbox_kill", "file_edit", "file_search", "sandbox_url"} <= names
            for tool in listed.tools:
                assert tool.input_schema["type"] == "object", tool.name
            create = next(t for t in listed.tools if t.name == "run_code")
            assert "code" in create.input_schema["required"]

            created = structured(await s.call_tool(
                "sandbox_create", {"template": "code-interpreter-v1", "timeout_s": 600}))
            sandbox_id = daemon.track(created["id"])
            assert created["template"] == "code-interpreter-v1"
            try:
                plot = await s.call_tool("run_code", {"sandbox_id": sandbox_id, "timeout_s": 240, "code": (
                    "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
                    "import matplotlib.pyplot as plt\n"
                    "plt.figure(figsize=(3, 2), dpi=100)\n"
                    "plt.plot([1, 2, 3])\nprint('plotted')\nplt.show()\n"
                )})
                value = structured(plot)
                assert value["stdout"] == "plotted\n" and value["error"] is None
                images = [c for c in plot.content if c.type == "image"]
                assert len(images) == 1 and images[0].mime_type == "image/png"
                assert png_size(base64.b64decode(images[0].data)) == (300, 200)

                failing = structured(await s.call_tool(
                    "run_code", {"sandbox_id": sandbox_id, "code": "1/0"}))
                assert failing["error"]["name"] == "ZeroDivisionError"

                written = structured(await s.call_tool("file_write", {
                    "sandbox_id": sandbox_id, "path": "/workspace/notes/a.txt",
                    "content": "hello from mcp\n"}))
                assert written["size_bytes"] == len("hello from mcp\n")
                read = structured(await s.call_tool(
                    "file_read", {"sandbox_id": sandbox_id, "path": "/workspace/notes/a.txt"}))
                assert read["content"] == "hello from mcp\n"
                edited = structured(await s.call_tool("file_edit", {
                    "sandbox_id": sandbox_id, "path": "/workspace/notes/a.txt",
                    "old": "hello", "new": "bye"}))
                assert edited["replacements"] == 1
                found = structured(await s.call_tool("file_search", {
                    "sandbox_id": sandbox_id, "path": "/workspace", "content_regex": "^bye"}))
                assert found["paths"] == ["/workspace/notes/a.txt"]

                ran = structured(await s.call_tool("run_command", {
                    "sandbox_id": sandbox_id, "command": "cat; echo err >&2; exit 3",
                    "stdin": "piped"}))
                assert (ran["stdout"], ran["stderr"], ran["exit_code"]) == ("piped", "err\n", 3)
                background = structured(await s.call_tool("run_command", {
                    "sandbox_id": sandbox_id, "command": "echo started; exec sleep 600",
                    "background": True}))
                pid = background["pid"]

                async def started():
                    output = structured(await s.call_tool(
                        "process_output", {"sandbox_id": sandbox_id, "pid": pid}))
                    return output if output["output"] == "started\n" else None
                output = None
                with anyio.fail_after(60):  # only stops a hang
                    while output is None:
                        output = await started()
                        await anyio.sleep(0.05)
                assert output["running"]
                structured(await s.call_tool("process_kill", {"sandbox_id": sandbox_id, "pid": pid}))

                # Bad arguments are tool errors, and the session goes on.
                missing = await s.call_tool("file_read", {"sandbox_id": sandbox_id})
                assert missing.is_error
                wrong_type = await s.call_tool("sandbox_set_timeout",
                                               {"sandbox_id": sandbox_id, "timeout_s": "soon"})
                assert wrong_type.is_error
                absent = await s.call_tool(
                    "file_read", {"sandbox_id": sandbox_id, "path": "/workspace/nope"})
                assert absent.is_error and '"code":"not_found"' in absent.content[0].text
                info = structured(await s.call_tool("sandbox_info", {"sandbox_id": sandbox_id}))
                assert info["state"] == "running"
            finally:
                killed = await s.call_tool("sandbox_kill", {"sandbox_id": sandbox_id})
            structured(killed)
            gone = await s.call_tool("sandbox_info", {"sandbox_id": sandbox_id})
            assert gone.is_error and '"code":"not_found"' in gone.content[0].text

    run(scenario)


@pytest.mark.parametrize("transport", ["stdio"])
def test_mcp_tools_flag_picks_a_subset(daemon, transport):
    async def scenario():
        async with session(daemon, transport, tools=["sandbox_list", "run_code"]) as s:
            names = sorted(t.name for t in (await s.list_tools()).tools)
            assert names == ["run_code", "sandbox_list"]
            listed = structured(await s.call_tool("sandbox_list", {}))
            assert isinstance(listed["sandboxes"], list)

    run(scenario)


def test_mcp_http_needs_an_api_key(daemon):
    missing = daemon.request("POST", "/mcp", {"Content-Type": "application/json",
                                              "Accept": "application/json, text/event-stream"},
                             b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    assert missing.status == 401, missing.body
    assert missing.json()["code"] == "unauthenticated"

    async def wrong_key():
        async with session(daemon, "http", key="not-a-key"):
            pass

    with pytest.raises(BaseException):
        run(wrong_key)


def test_mcp_stdio_unknown_tool_name_is_refused(daemon):
    import subprocess

    done = subprocess.run([str(AIRLOCK), "mcp", "--tools", "run_code,no_such_tool"],
                          env={"AIRLOCK_URL": daemon.url, "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert "no_such_tool" in done.stderr


def test_mcp_http_modern_era_discover_then_call(daemon):
    """The 2026-07-28 protocol era (`discover`, no initialize) on `/mcp` too."""
    async def scenario():
        async with httpx2.AsyncClient(headers={"X-API-Key": daemon.key}, timeout=600) as http:
            async with streamable_http_client(f"{daemon.url}/mcp", http_client=http) as (read, write):
                async with ClientSession(read, write) as s:
                    found = await s.discover()
                    assert "2026-07-28" in found.supported_versions
                    assert found.capabilities.tools is not None
                    listed = structured(await s.call_tool("sandbox_list", {"state": "running"}))
                    assert isinstance(listed["sandboxes"], list)
                    bad = await s.call_tool("sandbox_list", {"state": "sideways"})
                    assert bad.is_error and '"code":"invalid_request"' in bad.content[0].text

    run(scenario)
