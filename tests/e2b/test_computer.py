"""The native computer API (`POST /v1/sandboxes/{id}/computer`) on a desktop sandbox made by the
native API, with no SDK: the first action starts Xvfb at `metadata.resolution`; a page opened in
the sandbox's Chromium sees the clicks, the typing, the keys, the drag and the wheel (checked
from the page's own title, in Chromium's DevTools list inside the sandbox); the clipboard round
trips; files the browser downloads land in the template's download directory, which the files
API reads."""

import base64
import json
import time
import urllib.parse

import pytest

from airlock_harness import wait_for
from test_desktop import DRAG_PAGE, PAGE, first_clicks, png_size


class Native:
    def __init__(self, daemon):
        self.daemon = daemon

    def call(self, method, path, body=None, raw: bytes | None = None, expect=200):
        headers = {"X-API-Key": self.daemon.key}
        data = raw
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        answer = self.daemon.request(method, path, headers, data, timeout=120)
        assert answer.status == expect, (answer.status, answer.body[:500])
        return answer


@pytest.fixture
def native(daemon):
    return Native(daemon)


@pytest.fixture
def computer(native, daemon):
    created = native.call("POST", "/v1/sandboxes", {
        "template": "desktop", "timeout_ms": 600_000, "metadata": {"resolution": "800x600"},
    }, expect=201).json()
    sandbox_id = daemon.track(created["sandbox"]["id"])

    class Computer:
        id = sandbox_id

        def act(self, action, expect=200, **fields):
            return native.call("POST", f"/v1/sandboxes/{sandbox_id}/computer",
                               {"action": action, **fields}, expect=expect).json()

        def shell(self, command):
            answer = native.call("POST", f"/v1/sandboxes/{sandbox_id}/exec",
                                 {"shell": command, "env": {"DISPLAY": ":0"}})
            events = [json.loads(line) for line in answer.body.splitlines() if line.strip()]
            out = b"".join(base64.b64decode(e["data_base64"]) for e in events if e["type"] == "stdout")
            code = next(e["exit_code"] for e in events if e["type"] == "exit")
            return code, out.decode(errors="replace")

        def put(self, path, data: bytes):
            native.call("PUT", f"/v1/sandboxes/{sandbox_id}/files?path={urllib.parse.quote(path)}",
                        raw=data)

        def get(self, path) -> bytes:
            return native.call("GET", f"/v1/sandboxes/{sandbox_id}/files?path={urllib.parse.quote(path)}").body

        def titles(self):
            code, out = self.shell("curl -sf http://127.0.0.1:9222/json/list")
            if code != 0:
                return []
            return [t["title"] for t in json.loads(out) if t["type"] == "page"]

        def wait_title(self, title):
            wait_for(lambda: title in self.titles(), f"a page titled {title!r}", timeout=120,
                     interval=0.25)

        def browse(self, path, page, title):
            self.put(path, page.encode())
            # The first action starts the display the browser needs.
            self.act("screen_size")
            # No session, only XFCE's window manager: the window's size comes from its flags.
            self.shell(f"chromium --window-size=800,600 file://{path} >/dev/null 2>&1 &")
            self.wait_title(title)

    yield Computer()
    native.call("DELETE", f"/v1/sandboxes/{sandbox_id}", expect=204)


def test_computer_screen_has_the_resolution_from_metadata(computer):
    assert computer.act("screen_size") == {"result": "size", "width_px": 800, "height_px": 600}
    shot = computer.act("screenshot")
    assert shot["result"] == "screenshot"
    png = base64.b64decode(shot["png_base64"])
    assert png_size(png) == (800, 600) == (shot["width_px"], shot["height_px"])
    assert computer.act("move", x_px=123, y_px=45) == {"result": "done"}
    assert computer.act("cursor_position") == {"result": "position", "x_px": 123, "y_px": 45}


def test_computer_page_sees_clicks_typing_and_keys(computer):
    computer.browse("/tmp/page.html", PAGE, "ready")
    # The window starts at the top-left; its page begins under the browser's bars.
    clicks = first_clicks(lambda attempt: computer.act("click", x_px=400 - attempt, y_px=250),
                          computer.titles)
    computer.act("double_click", x_px=400, y_px=250)
    computer.wait_title(f"clicks {clicks + 2} doubles 1")
    computer.act("click", x_px=400, y_px=250, button="right")
    computer.wait_title("context menu")
    computer.act("click", x_px=300, y_px=520)
    computer.act("type", text="hello native")
    computer.wait_title("typed:hello native")
    computer.act("key", keys="ctrl+a")
    computer.act("key", keys="backspace")
    computer.wait_title("typed:")


