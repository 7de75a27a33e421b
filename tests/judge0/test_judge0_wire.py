"""Judge0 CE 1.13.1's wire format over raw HTTP: routes, shapes, types, errors, auth,
base64 rules, `fields`, `wait`, files, callbacks, networked submissions through the operator's
policy, and the queue across a daemon restart."""

import base64
import io
import json
import os
import re
import uuid
import zipfile

from judge0_harness import Daemon, wait_for

PYTHON = 71
DEFAULT_FIELDS = {"token", "time", "memory", "stdout", "stderr", "compile_output", "message", "status"}
ALL_FIELDS = {
    "source_code", "language_id", "stdin", "expected_output", "stdout", "status_id", "created_at",
    "finished_at", "time", "memory", "stderr", "token", "number_of_runs", "cpu_time_limit",
    "cpu_extra_time", "wall_time_limit", "memory_limit", "stack_limit",
    "max_processes_and_or_threads", "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit", "max_file_size", "compile_output", "exit_code",
    "exit_signal", "message", "wall_time", "compiler_options", "command_line_arguments",
    "redirect_stderr_to_stdout", "callback_url", "additional_files", "enable_network", "status",
    "language",
}
STATUSES = [
    "In Queue", "Processing", "Accepted", "Wrong Answer", "Time Limit Exceeded",
    "Compilation Error", "Runtime Error (SIGSEGV)", "Runtime Error (SIGXFSZ)",
    "Runtime Error (SIGFPE)", "Runtime Error (SIGABRT)", "Runtime Error (NZEC)",
    "Runtime Error (Other)", "Internal Error", "Exec Format Error",
]
DECIMAL = re.compile(r"^\d+(\.\d+)?$")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def finished(daemon, token: str, query: str = "base64_encoded=true&fields=*") -> dict:
    def done():
        answer = daemon.judge0("GET", f"/submissions/{token}?{query}")
        assert answer.status == 200, answer.body
        body = answer.json()
        status = body["status"]["id"] if "status" in body else body["status_id"]
        return body if status not in (1, 2) else None
    return wait_for(done, f"submission {token} to finish", timeout=120, interval=0.1)


def test_wire_every_route_needs_an_api_key_in_x_auth_token(daemon):
    for path in ("/languages", "/statuses", "/about", "/config_info", "/system_info",
                 f"/submissions/{uuid.uuid4()}"):
        for key in ("", "ak_" + "0" * 64):
            answer = daemon.judge0("GET", path, key=key)
            assert (answer.status, answer.body) == (401, b""), (path, key)
    assert daemon.judge0("GET", "/about").status == 200
    # Judge0 also takes the header's value as a query parameter of the same name.
    assert daemon.judge0("GET", f"/about?X-Auth-Token={daemon.key}", key="").status == 200
    # Listing needs the authorization header too (Judge0's AUTHZ).
    assert daemon.judge0("GET", "/submissions").status == 403
    listed = daemon.judge0("GET", "/submissions?per_page=2", headers={"X-Auth-User": daemon.key})
    assert listed.status == 200 and set(listed.json()) == {"submissions", "meta"}


def test_wire_statuses_languages_about_config_and_system_info(daemon):
    statuses = daemon.judge0("GET", "/statuses").json()
    assert statuses == [{"id": i + 1, "description": d} for i, d in enumerate(STATUSES)]
    languages = daemon.judge0("GET", "/languages").json()
    by_id = {entry["id"]: entry["name"] for entry in languages}
    assert all(set(entry) == {"id", "name"} for entry in languages)
    assert by_id[71] == "Python (3.8.1)" and by_id[63] == "JavaScript (Node.js 12.14.0)"
    assert by_id[50] == "C (GCC 9.2.0)" and by_id[54] == "C++ (GCC 9.2.0)" and by_id[46] == "Bash (5.0.0)"
    one = daemon.judge0("GET", "/languages/50").json()
    assert set(one) == {"id", "name", "is_archived", "source_file", "compile_cmd", "run_cmd"}
    assert one["source_file"] == "main.c" and "%s" in one["compile_cmd"]
    assert daemon.judge0("GET", "/languages/150000").status == 404
    about = daemon.judge0("GET", "/about").json()
    assert set(about) == {"version", "homepage", "source_code", "maintainer"} and about["version"] == "1.13.1"
    config = daemon.judge0("GET", "/config_info").json()
    assert len(config) == 39
    assert (config["cpu_time_limit"], config["max_cpu_time_limit"], config["memory_limit"]) == (5, 15, 128000)
    assert config["enable_callbacks"] is True and config["max_submission_batch_size"] == 20
    info = daemon.judge0("GET", "/system_info").json()
    assert {"Architecture", "CPU(s)", "Model name", "Mem", "Swap"} <= set(info)
    assert info["CPU(s)"] == str(os.cpu_count())


