"""Test equipment for the E2B acceptance suite: a private airlockd, raw HTTP, and checks for
what sandboxes leave on the host. Standard library only, so it imports under any SDK version."""

import http.client
import json
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_AIRLOCKD = REPO / "target/x86_64-unknown-linux-gnu/debug/airlockd"
ENVD_PORT = 49983
E2B_KEY = re.compile(r"^e2b_[0-9a-f]+$")  # what SDK 2.45.1 and the JS SDK's check accept
# Long-lived sandboxes' cgroups are named airlock-sbx-<...><sandbox id>.
CGROUP_PREFIX = "airlock-sbx-"


def sdk_version() -> tuple[int, ...]:
    return tuple(int(part) for part in version("e2b").split(".")[:3])


def wait_for(check, what: str, timeout: float = 30.0, interval: float = 0.05):
    """Polls `check` until it returns something truthy and returns that. The deadline is
    generous on purpose: it only stops a hang, it never judges speed."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def request(addr: str, method: str, path: str, headers=None, body: bytes | None = None,
            timeout: float = 60.0) -> Response:
    """One HTTP/1.1 request to `addr` (host:port) on a fresh connection."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


# --- processes and cgroups ----------------------------------------------------------------------

def _stat(pid: int):
    """(ppid, start ticks, comm) of a live process; None once it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1: raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19]), comm


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every live process below `root`: pid -> (start ticks, description)."""
    parents: dict[int, list[int]] = {}
    info = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))):
            parents.setdefault(stat[0], []).append(int(entry))
            info[int(entry)] = stat
    found, queue = {}, [root]
    while queue:
        for child in parents.get(queue.pop(), []):
            if child in info and child not in found:
                found[child] = (info[child][1], f"{child} {info[child][2]}: {_cmdline(child)}")
                queue.append(child)
    return found


def still_alive(snapshot: dict[int, tuple[int, str]]) -> list[str]:
    """The processes of `snapshot` that still run (same pid and start time)."""
    return [desc for pid, (ticks, desc) in snapshot.items()
            if (stat := _stat(pid)) and stat[1] == ticks]


def cgroup_roots() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base]
    return [base / name for name in ("memory", "pids", "cpu,cpuacct", "unified")
            if (base / name).is_dir()]


def sandbox_cgroups(ids) -> list[str]:
    """Cgroup directories of long-lived sandboxes whose name carries one of `ids`."""
    ids = [i for i in ids if i]
    found = []
    for root in cgroup_roots():
        for path, dirs, _ in os.walk(root):
            for name in dirs:
                if name.startswith(CGROUP_PREFIX) and any(i in name for i in ids):
                    found.append(os.path.join(path, name))
    return found


# --- the daemon ---------------------------------------------------------------------------------

