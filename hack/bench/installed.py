"""Issue 16: the prepare scenario's rows, measured on the plugin as installed.

The plugin runs from the image that ``deploy/Containerfile`` builds (``hack/build-image.sh``),
unpacked and entered with ``hack/run-in-rootfs.sh``: the image's interpreter (Debian's
python3), its bytecode and its environment (``PYTHONOPTIMIZE=2`` among it), the same paths
and network as the scenario ``prepare``, without a container runtime in between. Everything
else (claims, client, rows) is the scenarios ``discovery`` (start-up) and ``prepare``'s.
"""

from __future__ import annotations

import os

from hack.bench import discovery, prepare, probed
from hack.bench.lab import Lab
from hack.bench.results import ScenarioResult
from hack.image_rootfs import ImageError, installed

NAME = "installed"
TITLE = "Prepare and unprepare, the plugin as installed (issue 16)"
NEEDS_CLUSTER = True


def run(lab: Lab | None) -> ScenarioResult:
    assert lab is not None
    result = ScenarioResult(NAME, TITLE)
    if os.geteuid() != 0:
        return result.not_run("entering the image's root filesystem needs root.")
    try:
        image = installed()
    except ImageError as e:
        return result.not_run(str(e))
    env = " ".join(f"`{e}`" for e in image.env if not e.startswith("PATH="))
    result.setup.append(
        "Simulated `dgx-h100` nodes running the plugin of the image built from this checkout "
        "(`hack/build-image.sh`), unpacked and entered with `hack/run-in-rootfs.sh`: the "
        f"image's interpreter, bytecode and environment ({env}); the start-up rows include "
        "that script's `unshare`, mounts and `chroot` (10-30 ms here), not a container "
        f"runtime's start. Start-up: as the scenario `discovery` ({discovery.PLUGIN_STARTS} "
        "starts, dynamic MIG advertised). Prepare and unprepare: as the scenario `prepare`."
    )
    discovery.measure_start(lab, result, discovery.expected_slices(), image.command())
    probed.measure(lab, result, image.command(), "instp")
    prepare.measure(lab, lab.node("inst", program=image.command()), "bench-installed", result)
    return result