def test_wire_wait_true_answers_201_with_the_finished_submission(daemon):
    answer = daemon.judge0("POST", "/submissions?wait=true", {
        "source_code": "print(input())", "language_id": PYTHON, "stdin": "échec", "expected_output": "échec"})
    assert answer.status == 201, answer.body
    body = answer.json()
    assert set(body) == DEFAULT_FIELDS
    assert body["status"] == {"id": 3, "description": "Accepted"}
    assert body["stdout"] == "échec\n" and body["stderr"] is None and body["compile_output"] is None
    assert isinstance(body["time"], str) and DECIMAL.match(body["time"])
    assert isinstance(body["memory"], int)
    assert uuid.UUID(body["token"]).version == 4


def test_wire_create_returns_a_token_and_fields_select_what_is_shown(daemon):
    created = daemon.judge0("POST", "/submissions", {"source_code": "print(6 * 7)", "language_id": PYTHON})
    assert created.status == 201 and set(created.json()) == {"token"}
    token = created.json()["token"]
    everything = finished(daemon, token, "fields=*")
    assert set(everything) == ALL_FIELDS
    assert everything["language"] == {"id": 71, "name": "Python (3.8.1)"}
    assert everything["status_id"] == 3 and everything["stdout"] == "42\n"
    for key in ("cpu_time_limit", "cpu_extra_time", "wall_time_limit", "time", "wall_time"):
        assert isinstance(everything[key], str) and DECIMAL.match(everything[key]), key
    assert (everything["cpu_time_limit"], everything["memory_limit"]) == ("5.0", 128000)
    assert TIMESTAMP.match(everything["created_at"]) and TIMESTAMP.match(everything["finished_at"])
    assert everything["exit_code"] == 0 and everything["exit_signal"] is None
    some = daemon.judge0("GET", f"/submissions/{token}?fields=stdout,status_id").json()
    assert some == {"stdout": "42\n", "status_id": 3}
    bad = daemon.judge0("GET", f"/submissions/{token}?fields=stdout,nope,worse")
    assert (bad.status, bad.json()) == (400, {"error": "invalid fields: [nope, worse]"})
    assert daemon.judge0("GET", f"/submissions/{uuid.uuid4()}").status == 404


def test_wire_base64_follows_rubys_encode64_and_non_utf8_needs_it(daemon):
    long_line = "x" * 100
    created = daemon.judge0("POST", "/submissions?base64_encoded=true&wait=true", {
        "source_code": b64("import sys\nprint(sys.stdin.read())\nsys.stdout.flush()\n"
                           "sys.stdout.buffer.write(b'\\xff')\n"),
        "language_id": PYTHON, "stdin": b64(long_line)})
    assert created.status == 201, created.body
    body = created.json()
    # Ruby's encode64: a newline after every 60 characters and at the end.
    expected = base64.b64encode(f"{long_line}\n".encode() + b"\xff").decode()
    assert body["stdout"] == "".join(expected[i:i + 60] + "\n" for i in range(0, len(expected), 60))
    token = body["token"]
    # Without base64 a non-UTF-8 output cannot be shown: Judge0's 400.
    plain = daemon.judge0("GET", f"/submissions/{token}")
    assert plain.status == 400
    assert plain.json() == {"error": "some attributes for this submission cannot be converted to UTF-8, "
                                     "use base64_encoded=true query parameter"}
    # `message` is base64 too when asked (Judge0 encodes it; the SDK leaves it alone).
    failed = daemon.judge0("POST", "/submissions?base64_encoded=true&wait=true&fields=message,status",
                           {"source_code": b64("raise SystemExit(4)"), "language_id": PYTHON})
    assert base64.b64decode(failed.json()["message"]) == b"Exited with error status 4"