@dataclass
class Daemon:
    binary: Path
    state_dir: Path
    log_path: Path
    process: subprocess.Popen
    addr: str
    key: str
    created_ids: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    extra_args: tuple = ()

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    @property
    def sandboxes_dir(self) -> Path:
        return self.state_dir / "sandboxes"

    def track(self, sandbox_id: str) -> str:
        with self._lock:
            self.created_ids.add(sandbox_id)
        return sandbox_id

    def request(self, method, path, headers=None, body=None, timeout=60.0) -> Response:
        return request(self.addr, method, path, headers, body, timeout)

    def api(self, method, path, body=None, key=None) -> Response:
        """A control-plane call with the E2B key (or `key`), JSON in and out."""
        headers = {"X-API-Key": key if key is not None else self.key}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        return self.request(method, path, headers, data)

    def envd(self, sandbox_id, method, path, token=None, port=ENVD_PORT, body=None,
             headers=None) -> Response:
        """A data-plane call routed by E2B's headers, as the SDK makes it."""
        all_headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
        if token is not None:
            all_headers["X-Access-Token"] = token
        all_headers.update(headers or {})
        return self.request(method, path, all_headers, body)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def sandbox_leftovers(self, sandbox_id: str) -> list[str]:
        """What a destroyed sandbox still has on the host: its directory and cgroups. A kill
        answers before the teardown ends; a list answers only after every teardown begun before
        it, so once it has answered nothing of the sandbox may be left."""
        listed = self.api("GET", "/sandboxes")
        assert listed.status == 200, listed
        left = sandbox_cgroups([sandbox_id])
        if (self.sandboxes_dir / sandbox_id).exists():
            left.append(str(self.sandboxes_dir / sandbox_id))
        return left

    # --- start and stop ---

    @classmethod
    def start(cls, extra_args=()) -> "Daemon":
        binary = Path(os.environ.get("AIRLOCKD") or DEFAULT_AIRLOCKD)
        siblings = {
            "AIRLOCK_JAIL_BIN": binary.parent / "airlock-jail",
            "AIRLOCK_AGENT_BIN": Path(os.environ.get("AIRLOCK_AGENT_BIN") or binary.parent / "airlock-agent"),
        }
        for path in (binary, *siblings.values()):
            if not path.is_file():
                raise RuntimeError(f"{path} is missing: build the workspace first (cargo build --workspace)")
        # Not under /tmp: every sandbox has a /tmp of its own.
        state_dir = Path(tempfile.mkdtemp(prefix="airlock-e2b-state-", dir="/var/tmp"))
        log_fd, log_name = tempfile.mkstemp(prefix="airlock-e2b-daemon-", suffix=".log", dir="/var/tmp")
        process = None
        try:
            key = _create_key(binary, state_dir)
            process = subprocess.Popen(
                [str(binary), "--listen", "127.0.0.1:0", "--state-dir", str(state_dir),
                 *_storage_args(extra_args), *extra_args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_fd,
                env={**os.environ, **{k: str(v) for k, v in siblings.items()}})
            addr = _listening_address(process, Path(log_name))
            daemon = cls(binary, state_dir, Path(log_name), process, addr, key, extra_args=tuple(extra_args))
            wait_for(lambda: _healthy(daemon), "airlockd's GET /v1/health to answer 200")
            return daemon
        except BaseException:
            if process is not None:
                process.kill()
                process.wait()
            shutil.rmtree(state_dir, ignore_errors=True)
            raise
        finally:
            os.close(log_fd)

    def restart(self) -> None:
        """Stops the daemon with SIGTERM (its sandboxes keep running, by design) and starts
        a new one on the same state directory and address, as an operator's restart does."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)
        siblings = {
            "AIRLOCK_JAIL_BIN": self.binary.parent / "airlock-jail",
            "AIRLOCK_AGENT_BIN": Path(os.environ.get("AIRLOCK_AGENT_BIN")
                                      or self.binary.parent / "airlock-agent"),
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--listen", self.addr, "--state-dir", str(self.state_dir),
                 *_storage_args(self.extra_args), *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                env={**os.environ, **{k: str(v) for k, v in siblings.items()}})
        addr = _listening_address(self.process, self.log_path)
        assert addr == self.addr, f"the restarted daemon listens on {addr}, not {self.addr}"
        wait_for(lambda: _healthy(self), "the restarted airlockd's GET /v1/health to answer 200")

    def export_env(self) -> None:
        """What a user sets to point the unmodified SDKs at Airlock."""
        for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_VALIDATE_API_KEY"):
            os.environ.pop(name, None)
        os.environ["E2B_API_URL"] = self.url
        os.environ["E2B_SANDBOX_URL"] = self.url
        os.environ["E2B_API_KEY"] = self.key
        os.environ["NO_PROXY"] = "127.0.0.1,localhost"
        os.environ["no_proxy"] = "127.0.0.1,localhost"

    @contextlib.contextmanager
    def exported(self):
        """The E2B variables point at this daemon inside the block (a module's own daemon
        beside the session's), and are put back after it."""
        names = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "NO_PROXY", "no_proxy")
        saved = {name: os.environ.get(name) for name in names}
        self.export_env()
        try:
            yield self
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _listed_ids(self) -> set[str]:
        ids = set()
        native = self.request("GET", "/v1/sandboxes", {"X-API-Key": self.key})
        if native.status == 200:
            ids |= {s["id"] for s in native.json().get("sandboxes", [])}
        listed = self.api("GET", "/v2/sandboxes")
        if listed.status == 200:
            ids |= {s["sandboxID"] for s in listed.json()}
        return ids

    def stop_and_check(self) -> None:
        """Deletes what the tests left, stops the daemon and asserts that nothing of its
        sandboxes remains: no process, no cgroup, no per-sandbox directory."""
        problems = []
        if self.process.poll() is not None:
            problems.append(f"airlockd died during the session (exit {self.process.returncode})")
        else:
            try:
                leftover = self._listed_ids()
            except OSError as error:
                leftover = set()
                problems.append(f"cannot list the sandboxes left at the end: {error}")
            if leftover:
                problems.append(f"sandboxes still running when the session ended: {sorted(leftover)}")
                for sandbox_id in leftover:
                    self.track(sandbox_id)
                    self.request("DELETE", f"/v1/sandboxes/{sandbox_id}", {"X-API-Key": self.key})
                    self.api("DELETE", f"/sandboxes/{sandbox_id}")
            # Sandboxes outlive a daemon by design, so whatever still runs below it now must end
            # by itself once every sandbox is deleted.
            snapshot = descendants(self.process.pid)
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(30)
                if code != 0:
                    problems.append(f"airlockd exited with {code} after SIGTERM")
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                problems.append("airlockd did not stop within 30 s of SIGTERM")
            try:
                wait_for(lambda: not still_alive(snapshot), "the daemon's processes to end", timeout=15)
            except AssertionError:
                problems.append("processes of deleted sandboxes outlived the daemon:\n  "
                                + "\n  ".join(still_alive(snapshot)))
        storage = self.state_dir / "storage"
        if os.path.ismount(storage):
            # The daemon unmounts its disk scratch storage at exit once no volume is left.
            problems.append(f"the scratch storage {storage} stayed mounted")
            subprocess.run(["umount", "-l", str(storage)], check=False)
        cgroups = sandbox_cgroups(self.created_ids)
        if cgroups:
            problems.append(f"sandbox cgroups left: {cgroups}")
        if self.sandboxes_dir.exists() and (dirs := sorted(os.listdir(self.sandboxes_dir))):
            problems.append(f"sandbox directories left in {self.sandboxes_dir}: {dirs}")
        if problems:
            raise AssertionError(
                "\n".join(problems) + f"\n(state kept in {self.state_dir}; daemon log {self.log_path}:)\n"
                + self.log_tail())
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)


