"""OCI image archives written for ``ctr images import``."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

from hack.devcluster.realnode import images

FAKE_BUSYBOX = b"\x7fELF not really busybox, only bytes to package"


def _members(archive: bytes) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for m in tar.getmembers():
            if m.issym():
                out[m.name] = "-> " + m.linkname
            elif m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


def _blob(files: dict[str, bytes | str], digest: str) -> bytes:
    data = files["blobs/sha256/" + digest.split(":", 1)[1]]
    assert isinstance(data, bytes)
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


def _image(archive: bytes) -> tuple[dict[str, Any], dict[str, Any], dict[str, bytes | str]]:
    files = _members(archive)
    index_raw = files["index.json"]
    assert isinstance(index_raw, bytes)
    (entry,) = json.loads(index_raw)["manifests"]
    manifest = json.loads(_blob(files, entry["digest"]))
    config = json.loads(_blob(files, manifest["config"]["digest"]))
    (layer_desc,) = manifest["layers"]
    layer = _members(_blob(files, layer_desc["digest"]))
    assert config["rootfs"]["diff_ids"] == [layer_desc["digest"]]  # uncompressed layer
    return entry, config, layer


def test_test_image_has_busybox_and_the_applets() -> None:
    archive = images.oci_archive(images.test_image("localhost/tranche-test:latest"), FAKE_BUSYBOX)
    entry, config, layer = _image(archive)
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/tranche-test:latest"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "latest"
    assert layer["bin/busybox"] == FAKE_BUSYBOX
    for applet in ("sh", "env", "ls", "cat", "sleep"):
        assert layer[f"bin/{applet}"] == "-> busybox"
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    assert config["config"]["Cmd"] == ["/bin/sh"]
    assert any(e.startswith("PATH=") for e in config["config"]["Env"])


def test_pause_image_sleeps_until_killed() -> None:
    archive = images.oci_archive(images.pause_image("localhost/p:1"), FAKE_BUSYBOX)
    entry, config, layer = _image(archive)
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/p:1"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1"
    assert config["config"]["Entrypoint"][:2] == ["/bin/busybox", "sleep"]
    assert "bin/sh" not in layer


def test_archive_has_the_oci_layout_marker_and_is_deterministic() -> None:
    spec = images.test_image("localhost/t:latest")
    a = images.oci_archive(spec, FAKE_BUSYBOX)
    assert a == images.oci_archive(spec, FAKE_BUSYBOX)
    files = _members(a)
    layout = files["oci-layout"]
    assert isinstance(layout, bytes)
    assert json.loads(layout) == {"imageLayoutVersion": "1.0.0"}
