"""Sandbox lifecycle through the unmodified e2b SDK: info, list with filters and pages,
timeouts, connect by id, kill and use after kill, isolation, templates, keys and pause."""

import threading
from datetime import datetime, timezone

import e2b
import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from airlock_harness import wait_for

# What an SDK raises for a sandbox that is gone: SandboxNotRunningException from 2.5x on, a
# TimeoutException (its base class) before.
NOT_RUNNING = getattr(e2b, "SandboxNotRunningException", TimeoutException)


def listed(query=None, **options):
    paginator = Sandbox.list(query=query, **options)
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def listed_ids(query=None):
    return {s.sandbox_id for s in listed(query)}


def seconds_left(info):
    return (info.end_at - datetime.now(timezone.utc)).total_seconds()


def test_get_info_describes_the_sandbox(new_sandbox, tag):
    sandbox = new_sandbox(metadata={"suite": tag, "purpose": "info"}, timeout=321)
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.metadata == {"suite": tag, "purpose": "info"}
    assert info.state == SandboxState.RUNNING
    assert info.template_id
    assert abs((info.end_at - info.started_at).total_seconds() - 321) <= 5
    assert Sandbox.get_info(sandbox.sandbox_id).sandbox_id == sandbox.sandbox_id


def test_base_is_the_default_template(new_sandbox):
    default = new_sandbox().get_info()
    base = new_sandbox(template="base").get_info()
    assert default.template_id == base.template_id


def test_an_unknown_template_is_refused_with_e2bs_error(daemon, tag):
    name = f"no-such-template-{tag}"
    before = listed_ids()
    with pytest.raises(SandboxException) as caught:
        Sandbox.create(template=name)
    text = str(caught.value)
    assert text.startswith("404") and name in text and "not found" in text.lower(), text
    assert listed_ids() == before, "the refused create left no sandbox behind"


def test_a_wrong_api_key_is_refused(daemon):
    wrong = "e2b_" + "0" * 40
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key=wrong)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=wrong).next_items()


def test_list_filters_by_metadata_and_state(new_sandbox, tag):
    a = new_sandbox(metadata={"suite": tag, "role": "a"}).sandbox_id
    b = new_sandbox(metadata={"suite": tag, "role": "b", "odd key &=": "odd value &=+ é"}).sandbox_id
    other = new_sandbox(metadata={"suite": f"not-{tag}"}).sandbox_id
    assert listed_ids(SandboxQuery(metadata={"suite": tag})) == {a, b}
    assert listed_ids(SandboxQuery(metadata={"suite": tag, "role": "b"})) == {b}
    assert listed_ids(SandboxQuery(metadata={"odd key &=": "odd value &=+ é"})) == {b}
    assert listed_ids(SandboxQuery(metadata={"suite": tag, "role": "c"})) == set()
    assert listed_ids(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING])) == {a, b}
    assert listed_ids(SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED])) == set()
    everything = {s.sandbox_id: s for s in listed()}
    assert {a, b, other} <= set(everything)
    entry = everything[b]
    assert entry.metadata == {"suite": tag, "role": "b", "odd key &=": "odd value &=+ é"}
    assert entry.state == SandboxState.RUNNING
    assert entry.started_at < entry.end_at


def test_list_pages_follow_the_next_token(new_sandbox, tag):
    made = {new_sandbox(metadata={"page": tag}).sandbox_id for _ in range(5)}
    paginator = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), limit=2)
    pages = []
    while paginator.has_next:
        pages.append([s.sandbox_id for s in paginator.next_items()])
    while pages and not pages[-1]:
        pages.pop()  # a last empty page is allowed
    assert [len(page) for page in pages] == [2, 2, 1]
    flat = [i for page in pages for i in page]
    assert len(flat) == len(set(flat)) and set(flat) == made


def test_set_timeout_moves_the_end_and_a_short_one_ends_the_sandbox(daemon, new_sandbox):
    sandbox = new_sandbox(timeout=600)
    sandbox.set_timeout(3600)
    assert seconds_left(sandbox.get_info()) > 3000
    sandbox.set_timeout(2)
    wait_for(lambda: not sandbox.is_running(), "the sandbox to end at its new timeout", timeout=60)
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    wait_for(lambda: not daemon.sandbox_leftovers(sandbox.sandbox_id),
             "the timed-out sandbox's cgroups and directory to go")


