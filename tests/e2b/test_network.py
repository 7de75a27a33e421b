"""Servers inside a sandbox reached from outside: `sandbox.get_host(port)` host routing for HTTP
and WebSocket, E2B's routing headers for any port, and the proxy's 502 answers."""

import base64
import hashlib
import os
import socket
import struct

from airlock_harness import request, wait_for

HTTP_PORT = 8123
WS_PORT = 8124

# Programs the tests start inside the sandbox (its Python is the host's, seen read-only).
HTTP_SERVER = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with open("/tmp/www/token.txt", "rb") as token:
            self._answer(token.read() + b" " + self.path.encode())

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(body[::-1])

ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
'''

WS_SERVER = r'''
import base64, hashlib, socket, sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def serve(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in
                   (line.partition(b":") for line in head.split(b"\r\n")[1:]))
    key = headers.get(b"sec-websocket-key")
    if not key:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while len(rest) < 6:
        rest += conn.recv(4096)
    length = rest[1] & 0x7F
    while len(rest) < 6 + length:
        rest += conn.recv(4096)
    mask, payload = rest[2:6], rest[6:6 + length]
    text = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    reply = b"echo:" + text
    conn.sendall(bytes([0x81, len(reply)]) + reply)

server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    with conn:
        serve(conn)
'''


def host_address(daemon, host):
    """Where a client resolving `host` (`<port>-<id>.<domain>`) connects: loopback (as
    browsers and SDKs >= 2.50 resolve *.localhost), at the domain's port or 80."""
    domain = host.split(".", 1)[1]
    port = domain.rsplit(":", 1)[1] if ":" in domain else "80"
    return f"127.0.0.1:{port}"


def start_server(sandbox, script, port, name):
    sandbox.files.write(f"/tmp/{name}.py", script)
    return sandbox.commands.run(f"python3 /tmp/{name}.py {port}", background=True, timeout=0)


def test_get_host_reaches_an_http_server_in_the_sandbox(daemon, sandbox, tag):
    sandbox.files.write("/tmp/www/token.txt", f"token-{tag}")
    start_server(sandbox, HTTP_SERVER, HTTP_PORT, "http_server")
    host = sandbox.get_host(HTTP_PORT)
    assert host.startswith(f"{HTTP_PORT}-{sandbox.sandbox_id}.")
    address = host_address(daemon, host)

    def fetch(path="/hello?x=1", method="GET", body=None):
        try:
            return request(address, method, path, {"Host": host}, body, timeout=30)
        except ConnectionRefusedError as error:
            raise AssertionError(
                f"get_host gave {host!r}, which does not reach airlockd: the create response's "
                f"'domain' must name the daemon, e.g. localhost:{daemon.port}") from error

    answer = wait_for(lambda: (r := fetch()).status == 200 and r, "the server in the sandbox to answer",
                      timeout=60)
    assert answer.body == f"token-{tag} /hello?x=1".encode()
    payload = os.urandom(1 << 20)
    echoed = fetch("/echo", "POST", payload)
    assert echoed.status == 200 and echoed.body == payload[::-1]
    # The same server through E2B's routing headers at the sandbox URL.
    routed = daemon.envd(sandbox.sandbox_id, "GET", "/by-header", port=HTTP_PORT)
    assert routed.status == 200 and routed.body == f"token-{tag} /by-header".encode()


def test_get_host_carries_a_websocket_to_the_sandbox(daemon, sandbox, tag):
    start_server(sandbox, WS_SERVER, WS_PORT, "ws_server")
    host = sandbox.get_host(WS_PORT)
    address = host_address(daemon, host)
    wait_for(lambda: daemon.envd(sandbox.sandbox_id, "GET", "/", port=WS_PORT).status == 400,
             "the WebSocket server in the sandbox to listen", timeout=60)
    key = base64.b64encode(os.urandom(16))
    ip, port = address.rsplit(":", 1)
    with socket.create_connection((ip, int(port)), timeout=30) as conn:
        conn.sendall(b"GET /chat HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key + b"\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            assert chunk, f"the connection closed during the handshake: {data!r}"
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])}
        expected = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        assert headers.get(b"sec-websocket-accept") == expected
        message = f"hello-{tag}".encode()
        mask = os.urandom(4)
        conn.sendall(struct.pack("!BB", 0x81, 0x80 | len(message)) + mask
                     + bytes(b ^ mask[i % 4] for i, b in enumerate(message)))
        while len(rest) < 2 or len(rest) < 2 + rest[1]:
            chunk = conn.recv(4096)
            assert chunk, "the connection closed before the echo"
            rest += chunk
        assert rest[0] == 0x81
        assert rest[2:2 + rest[1]] == b"echo:" + message


def test_a_closed_port_and_an_unknown_sandbox_get_502(daemon, sandbox):
    closed = daemon.envd(sandbox.sandbox_id, "GET", "/", port=8999)
    assert closed.status == 502
    assert "port is not open" in closed.json()["message"]
    host = sandbox.get_host(HTTP_PORT)
    ghost = f"{HTTP_PORT}-nosuchsandbox0000000.{host.split('.', 1)[1]}"
    unknown = request(host_address(daemon, host), "GET", "/", {"Host": ghost})
    assert unknown.status == 502
    assert "was not found" in unknown.json()["message"]
