"""`sandbox.files` through the unmodified e2b SDK: every call, binary and 10 MB round-trips,
paths the SDK form-encodes, and a directory watcher."""

import hashlib
import io
import os

import pytest
from e2b import FileNotFoundException, FilesystemEventType, FileType, SandboxException

from airlock_harness import wait_for


def sandbox_sha256(sandbox, path):
    return sandbox.commands.run(f"sha256sum '{path}'").stdout.split()[0]


def test_text_round_trip_and_what_write_returns(sandbox):
    info = sandbox.files.write("/tmp/notes/hello.txt", "hello, żółw\n")
    assert (info.name, info.path, info.type) == ("hello.txt", "/tmp/notes/hello.txt", FileType.FILE)
    assert sandbox.files.read("/tmp/notes/hello.txt") == "hello, żółw\n"
    # The file is really in the sandbox, where its programs see it.
    assert sandbox.commands.run("cat /tmp/notes/hello.txt").stdout == "hello, żółw\n"


def test_write_replaces_and_read_sees_what_commands_wrote(sandbox):
    sandbox.files.write("/tmp/replace.txt", "a much longer first version\n")
    sandbox.files.write("/tmp/replace.txt", "short\n")
    assert sandbox.files.read("/tmp/replace.txt") == "short\n"
    sandbox.commands.run("printf 'from a command' > /tmp/by-command.txt")
    assert sandbox.files.read("/tmp/by-command.txt") == "from a command"


def test_binary_round_trip_keeps_every_byte(sandbox):
    data = bytes(range(256)) * 64 + b"\x00\xff\xfe" + os.urandom(4096)
    sandbox.files.write("/tmp/blob.bin", data)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == data
    assert b"".join(sandbox.files.read("/tmp/blob.bin", format="stream")) == data
    assert sandbox_sha256(sandbox, "/tmp/blob.bin") == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("how", ["bytes", "file object"])
