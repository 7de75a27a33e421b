#!/usr/bin/env python3
"""Writes an uncompressed newc cpio archive (a Linux initramfs) from a directory tree.

Usage: initramfs.py DIR OUT. Every entry is owned by root; device nodes are not needed
(the kernel's devtmpfs provides them). No `cpio` binary on these machines, hence this.
"""
import os
import stat
import sys


def entry(out, name, mode, data=b"", ino=1, nlink=1):
    name_bytes = name.encode() + b"\0"
    header = "070701" + "".join(
        f"{value:08x}"
        for value in (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name_bytes), 0)
    )
    out.write(header.encode())
    out.write(name_bytes)
    out.write(b"\0" * ((4 - (110 + len(name_bytes)) % 4) % 4))
    out.write(data)
    out.write(b"\0" * ((4 - len(data) % 4) % 4))


def main():
    root, target = sys.argv[1], sys.argv[2]
    ino = 1
    with open(target, "wb") as out:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                info = os.lstat(path)
                ino += 1
                if stat.S_ISLNK(info.st_mode):
                    data = os.readlink(path).encode()
                elif stat.S_ISREG(info.st_mode):
                    with open(path, "rb") as f:
                        data = f.read()
                else:
                    data = b""
                entry(out, relative, info.st_mode, data, ino)
        entry(out, "TRAILER!!!", 0, ino=0)


if __name__ == "__main__":
    main()