def test_connect_by_id_reaches_the_same_sandbox_and_extends_it(new_sandbox, tag):
    sandbox = new_sandbox(timeout=600)
    sandbox.files.write("/tmp/connected.txt", tag)
    again = Sandbox.connect(sandbox.sandbox_id, timeout=3600)
    assert again.sandbox_id == sandbox.sandbox_id
    assert again.files.read("/tmp/connected.txt") == tag
    assert again.commands.run("cat /tmp/connected.txt").stdout == tag
    assert seconds_left(again.get_info()) > 3000
    # An instance connects too, and a shorter timeout never shortens a running sandbox.
    sandbox.connect(timeout=60)
    assert seconds_left(sandbox.get_info()) > 3000


def test_unknown_ids_are_not_found(daemon, tag):
    ghost = f"airlockghost{tag}"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(ghost)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(ghost)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(ghost, 30)
    assert Sandbox.kill(ghost) is False


def test_kill_ends_the_sandbox_and_later_use_raises(daemon, new_sandbox):
    sandbox = new_sandbox()
    sandbox.commands.run("sleep 600", background=True)
    assert sandbox.kill() is True
    assert sandbox.is_running() is False
    with pytest.raises(NOT_RUNNING):
        sandbox.commands.run("echo too late")
    with pytest.raises(NOT_RUNNING):
        sandbox.files.read("/etc/hostname")
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()
    with pytest.raises(SandboxNotFoundException):
        sandbox.set_timeout(60)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    assert sandbox.kill() is False
    assert sandbox.sandbox_id not in listed_ids()
    wait_for(lambda: not daemon.sandbox_leftovers(sandbox.sandbox_id),
             "the killed sandbox's cgroups and directory to go")


def test_two_sandboxes_run_at_once_and_cannot_see_each_other(new_sandbox, tag):
    a, b = new_sandbox(), new_sandbox()
    assert a.sandbox_id != b.sandbox_id
    a.files.write("/tmp/same-name.txt", "A")
    b.files.write("/tmp/same-name.txt", "B")
    a.files.write(f"/tmp/only-in-a-{tag}.txt", "secret")
    assert (a.files.read("/tmp/same-name.txt"), b.files.read("/tmp/same-name.txt")) == ("A", "B")
    assert a.files.exists(f"/tmp/only-in-a-{tag}.txt") is True
    assert b.files.exists(f"/tmp/only-in-a-{tag}.txt") is False
    assert f"only-in-a-{tag}" not in b.commands.run("ls -a /tmp").stdout
    # a's processes are invisible from b (the marker is split so the probe never matches itself).
    a.commands.run(f"sleep 600; echo proc-{tag}", background=True)
    probe = f'm=proc-; pgrep -f "${{m}}{tag}" >/dev/null && echo found || echo none'
    assert a.commands.run(probe).stdout == "found\n"
    assert b.commands.run(probe).stdout == "none\n"
    assert not any(f"proc-{tag}" in " ".join(p.args) for p in b.commands.list())
    results = {}

    def work(name, sandbox):
        script = f"for i in 1 2 3; do echo {name}$i; sleep 0.1; done; cat /tmp/same-name.txt"
        results[name] = sandbox.commands.run(script).stdout

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == {"a": "a1\na2\na3\nA", "b": "b1\nb2\nb3\nB"}


def test_pause_really_pauses_or_is_refused_and_the_sandbox_keeps_running(sandbox, tag):
    sandbox.files.write("/tmp/kept.txt", tag)
    try:
        paused = sandbox.pause()
    except SandboxException as error:
        assert not str(error).startswith("404"), error
        paused = None
    if paused is True:
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
        assert sandbox.sandbox_id in listed_ids(SandboxQuery(state=[SandboxState.PAUSED]))
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.files.read("/tmp/kept.txt") == tag
    else:
        assert paused is None, "pause() said 'already paused' (409) about a running sandbox"
        assert sandbox.get_info().state == SandboxState.RUNNING
        assert sandbox.files.read("/tmp/kept.txt") == tag
        assert sandbox.commands.run("echo still running").stdout == "still running\n"
