"""The E2B SDK's git module in a repository sandbox, with no token in the sandbox.

A private airlockd is started for this module with a forge: a git smart-HTTP server on
loopback (`git http-backend` behind a small HTTP server that wants a token) and a fake
GitHub-compatible API. The sandbox is created by the SDK with E2B's only free-form field,
its metadata (`airlock.git.url`, `airlock.git.branch`); then `sandbox.git` stages, commits and
pushes without any credential: the egress proxy swaps the placeholder for the token at the
repository alone, and refuses a push to another branch."""

import base64
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2b import Sandbox

from airlock_harness import Daemon

TOKEN = "forge-token-e2b-7d41c09a58"
URL = "http://git.test/acme/app.git"


def git(*args, cwd=None):
    return subprocess.run(
        ["git", "-c", "user.name=upstream", "-c", "user.email=u@test", "-c", "init.defaultBranch=main",
         *args],
        cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


class GitHandler(BaseHTTPRequestHandler):
    """`git http-backend` as CGI, behind `Authorization: Basic x:<TOKEN>`."""
    root: Path
    seen: list

    def log_message(self, *args):
        pass

    def _handle(self):
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.command, self.path, auth))
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        if auth != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        env = {
            "PATH": "/usr/bin:/bin", "GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "REMOTE_USER": "e2b",
            "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.receivepack", "GIT_CONFIG_VALUE_0": "true",
            "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode().splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

    do_GET = _handle
    do_POST = _handle


class ForgeHandler(BaseHTTPRequestHandler):
    """`POST /repos/{owner}/{repo}/pulls` with `Authorization: Bearer <TOKEN>`."""
    calls: list

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, self.headers.get("Authorization"), body))
        ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        answer = json.dumps({"number": 7, "html_url": "https://forge.test/acme/app/pull/7"} if ok
                            else {"message": "Bad credentials"}).encode()
        self.send_response(201 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def serve(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def forge(tmp_path_factory):
    """The upstream repository, its servers, and a daemon that knows them; the SDK's variables
    point at that daemon for this module's tests, and are put back after."""
    base = Path(tmp_path_factory.mktemp("git", numbered=True))
    work = base / "work"
    work.mkdir()
    git("init", "-q", cwd=work)
    (work / "README").write_text("the app\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    root = base / "root"
    (root / "acme").mkdir(parents=True)
    git("clone", "-q", "--bare", str(work), str(root / "acme/app.git"))
    seen, calls = [], []
    git_server = serve(type("Git", (GitHandler,), {"root": root, "seen": seen}))
    forge_server = serve(type("Forge", (ForgeHandler,), {"calls": calls}))
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    daemon = Daemon.start(extra_args=(
        "--test-egress-resolve", f"git.test=127.0.0.1:{git_server.server_address[1]}",
        "--forge-api", f"http://127.0.0.1:{forge_server.server_address[1]}",
        "--forge-git-host", "git.test",
        "--forge-token-file", str(token_file),
    ))
    try:
        with daemon.exported():
            yield {"daemon": daemon, "root": root, "seen": seen, "calls": calls}
    finally:
        git_server.shutdown()
        forge_server.shutdown()
        daemon.stop_and_check()


def upstream(forge, *args):
    return git("-C", str(forge["root"] / "acme/app.git"), *args)


def test_git_module_commits_and_pushes_its_branch_without_a_token(forge):
    sandbox = Sandbox.create(timeout=600, metadata={"airlock.git.url": URL, "airlock.git.branch": "e2b-agent"})
    forge["daemon"].track(sandbox.sandbox_id)
    try:
        status = sandbox.git.status("/workspace")
        assert status.current_branch == "e2b-agent"
        assert status.is_clean
        assert sandbox.files.read("/workspace/README") == "the app\n"

        sandbox.files.write("/workspace/NOTES.md", "written through the e2b SDK\n")
        assert not sandbox.git.status("/workspace").is_clean
        sandbox.git.add("/workspace", all=True)
        sandbox.git.commit("/workspace", "notes", author_name="e2b", author_email="e2b@test")
        sandbox.git.push("/workspace")  # no username, no password: the placeholder does it
        head = sandbox.commands.run("git -C /workspace rev-parse HEAD").stdout.strip()
        assert upstream(forge, "rev-parse", "refs/heads/e2b-agent") == head
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        pushes = [s for s in forge["seen"] if s[1].endswith("/git-receive-pack")]
        assert pushes and all(auth == expected for _, _, auth in pushes)

        # Another branch: the proxy refuses it, and main stays where it was.
        main = upstream(forge, "rev-parse", "refs/heads/main")
        with pytest.raises(Exception) as refused:
            sandbox.git.push("/workspace", remote="origin", branch="HEAD:refs/heads/main", set_upstream=False)
        assert "403" in str(refused.value)
        assert upstream(forge, "rev-parse", "refs/heads/main") == main

        # The token is nowhere in the sandbox (searched from a file, so that no command
        # line holds it); the same search finds the placeholder.
        front, back = TOKEN[:10], TOKEN[10:]
        search = ("{ env; git -C /workspace config --list; "
                  "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
                  "grep -rsa -F -f /tmp/.p --exclude=.p /workspace /tmp /run/airlock 2>/dev/null; } "
                  "| grep -c -F -f /tmp/.p || true")
        found = sandbox.commands.run(f'a={front}; b={back}; printf %s "$a$b" > /tmp/.p; {search}')
        assert found.stdout.strip() == "0"
        control = sandbox.commands.run(f'printf %s "$AIRLOCK_GIT_TOKEN" > /tmp/.p; {search}')
        assert int(control.stdout.strip()) >= 1

        # The pull request, with the E2B key (it is the daemon's API key too).
        daemon = forge["daemon"]
        answer = daemon.request("POST", f"/v1/sandboxes/{sandbox.sandbox_id}/git/pull-request",
                                {"X-API-Key": daemon.key, "Content-Type": "application/json"},
                                json.dumps({"title": "From E2B"}).encode())
        assert answer.status == 201, answer.body
        assert answer.json()["url"] == "https://forge.test/acme/app/pull/7"
        path, auth, body = forge["calls"][-1]
        assert path == "/repos/acme/app/pulls" and auth == f"Bearer {TOKEN}"
        assert (body["head"], body["base"]) == ("e2b-agent", "main")
    finally:
        sandbox.kill()


def test_sandboxes_of_one_repository_are_listed_by_its_metadata(forge):
    sandboxes = [Sandbox.create(timeout=600, metadata={"airlock.git.url": URL, "airlock.git.branch": f"agent-{n}"})
                 for n in range(3)]
    try:
        for sandbox in sandboxes:
            forge["daemon"].track(sandbox.sandbox_id)
        from e2b import SandboxQuery
        listed = Sandbox.list(query=SandboxQuery(metadata={"airlock.git.url": URL})).next_items()
        branches = sorted(s.metadata["airlock.git.branch"] for s in listed
                          if s.sandbox_id in {x.sandbox_id for x in sandboxes})
        assert branches == ["agent-0", "agent-1", "agent-2"]
        for n, sandbox in enumerate(sandboxes):
            assert sandbox.git.status("/workspace").current_branch == f"agent-{n}"
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
