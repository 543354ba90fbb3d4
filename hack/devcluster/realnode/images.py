"""OCI image archives written locally, for ``ctr -n k8s.io images import`` (no registry).

Both images hold one uncompressed layer with Debian's static busybox:

* the sandbox ("pause") image runs ``busybox sleep`` until the runtime kills it;
* ``localhost/tranche-test:latest`` has ``/bin/sh``, ``env``, ``ls``, ``cat`` and ``sleep``
  as links to busybox.

The archive layout is the OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256/...``); the image name is the ``io.containerd.image.name`` annotation of
the index entry. Everything is deterministic (fixed mtimes, owners, order), so the same
busybox gives byte-identical archives.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APPLETS = ("sh", "env", "ls", "cat", "sleep")
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
_INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class ImageSpec:
    name: str  # e.g. localhost/tranche-test:latest
    links: tuple[str, ...]  # /bin/<link> -> busybox
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()


def pause_image(name: str) -> ImageSpec:
    # PID 1 ignores SIGTERM; containerd stops sandbox containers with SIGKILL.
    return ImageSpec(name=name, links=(), entrypoint=("/bin/busybox", "sleep", "2147483647"))


def test_image(name: str) -> ImageSpec:
    return ImageSpec(name=name, links=APPLETS, entrypoint=(), cmd=("/bin/sh",))


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def layer_tar(busybox: bytes, links: tuple[str, ...]) -> bytes:
    """An uncompressed layer: /bin/busybox, symlinks to it, and /tmp, /etc, /dev, /proc, /sys."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d, mode in (
            ("bin", 0o755),
            ("dev", 0o755),
            ("etc", 0o755),
            ("proc", 0o555),
            ("sys", 0o555),
            ("tmp", 0o1777),
        ):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            _add(tar, info)
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(busybox)
        info.mode = 0o755
        _add(tar, info, busybox)
        for link in sorted(links):
            info = tarfile.TarInfo(f"bin/{link}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            info.mode = 0o777
            _add(tar, info)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(spec: ImageSpec, busybox: bytes) -> bytes:
    """The whole OCI image layout of ``spec`` as one tar archive."""
    layer = layer_tar(busybox, spec.links)
    cfg: dict[str, Any] = {"Env": [_PATH_ENV], "WorkingDir": "/"}
    if spec.entrypoint:
        cfg["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        cfg["Cmd"] = list(spec.cmd)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
            "created": "1970-01-01T00:00:00Z",
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST_TYPE,
            "config": {"mediaType": _CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": _LAYER_TYPE, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": _INDEX_TYPE,
            "manifests": [
                {
                    "mediaType": _MANIFEST_TYPE,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        blobs = tarfile.TarInfo("blobs")
        blobs.type = tarfile.DIRTYPE
        blobs.mode = 0o755
        _add(tar, blobs)
        sha = tarfile.TarInfo("blobs/sha256")
        sha.type = tarfile.DIRTYPE
        sha.mode = 0o755
        _add(tar, sha)
        for blob in (layer, config, manifest):
            info = tarfile.TarInfo("blobs/sha256/" + _digest(blob).split(":", 1)[1])
            info.size = len(blob)
            info.mode = 0o644
            _add(tar, info, blob)
        for name, data in (
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("index.json", index),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            _add(tar, info, data)
    return out.getvalue()


def write_archive(spec: ImageSpec, busybox: Path, out: Path) -> Path:
    """Write ``spec``'s archive to ``out`` (atomically) and return ``out``."""
    data = oci_archive(spec, busybox.read_bytes())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out
