"""``hack/image_rootfs.py`` and ``hack/run-in-rootfs.sh``: an OCI archive unpacked as the image
is (layers in order, whiteouts applied, config read), and a command run inside it with the
image's environment only, as the benchmark ``installed`` runs the plugin."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hack.image_rootfs import ImageError, ImageRoot, unpack
from tests.conftest import unavailable

Files = dict[str, bytes | None]  # path -> content; None: a directory


def _layer(files: Files) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755
                tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue())


def _archive(path: Path, layers: list[Files], config: Mapping[str, object]) -> Path:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    manifest = {
        "schemaVersion": 2,
        "config": {"digest": blob(json.dumps({"config": config}).encode())},
        "layers": [{"digest": blob(_layer(files))} for files in layers],
    }
    index = {"schemaVersion": 2, "manifests": [{"digest": blob(json.dumps(manifest).encode())}]}
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", json.dumps(index).encode())] + [
            (f"blobs/sha256/{d.partition(':')[2]}", data) for d, data in blobs.items()
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


CONFIG = {"Env": ["PATH=/opt/tranche/bin:/usr/bin", "PYTHONOPTIMIZE=2"], "Entrypoint": ["tranche"]}


def test_layers_are_applied_in_order_with_their_whiteouts(tmp_path: Path) -> None:
    base: Files = {"etc": None, "etc/os": b"base\n", "etc/gone": b"x", "old": None, "old/f": b"x"}
    top: Files = {"etc/os": b"top\n", "etc/.wh.gone": b"", ".wh.old": b"", "opt": None}
    image = unpack(_archive(tmp_path / "img.tar", [base, top], CONFIG), tmp_path / "cache")
    assert (image.rootfs / "etc" / "os").read_bytes() == b"top\n"
    assert not (image.rootfs / "etc" / "gone").exists()
    assert not (image.rootfs / "old").exists()
    assert not list(image.rootfs.rglob(".wh.*"))
    assert image.env == ("PATH=/opt/tranche/bin:/usr/bin", "PYTHONOPTIMIZE=2")
    assert image.entrypoint == ("tranche",)
    assert image.command()[-4:] == ["PATH=/opt/tranche/bin:/usr/bin", "PYTHONOPTIMIZE=2", "--",
                                    "tranche"]  # fmt: skip


def test_an_image_is_unpacked_once_and_only_the_two_last_used_are_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    archives = [
        _archive(tmp_path / f"img{i}.tar", [{"v": str(i).encode()}], CONFIG) for i in range(3)
    ]
    first = unpack(archives[0], cache)
    (first.rootfs / "marker").write_text("still the first unpack")
    again = unpack(archives[0], cache)
    assert again.rootfs == first.rootfs
    assert (again.rootfs / "marker").exists(), "unpacked a second time"
    second, third = unpack(archives[1], cache), unpack(archives[2], cache)
    kept = sorted(p.name for p in cache.glob("rootfs-*"))
    assert kept == sorted([second.rootfs.name, third.rootfs.name])


def test_an_unfinished_unpack_is_done_again(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "img.tar", [{"f": b"whole"}], CONFIG)
    image = unpack(archive, tmp_path / "cache")
    (image.rootfs / ".complete").unlink()
    (image.rootfs / "f").write_bytes(b"torn")
    assert (unpack(archive, tmp_path / "cache").rootfs / "f").read_bytes() == b"whole"


def test_an_archive_without_its_layer_names_the_missing_blob(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "img.tar", [{"f": b"x"}], CONFIG)
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m)) for m in tar.getmembers()]
        kept = [(m, f.read() if f else b"") for m, f in members]
    manifest = next(json.loads(d) for _, d in kept if b'"layers"' in d)
    layer = manifest["layers"][0]["digest"].partition(":")[2]
    broken = tmp_path / "broken.tar"
    with tarfile.open(broken, "w") as tar:
        for m, data in kept:
            if not m.name.endswith(layer):
                tar.addfile(m, io.BytesIO(data))
    with pytest.raises(ImageError, match=f"no file blobs/sha256/{layer}"):
        unpack(broken, tmp_path / "cache")


def _rootfs_with(tmp_path: Path, binary: str) -> Path:
    """A root filesystem holding the host's ``binary`` and the libraries it links."""
    root = tmp_path / "rootfs"
    for d in ("tmp", "dev", "proc", "sys"):
        (root / d).mkdir(parents=True)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    needed = [binary] + [w for line in ldd.splitlines() for w in line.split() if w.startswith("/")]
    for path in needed:
        real = Path(path).resolve()
        for name in {path, str(real)}:
            dest = root / name.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(real, dest)
    return root


def test_the_command_runs_in_the_image_with_its_environment_only(tmp_path: Path) -> None:
    if os.geteuid() != 0:  # CI runs as root (the real nodes need it): a skip there hides this
        unavailable("entering a root filesystem needs root", "root")
    cat = shutil.which("cat")
    assert cat is not None
    root = _rootfs_with(tmp_path, cat)
    image = ImageRoot(rootfs=root, env=("ONLY=this", "PYTHONOPTIMIZE=2"), entrypoint=(cat,))
    shared = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp is bound into the image
    seen = shared / "from-the-host"
    seen.write_text("host file\n")
    env = subprocess.run(
        [*image.command(), "/proc/self/environ"],
        capture_output=True,
        env={**os.environ, "LEAK": "from the caller"},
        check=True,
        timeout=30,
    ).stdout
    assert sorted(env.decode().strip("\0").split("\0")) == ["ONLY=this", "PYTHONOPTIMIZE=2"]
    try:
        out = subprocess.run([*image.command(), str(seen)], capture_output=True, check=True)
    finally:
        shutil.rmtree(shared)
    assert out.stdout == b"host file\n"
    # Only this test's mounts: a real node of the e2e tests mounts and unmounts meanwhile.
    mountinfo = Path("/proc/self/mountinfo").read_text()
    assert str(root) not in mountinfo and str(shared) not in mountinfo, "mounts leaked"


def test_the_runner_refuses_a_command_line_without_its_separator(tmp_path: Path) -> None:
    image = ImageRoot(rootfs=tmp_path, env=(), entrypoint=())
    done = subprocess.run(
        [image.command()[0], str(tmp_path), "A=1", "cat"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_concurrent_unpacks_of_one_image_all_get_it_whole(tmp_path: Path) -> None:
    files: Files = {"d": None, **{f"d/f{i}": bytes([i]) * 4096 for i in range(200)}}
    archive = _archive(tmp_path / "img.tar", [files], CONFIG)
    with ThreadPoolExecutor(4) as pool:
        images = list(pool.map(lambda _: unpack(archive, tmp_path / "cache"), range(4)))
    assert len({i.rootfs for i in images}) == 1
    root = images[0].rootfs
    assert sorted(p.name for p in (root / "d").iterdir()) == sorted(f"f{i}" for i in range(200))
    assert not list((tmp_path / "cache").glob("*.partial"))
