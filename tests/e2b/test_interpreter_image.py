"""E2B's code interpreter on the container tier: a template built with `airlock template build`
from the Dockerfile the project ships (images/code-interpreter), whose `RUN apt-get install`
fetches Debian's python3-ipykernel, matplotlib and pandas through the build's egress proxy,
then driven by the unmodified `e2b-code-interpreter` SDK: rich results from the image's own
Python, the host invisible, and the template's memory limit holding for the kernel.

The base image is the python test image of scripts/test-images.sh (an mmdebstrap minbase of
bookworm). The test machines' Debian mirror sits on an address the egress proxy refuses
(as it refuses every private and documentation address), so this module's daemon resolves
deb.debian.org and security.debian.org to a loopback relay that carries the bytes to the
mirror this host's apt uses: the Dockerfile's build policy, its rules and apt's signature
checks are the ones a user gets.
"""

import base64
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from airlock_harness import REPO, Daemon

pytest.importorskip("e2b_code_interpreter")
from e2b_code_interpreter import Sandbox  # noqa: E402

PYTHON_IMAGE = REPO / "target/test-images/python.tar"
IMAGE_DIR = REPO / "images/code-interpreter"
TEMPLATE = "code-interpreter-image"
MEMORY = "768MiB"
READY = "python3 -c \"import urllib.request as r; r.urlopen('http://127.0.0.1:49999/health')\""
MIRRORS = ("deb.debian.org", "security.debian.org")


class Relay:
    """A loopback TCP listener that carries each connection to `target` (host, port)."""

    def __init__(self, target):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=30)
            except OSError:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self):
        self.server.close()


@pytest.fixture(scope="module")
def image_daemon():
    if not PYTHON_IMAGE.exists():
        pytest.fail(f"{PYTHON_IMAGE} is missing: run scripts/test-images.sh first")
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
    tag = "airlock/python:interpreter"
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
         "--ready-cmd", READY, "--memory", MEMORY],
        capture_output=True, text=True, timeout=1800,
        env={**os.environ, "AIRLOCK_URL": image_daemon.url, "AIRLOCK_API_KEY": image_daemon.key})
    assert built.returncode == 0, f"{built.stderr}\n{built.stdout[-4000:]}"
    assert "python3-ipykernel" in built.stdout, "apt ran inside the RUN step"
    return TEMPLATE


@pytest.fixture
def interpreter(image_daemon, template):
    sandbox = Sandbox.create(template=template, timeout=600)
    image_daemon.track(sandbox.sandbox_id)
    yield sandbox
    sandbox.kill()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_interpreter_image_runs_rich_results_in_the_image(interpreter):
    assert interpreter.get_info().template_id.split(":")[0] == TEMPLATE
    plot = interpreter.run_code(
        # The inline backend crops to the drawn area unless told not to.
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.plot([1, 2, 3])\nplt.show()", timeout=240)
    assert plot.error is None, plot.error
    pngs = [result.png for result in plot.results if result.png]
    assert len(pngs) == 1, plot.results
    assert png_size(base64.b64decode(pngs[0])) == (400, 300)
    frame = interpreter.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert frame.error is None, frame.error
    assert "<table" in frame.results[0].html
    # The kernel is the image's python3, with the image's files as its whole filesystem.
    seen = interpreter.run_code(
        "import sys, os, ipykernel\n"
        "(sys.executable, ipykernel.__file__.startswith('/usr/lib/python3/'), "
        f"os.path.exists({str(REPO)!r}), os.path.exists('/usr/share/doc/python3-pandas'))")
    assert seen.error is None, seen.error
    assert seen.text == "('/usr/bin/python3', True, False, True)"


def test_interpreter_image_kernel_is_held_to_the_template_memory(interpreter):
    interpreter.run_code("before = 1")
    # Written bytes, not a lazily zeroed allocation: the memory cgroup has to account them.
    bomb = interpreter.run_code("hog = b'x' * (2 << 30)\nlen(hog)")
    assert bomb.error is not None, f"2 GiB fit a {MEMORY} sandbox: {bomb.text}"
    # The kernel was killed, not handed a MemoryError: the next execution gets a new one.
    after = interpreter.run_code("'before' in globals(), 1 + 1")
    assert after.error is None and after.text == "(False, 2)", after.error
