"""A warm pool of the `desktop` template: each member's X server and XFCE session run before any
claim, at 1024x768 with the e2b-desktop SDK's own Xvfb command (crates/server/src/lifecycle/
desktop_warm.rs). The unmodified SDK's create at that size is served by a member and uses its
display (one X server, the member's, and one XFCE session); a create at another size is served
by a member too (the SDK's create does not say the size) whose warm display the SDK's own Xvfb
command replaces, so the screen has the size asked for; a native create whose
`metadata.resolution` differs goes cold. Other tests share the daemon, so the pool is removed
after."""

import json

import pytest

e2b_desktop = pytest.importorskip("e2b_desktop")
from e2b_desktop import Sandbox  # noqa: E402

from airlock_harness import wait_for  # noqa: E402
from test_desktop import png_size  # noqa: E402
from test_pool import pool, pool_members, set_pool  # noqa: E402

TEMPLATE = "desktop"


def lines(desktop, command):
    return desktop.commands.run(command, timeout=30).stdout.split()


def x_servers(desktop):
    """The sandbox's X servers (processes of /usr/bin/Xvfb, not the warm display's scripts of
    that name), as `pid args...` lines."""
    script = ("for p in $(pgrep -x Xvfb); do [ \"$(readlink /proc/$p/exe)\" = /usr/bin/Xvfb ] "
              "&& echo \"$p $(tr '\\0' ' ' </proc/$p/cmdline)\"; done; true")
    out = desktop.commands.run(script, timeout=30).stdout
    return [line for line in out.splitlines() if line.strip()]


@pytest.fixture
def desktop_pool(daemon):
    set_pool(daemon, 1, TEMPLATE)
    try:
        yield lambda: wait_for(lambda: pool(daemon, TEMPLATE)["ready"] == 1,
                               "a ready desktop member (its XFCE session up)", timeout=300,
                               interval=0.25)
    finally:
        set_pool(daemon, 0, TEMPLATE)
    assert pool_members(daemon) == set()


@pytest.fixture
def made(daemon):
    desktops = []
    yield desktops
    for desktop in desktops:
        try:
            desktop.kill()
        except Exception:  # noqa: BLE001 - a failed kill shows up in the session's leak check
            pass


def claim(daemon, made, **options):
    """An SDK create that must be served by the pool's member."""
    members = pool_members(daemon)
    claims = pool(daemon, TEMPLATE)["claims_total"]
    desktop = Sandbox.create(timeout=600, **options)
    daemon.track(desktop.sandbox_id)
    made.append(desktop)
    assert desktop.sandbox_id in members, "served by the warm member"
    assert pool(daemon, TEMPLATE)["claims_total"] == claims + 1
    return desktop


def test_desktop_pool_sdk_create_uses_the_members_display(daemon, desktop_pool, made):
    desktop_pool()
    desktop = claim(daemon, made)
    warm_pid = desktop.files.read("/tmp/.airlock-desktop/xvfb.pid").strip()
    assert png_size(desktop.screenshot()) == (1024, 768)
    assert tuple(desktop.get_screen_size()) == (1024, 768)
    # No second display: the one X server is the member's, started before the claim.
    servers = x_servers(desktop)
    assert len(servers) == 1, servers
    assert servers[0].split()[0] == warm_pid, (servers, warm_pid)
    assert len(lines(desktop, "pgrep -x xfce4-session")) == 1
    desktop.move_mouse(321, 123)
    assert tuple(desktop.get_cursor_position()) == (321, 123)
    # The claim's env reaches what the SDK starts after it (DISPLAY, set by the SDK).
    assert desktop.commands.run("echo $DISPLAY").stdout.strip() == ":0"


def test_desktop_pool_sdk_create_at_another_size_gets_that_size(daemon, desktop_pool, made):
    desktop_pool()
    desktop = claim(daemon, made, resolution=(1280, 720))
    assert png_size(desktop.screenshot()) == (1280, 720)
    assert tuple(desktop.get_screen_size()) == (1280, 720)
    servers = x_servers(desktop)
    assert len(servers) == 1, servers
    assert "1280x720x24" in servers[0], servers
    # The SDK's create waited for XFCE's three processes on the new server: they run, once.
    for name in ("xfce4-session", "xfwm4", "xfdesktop"):
        assert len(lines(desktop, f"pgrep -x {name}")) == 1, name
    desktop.move_mouse(1200, 700)
    assert tuple(desktop.get_cursor_position()) == (1200, 700)


def test_desktop_pool_native_create_at_another_size_goes_cold(daemon, desktop_pool):
    desktop_pool()
    members = pool_members(daemon)
    claims = pool(daemon, TEMPLATE)["claims_total"]
    created = daemon.api("POST", "/v1/sandboxes", {
        "template": TEMPLATE, "timeout_ms": 600_000, "metadata": {"resolution": "800x600"},
    })
    assert created.status == 201, created.body
    sandbox_id = daemon.track(created.json()["sandbox"]["id"])
    try:
        assert sandbox_id not in members
        assert pool(daemon, TEMPLATE)["claims_total"] == claims
        shot = daemon.api("POST", f"/v1/sandboxes/{sandbox_id}/computer", {"action": "screenshot"})
        assert shot.status == 200, shot.body[:300]
        answer = json.loads(shot.body)
        assert (answer["width_px"], answer["height_px"]) == (800, 600)
        # The member is still there for a create at its size.
        assert pool(daemon, TEMPLATE)["ready"] == 1
    finally:
        assert daemon.api("DELETE", f"/v1/sandboxes/{sandbox_id}").status == 204
