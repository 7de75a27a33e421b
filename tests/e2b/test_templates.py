"""Templates through E2B's SDK: `Template().from_image(...)...` and `Template.build(...)` against
airlockd (file uploads to the daemon's one-time URLs, log polling), a template built with
`airlock template build` from a Dockerfile, and `Sandbox.create(name)` of both, checked from
inside: the copied files, the environment, the working directory, the user and the start
command, and a template built `from_template` another. An unchanged rebuild is all cache hits;
a failing RUN raises with its output in the log; a RUN sees no network but loopback.

The base image is the busybox test image of scripts/test-images.sh, imported into the daemon's
store through `POST /v1/images/import`. The SDK runs commands with `/bin/bash -l -c`, so each
template puts a small script there that runs busybox's sh.
"""

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from airlock_harness import REPO, sdk_version

BUSYBOX = REPO / "target/test-images/busybox.tar"
AIRLOCK = Path(os.environ.get("AIRLOCKD") or REPO / "target/x86_64-unknown-linux-gnu/debug/airlockd").parent / "airlock"

# The SDK runs commands with `/bin/bash -l -c`: busybox's sh stands in.
BASH = "printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash"

pytestmark = pytest.mark.skipif(sdk_version() < (2, 10, 0), reason="Template.build needs /v3/templates (SDK 2.10+)")


@pytest.fixture(scope="module")
def base_image(daemon):
    if not BUSYBOX.exists():
        pytest.fail(f"{BUSYBOX} is missing: run scripts/test-images.sh first")
    tag = "airlock/busybox:e2b"
    answer = daemon.request("POST", f"/v1/images/import?tag={tag}",
                            {"X-API-Key": daemon.key, "Content-Type": "application/octet-stream"},
                            BUSYBOX.read_bytes(), timeout=120)
    assert answer.status == 201, answer.body
    return tag


@pytest.fixture
def context(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hello')\n")
    (tmp_path / "app" / "secret.key").write_text("not for the image\n")
    (tmp_path / "requirements.txt").write_text("flask\n")
    (tmp_path / ".dockerignore").write_text("**/*.key\n")
    return tmp_path


def template_of(base, context):
    from e2b import Template
    return (
        Template(file_context_path=str(context))
        .from_image(base)
        .set_user("root")
        .run_cmd(BASH)
        .run_cmd("cat /proc/net/dev")
        .copy("app", "/srv/app/")
        .copy("requirements.txt", "/srv/")
        .set_envs({"GREETING": "hello from e2b", "STAGE": "built"})
        .set_user("app")
        .set_workdir("/home/app/work")
        .run_cmd("echo built by $(id -un) in $(pwd) > built.txt")
        .set_start_cmd("echo started in $(pwd) as $(id -un) > /tmp/started; exec sleep 3600",
                       "test -f /tmp/started")
    )


def build(template, name):
    from e2b import Template
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append)
    return info, [entry.message for entry in logs]


def check_inside(sandbox, workdir):
    result = sandbox.commands.run(
        f"cat /srv/app/main.py /srv/requirements.txt {workdir}/built.txt /tmp/started; "
        "echo \"$GREETING $STAGE\"; id -un; ls /srv/app; stat -c %U /srv/app/main.py")
    return result.stdout.splitlines()


def test_sdk_template_build_then_create_from_it(daemon, base_image, context, new_sandbox, tag):
    from e2b import Template
    name = f"e2b-{tag}"
    template = template_of(base_image, context)
    info, logs = build(template, f"{name}:v1")
    assert info.template_id == name
    uuid.UUID(info.build_id)
    assert "v1" in info.tags
    text = "\n".join(logs)
    # The RUN's network: its namespace has loopback only.
    assert "lo:" in text and "eth0" not in text, text
    assert Template.exists(name)
    assert not Template.exists(f"missing-{tag}")

    sandbox = new_sandbox(template=name)
    assert check_inside(sandbox, "/home/app/work") == [
        "print('hello')", "flask", "built by app in /home/app/work",
        "started in /home/app/work as app", "hello from e2b built", "app", "main.py", "root",
    ]
    # name:tag works too.
    tagged = new_sandbox(template=f"{name}:v1")
    assert tagged.commands.run("id -un").stdout.strip() == "app"

    # An unchanged rebuild: every step comes from the cache, no RUN runs again.
    again, relogs = build(template_of(base_image, context), f"{name}:v1")
    cached = [m for m in relogs if " CACHED " in m]
    assert len(cached) == 9, "\n".join(relogs)
    assert not any(m.strip() == "lo:" or m.lstrip().startswith("lo:") for m in relogs), relogs
    assert Template.get_build_status(again).status.value == "ready"


def test_sdk_failing_run_raises_with_its_step_and_output(daemon, base_image, tag):
    from e2b import Template
    from e2b.exceptions import BuildException
    template = Template().from_image(base_image).set_user("root").run_cmd("echo failing-$((6*7)) && exit 3")
    logs = []
    with pytest.raises(BuildException) as raised:
        Template.build(template, f"broken-{tag}", on_build_logs=logs.append)
    assert "exit code 3" in str(raised.value)
    assert any("failing-42" in entry.message for entry in logs), [e.message for e in logs]
    assert not Template.exists(f"broken-{tag}")


def test_cli_built_template_is_created_by_the_sdk(daemon, base_image, context, new_sandbox, tag):
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        f"RUN {BASH}\n"
        "COPY app /srv/app/\nCOPY requirements.txt /srv/\n"
        "ENV GREETING=\"hello from e2b\" STAGE=built\n"
        "USER app\nWORKDIR /home/app/cli\n"
        "RUN echo built by $(id -un) in $(pwd) > built.txt\n"
        "CMD [\"/bin/sh\", \"-c\", \"echo started in $(pwd) as $(id -un) > /tmp/started; exec sleep 3600\"]\n")
    name = f"cli-{tag}"
    built = subprocess.run(
        [str(AIRLOCK), "template", "build", name, str(context), "--ready-cmd", "test -f /tmp/started"],
        env={**os.environ, "AIRLOCK_URL": daemon.url, "AIRLOCK_API_KEY": daemon.key},
        capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr + built.stdout
    sandbox = new_sandbox(template=name)
    assert check_inside(sandbox, "/home/app/cli") == [
        "print('hello')", "flask", "built by app in /home/app/cli",
        "started in /home/app/cli as app", "hello from e2b built", "app", "main.py", "root",
    ]


def test_sdk_template_from_a_template(daemon, base_image, new_sandbox, tag):
    from e2b import Template
    parent = f"parent-{tag}"
    build(Template().from_image(base_image).set_user("root").run_cmd(BASH).run_cmd("echo one > /one"), parent)
    child = f"child-{tag}"
    info, _ = build(Template().from_template(parent).run_cmd("cat /one > /two && echo two >> /two"), child)
    assert info.template_id == child
    sandbox = new_sandbox(template=child)
    assert sandbox.commands.run("cat /two").stdout == "one\ntwo\n"
