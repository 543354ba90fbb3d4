"""Per-claim CDI spec files: contents, version, atomic replacement, sweeping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from driver.api import ClaimRef
from driver.prepare.cdi import (
    KIND,
    CdiDevice,
    CdiSpecs,
    ContainerEdits,
    DeviceNumbers,
    Mount,
    build_spec,
    claim_devices,
    claim_edits,
    device_name,
    mig_caps_minors,
    minimum_version,
)
from driver.prepare.plan import PlannedDevice

REF = ClaimRef("0f2c1d9e-1111-2222-3333-444455556666", "team-a", "train")


def planned(
    device: str, minor: int, request: str = "gpu", share: str | None = None
) -> PlannedDevice:
    return PlannedDevice(
        request=request, pool="node-a", device=device, type="gpu", gpu_uuid=f"GPU-{minor}",
        uuid=f"GPU-{minor}", minor=minor, share_id=share,
    )  # fmt: skip


def test_claim_spec_contents() -> None:
    devices = [planned("gpu-a", 0, "x/sub"), planned("gpu-b", 3, "x/sub"), planned("gpu-c", 5, "y")]
    uuids = {"gpu-a": "GPU-aaa", "gpu-b": "GPU-bbb", "gpu-c": "GPU-ccc"}
    spec = build_spec(claim_devices(REF, devices, uuids), claim_edits(REF))
    assert spec["kind"] == "gpu.tranche.dev/claim"
    assert spec["cdiVersion"] == "0.5.0"  # the names start with a digit (the claim UID)
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    a = by_name[f"{REF.uid}-gpu-a"]
    assert a["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert a["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb"]
    assert by_name[f"{REF.uid}-gpu-c"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-ccc"]
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
    ]  # fmt: skip
    assert f"TRANCHE_CLAIM_UID={REF.uid}" in common["env"]
    assert not any("=all" in e for d in spec["devices"] for e in d["containerEdits"]["env"])


PROC_DEVICES = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps\n510 nvidia-uvm\n"


def test_simulated_node_spec_describes_device_nodes_by_type_and_numbers(tmp_path: Path) -> None:
    # A simulated node has no /dev/nvidia*: containerd stats a path-only node on the host
    # and fails the container, so the spec carries the numbers the runtime creates it from.
    numbers = DeviceNumbers.from_proc_devices(PROC_DEVICES)
    mig = ContainerEdits(device_nodes=("/dev/nvidia-caps/nvidia-cap21",))
    devices = claim_devices(REF, [planned("gpu-b", 3)], {"gpu-b": "GPU-bbb"}, {"gpu-b": mig})
    path = CdiSpecs(tmp_path, numbers=numbers).write(REF.uid, devices, claim_edits(REF))
    spec = json.loads(path.read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 234, "minor": 21},
    ]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 510, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 510, "minor": 1},
    ]


def test_real_node_spec_names_host_device_nodes_by_path_alone(tmp_path: Path) -> None:
    devices = claim_devices(REF, [planned("gpu-b", 3)], {"gpu-b": "GPU-bbb"})
    spec = json.loads(CdiSpecs(tmp_path).write(REF.uid, devices, claim_edits(REF)).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}]
    # a /proc/devices without the dynamic majors describes only the fixed nodes
    partial = DeviceNumbers.from_proc_devices("Character devices:\n195 nvidia-frontend\n")
    assert partial.node("/dev/nvidia-uvm") == {"path": "/dev/nvidia-uvm"}
    assert partial.node("/dev/nvidiactl")["minor"] == 255


def test_extra_edits_and_share_ids() -> None:
    devs = claim_devices(
        REF,
        [planned("gpu-a", 0, share="s1")],
        {"gpu-a": "GPU-a"},
        {"gpu-a": ContainerEdits(device_nodes=("/dev/nvidia-caps/nvidia-cap12",))},
    )
    assert devs[0].name == f"{REF.uid}-gpu-a-s1"
    assert devs[0].edits.device_nodes == ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12")


@pytest.mark.parametrize(
    ("devices", "common", "version"),
    [
        ([CdiDevice("abc")], ContainerEdits(), "0.3.0"),
        ([CdiDevice("1bc")], ContainerEdits(), "0.5.0"),
        (
            [CdiDevice("abc", ContainerEdits(mounts=(Mount("/a", "/b", type="bind"),)))],
            ContainerEdits(),
            "0.4.0",
        ),
    ],
)
def test_minimum_version(devices: list[CdiDevice], common: ContainerEdits, version: str) -> None:
    assert build_spec(devices, common)["cdiVersion"] == version


def test_minimum_version_rules_for_annotations_and_class_dots() -> None:
    assert (
        minimum_version({"kind": "a.b/c", "devices": [{"name": "x", "annotations": {"k": "v"}}]})
        == "0.6.0"
    )
    assert minimum_version({"kind": "a.b/c.d", "devices": [{"name": "x"}]}) == "0.6.0"


def test_device_names_must_be_valid() -> None:
    assert device_name("u1", "gpu-a") == "u1-gpu-a"
    with pytest.raises(ValueError, match="not valid"):
        device_name("u1", "gpu a")
    assert KIND + "=u1-gpu-a" == "gpu.tranche.dev/claim=u1-gpu-a"


def test_write_remove_and_sweep(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    path = specs.write("uid-1", [CdiDevice("uid-1-gpu-a")], claim_edits(REF))
    assert path.name == "gpu.tranche.dev-claim_uid-1.json"
    assert json.loads(path.read_text())["devices"][0]["name"] == "uid-1-gpu-a"
    specs.write("uid-2", [CdiDevice("uid-2-gpu-a")], ContainerEdits())
    (tmp_path / "other-vendor.json").write_text("{}")
    (tmp_path / ".gpu.tranche.dev-claim_uid-9.json.x.tmp").write_text("half")
    assert specs.claim_uids() == {"uid-1", "uid-2"}
    assert specs.sweep(keep={"uid-1"}) == ["uid-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu.tranche.dev-claim_uid-1.json", "other-vendor.json",
    ]  # fmt: skip
    assert specs.remove("uid-1") is True
    assert specs.remove("uid-1") is False


def test_a_crash_before_the_rename_leaves_the_old_spec_whole(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write("uid-1", [CdiDevice("uid-1-old")], ContainerEdits())
    script = (
        "import sys; from pathlib import Path\n"
        "from driver.prepare.cdi import CdiSpecs, CdiDevice, ContainerEdits\n"
        "from driver.faults import FaultPoints\n"
        "CdiSpecs(Path(sys.argv[1]), FaultPoints('cdi:before-replace'))"
        ".write('uid-1', [CdiDevice('uid-1-new')], ContainerEdits())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False)
    assert proc.returncode == 137
    assert json.loads(specs.path("uid-1").read_text())["devices"][0]["name"] == "uid-1-old"
    assert specs.sweep(keep={"uid-1"}) == []
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.tranche.dev-claim_uid-1.json"]


def test_mig_caps_minors(tmp_path: Path) -> None:
    table = tmp_path / "mig-minors"
    table.write_text("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    assert mig_caps_minors(table, 0, 1, 0) == (12, 13)
    with pytest.raises(FileNotFoundError, match="gpu1/gi1/access"):
        mig_caps_minors(table, 1, 1, 0)
