"""A warm pool for `base` serves the unmodified SDK's Sandbox.create: the sandbox comes from the
pool (its claims count), yet it carries this create's env vars, metadata and timeout, its own
access token, and the pool refills. Other tests share the daemon, so the pool is removed after."""

import datetime

from airlock_harness import wait_for


def pool(daemon, template="base"):
    response = daemon.api("GET", f"/v1/templates/{template}/pool")
    assert response.status == 200, response.body
    return response.json()


def set_pool(daemon, size, template="base"):
    response = daemon.api("PUT", f"/v1/templates/{template}/pool", {"size": size})
    assert response.status == 200, response.body
    return response.json()


def pool_members(daemon):
    response = daemon.api("GET", "/v1/sandboxes?include=pool")
    assert response.status == 200, response.body
    return {s["id"] for s in response.json()["sandboxes"] if s.get("pool")}


def test_sdk_create_claims_from_a_warm_pool(daemon, new_sandbox, tag):
    set_pool(daemon, 2)
    try:
        wait_for(lambda: pool(daemon)["ready"] == 2, "a full pool", timeout=60)
        members = pool_members(daemon)
        claims = pool(daemon)["claims_total"]
        sandbox = new_sandbox(
            envs={"POOL_TEST": tag}, metadata={"suite": tag}, timeout=123, secure=True
        )
        assert sandbox.sandbox_id in members, "served by a member"
        assert pool(daemon)["claims_total"] == claims + 1
        result = sandbox.commands.run("echo $POOL_TEST")
        assert result.stdout == f"{tag}\n"
        info = sandbox.get_info()
        assert info.metadata == {"suite": tag}
        lifetime = info.end_at - info.started_at
        assert abs(lifetime - datetime.timedelta(seconds=123)) < datetime.timedelta(seconds=2)
        # The envd token is this create's: the data plane refuses another.
        assert sandbox._envd_access_token
        def rpc(token):
            return daemon.envd(sandbox.sandbox_id, "POST", "/process.Process/List", token=token,
                               body=b"{}", headers={"Content-Type": "application/json"})

        assert rpc("not-the-token").status == 401
        assert rpc(sandbox._envd_access_token).status == 200
        # The agent's claim endpoint is not on the data plane.
        again = daemon.envd(sandbox.sandbox_id, "POST", "/airlock/claim",
                            token=sandbox._envd_access_token, body=b'{"env":{}}')
        assert again.status == 404, again.status
        wait_for(lambda: pool(daemon)["ready"] == 2, "the pool refilled", timeout=60)
        assert sandbox.sandbox_id not in pool_members(daemon)
    finally:
        set_pool(daemon, 0)
    assert pool_members(daemon) == set()
