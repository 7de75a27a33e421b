"""E2B's wire behaviour that the SDKs rely on without showing it in their calls: create on both
route versions with the fields old SDKs add, the legacy list, the proxy's 502 for a gone
sandbox, X-Access-Token enforcement, route precedence and keep-alive after an error.
Raw HTTP, so these run the same under every SDK version."""

import http.client
import json
from urllib.parse import quote, urlencode

import pytest

REQUIRED_SANDBOX = {"templateID", "sandboxID", "clientID", "envdVersion"}
REQUIRED_LISTED = {"templateID", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount",
                   "memoryMB", "diskSizeMB", "state", "envdVersion"}
RPC_HEADERS = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


def create_raw(daemon, path="/v2/sandboxes", **extra):
    body = {"templateID": "base", "timeout": 120, **extra}
    response = daemon.api("POST", path, body)
    assert response.status == 201, (response.status, response.body)
    created = response.json()
    daemon.track(created["sandboxID"])
    return created


@pytest.fixture
def raw_sandbox(daemon):
    created = create_raw(daemon)
    yield created
    daemon.api("DELETE", f"/sandboxes/{created['sandboxID']}")


@pytest.mark.parametrize("path,extra", [
    ("/v2/sandboxes", {"autoPause": False, "allow_internet_access": True}),
    # What SDKs up to 2.50 send to the v1 route, snake_case quirk included.
    ("/sandboxes", {"autoPause": False, "secure": True, "allow_internet_access": True}),
])
def test_create_answers_201_with_what_the_sdk_reads(daemon, path, extra):
    created = create_raw(daemon, path, metadata={"route": path}, envVars={"A": "1"}, **extra)
    assert REQUIRED_SANDBOX <= set(created), created
    assert [int(part) for part in created["envdVersion"].split(".")] >= [0, 5, 2]
    assert isinstance(created.get("envdAccessToken"), str) and created["envdAccessToken"]
    sandbox_id = created["sandboxID"]
    detail = daemon.api("GET", f"/sandboxes/{sandbox_id}")
    assert detail.status == 200
    assert REQUIRED_LISTED <= set(detail.json()), detail.json()
    assert detail.json()["metadata"] == {"route": path}
    assert daemon.api("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    assert daemon.api("DELETE", f"/sandboxes/{sandbox_id}").status == 404
    assert daemon.api("GET", f"/sandboxes/{sandbox_id}").status == 404


def test_both_lists_carry_every_required_field_and_filter_by_metadata(daemon, raw_sandbox, tag):
    other = create_raw(daemon, metadata={"list": tag})
    try:
        query = "?" + urlencode({"metadata": urlencode({quote("list"): quote(tag)})})
        for path in ("/sandboxes", "/v2/sandboxes"):
            everything = daemon.api("GET", path)
            assert everything.status == 200
            ids = {s["sandboxID"] for s in everything.json()}
            assert {raw_sandbox["sandboxID"], other["sandboxID"]} <= ids
            for entry in everything.json():
                assert REQUIRED_LISTED <= set(entry), entry
            filtered = daemon.api("GET", path + query)
            assert filtered.status == 200
            assert [s["sandboxID"] for s in filtered.json()] == [other["sandboxID"]]
    finally:
        daemon.api("DELETE", f"/sandboxes/{other['sandboxID']}")


def test_control_plane_needs_a_valid_key(daemon):
    for key in (None, "e2b_" + "1" * 40):
        headers = {"Content-Type": "application/json"} | ({"X-API-Key": key} if key else {})
        response = daemon.request("POST", "/v2/sandboxes", headers, b'{"templateID":"base"}')
        assert response.status == 401
        assert response.json()["message"]
        assert daemon.request("GET", "/v2/sandboxes", headers).status == 401


def test_unknown_and_deleted_sandboxes_get_the_proxys_502(daemon):
    for path, method, body in (("/health", "GET", None), ("/process.Process/List", "POST", b"{}")):
        response = daemon.envd("nosuchsandbox0000000", method, path, body=body,
                               headers=RPC_HEADERS if body else None)
        assert response.status == 502
        assert "was not found" in response.json()["message"]
    created = create_raw(daemon)
    sandbox_id, token = created["sandboxID"], created["envdAccessToken"]
    assert daemon.envd(sandbox_id, "GET", "/health", token=token).status // 100 == 2
    assert daemon.api("DELETE", f"/sandboxes/{sandbox_id}").status == 204
    gone = daemon.envd(sandbox_id, "GET", "/health", token=token)
    assert gone.status == 502
    assert "was not found" in gone.json()["message"]


def test_the_access_token_guards_the_data_plane(daemon, raw_sandbox):
    sandbox_id, token = raw_sandbox["sandboxID"], raw_sandbox["envdAccessToken"]
    other = create_raw(daemon)
    try:
        def rpc(with_token):
            return daemon.envd(sandbox_id, "POST", "/process.Process/List", token=with_token,
                               body=b"{}", headers=RPC_HEADERS)

        assert rpc(None).status == 401
        assert rpc("at_wrong").status == 401
        assert rpc(other["envdAccessToken"]).status == 401, "another sandbox's token is refused"
        allowed = rpc(token)
        assert allowed.status == 200
        assert "processes" in allowed.json() or allowed.json() == {}
        file_path = "/files?" + urlencode({"path": "/etc/hostname"})
        assert daemon.envd(sandbox_id, "GET", file_path).status == 401
        assert daemon.envd(sandbox_id, "GET", file_path, token=token).status == 200
        # Health is open, as in envd: the SDK probes it without knowing whether it may.
        assert daemon.envd(sandbox_id, "GET", "/health").status // 100 == 2
    finally:
        daemon.api("DELETE", f"/sandboxes/{other['sandboxID']}")


def test_control_plane_routes_win_over_routing_headers(daemon, raw_sandbox):
    # SDK 2.10 sends E2b-Sandbox-Id on control-plane calls too.
    sandbox_id = raw_sandbox["sandboxID"]
    response = daemon.request(
        "POST", f"/sandboxes/{sandbox_id}/connect",
        {"X-API-Key": daemon.key, "Content-Type": "application/json",
         "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"},
        json.dumps({"timeout": 120}).encode())
    assert response.status in (200, 201), (response.status, response.body)
    assert response.json()["sandboxID"] == sandbox_id


def test_a_keep_alive_connection_survives_an_error_with_a_body(daemon, raw_sandbox):
    host, port = daemon.addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        headers = {"X-API-Key": daemon.key, "Content-Type": "application/json"}
        conn.request("POST", "/v2/sandboxes/nosuchsandbox0000000/connect", b'{"timeout": 60}', headers)
        first = conn.getresponse()
        first.read()
        assert first.status == 404
        conn.request("GET", f"/sandboxes/{raw_sandbox['sandboxID']}", headers=headers)
        second = conn.getresponse()
        assert second.status == 200
        assert json.loads(second.read())["sandboxID"] == raw_sandbox["sandboxID"]
    finally:
        conn.close()
