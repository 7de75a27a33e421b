"""The npm `e2b` SDK against the same daemon: create, run, write/read, kill (js/smoke.mjs); and
the npm `@e2b/code-interpreter` SDK (js/interpreter.mjs)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parent / "js"


@pytest.mark.skipif(os.environ.get("AIRLOCK_E2B_JS") != "1",
                    reason="set AIRLOCK_E2B_JS=1 after `npm ci` in tests/e2b/js (scripts/e2b-tests.sh does)")
def test_js_sdk_smoke(daemon):
    assert (JS_DIR / "node_modules/e2b").is_dir(), "run `npm ci` in tests/e2b/js first"
    result = subprocess.run(["node", "smoke.mjs"], cwd=JS_DIR, env=os.environ.copy(),
                            capture_output=True, text=True, timeout=300)
    for sandbox_id in re.findall(r"in sandbox (\S+)", result.stdout):
        daemon.track(sandbox_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "js-smoke: 1 passed, 0 failed" in result.stdout


@pytest.mark.skipif(os.environ.get("AIRLOCK_E2B_JS") != "1",
                    reason="set AIRLOCK_E2B_JS=1 after `npm ci` in tests/e2b/js (scripts/e2b-tests.sh does)")
def test_js_code_interpreter_sdk(daemon):
    """@e2b/code-interpreter: output callbacks, results, errors, contexts, env vars, an
    interrupt by the client's timeout (js/interpreter.mjs)."""
    assert (JS_DIR / "node_modules/@e2b/code-interpreter").is_dir(), "run `npm ci` in tests/e2b/js"
    result = subprocess.run(["node", "interpreter.mjs"], cwd=JS_DIR, env=os.environ.copy(),
                            capture_output=True, text=True, timeout=900)
    for sandbox_id in re.findall(r"in sandbox (\S+)", result.stdout):
        daemon.track(sandbox_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "js-interpreter: 1 passed, 0 failed" in result.stdout