def test_wire_validation_errors_have_judge0s_422_shape(daemon):
    answer = daemon.judge0("POST", "/submissions", {"source_code": "x", "language_id": 150000,
                                                    "wall_time_limit": 50, "memory_limit": 10})
    assert answer.status == 422
    errors = answer.json()
    assert errors["language_id"] == ["language with id 150000 doesn't exist"]
    # Judge0's maxima are Ruby floats (`.to_f`), and Rails prints them so.
    assert errors["wall_time_limit"] == ["must be less than or equal to 20.0"]
    assert "memory_limit" in errors
    blank = daemon.judge0("POST", "/submissions", {"source_code": "x"})
    assert (blank.status, blank.json()) == (422, {"language_id": ["can't be blank"]})
    # Unlike Judge0, a misspelt attribute is named rather than silently dropped.
    typo = daemon.judge0("POST", "/submissions", {"source_code": "x", "language_id": 71, "cpu_time_limt": 1})
    assert typo.status == 422 and "cpu_time_limt" in typo.json()
    network = daemon.judge0("POST", "/submissions", {"source_code": "x", "language_id": 71, "enable_network": True})
    assert (network.status, network.json()) == (422, {"enable_network": ["enabling network is not allowed"]})


def test_wire_batch_create_and_get_keep_order_and_limits(daemon):
    items = [{"source_code": b64(f"print({i})"), "language_id": PYTHON} for i in range(3)]
    items.insert(1, {"source_code": b64("x"), "language_id": 150000})
    created = daemon.judge0("POST", "/submissions/batch?base64_encoded=true", {"submissions": items})
    assert created.status == 201, created.body
    answers = created.json()
    assert set(answers[1]) == {"language_id"} and all(set(answers[i]) == {"token"} for i in (0, 2, 3))
    tokens = [answers[i]["token"] for i in (0, 2, 3)]
    for token in tokens:
        finished(daemon, token)
    missing = str(uuid.uuid4())
    got = daemon.judge0("GET", f"/submissions/batch?tokens={tokens[0]},{missing},{tokens[2]}&fields=stdout")
    assert got.json() == {"submissions": [{"stdout": "0\n"}, None, {"stdout": "2\n"}]}
    too_many = daemon.judge0("POST", "/submissions/batch", {"submissions": items * 6})
    assert (too_many.status, too_many.json()) == (
        400, {"error": "number of submissions in a batch should be less than or equal to 20"})
    empty = daemon.judge0("POST", "/submissions/batch", {"submissions": []})
    assert (empty.status, empty.json()) == (400, {"error": "there should be at least one submission in a batch"})
    none_valid = daemon.judge0("POST", "/submissions/batch", {"submissions": [items[1]]})
    assert none_valid.status == 422


def test_wire_callback_goes_only_to_an_allow_listed_host(daemon, callback_server):
    port = callback_server.server_address[1]
    refused = daemon.judge0("POST", "/submissions", {"source_code": "print(1)", "language_id": PYTHON,
                                                     "callback_url": "http://169.254.169.254/latest/meta-data"})
    assert refused.status == 422 and "callback_url" in refused.json()
    other_port = daemon.judge0("POST", "/submissions", {"source_code": "print(1)", "language_id": PYTHON,
                                                        "callback_url": f"http://127.0.0.1:{port + 1}/x"})
    assert other_port.status == 422
    url = f"http://127.0.0.1:{port}/done/{uuid.uuid4()}"
    created = daemon.judge0("POST", "/submissions", {"source_code": "print('called back')",
                                                     "language_id": PYTHON, "callback_url": url})
    assert created.status == 201, created.body
    token = created.json()["token"]
    path = url.split(str(port), 1)[1]
    (_, _, body), = wait_for(lambda: [r for r in callback_server.received if r[1] == path],
                             "the callback", timeout=120)
    sent = json.loads(body)
    assert set(sent) == DEFAULT_FIELDS and sent["token"] == token
    assert base64.b64decode(sent["stdout"]) == b"called back\n"


