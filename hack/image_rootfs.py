"""The image of ``deploy/Containerfile`` unpacked for a host process: its root filesystem and
its configuration, so that a benchmark runs the plugin as installed (the image's interpreter,
its bytecode, its environment) without a container runtime.

``installed()`` builds the image (``hack/build-image.sh``, cached by its inputs), unpacks its
OCI archive once into ``<cache root>/rootfs-<manifest digest>`` and returns the command that
runs the image's entrypoint there through ``hack/run-in-rootfs.sh`` (root only). The two most
recently used root filesystems are kept.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.cache_dir import cache_root

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "hack" / "run-in-rootfs.sh"
KEEP = 2
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class ImageError(RuntimeError):
    """The image could not be built or unpacked; the message says which step and why."""


@dataclass(frozen=True)
class ImageRoot:
    rootfs: Path
    env: tuple[str, ...]  # NAME=VALUE, the image config's Env
    entrypoint: tuple[str, ...]

    def command(self) -> list[str]:
        """The argv prefix that runs the image's entrypoint in its root filesystem."""
        return [str(RUNNER), str(self.rootfs), *self.env, "--", *self.entrypoint]


def build_image() -> Path:
    """The OCI archive of the current sources (``hack/build-image.sh`` prints its path last)."""
    done = subprocess.run(
        [str(REPO / "hack" / "build-image.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise ImageError(f"hack/build-image.sh failed: {done.stderr.strip()[-800:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def installed() -> ImageRoot:
    return unpack(build_image(), cache_root())


def _read(archive: tarfile.TarFile, name: str) -> bytes:
    try:
        member = archive.extractfile(name)
    except KeyError:
        member = None
    if member is None:
        raise ImageError(f"image archive {os.fsdecode(archive.name or '')}: no file {name}")
    return member.read()


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    return _read(archive, f"blobs/{algorithm}/{hexdigest}")


def _json(archive: tarfile.TarFile, digest: str) -> Any:
    return json.loads(_blob(archive, digest))


def unpack(archive_path: Path, root: Path) -> ImageRoot:
    """The image's root filesystem under ``root`` (unpacked once per manifest) and its config.
    Concurrent callers take turns (an exclusive ``flock`` on ``root/.rootfs.lock``)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".rootfs.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _unpack(archive_path, root)


def _unpack(archive_path: Path, root: Path) -> ImageRoot:
    with tarfile.open(archive_path) as archive:
        index = json.loads(_read(archive, "index.json"))
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise ImageError(f"image archive {archive_path}: {len(manifests)} manifests, not 1")
        digest = manifests[0]["digest"]
        manifest = _json(archive, digest)
        config = _json(archive, manifest["config"]["digest"]).get("config") or {}
        target = root / f"rootfs-{digest.partition(':')[2][:12]}"
        if not (target / ".complete").exists():
            _extract(archive, [layer["digest"] for layer in manifest["layers"]], target)
    (target / ".complete").touch()  # recently used: kept by the next unpack's pruning
    _prune(root, keep=KEEP)
    return ImageRoot(
        rootfs=target,
        env=tuple(config.get("Env") or ()),
        entrypoint=tuple(config.get("Entrypoint") or ()),
    )


def _extract(archive: tarfile.TarFile, layers: list[str], target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for digest in layers:
        with tarfile.open(fileobj=io.BytesIO(_blob(archive, digest)), mode="r:*") as layer:
            _apply_layer(layer, digest, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _apply_layer(layer: tarfile.TarFile, digest: str, into: Path) -> None:
    """One layer over the ones below it, with the OCI whiteouts (a removed file or directory)."""
    members = []
    for m in layer.getmembers():
        path = Path(m.name)
        if path.name == OPAQUE:
            raise ImageError(f"layer {digest}: opaque directory {path.parent} not supported")
        if path.name.startswith(WHITEOUT):
            gone = into / path.parent / path.name[len(WHITEOUT) :]
            if gone.is_dir() and not gone.is_symlink():
                shutil.rmtree(gone)
            else:
                gone.unlink(missing_ok=True)
            continue
        members.append(m)
    # Our own build, trusted: owners, modes and links exactly as the image has them.
    layer.extractall(into, members=members, filter="fully_trusted")  # noqa: S202


def _prune(root: Path, keep: int) -> None:
    done = [p for p in root.glob("rootfs-*") if (p / ".complete").exists()]
    done.sort(key=lambda p: (p / ".complete").stat().st_mtime, reverse=True)
    for old in done[keep:]:
        shutil.rmtree(old, ignore_errors=True)
