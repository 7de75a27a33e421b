"""Test equipment for the Judge0 compatibility suite: a private airlockd serving the Judge0 API
(`--judge0-listen`), raw HTTP towards it, and the leak checks of the E2B suite's harness."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/e2b"))

from airlock_harness import (  # noqa: E402 - the E2B suite's standard-library helpers
    DEFAULT_AIRLOCKD, Response, descendants, request, sandbox_cgroups, still_alive, wait_for)

__all__ = ["Daemon", "Response", "wait_for"]


def _siblings(binary: Path) -> dict[str, str]:
    return {
        "AIRLOCK_JAIL_BIN": str(binary.parent / "airlock-jail"),
        "AIRLOCK_AGENT_BIN": os.environ.get("AIRLOCK_AGENT_BIN") or str(binary.parent / "airlock-agent"),
    }


def _read_addresses(process: subprocess.Popen, log_path: Path) -> tuple[str, str]:
    """The control-plane and Judge0 addresses from airlockd's first two lines."""
    lines: list[str] = []

    def read():
        for _ in range(2):
            lines.append(process.stdout.readline().decode(errors="replace").strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    main, judge0 = "airlockd listening on http://", "airlockd judge0 API listening on http://"
    if len(lines) < 2 or not lines[0].startswith(main) or not lines[1].startswith(judge0):
        raise RuntimeError(f"airlockd did not start (first lines {lines!r}); its log:\n"
                           f"{log_path.read_text(errors='replace')}")
    threading.Thread(target=process.stdout.read, daemon=True).start()
    return lines[0][len(main):], lines[1][len(judge0):]


@dataclass
class Daemon:
    binary: Path
    state_dir: Path
    log_path: Path
    process: subprocess.Popen
    addr: str
    judge0_addr: str
    key: str
    args: list[str]

    @property
    def url(self) -> str:
        return f"http://{self.judge0_addr}"

    def judge0(self, method: str, path: str, body=None, headers=None, key=None,
               timeout: float = 120.0) -> Response:
        """A call to the Judge0 API with the API key in X-Auth-Token (or `key`; "" sends none)."""
        all_headers = {"Content-Type": "application/json"}
        key = self.key if key is None else key
        if key:
            all_headers["X-Auth-Token"] = key
        all_headers.update(headers or {})
        data = json.dumps(body).encode() if body is not None else None
        return request(self.judge0_addr, method, path, all_headers, data, timeout)

    def native(self, method: str, path: str) -> Response:
        return request(self.addr, method, path, {"X-API-Key": self.key})

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @classmethod
    def start(cls, extra_args: list[str]) -> "Daemon":
        binary = Path(os.environ.get("AIRLOCKD") or DEFAULT_AIRLOCKD)
        for path in (binary, *map(Path, _siblings(binary).values())):
            if not path.is_file():
                raise RuntimeError(f"{path} is missing: build the workspace first (cargo build --workspace)")
        state_dir = Path(tempfile.mkdtemp(prefix="airlock-judge0-state-", dir="/var/tmp"))
        log_fd, log_name = tempfile.mkstemp(prefix="airlock-judge0-daemon-", suffix=".log", dir="/var/tmp")
        try:
            keys = subprocess.run([str(binary), "keys", "--state-dir", str(state_dir), "create", "judge0"],
                                  capture_output=True, text=True, timeout=60, check=True)
            key = keys.stdout.strip()
            args = ["--state-dir", str(state_dir), *extra_args]
            process = subprocess.Popen(
                [str(binary), "--listen", "127.0.0.1:0", "--judge0-listen", "127.0.0.1:0", *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_fd,
                env={**os.environ, **_siblings(binary)})
            try:
                addr, judge0_addr = _read_addresses(process, Path(log_name))
            except BaseException:
                process.kill()
                process.wait()
                raise
            return cls(binary, state_dir, Path(log_name), process, addr, judge0_addr, key, args)
        except BaseException:
            shutil.rmtree(state_dir, ignore_errors=True)
            raise
        finally:
            os.close(log_fd)

    def restart(self) -> None:
        """SIGTERM, then a new daemon on the same state directory and addresses."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--listen", self.addr, "--judge0-listen", self.judge0_addr, *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                env={**os.environ, **_siblings(self.binary)})
        addr, judge0_addr = _read_addresses(self.process, self.log_path)
        assert (addr, judge0_addr) == (self.addr, self.judge0_addr)

    def sandbox_ids(self) -> list[str]:
        listed = self.native("GET", "/v1/sandboxes")
        assert listed.status == 200, listed.body
        return [s["id"] for s in listed.json()["sandboxes"]]

    def stop_and_check(self) -> None:
        """Stops the daemon and asserts that no submission's sandbox is left: no sandbox,
        no process, no cgroup, no directory."""
        problems = []
        if self.process.poll() is not None:
            problems.append(f"airlockd died during the session (exit {self.process.returncode})")
        else:
            try:
                wait_for(lambda: not self.sandbox_ids(), "every submission's sandbox to go", timeout=60)
            except AssertionError:
                problems.append(f"sandboxes left at the end: {self.sandbox_ids()}")
            snapshot = descendants(self.process.pid)
            self.process.send_signal(signal.SIGTERM)
            try:
                if (code := self.process.wait(60)) != 0:
                    problems.append(f"airlockd exited with {code} after SIGTERM")
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                problems.append("airlockd did not stop within 60 s of SIGTERM")
            try:
                wait_for(lambda: not still_alive(snapshot), "the daemon's processes to end", timeout=15)
            except AssertionError:
                problems.append("processes outlived the daemon:\n  " + "\n  ".join(still_alive(snapshot)))
        sandboxes = self.state_dir / "sandboxes"
        if sandboxes.exists() and (dirs := sorted(os.listdir(sandboxes))):
            problems.append(f"sandbox directories left: {dirs}")
            if cgroups := sandbox_cgroups(dirs):
                problems.append(f"sandbox cgroups left: {cgroups}")
        storage = self.state_dir / "storage"
        if os.path.ismount(storage):
            problems.append(f"the scratch storage {storage} stayed mounted")
            subprocess.run(["umount", "-l", str(storage)], check=False)
        if problems:
            raise AssertionError("\n".join(problems) + f"\n(state kept in {self.state_dir}; log "
                                 f"{self.log_path}:)\n" + self.log_tail())
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)