def zip_of(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return b64(buffer.getvalue())


def test_wire_additional_files_and_the_multi_file_program(daemon):
    data = zip_of({"data.txt": "from the archive\n"})
    with_files = daemon.judge0("POST", "/submissions?wait=true&fields=status_id,stdout", {
        "source_code": "print(open('data.txt').read().strip().upper())", "language_id": PYTHON,
        "additional_files": data})
    assert with_files.json() == {"status_id": 3, "stdout": "FROM THE ARCHIVE\n"}, with_files.body
    project = zip_of({"compile": "gcc -o hello hello.c\n", "run": "./hello \"$@\"\n",
                      "hello.c": '#include <stdio.h>\nint main(void) { puts("multi-file"); }\n'})
    built = daemon.judge0("POST", "/submissions?wait=true&fields=status_id,stdout,compile_output", {
        "language_id": 89, "additional_files": project})
    assert built.json()["status_id"] == 3, built.body
    assert built.json()["stdout"] == "multi-file\n"


def test_wire_runs_redirects_and_the_operators_language(daemon):
    runs = daemon.judge0("POST", "/submissions?wait=true&fields=status_id,stdout,stderr,time,memory", {
        "source_code": "import sys\nprint('out')\nprint('err', file=sys.stderr)", "language_id": PYTHON,
        "number_of_runs": 3, "redirect_stderr_to_stdout": True})
    body = runs.json()
    assert body["status_id"] == 3 and body["stderr"] is None
    assert sorted(body["stdout"].split()) == ["err", "out"]
    languages = {entry["id"]: entry["name"] for entry in daemon.judge0("GET", "/languages").json()}
    assert languages[2001] == "AWK (mawk)"
    awk = daemon.judge0("POST", "/submissions?wait=true&fields=status_id,stdout", {
        "source_code": "{ total += $1 } END { print total }", "language_id": 2001, "stdin": "1\n2\n39\n"})
    assert awk.json() == {"status_id": 3, "stdout": "42\n"}, awk.body


def test_wire_queue_survives_a_daemon_restart():
    daemon = Daemon.start(["--judge0-workers", "1", "--judge0-max-queue", "5"])
    try:
        # Past --judge0-max-queue a create is Judge0's 503, and nothing of it is queued.
        six = [{"source_code": "print(0)", "language_id": PYTHON}] * 6
        full = daemon.judge0("POST", "/submissions/batch", {"submissions": six})
        assert (full.status, full.json()) == (503, {"error": "queue is full"})
        slow = {"source_code": "import time\ntime.sleep(5)\nprint('slow')", "language_id": PYTHON}
        quick = [{"source_code": f"print({i})", "language_id": PYTHON} for i in range(4)]
        created = daemon.judge0("POST", "/submissions/batch", {"submissions": [slow, *quick]})
        assert created.status == 201, created.body
        tokens = [entry["token"] for entry in created.json()]
        wait_for(lambda: daemon.judge0("GET", f"/submissions/{tokens[0]}?fields=status_id").json()["status_id"] == 2,
                 "the slow submission to start")
        running = wait_for(daemon.sandbox_ids, "the slow submission's sandbox")
        daemon.restart()
        results = [finished(daemon, token, "fields=status_id,stdout") for token in tokens]
        assert results == [{"status_id": 3, "stdout": "slow\n"}] + [
            {"status_id": 3, "stdout": f"{i}\n"} for i in range(4)]
        # The interrupted run's sandbox was deleted and the run started over in a new one.
        assert not set(running) & set(daemon.sandbox_ids())
    finally:
        daemon.stop_and_check()


def test_wire_enable_network_goes_only_through_the_operators_policy(tmp_path):
    """With --judge0-network-policy, `enable_network: true` gets that policy's egress proxy:
    the allowed host answers, another host is refused; without it there is no network."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            body = b"hello from upstream"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    policy = tmp_path / "network.yaml"
    policy.write_text("version: 1\nnetwork:\n  mode: proxy\n  egress:\n"
                      "    - name: plain\n      host: allowed.test\n      ports: [80]\n      methods: [GET]\n")
    address = f"127.0.0.1:{upstream.server_address[1]}"
    daemon = Daemon.start(["--judge0-network-policy", str(policy),
                           "--test-egress-resolve", f"allowed.test={address},other.test={address}"])
    program = ("import sys, urllib.request\ntry:\n"
               "    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
               "except Exception as error:\n    print('refused', error)\n")

    def fetch(url: str, network: bool) -> str:
        answer = daemon.judge0("POST", "/submissions?wait=true&fields=status_id,stdout", {
            "source_code": program, "language_id": PYTHON, "command_line_arguments": url,
            "enable_network": network})
        assert answer.status == 201 and answer.json()["status_id"] == 3, answer.body
        return answer.json()["stdout"]

    try:
        assert daemon.judge0("GET", "/config_info").json()["allow_enable_network"] is True
        assert fetch("http://allowed.test/", True) == "hello from upstream\n"
        assert fetch("http://other.test/", True).startswith("refused HTTP Error 403")
        assert fetch("http://allowed.test/", False).startswith("refused <urlopen error")
    finally:
        upstream.shutdown()
        daemon.stop_and_check()
