"""Schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

Three narrowings, and why. First: a policy document (`PolicyDocument`, in the create body and as the body
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
        "tier": {"enum": ["process"]},
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "memory": {"enum": ["256MiB", "1GiB"]},
                "pids": {"enum": ["64", "1024"]},
                "cpus": {"enum": ["0.5", "2"]},
                "disk": {"enum": ["16MiB", "1GiB"]},
                "timeout": {"enum": ["30s", "10m"]},
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
            "properties": {"mode": {"enum": ["none"]}},
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
