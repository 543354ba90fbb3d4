"""``tranche devices`` over the simulated NVML: table, YAML slices, errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from driver.cli.devices import devices_command
from driver.devices.inventory import build_inventory
from driver.devices.slices import build_slices
from driver.health.monitor import Fault
from driver.health.policy import FaultClass
from driver.health.store import HealthStateFile
from driver.nvml.sim import create_state, open_simulated, shipped_profiles


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    devices_command.add_arguments(parser)
    code = devices_command.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("profile", shipped_profiles())
def test_yaml_is_what_the_plugin_publishes(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(
        ["--nvml", "simulated", "--profile", profile, "--node-name", "n1", "--output", "yaml"],
        capsys,
    )
    assert code == 0
    nvml = open_simulated(create_state(profile, node="n1"))  # GPU UUIDs are the node's own
    expected = build_slices(build_inventory(nvml.list_gpus(), nvml.system_info()), "n1")
    assert list(yaml.safe_load_all(out)) == expected


def test_table_lists_gpus_and_mig_slots(capsys: pytest.CaptureFixture[str]) -> None:
    mig = json.dumps({"*": ["gpu", "mig"]})
    code, out, _ = _run(["--nvml", "simulated", "--profile", "mixed", "--advertise", mig], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "PRODUCT", "MEMORY", "PROFILE", "PARENT", "TAINTS"]
    mig = next(line for line in lines if "-mig-3g40gb-4 " in line)
    assert "3g.40gb" in mig and "H100" in mig
    assert any(line.split()[1] == "gpu" and "L4" in line for line in lines[1:])


def test_table_by_default_lists_whole_gpus_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--nvml", "simulated", "--profile", "dgx-h100"], capsys)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert len(rows) == 8 and all(r[1] == "gpu" for r in rows)


def test_static_mig_and_advertise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "sim.json"
    store = create_state("dgx-h100", state)
    nvml = open_simulated(store)
    uuid = nvml.list_gpus()[0].uuid
    nvml.set_mig_mode(uuid, True)
    created = nvml.create_mig_instance(uuid, 9, 4)  # 3g.40gb at slice 4, made out of band
    code, out, err = _run(
        ["--nvml", "simulated", "--sim-state", str(state), "--advertise",
         json.dumps({"*": [], uuid: ["gpu", "mig"]}), "--output", "json"],
        capsys,
    )  # fmt: skip
    assert code == 0
    devices = [d for s in json.loads(out)["items"] for d in s["spec"].get("devices", [])]
    static = [d for d in devices if d["attributes"].get("uuid") == {"string": created.uuid}]
    assert len(static) == 1 and static[0]["name"].endswith("-mig-3g40gb-4")
    assert not any(d["attributes"]["type"] == {"string": "gpu"} for d in devices)
    assert "did not create" in err


def test_taints_from_the_health_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nvml = open_simulated(create_state("l4-x4", node="n1"))
    uuid = nvml.list_gpus()[0].uuid
    path = tmp_path / "health.json"
    HealthStateFile(path).save(
        {
            uuid: [
                Fault(
                    key="gpu.tranche.dev/xid", value="79", effect="NoExecute",
                    fault_class=FaultClass.UNCONTAINED, message="fell off the bus",
                    time_added=1_700_000_000.0, last_seen=1_700_000_000.0,
                )
            ]
        }
    )  # fmt: skip
    code, out, _ = _run(
        ["--nvml", "simulated", "--profile", "l4-x4", "--node-name", "n1",
         "--health-state", str(path)],
        capsys,
    )  # fmt: skip
    assert code == 0
    tainted = [line for line in out.splitlines() if "gpu.tranche.dev/xid=79:NoExecute" in line]
    assert len(tainted) == 1


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--advertise", '{"*": ["tpu"]}'], "--advertise"),
        (["--profile", "no-such-node"], "no-such-node"),
        (["--sim-state", "/nonexistent/sim.json"], "--sim-state"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["--nvml", "simulated", *argv], capsys)
    assert code == 1 and not out
    assert fragment in err


def test_the_real_nvml_is_taken_from_the_driver_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["--nvml", "real", "--driver-root", str(tmp_path)], capsys)
    assert code == 1
    assert f"libnvidia-ml.so.1 not found under the driver root {tmp_path} " in err
