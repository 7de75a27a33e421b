"""The Judge0 suite's fixtures: one private airlockd serving the Judge0 API for the session,
and the unmodified `judge0` SDK's client pointed at it.

Run it with scripts/judge0-tests.sh, or by hand (as root, after `cargo build --workspace`):
    target/judge0-venv/bin/python -m pytest tests/judge0
"""

import json
import os
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from judge0_harness import Daemon


@pytest.fixture(scope="session")
def callback_server():
    """A loopback HTTP server that records the callbacks it receives: (method, path, body)."""
    received: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            received.append(("PUT", self.path, self.rfile.read(length)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.received = received
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture(scope="session")
def daemon(callback_server):
    if os.geteuid() != 0:
        pytest.exit("the Judge0 suite creates sandboxes (cgroups, namespaces): run it as root", 2)
    port = callback_server.server_address[1]
    # The operator's language file: one language added to the built-in table.
    languages = tempfile.NamedTemporaryFile("w", prefix="judge0-languages-", suffix=".json", delete=False)
    json.dump({"languages": [{"id": 2001, "name": "AWK (mawk)", "source_file": "script.awk",
                              "run_cmd": "/usr/bin/mawk -f script.awk", "requires": ["/usr/bin/mawk"]}]},
              languages)
    languages.close()
    # A secret in the daemon's environment, which no submission may see (Judge0 #564).
    os.environ["JUDGE0_SUITE_DAEMON_SECRET"] = "daemon-secret-value"
    started = Daemon.start(["--judge0-workers", "2",
                            "--judge0-callback-hosts", f"127.0.0.1:{port}",
                            "--judge0-callback-internal",
                            "--judge0-languages", languages.name])
    try:
        yield started
    finally:
        os.unlink(languages.name)
        started.stop_and_check()


@pytest.fixture(scope="session")
def client(daemon):
    """The official SDK's client for a self-hosted Judge0 CE with an auth header."""
    import judge0

    return judge0.Client(daemon.url, {"X-Auth-Token": daemon.key})
