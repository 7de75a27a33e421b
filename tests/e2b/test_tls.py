"""Host-routed traffic over TLS on the daemon's own listener (`crates/server/src/tls.rs`): an
operator's wildcard certificate (`--tls-cert`, `--tls-key`) for `*.<domain>`, and the local CA a
loopback daemon makes by default, which issues only for `localhost` names. Plain HTTP keeps
working on the same port."""

import socket
import ssl
import subprocess

import pytest

from airlock_harness import Daemon, wait_for


def fetch(port: int, host: str, context: ssl.SSLContext, path: str = "/") -> tuple[int, bytes]:
    """One HTTPS GET to the daemon at 127.0.0.1:`port` for `host` (SNI and Host)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def serve_in_sandbox(sandbox, port: int, text: str) -> None:
    sandbox.files.write("/tmp/site/index.html", text + "\n")
    sandbox.commands.run(f"cd /tmp/site && python3 -m http.server {port}", background=True, timeout=0)


@pytest.fixture
def operator_daemon(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=sandbox.test",
         "-addext", "subjectAltName=DNS:*.sandbox.test,DNS:sandbox.test"],
        check=True, capture_output=True)
    started = Daemon.start(extra_args=["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        yield started, cert
    finally:
        started.stop_and_check()


def test_tls_operator_wildcard_certificate_serves_a_sandbox_port(operator_daemon):
    from e2b import Sandbox

    daemon, cert = operator_daemon
    # The session's E2B variables name the session daemon; this one is named explicitly.
    urls = {"api_url": daemon.url, "sandbox_url": daemon.url, "api_key": daemon.key}
    sandbox = Sandbox.create(timeout=300, **urls)
    daemon.track(sandbox.sandbox_id)
    try:
        serve_in_sandbox(sandbox, 8000, "operator-tls")
        context = ssl.create_default_context(cafile=str(cert))
        host = f"8000-{sandbox.sandbox_id}.sandbox.test"

        def served():
            try:
                return fetch(daemon.port, host, context)
            except (OSError, IndexError, ValueError):
                return None

        _, body = wait_for(lambda: (got := served()) and got[0] == 200 and got, "the sandbox's server")
        assert body.strip() == b"operator-tls"
        # Plain HTTP still answers on the same port.
        assert daemon.request("GET", "/v1/health").status == 200
        # No local CA when the operator gives a certificate.
        assert not (daemon.state_dir / "tls").exists()
    finally:
        sandbox.kill()


def test_tls_local_ca_issues_only_for_localhost_names(daemon, sandbox):
    ca = daemon.state_dir / "tls" / "local-ca.pem"
    context = ssl.create_default_context(cafile=str(ca))
    serve_in_sandbox(sandbox, 8000, "local-ca")
    host = f"8000-{sandbox.sandbox_id}.localhost"

    def served():
        try:
            return fetch(daemon.port, host, context)
        except (OSError, IndexError, ValueError):
            return None

    _, body = wait_for(lambda: (got := served()) and got[0] == 200 and got, "the sandbox's server")
    assert body.strip() == b"local-ca"
    # A name outside localhost gets no certificate at all: the handshake fails.
    with pytest.raises(ssl.SSLError):
        fetch(daemon.port, "example.com", context)
    assert daemon.request("GET", "/v1/health").status == 200