def test_computer_drag_and_scroll_reach_the_page(computer):
    computer.browse("/tmp/drag.html", DRAG_PAGE, "drag ready")
    # A click is a drag of nothing: once the page reports it, it takes the pointer's input.
    wait_for(lambda: computer.act("click", x_px=200, y_px=300) and "drag 0,0" in computer.titles(),
             "the page to take a click", timeout=120, interval=0.5)
    computer.act("drag", from_x_px=200, from_y_px=300, to_x_px=350, to_y_px=400)
    computer.wait_title("drag 150,100")
    computer.act("scroll", direction="down", clicks=3, x_px=400, y_px=300)
    wait_for(lambda: any(t.startswith("scrolled ") and t != "scrolled 0" for t in computer.titles()),
             "the page to scroll down", timeout=60, interval=0.25)


DOWNLOAD_PAGE = """<!doctype html><html><head><title>download ready</title><style>
html, body { margin: 0; height: 100% }
a { display: block; width: 100%; height: 60vh; font-size: 40px }
</style></head><body>
<a download="report.txt" href="data:text/plain,downloaded%20by%20chromium">download</a>
</body></html>"""


def test_computer_browser_downloads_land_where_the_files_api_reads(computer, native):
    computer.browse("/tmp/download.html", DOWNLOAD_PAGE, "download ready")
    path = urllib.parse.quote("/tmp/Downloads/report.txt")
    clicked = [0.0]

    def downloaded():
        # A window just mapped may miss a first click: click again every few seconds (a
        # second download would be "report (1).txt"; the first is the one read).
        if time.monotonic() - clicked[0] > 3:
            computer.act("click", x_px=400, y_px=250)
            clicked[0] = time.monotonic()
        answer = computer_file(native, computer.id, path)
        return answer if answer is not None and answer.status == 200 else None

    answer = wait_for(downloaded, "the browser's download in /tmp/Downloads", timeout=120, interval=0.25)
    assert answer.body == b"downloaded by chromium"


def computer_file(native, sandbox_id, quoted_path):
    return native.daemon.request("GET", f"/v1/sandboxes/{sandbox_id}/files?path={quoted_path}",
                                 {"X-API-Key": native.daemon.key})


def test_computer_clipboard_round_trips(computer):
    assert computer.act("clipboard_set", text="copied ✓ text") == {"result": "done"}
    assert computer.act("clipboard_get") == {"result": "clipboard", "text": "copied ✓ text"}
    # What the sandbox's own tools see is the same clipboard.
    code, out = computer.shell("xclip -selection clipboard -o")
    assert (code, out) == (0, "copied ✓ text")


def test_computer_rejects_bad_actions_by_name(computer, native):
    bad = computer.act("scroll", expect=400, direction="down", clicks=0)
    assert "clicks must be 1 to 100" in bad["message"]
    bad = computer.act("key", expect=400, keys="ctrl+")
    assert "keys must be" in bad["message"]
    bad = computer.act("teleport", expect=400)
    assert "teleport" in bad["message"]
    refused = native.call("POST", "/v1/sandboxes", {
        "template": "desktop", "metadata": {"resolution": "huge"}}, expect=422).json()
    assert "metadata.resolution must be WIDTHxHEIGHT" in refused["message"]


def test_computer_mcp_tool_does_the_same_steps(computer, daemon):
    from test_mcp import run, session, structured

    computer.browse("/tmp/page.html", PAGE, "ready")

    async def scenario():
        async with session(daemon, "http") as s:
            names = {t.name for t in (await s.list_tools()).tools}
            assert "computer" in names
            call = lambda **args: s.call_tool("computer", {"sandbox_id": computer.id, **args})  # noqa: E731
            shot = await call(action="screenshot")
            assert structured(shot)["width_px"] == 800
            images = [c for c in shot.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png"
            assert png_size(base64.b64decode(images[0].data)) == (800, 600)
            assert structured(await call(action="click", x_px=400, y_px=250)) == {"result": "done"}
            await anyio_wait(lambda: "clicks 1 doubles 0" in computer.titles())
            structured(await call(action="click", x_px=300, y_px=520))
            structured(await call(action="type", text="via mcp"))
            await anyio_wait(lambda: "typed:via mcp" in computer.titles())
            assert structured(await call(action="screen_size")) == {
                "result": "size", "width_px": 800, "height_px": 600}
            bad = await call(action="click", x_px=1)
            assert bad.is_error and "y_px" in bad.structured_content["message"]

    async def anyio_wait(check):
        import anyio

        for _ in range(480):
            if check():
                return
            await anyio.sleep(0.25)
        raise AssertionError("gave up waiting for the page")

    run(scenario)
