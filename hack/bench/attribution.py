"""Issue 9: CPU of usage sampling with 56 MIG consumers; metrics scrape time and series.

In-process (see :mod:`hack.bench.executor`): 56 claims of dynamic ``1g.10gb``
MIG devices (7 per GPU of a simulated ``dgx-h100``) are prepared by the
executor, so the checkpoint holds their allocation records exactly as in the
plugin; one process per MIG device runs in its claim's pod cgroup. The
:class:`~driver.usage.attribution.UsageSampler` then samples as the plugin's loop does, and
the registry is served by ``prometheus_client`` as ``--metrics-address`` does.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from driver.metrics import Metrics
from driver.nvml.sim import SimControl, SimStore, open_simulated
from driver.usage.attribution import UsageSampler
from driver.usage.records import checkpoint_records
from hack.bench.executor import Executor, claim_json
from hack.bench.results import Row, ScenarioResult, median, percentile, timing
from kubelet_plugin.http_endpoint import HttpEndpoint, metrics_route

NAME = "attribution"
TITLE = "Attribution: usage sampling and metrics (issue 9)"
NEEDS_CLUSTER = False
SAMPLES = 60
SCRAPES = 30
GIB = 1 << 30
CID = "b" * 64


def _cgroup(pod_uid: str) -> str:
    slug = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slug}.slice/"
        f"cri-containerd-{CID}.scope\n"
    )


def run(lab: object) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    work = Path(tempfile.mkdtemp(prefix="tba", dir="/tmp"))
    ex = Executor.create(work)
    server = None
    try:
        claims: list[dict[str, Any]] = []
        for gpu in ex.state.inventory.gpus:
            slots = [m for m in ex.state.inventory.migs_of(gpu.name) if m.profile.name == "1g.10gb"]
            for slot in slots:
                claim = claim_json(f"mig-{len(claims)}", [{"device": slot.name}])
                ex.prepare(claim)
                claims.append(claim)
        control = SimControl(SimStore(path=work / "sim.json"))
        for pid, claim in enumerate(claims, start=1000):
            record, _ = ex.state.checkpoint.load()
            mig_uuid = next(iter(record.claims[claim["metadata"]["uid"]].device_uuids.values()))
            pod = claim["status"]["reservedFor"][0]["uid"]
            control.add_process(mig_uuid, pid, used_memory_bytes=4 * GIB, cgroup=_cgroup(pod))

        nvml_seconds = [0.0]

        def on_call(name: str, seconds: float) -> None:
            nvml_seconds[0] += seconds

        nvml = open_simulated(work / "sim.json", on_call=on_call)
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        sampler = UsageSampler(nvml, checkpoint_records(ex.state.checkpoint), metrics)
        sampler.sample_once()
        cpu, wall, in_nvml = [], [], []
        for _ in range(SAMPLES):
            time.sleep(0.01)
            nvml_seconds[0] = 0.0
            c0, w0 = time.process_time(), time.perf_counter()
            interval = sampler.sample_once()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
            in_nvml.append(nvml_seconds[0])
            assert interval is not None and len(interval.claims) == len(claims)

        server = HttpEndpoint("127.0.0.1", 0, {"/metrics": metrics_route(registry)}, "metrics")
        server.start()
        url = f"http://127.0.0.1:{server.port}/metrics"
        scrape, body = [], b""
        for _ in range(SCRAPES):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read()
            scrape.append(time.perf_counter() - t0)
        lines = body.decode().splitlines()
        series = [ln for ln in lines if ln and not ln.startswith("#")]
        usage_series = [ln for ln in series if ln.startswith("tranche_claim_")]

        cpu_p50 = median(cpu)
        result.add(timing(f"CPU per sample, {len(claims)} MIG consumers (`process_time`)", cpu))
        result.add(
            Row(
                "CPU share at one sample per second",
                f"{cpu_p50 * 100:.1f} % of a core (p99 {percentile(cpu, 99) * 100:.1f} %)",
                len(cpu),
            )
        )
        result.add(timing("Wall time per sample", wall))
        result.add(timing("…of which in NVML calls (simulated, file-backed)", in_nvml))
        result.add(timing("Metrics scrape (`GET /metrics`, whole answer)", scrape))
        result.add(
            Row(
                "Series exposed / of them `tranche_claim_*`", f"{len(series)} / {len(usage_series)}"
            )
        )
        result.add(Row("Scrape size", f"{len(body) / 1024:.0f} KiB"))
    finally:
        if server is not None:
            server.stop()
        ex.close()
        shutil.rmtree(work, ignore_errors=True)
    result.setup.append(
        f"{len(claims)} claims of dynamic `1g.10gb` MIG devices (7 per GPU, 8 GPUs), prepared by "
        "the executor with the sharing handlers; one process per MIG device (4 GiB) in its "
        "claim's pod cgroup. `UsageSampler` reads the allocation records from the checkpoint "
        "file at each sample (as in the plugin) and the usage from the simulated NVML; "
        f"{SAMPLES} samples 10 ms apart, CPU by `time.process_time` around `sample_once` (the "
        f"process runs nothing else meanwhile). Then {SCRAPES} scrapes of the registry served "
        "by `kubelet_plugin.http_endpoint`, as `--metrics-address` serves it."
    )
    return result