def test_ten_megabytes_round_trip(sandbox, how):
    data = os.urandom(10 * 1024 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    # bytes go as multipart/form-data, a file object as application/octet-stream.
    sandbox.files.write("/tmp/big.bin", data if how == "bytes" else io.BytesIO(data))
    assert sandbox.commands.run("stat -c %s /tmp/big.bin").stdout == f"{len(data)}\n"
    assert sandbox_sha256(sandbox, "/tmp/big.bin") == digest
    back = bytes(sandbox.files.read("/tmp/big.bin", format="bytes"))
    assert len(back) == len(data)
    assert hashlib.sha256(back).hexdigest() == digest
    streamed = hashlib.sha256()
    for chunk in sandbox.files.read("/tmp/big.bin", format="stream"):
        streamed.update(chunk)
    assert streamed.hexdigest() == digest


def test_read_with_gzip_accepted_returns_the_same_bytes(sandbox):
    data = b"compressible " * 10000
    sandbox.files.write("/tmp/gz.txt", data)
    assert bytes(sandbox.files.read("/tmp/gz.txt", format="bytes", gzip=True)) == data


def test_write_files_writes_several_at_once(sandbox):
    infos = sandbox.files.write_files([
        {"path": "/tmp/multi/a.txt", "data": "alpha"},
        {"path": "/tmp/multi/deeper/b.bin", "data": b"\x00beta\xff"},
    ])
    assert sorted(i.path for i in infos) == ["/tmp/multi/a.txt", "/tmp/multi/deeper/b.bin"]
    assert sandbox.files.read("/tmp/multi/a.txt") == "alpha"
    assert bytes(sandbox.files.read("/tmp/multi/deeper/b.bin", format="bytes")) == b"\x00beta\xff"


def test_paths_with_spaces_plus_and_ampersand(sandbox):
    path = "/tmp/odd name +&%é/file one+two.txt"
    sandbox.files.write(path, "odd")
    assert sandbox.files.read(path) == "odd"
    assert sandbox.commands.run(f"cat '{path}'").stdout == "odd"
    assert [e.name for e in sandbox.files.list("/tmp/odd name +&%é")] == ["file one+two.txt"]


def test_relative_paths_resolve_against_the_home_directory(sandbox):
    sandbox.files.write("relative-note.txt", "at home")
    assert sandbox.commands.run('cat "$HOME/relative-note.txt"').stdout == "at home"
    assert sandbox.files.read("~/relative-note.txt") == "at home"


def test_exists_and_get_info(sandbox):
    sandbox.files.write("/tmp/info/file.txt", "12345")
    assert sandbox.files.exists("/tmp/info/file.txt") is True
    assert sandbox.files.exists("/tmp/info") is True
    assert sandbox.files.exists("/tmp/info/missing.txt") is False
    info = sandbox.files.get_info("/tmp/info/file.txt")
    assert (info.name, info.path, info.type, info.size) == ("file.txt", "/tmp/info/file.txt", FileType.FILE, 5)
    assert info.permissions.startswith("-")
    directory = sandbox.files.get_info("/tmp/info")
    assert (directory.name, directory.type) == ("info", FileType.DIR)
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/tmp/info/missing.txt")


def test_list_at_depth_one_and_two(sandbox):
    sandbox.files.write("/tmp/tree/top.txt", "t")
    sandbox.files.write("/tmp/tree/sub/inner.txt", "i")
    top = {e.name: e for e in sandbox.files.list("/tmp/tree")}
    assert set(top) == {"top.txt", "sub"}
    assert top["sub"].type == FileType.DIR and top["top.txt"].type == FileType.FILE
    assert top["top.txt"].path == "/tmp/tree/top.txt"
    deep = {e.path for e in sandbox.files.list("/tmp/tree", depth=2)}
    assert deep == {"/tmp/tree/top.txt", "/tmp/tree/sub", "/tmp/tree/sub/inner.txt"}
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/tmp/no-such-tree")


def test_make_dir_reports_whether_it_created(sandbox):
    assert sandbox.files.make_dir("/tmp/made/a/b") is True
    assert sandbox.files.make_dir("/tmp/made/a/b") is False
    assert sandbox.commands.run("test -d /tmp/made/a/b && echo yes").stdout == "yes\n"


def test_rename_moves_and_returns_the_destination(sandbox):
    sandbox.files.write("/tmp/before.txt", "moving")
    entry = sandbox.files.rename("/tmp/before.txt", "/tmp/moved/after.txt")
    assert (entry.name, entry.path) == ("after.txt", "/tmp/moved/after.txt")
    assert sandbox.files.exists("/tmp/before.txt") is False
    assert sandbox.files.read("/tmp/moved/after.txt") == "moving"
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename("/tmp/never-was.txt", "/tmp/x.txt")


def test_remove_deletes_files_and_trees(sandbox):
    sandbox.files.write("/tmp/doomed.txt", "x")
    sandbox.files.write("/tmp/doomed-dir/a/b.txt", "y")
    sandbox.files.remove("/tmp/doomed.txt")
    sandbox.files.remove("/tmp/doomed-dir")
    assert sandbox.files.exists("/tmp/doomed.txt") is False
    assert sandbox.files.exists("/tmp/doomed-dir") is False
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/tmp/doomed.txt")


def test_writes_outside_the_writable_areas_fail_cleanly(sandbox):
    with pytest.raises(SandboxException):
        sandbox.files.write("/usr/airlock-should-not-exist.txt", "nope")
    assert sandbox.commands.run("test -e /usr/airlock-should-not-exist.txt || echo absent").stdout == "absent\n"


def test_watch_dir_sees_created_and_written_files(sandbox, tag):
    sandbox.files.make_dir("/tmp/watched")
    watcher = sandbox.files.watch_dir("/tmp/watched")
    seen = []

    def saw(name, kinds):
        seen.extend(watcher.get_new_events())
        return any(e.name == name and e.type in kinds for e in seen)

    sandbox.files.write(f"/tmp/watched/new-{tag}.txt", "content")
    wait_for(lambda: saw(f"new-{tag}.txt", {FilesystemEventType.CREATE, FilesystemEventType.WRITE}),
             "the watcher to report the new file")
    sandbox.commands.run(f"rm /tmp/watched/new-{tag}.txt")
    wait_for(lambda: saw(f"new-{tag}.txt", {FilesystemEventType.REMOVE}), "the watcher to report the removal")
    watcher.stop()


def test_recursive_watch_names_files_below_the_directory(sandbox, tag):
    sandbox.files.make_dir("/tmp/rwatch/sub")
    watcher = sandbox.files.watch_dir("/tmp/rwatch", recursive=True)
    seen = []

    def saw():
        seen.extend(watcher.get_new_events())
        return any(e.name == f"sub/deep-{tag}.txt" for e in seen)

    sandbox.commands.run(f"echo hi > /tmp/rwatch/sub/deep-{tag}.txt")
    wait_for(saw, "the recursive watcher to report sub/deep.txt")
    watcher.stop()
