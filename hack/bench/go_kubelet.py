"""The kubelet's own gRPC client, for the benchmarks' prepare and unprepare rows.

The kubelet calls a DRA plugin with grpc-go and the stubs of the ``k8s.io/kubelet``
module; ``hack/kubeletclient`` makes the same calls with the same stubs (v0.37.2), so that
the latency measured is the one a kubelet sees, not that plus a Python client's own
work (:mod:`hack.kubeletsim` is Python, and about 0.1-0.3 ms slower per call on this
machine kind). ``hack/build-kubeletclient.sh`` builds it once into the cache.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hack.kubeletsim.client import ClaimRequest

HACK = Path(__file__).resolve().parents[1]
BUILD = HACK / "build-kubeletclient.sh"


@dataclass(frozen=True)
class Calls:
    """Latencies in seconds, in the order made (burst: in the claims' order)."""

    prepare: list[float]
    unprepare: list[float]
    prepare_wall: float
    unprepare_wall: float


def built(script: Path, binary: str) -> Path:
    """``binary`` in the directory that the cache build ``script`` (a ``hack/build-*.sh``)
    prints last, built or found in the cache; its progress goes to this process's stderr."""
    done = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{script} failed with status {done.returncode} (its messages above)")
    return Path(lines[-1]) / binary


def build() -> Path:
    """The client's path (``hack/build-kubeletclient.sh``)."""
    return built(BUILD, "kubeletclient")


def call(
    client: Path,
    socket: str,
    mode: str,
    claims: Sequence[ClaimRequest] = (),
    *,
    warmup: int = 0,
    rounds: int = 0,
    concurrency: int = 1,
    timeout_s: float = 600.0,
) -> Calls:
    """Run ``client`` against the plugin listening on ``socket`` (the modes of
    ``hack/kubeletclient/main.go``: single, burst, empty)."""
    request = {
        "socket": socket,
        "mode": mode,
        "claims": [{"uid": c.uid, "namespace": c.namespace, "name": c.name} for c in claims],
        "warmup": warmup,
        "rounds": rounds,
        "concurrency": concurrency,
    }
    done = subprocess.run(
        [str(client)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubelet client ({mode}): {done.stderr.strip() or done.returncode}")
    out = json.loads(done.stdout)
    return Calls(
        prepare=list(out.get("prepare") or []),
        unprepare=list(out.get("unprepare") or []),
        prepare_wall=float(out.get("prepareWall", 0.0)),
        unprepare_wall=float(out.get("unprepareWall", 0.0)),
    )
