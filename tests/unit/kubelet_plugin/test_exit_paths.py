"""How the plugin's process ends (``kubelet_plugin.main``): every way out once its sockets
exist removes them, and a failure is logged with exit status 1.

The kubelet's plugin watcher keeps dialling a registration socket that nobody serves (with
a back-off up to two minutes, an error logged each time), and an instance it had
registered stays registered with a dead DRA socket until the file goes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.kube.http import KubeClient
from driver.nvml.sim import create_state
from kubelet_plugin import main
from kubelet_plugin.node_labels import NodeLabelWatch
from kubelet_plugin.publisher import Publisher
from kubelet_plugin.settings import PluginSettings
from tests.unit.kubelet_plugin.slice_api import SliceApi
from tests.waiting import wait_for

REFUSED = RuntimeError("can't start new thread")  # what a full pids cgroup makes of a start


def _settings(root: Path) -> PluginSettings:
    create_state("dgx-h100", root / "sim.json")
    return PluginSettings(
        node_name="node-a",
        nvml="simulated",
        kubelet_root_dir=root / "kubelet",
        cdi_root=root / "cdi",
        state_dir=root / "state",
        sim_state=root / "sim.json",
        metrics_address="",
        health_address="",
    )


def _sockets(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "kubelet").rglob("*.sock"))


@pytest.fixture
def tmp(short_tmp: Path) -> Path:
    return short_tmp


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[SliceApi]:
    """The API server the plugin connects to (``KubeClient.connect``)."""
    api = SliceApi()
    monkeypatch.setattr(KubeClient, "connect", lambda *_a, **_k: api)
    yield api
    api.close()


def test_a_start_that_fails_after_the_sockets_opened_removes_them(
    tmp: Path, api: SliceApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []

    def refuse(_self: Publisher) -> None:  # the first step after the sockets
        opened.extend(_sockets(tmp))
        raise REFUSED

    monkeypatch.setattr(Publisher, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        main.serve(_settings(tmp), threading.Event(), threading.Event())
    assert opened == [
        "kubelet/plugins/gpu.tranche.dev/dra.sock",
        "kubelet/plugins_registry/gpu.tranche.dev-reg.sock",
    ]
    assert _sockets(tmp) == []


def test_a_stop_step_that_fails_does_not_keep_the_sockets(
    tmp: Path, api: SliceApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The label watch stops before the plugin: its failure must not skip the plugin's."""

    def fail(_self: NodeLabelWatch, timeout_s: float = 10.0) -> None:
        raise RuntimeError("label watch stuck")

    monkeypatch.setattr(NodeLabelWatch, "stop", fail)
    stop = threading.Event()
    codes: list[int] = []
    serving = threading.Thread(
        target=lambda: codes.append(main.serve(_settings(tmp), stop, threading.Event()))
    )
    serving.start()
    try:
        wait_for("sockets", lambda: len(_sockets(tmp)) == 2, timeout_s=30)
    finally:
        stop.set()
        serving.join(30)
    assert codes == [0]
    assert _sockets(tmp) == []


# The whole command, as the container runs it, with an unexpected error in its start.
FAILING = """
import sys
from driver.kube.http import KubeClient
from kubelet_plugin.publisher import Publisher
from tests.unit.kubelet_plugin.slice_api import SliceApi
KubeClient.connect = lambda *_a, **_k: SliceApi()
def refuse(_self):
    raise RuntimeError("can't start new thread")
Publisher.start = refuse
from driver.cli import main as cli
sys.exit(cli(sys.argv[1:]))
"""


def test_an_unexpected_error_is_logged_and_exits_1_without_sockets(tmp: Path) -> None:
    settings = _settings(tmp)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            FAILING,
            "kubelet-plugin",
            "--node-name=node-a",
            "--nvml=simulated",
            f"--sim-state={settings.sim_state}",
            f"--kubelet-root-dir={settings.kubelet_root_dir}",
            f"--cdi-root={settings.cdi_root}",
            f"--state-dir={settings.state_dir}",
            "--metrics-address=",
            "--health-address=",
            "--log-format=json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    (failed,) = [line for line in run.stderr.splitlines() if "kubelet plugin failed" in line]
    assert "node=node-a error=can't start new thread" in failed
    assert "Traceback" in failed  # inside the JSON line, not loose lines after it
    assert all(line.startswith("{") for line in run.stderr.splitlines()), run.stderr
    assert _sockets(tmp) == []
