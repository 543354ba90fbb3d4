"""Issue 5: prepare latency per sharing mode; MPS daemon start for the first share and the Nth.

In-process executor (see :mod:`hack.bench.executor`): no API read, no gRPC; the
simulated NVML is file-backed as in the plugin process.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.bench.executor import GROUP, Executor, claim_json
from hack.bench.results import ScenarioResult, timing

NAME = "modes"
TITLE = "Prepare per sharing mode (issue 5)"
NEEDS_CLUSTER = False
CYCLES = 50
MIG_CYCLES = 30
MPS_ROUNDS = 5
MPS_SHARES = 8
TIME_SLICING = {"apiVersion": "gpu.tranche.dev/v1alpha1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"}}  # fmt: skip


def _cycles(
    ex: Executor, make: Callable[[int], dict[str, Any]], n: int
) -> tuple[list[float], list[float]]:
    prep, unprep = [], []
    for i in range(n + 1):
        claim = make(i)
        t0 = time.perf_counter()
        ex.prepare(claim)
        t1 = time.perf_counter()
        ex.unprepare(claim)
        t2 = time.perf_counter()
        if i:  # the first round warms caches
            prep.append(t1 - t0)
            unprep.append(t2 - t1)
    return prep, unprep


def _share(device: str, round_: int, k: int) -> dict[str, Any]:
    """One MPS share result: a share ID and the consumable capacity it takes."""
    return {
        "device": device,
        "shareID": f"0000000{round_}-0000-4000-8000-00000000000{k}",
        "consumedCapacity": {"memory": "8Gi", "shares": "1"},
    }


def run(lab: object) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    work = Path(tempfile.mkdtemp(prefix="tbm", dir="/tmp"))
    ex = Executor.create(work)
    try:
        gpus = ex.state.inventory.gpus
        whole = gpus[0].name
        prep, unprep = _cycles(ex, lambda i: claim_json(f"w{i}", [{"device": whole}]), CYCLES)
        result.add(timing("Whole GPU: prepare", prep))
        result.add(timing("Whole GPU: unprepare", unprep))

        ts = gpus[1].name
        prep, unprep = _cycles(
            ex, lambda i: claim_json(f"t{i}", [{"device": ts}], TIME_SLICING), CYCLES
        )
        result.add(timing("Time-slice (GpuConfig TimeSlicing): prepare", prep))
        result.add(timing("Time-slice: unprepare", unprep))

        slot = next(
            m for m in ex.state.inventory.migs_of(gpus[2].name) if m.profile.name == "1g.10gb"
        )
        prep, unprep = _cycles(
            ex, lambda i: claim_json(f"m{i}", [{"device": slot.name, "request": "gpu"}]), MIG_CYCLES
        )
        result.add(timing("Dynamic MIG 1g.10gb: prepare (MIG mode on, GI + CI created)", prep))
        result.add(timing("Dynamic MIG: unprepare (instances destroyed, MIG mode off)", unprep))

        share_device = f"{gpus[3].name}-mps-{GROUP}"
        first: list[float] = []
        nth: list[float] = []
        unprep = []
        for r in range(MPS_ROUNDS):
            claims = [
                claim_json(f"s{r}-{k}", [_share(share_device, r, k)]) for k in range(MPS_SHARES)
            ]
            for k, claim in enumerate(claims):
                t0 = time.perf_counter()
                ex.prepare(claim)
                (first if k == 0 else nth).append(time.perf_counter() - t0)
            for claim in claims:
                t0 = time.perf_counter()
                ex.unprepare(claim)
                unprep.append(time.perf_counter() - t0)
        result.add(
            timing("MPS share, first on the GPU: prepare (daemon start)", first, show_max=True)
        )
        result.add(timing(f"MPS share, 2nd to {MPS_SHARES}th: prepare (daemon running)", nth))
        result.add(
            timing("MPS share: unprepare (the last one stops the daemon)", unprep, show_max=True)
        )
    finally:
        ex.close()
        shutil.rmtree(work, ignore_errors=True)
    result.setup.append(
        "The executor (`DeviceState`) with the sharing handlers of `driver/sharing` "
        "(`SharingNode`), in the benchmark's process over a file-backed simulated `dgx-h100`, "
        "claims handed over as JSON: no API read, no gRPC. Each sample is one prepare (or "
        f"unprepare) of one claim; whole GPU and time-slice {CYCLES} cycles, MIG {MIG_CYCLES}, "
        f"MPS {MPS_ROUNDS} rounds of {MPS_SHARES} shares of one `<gpu>-mps-{GROUP}` device "
        "(consumable capacity 8Gi, 1 share). MPS uses `tests/fixtures/fake-mps-control`, a "
        "Python stand-in for `nvidia-cuda-mps-control` (fork, FIFO): the daemon-start "
        "time is the driver's part plus a Python interpreter start, not the real daemon's."
    )
    return result
