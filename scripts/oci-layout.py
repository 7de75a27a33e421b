#!/usr/bin/env python3
"""Turns the rootfs tars of scripts/test-images.sh into OCI image layouts for the image store's
tests: OUT/layouts/<name>/ (oci-layout, index.json, blobs/sha256/...), one tag per variant.

  busybox:gzip     one gzip layer, with a config (Env, WorkingDir, User, Entrypoint, Cmd)
  busybox:zstd     the same layer compressed with zstd (the `zstd` program)
  busybox:plain    the same layer uncompressed
  busybox:layered  the gzip layer plus a second one: a whiteout, an opaque directory, a hard
                   link, an absolute symlink and a new file
  busybox:multi    an image index: linux/arm64 (a tiny decoy) and linux/amd64 (the gzip image)
  python:gzip      the mmdebstrap minbase + python3 rootfs, one big gzip layer (if built)
  python:split     the same files as three gzip layers (usr/lib, usr/share, the rest), as
                   images built in steps have; `airlock bench image --tag split`

Only the standard library and the gzip/zstd programs are used; everything is deterministic.
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

OUT = sys.argv[1]
LAYOUTS = os.path.join(OUT, "layouts")


class Layout:
    def __init__(self, name):
        self.dir = os.path.join(LAYOUTS, name)
        os.makedirs(os.path.join(self.dir, "blobs", "sha256"), exist_ok=True)
        with open(os.path.join(self.dir, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        self.manifests = []

    def blob(self, data, media_type):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(self.dir, "blobs", "sha256", digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}

    def image(self, layers, config, platform=("linux", "amd64")):
        """layers: [(uncompressed tar bytes, compression)]; returns the manifest descriptor."""
        descriptors, diff_ids = [], []
        for tar, compression in layers:
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
            if compression == "gzip":
                data = subprocess.run(["gzip", "-n", "-6", "-c"], input=tar, capture_output=True, check=True).stdout
                media = "application/vnd.oci.image.layer.v1.tar+gzip"
            elif compression == "zstd":
                data = subprocess.run(["zstd", "-q", "-3", "-c"], input=tar, capture_output=True, check=True).stdout
                media = "application/vnd.oci.image.layer.v1.tar+zstd"
            else:
                data, media = tar, "application/vnd.oci.image.layer.v1.tar"
            descriptors.append(self.blob(data, media))
        config_doc = {
            "architecture": platform[1],
            "os": platform[0],
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": "scripts/oci-layout.py"}],
        }
        config_desc = self.blob(json.dumps(config_doc, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": descriptors,
        }
        desc = self.blob(json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
        desc["platform"] = {"architecture": platform[1], "os": platform[0]}
        return desc

    def tag(self, desc, tag):
        entry = dict(desc)
        entry["annotations"] = {"org.opencontainers.image.ref.name": tag}
        self.manifests.append(entry)

    def index(self, descs):
        doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": descs}
        return self.blob(json.dumps(doc, sort_keys=True).encode(), doc["mediaType"])

    def finish(self):
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": self.manifests}, f, sort_keys=True)


def tar_of(entries):
    """entries: [(name, kind, data_or_target, mode)] -> deterministic tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.mode, info.uid, info.gid = 1700000000, mode, 0, 0
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "link": tarfile.LNKTYPE}[kind]
            if kind in ("symlink", "link"):
                info.linkname = payload
            tar.addfile(info)
    return buf.getvalue()


def main():
    with open(os.path.join(OUT, "busybox.tar"), "rb") as f:
        busybox = f.read()
    config = {
        "Env": ["PATH=/bin", "AIRLOCK_IMAGE=busybox"],
        "WorkingDir": "/tmp",
        "User": "1000:1000",
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo hello from the image"],
    }
    layout = Layout("busybox")
    gzip_desc = layout.image([(busybox, "gzip")], config)
    layout.tag(gzip_desc, "gzip")
    layout.tag(layout.image([(busybox, "zstd")], config), "zstd")
    layout.tag(layout.image([(busybox, "none")], config), "plain")
    second = tar_of([
        ("etc", "dir", None, 0o755),
        ("etc/.wh.motd", "file", b"", 0o644),
        ("opt", "dir", None, 0o755),
        ("opt/keep", "dir", None, 0o755),
        ("opt/keep/.wh..wh..opq", "file", b"", 0o644),
        ("opt/keep/new", "file", b"new in layer two\n", 0o644),
        ("opt/keep/new-link", "link", "opt/keep/new", 0o644),
        ("opt/passwd-link", "symlink", "/etc/passwd", 0o777),
    ])
    layout.tag(layout.image([(busybox, "gzip"), (second, "gzip")], config), "layered")
    decoy = tar_of([("ARM64", "file", b"not for this machine\n", 0o644)])
    arm = layout.image([(decoy, "gzip")], {"Cmd": ["/ARM64"]}, platform=("linux", "arm64"))
    layout.tag(layout.index([arm, gzip_desc]), "multi")
    layout.finish()

    python_tar = os.path.join(OUT, "python.tar")
    if os.path.exists(python_tar):
        with open(python_tar, "rb") as f:
            python = f.read()
        layout = Layout("python")
        py_config = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["/usr/bin/python3"]}
        layout.tag(layout.image([(python, "gzip")], py_config), "gzip")
        layout.tag(layout.image([(part, "gzip") for part in split(python)], py_config), "split")
        layout.finish()


def split(tar_bytes):
    """The members of a tar as three tars: usr/lib/, usr/share/ and everything else."""
    outs = [io.BytesIO() for _ in range(3)]
    writers = [tarfile.open(fileobj=o, mode="w", format=tarfile.PAX_FORMAT) for o in outs]
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as source:
        for member in source:
            name = member.name.lstrip("./")
            part = 0 if name.startswith("usr/lib/") else 1 if name.startswith("usr/share/") else 2
            data = source.extractfile(member) if member.isfile() else None
            writers[part].addfile(member, data)
    for writer in writers:
        writer.close()
    return [o.getvalue() for o in outs]


if __name__ == "__main__":
    main()
