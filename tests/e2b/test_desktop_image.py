"""The `desktop` template on the container tier: a template built with `airlock template build`
from the Dockerfile the project ships (images/desktop), whose `RUN apt-get install` fetches
Debian's Xvfb, XFCE, xdotool, scrot, x11vnc, noVNC and Chromium through the build's egress
proxy, then driven by the unmodified e2b-desktop SDK: the screenshot has the size given at
create, and a click in the image's Chromium changes a local page (checked from the page's own
title in Chromium's DevTools list inside the sandbox). The image's files are the sandbox's
whole filesystem: the host's are not visible.

The base image and the mirror relay are test_interpreter_image.py's: the python test image of
scripts/test-images.sh (an mmdebstrap minbase of bookworm), and deb.debian.org and
security.debian.org resolved to a loopback relay to this host's mirror, with the Dockerfile's
build policy and apt's signature checks as a user gets them. The build installs about 550 MB.
"""

import json
import os
import subprocess

import pytest

from airlock_harness import REPO, Daemon, wait_for
from test_interpreter_image import MIRRORS, PYTHON_IMAGE, Relay

pytest.importorskip("e2b_desktop")
from e2b_desktop import Sandbox  # noqa: E402

from test_desktop import PAGE, png_size  # noqa: E402

IMAGE_DIR = REPO / "images/desktop"
TEMPLATE = "desktop-image"


@pytest.fixture(scope="module")
def image_daemon():
    if not PYTHON_IMAGE.exists():
        pytest.fail(f"{PYTHON_IMAGE} is missing: run scripts/test-images.sh first")
    import socket

    mirror = socket.getaddrinfo("deb.debian.org", 80, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    relay = Relay(mirror)
    resolve = ",".join(f"{name}=127.0.0.1:{relay.port}" for name in MIRRORS)
    daemon = Daemon.start(["--test-egress-resolve", resolve])
    try:
        with daemon.exported():
            yield daemon
    finally:
        daemon.stop_and_check()
        relay.close()


@pytest.fixture(scope="module")
def template(image_daemon):
    tag = "airlock/python:desktop-base"
    imported = image_daemon.request(
        "POST", f"/v1/images/import?tag={tag}",
        {"X-API-Key": image_daemon.key, "Content-Type": "application/octet-stream"},
        PYTHON_IMAGE.read_bytes(), timeout=300)
    assert imported.status == 201, imported.body
    airlock = image_daemon.binary.parent / "airlock"
    built = subprocess.run(
        [str(airlock), "template", "build", TEMPLATE, str(IMAGE_DIR),
         "--build-arg", f"BASE={tag}",
         "--policy", str(IMAGE_DIR / "build-policy.yaml"),
         "--disk", "2GiB", "--memory", "2GiB"],
        capture_output=True, text=True, timeout=3600,
        env={**os.environ, "AIRLOCK_URL": image_daemon.url, "AIRLOCK_API_KEY": image_daemon.key})
    assert built.returncode == 0, f"{built.stderr}\n{built.stdout[-4000:]}"
    assert "Setting up chromium" in built.stdout, "apt ran inside the RUN step"
    return TEMPLATE


def titles(desktop) -> list[str]:
    try:
        listed = desktop.commands.run("curl -sf http://127.0.0.1:9222/json/list", timeout=30)
    except Exception:  # noqa: BLE001 - Chromium not listening yet
        return []
    return [t["title"] for t in json.loads(listed.stdout) if t["type"] == "page"]


# The template's build (about 550 MB through apt and dpkg) is part of this test's setup: the
# suite's 300 s deadline would judge the machine's disk, not a hang.
@pytest.mark.timeout(1800)
def test_desktop_image_sdk_screenshot_and_click(image_daemon, template):
    desktop = Sandbox.create(template=template, resolution=(800, 600), timeout=600)
    image_daemon.track(desktop.sandbox_id)
    try:
        assert desktop.get_info().template_id.split(":")[0] == TEMPLATE
        assert png_size(desktop.screenshot()) == (800, 600)
        assert tuple(desktop.get_screen_size()) == (800, 600)
        # The image is the whole filesystem: the repository on the host is not there.
        seen = desktop.commands.run(f"test -e {REPO} && echo host || echo image").stdout
        assert seen.strip() == "image"
        desktop.files.write("/tmp/page.html", PAGE)
        desktop.commands.run("chromium file:///tmp/page.html >/tmp/chromium.log 2>&1",
                             background=True, timeout=0)
        wait_for(lambda: "ready" in titles(desktop), "the page in the image's Chromium",
                 timeout=180, interval=0.5)
        # The button covers the top 60 % of the viewport, whatever the browser's bars take.
        def clicked():
            desktop.left_click(400, 300)
            return any(t.startswith("clicks ") for t in titles(desktop))

        wait_for(clicked, "the page to count a click", timeout=60, interval=1.0)
        # Chromium runs with --no-sandbox inside (Airlock is the sandbox).
        flags = desktop.commands.run("tr '\\0' ' ' </proc/$(pgrep -o -x chromium)/cmdline").stdout
        assert "--no-sandbox" in flags and "--remote-debugging-port=9222" in flags, flags
    finally:
        desktop.kill()
