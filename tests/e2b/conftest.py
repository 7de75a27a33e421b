"""The E2B acceptance suite's fixtures: one private airlockd for the session, the E2B variables
a user would set, and sandboxes that are killed when their test ends.

Run it with scripts/e2b-tests.sh, or by hand (as root, after `cargo build --workspace`):
    target/e2b-venv-latest/bin/python -m pytest tests/e2b
AIRLOCKD names another daemon binary (its airlock-jail and airlock-agent must sit beside it).
"""

import os
import uuid

import pytest

from airlock_harness import Daemon, sdk_version


def pytest_report_header(config):
    return f"e2b SDK {'.'.join(map(str, sdk_version()))}"


@pytest.fixture(scope="session")
def daemon():
    if os.geteuid() != 0:
        pytest.exit("the E2B suite creates sandboxes (cgroups, namespaces): run it as root", 2)
    started = Daemon.start()
    started.export_env()
    try:
        yield started
    finally:
        started.stop_and_check()


@pytest.fixture
def new_sandbox(daemon):
    """Creates sandboxes through the SDK; each is killed when the test ends."""
    from e2b import Sandbox

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
            Sandbox.kill(sandbox.sandbox_id)
        except Exception:  # noqa: BLE001 - a failed kill shows up in the session's leak check
            pass


@pytest.fixture
def sandbox(new_sandbox):
    return new_sandbox()


@pytest.fixture
def tag():
    """A value no other test (or earlier run) uses."""
    return uuid.uuid4().hex[:12]
