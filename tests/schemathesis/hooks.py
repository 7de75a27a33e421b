"""Schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

One narrowing, and why: a policy document (`PolicyDocument`, in the create body and as the body
of PUT .../policy) is checked by airlock-policy beyond what JSON Schema can say: profile names,
paths and their tokens, syscall names from the x86_64 table, host names and blocked address
ranges in every spelling, credential sources read on the host, quantities such as `512MiB`.
A schema-valid random document is almost never a valid policy, and the daemon rightly answers
422 with the problems. So the policy is generated from a smaller schema whose every instance is
a valid policy (and whose violations are still invalid ones); the policy language itself is
fuzzed by `crates/policy/tests/fuzz_policy.rs` and `crates/policy/fuzz`. Everything else is
tested against api/openapi.json as committed, with every check on.
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
