"""Schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

Five narrowings, and why. First: a policy document (`PolicyDocument`, in the create body and as the body
of PUT .../policy) is checked by airlock-policy beyond what JSON Schema can say: profile names,
paths and their tokens, syscall names from the x86_64 table, host names and blocked address
ranges in every spelling, credential sources read on the host, quantities such as `512MiB`.
A schema-valid random document is almost never a valid policy, and the daemon rightly answers
422 with the problems. So the policy is generated from a smaller schema whose every instance is
a valid policy (and whose violations are still invalid ones); the policy language itself is
fuzzed by `crates/policy/tests/fuzz_policy.rs` and `crates/policy/fuzz`. Everything else is
tested against api/openapi.json as committed, with every check on.

Second, the repository workspace (`workspace: {"type": "git"}`) is left out of the create body:
a schema-valid URL names an arbitrary host, which the sandbox's egress proxy would resolve and
try to clone from, and this run must reach nothing but loopback. Repository workspaces are
tested against a real git server on loopback by crates/server/tests/git.rs and
tests/e2b/test_git.py.

Third, a create's `timeout_ms` is at least a minute here: the API takes 1 ms, and such a sandbox
is gone before the stateful phase's next call, which then rightly answers 404; checking that a
created sandbox is available needs one that lives.

Fourth, registries. A schema-valid image reference may name any registry on the internet (`a` is
docker.io/library/a), and a pull or a build's FROM would go there. So positive cases of
`POST /v1/images/pull` and `POST /v1/templates` get `127.0.0.1:9/...` (a closed port: the pull
fails at once, as the answer says); negative ones are sent as generated, and the daemon refuses
them before any pull.

Fifth, archives. The bodies of `POST /v1/images/import`, `PUT /v1/template-files/{id}` and
`PUT /v1/uploads/{id}` are tar archives (or images in archive form); JSON Schema cannot say
which bytes make one, so for a random body the daemon rightly answers 422 or 400. Only that
rejection of "positive" data is not reported for those three operations; every other check
runs on them.
"""

import schemathesis

VALID_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {
        "version": {"const": 1},
        # networked-dev is left out: its egress rules name real registries, and this run must
        # reach nothing but loopback.
        "extends": {"type": "array", "maxItems": 2, "uniqueItems": True, "items": {"enum": ["read-only", "workspace"]}},
        # None: the document's optional fields may be null (api/policy.schema.json says so).
        "tier": {"enum": ["process", None]},
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "memory": {"enum": ["256MiB", "1GiB", None]},
                "pids": {"enum": ["64", "1024", None]},
                "cpus": {"enum": ["0.5", "2", None]},
                "disk": {"enum": ["16MiB", "1GiB", None]},
                "timeout": {"enum": ["30s", "10m", None]},
            },
        },
        "process": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "syscalls": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"deny_extra": {"type": "array", "uniqueItems": True, "items": {"enum": ["kcmp", "ptrace"]}}},
                }
            },
        },
        "network": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"mode": {"enum": ["none", None]}},
        },
    },
}


@schemathesis.hook
def before_load_schema(ctx, raw_schema):
    raw_schema["components"]["schemas"]["PolicyDocument"] = VALID_POLICY
    create = raw_schema["components"]["schemas"]["CreateSandboxRequest"]
    create["properties"]["timeout_ms"]["minimum"] = 60_000
    workspace = raw_schema["components"]["schemas"]["Workspace"]
    workspace["oneOf"] = [
        variant for variant in workspace["oneOf"]
        if variant.get("properties", {}).get("type", {}).get("const") != "git"
    ]


# A closed port on loopback: a pull from it fails at once, and reaches nothing.
CLOSED_REGISTRY = "127.0.0.1:9/schemathesis/unreachable:1"
ARCHIVE_OPERATIONS = {
    ("POST", "/v1/images/import"),
    ("PUT", "/v1/template-files/{id}"),
    ("PUT", "/v1/uploads/{id}"),
}


@schemathesis.hook
def before_call(ctx, case, kwargs):
    meta = getattr(case, "meta", None)
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return
    path = case.operation.path
    if path == "/v1/images/pull" and "reference" in case.body:
        case.body["reference"] = CLOSED_REGISTRY
    elif path == "/v1/templates" and case.operation.method.upper() == "POST" and "from_image" in case.body:
        case.body["from_image"] = CLOSED_REGISTRY


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    """False drops the failure: only a rejected random archive, as the module docs say."""
    operation = (case.operation.method.upper(), case.operation.path)
    rejected_archive = (
        operation in ARCHIVE_OPERATIONS
        and type(failure).__name__ == "RejectedPositiveData"
        and response.status_code in (400, 422)
    )
    return not rejected_archive