def _storage_args(extra_args) -> list[str]:
    """A 4 GiB scratch image unless the test asks for another: the default (half the free
    space, up to 16 GiB) is reserved up front, and parallel suites on one disk fill it."""
    return [] if "--storage-size" in extra_args or "--scratch" in extra_args else ["--storage-size", "4GiB"]


def _create_key(binary: Path, state_dir: Path) -> str:
    """An API key in E2B's form, made on the store before the daemon starts."""
    keys = subprocess.run(
        [str(binary), "keys", "--state-dir", str(state_dir), "create", "--e2b", "e2b-acceptance"],
        capture_output=True, text=True, timeout=60)
    if keys.returncode != 0:
        raise RuntimeError(f"airlockd keys create --e2b failed: {keys.stderr.strip()}")
    key = keys.stdout.strip()
    if not E2B_KEY.match(key):
        raise RuntimeError(f"`airlockd keys create --e2b` printed {key!r}, not an e2b_<hex> key")
    return key


def _listening_address(process: subprocess.Popen, log_path: Path) -> str:
    """The address from airlockd's first line, `airlockd listening on http://ADDR`."""
    first_line: list[bytes] = []
    reader = threading.Thread(target=lambda: first_line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    line = first_line[0].decode(errors="replace").strip() if first_line else ""
    prefix = "airlockd listening on http://"
    if not line.startswith(prefix):
        raise RuntimeError(f"airlockd did not start (first line {line!r}); its log:\n"
                           f"{log_path.read_text(errors='replace')}")
    # Keep draining stdout so that the daemon never blocks on a full pipe.
    threading.Thread(target=process.stdout.read, daemon=True).start()
    return line[len(prefix):]


def _healthy(daemon: Daemon) -> bool:
    try:
        return daemon.request("GET", "/v1/health", timeout=5).status == 200
    except OSError:
        return False
