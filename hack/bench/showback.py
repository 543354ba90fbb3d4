"""Issue 18, item 5: ``tranche report --prometheus --since 30d`` over 500 nodes and 2,000 claims.

The synthetic fleet of :mod:`hack.bench.showback_fleet` is written as OpenMetrics and loaded
into a real Prometheus TSDB with ``promtool tsdb create-blocks-from openmetrics`` (cached
under the build scripts' cache root (:mod:`hack.cache_dir`) for :data:`MAX_AGE_S`, keyed by the
generator's source and the Prometheus build). A real Prometheus serves it; the real CLI runs in
a subprocess :data:`RUNS` times; wall time and the child's maximum resident set
(``wait4``'s ``ru_maxrss``) are measured, and Prometheus's CPU time (``/proc``) is shown. The
last run's totals are checked against the increases the samples hold (exact, per series).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from hack.bench import showback_fleet
from hack.bench.machine import REPO
from hack.bench.results import Row, ScenarioResult, median
from hack.bench.showback_fleet import Fleet, build, exact_increase, write_file
from hack.cache_dir import cache_root
from hack.devcluster.processes import free_port

NAME = "showback"
TITLE = "Showback: `tranche report --prometheus --since 30d`, 500 nodes, 2,000 claims (issue 18)"
NEEDS_CLUSTER = False
RUNS = 3
TARGET_S = 10.0
TARGET_MIB = 200.0
MAX_AGE_S = 6 * 3600  # older data would leave the window's last hours empty
CHECKED = {
    "tranche_tenant_gpu_allocated_seconds_total": "allocated_gpu_hours",
    "tranche_device_held_seconds_total": "held_gpu_hours",
}


def _prometheus_bins() -> Path:
    override = os.environ.get("TRANCHE_PROMETHEUS_BIN_DIR")
    if override:
        return Path(override)
    done = subprocess.run(
        [str(REPO / "hack" / "build-prometheus.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def _cache(bins: Path) -> Path:
    source = Path(showback_fleet.__file__).read_bytes()
    key = hashlib.sha256(source + str(bins).encode()).hexdigest()[:12]
    root = cache_root()
    return root / f"bench-showback-{key}"


def _prepare(bins: Path) -> tuple[Path, Fleet, dict[str, Any]]:
    """The TSDB of the fleet (cached) and what making it took."""
    cache = _cache(bins)
    stamp = cache / "stamp.json"
    if stamp.exists():
        made = json.loads(stamp.read_text())
        if time.time() - made["now"] < MAX_AGE_S:
            return cache / "data", build(made["now"]), {**made, "cached": True}
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    now = time.time()
    fleet = build(now)
    text = cache / "fleet.om"
    t0 = time.monotonic()
    samples = write_file(fleet, text)
    written_s = time.monotonic() - t0
    size = text.stat().st_size
    t0 = time.monotonic()
    done = subprocess.run(
        [str(bins / "promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet",
         f"--max-block-duration={24 * 7}h", str(text), str(cache / "data")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    text.unlink()
    made = {
        "now": now,
        "samples": samples,
        "series": len(fleet.series),
        "openmetrics_mib": size / 2**20,
        "write_s": written_s,
        "backfill_s": time.monotonic() - t0,
    }
    stamp.write_text(json.dumps(made))
    return cache / "data", fleet, {**made, "cached": False}


def _start(bins: Path, data: Path, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15m\n")
    log = (root / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [str(bins / "prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         "--storage.tsdb.retention.time=400d", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:  # noqa: S310 (http)
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    _stop(proc)
    raise RuntimeError(f"prometheus did not become ready; see {root / 'prometheus.log'}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(url: str, root: Path) -> tuple[float, float, dict[str, Any]]:
    """One run of the CLI: wall seconds, maximum resident set (MiB, ``wait4``), its JSON."""
    out, err = root / "report.json", root / "report.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "driver.cli", "report", "--prometheus", url, "--since", "30d",
             "--output", "json", "--timeout", "120"],
            stdout=stdout, stderr=stderr, cwd=REPO,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"tranche report exited {proc.returncode}: {err.read_text()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, json.loads(out.read_text())


def _check(fleet: Fleet, doc: dict[str, Any]) -> str:
    """Compare the report's totals with the samples' increases; raise when they differ."""
    start = datetime.fromisoformat(doc["start"].replace("Z", "+00:00")).timestamp()
    end = datetime.fromisoformat(doc["end"].replace("Z", "+00:00")).timestamp()
    lines = []
    for metric, column in CHECKED.items():
        want = sum(exact_increase(fleet, s, start, end) for s in fleet.series if s.metric == metric)
        got = (doc["total"] if column == "allocated_gpu_hours" else doc["devices"])[column] * 3600
        if abs(got - want) > 1e-9 * want + 1.0:
            raise RuntimeError(f"{metric}: report {got:.1f} GPU-s, samples {want:.1f}")
        lines.append(f"{column} {got / 3600:.1f} GPU-h (samples: {want / 3600:.1f})")
    return "; ".join(lines)


def run(lab: object | None) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    bins = _prometheus_bins()
    data, fleet, made = _prepare(bins)
    root = data.parent
    proc, url = _start(bins, data, root)
    walls, rss, server_cpu = [], [], []
    try:
        for _ in range(RUNS):
            before = _cpu_s(proc.pid)
            wall, peak, doc = _report(url, root)
            server_cpu.append(_cpu_s(proc.pid) - before)
            walls.append(wall)
            rss.append(peak)
    finally:
        _stop(proc)
    checked = _check(fleet, doc)
    result.add(
        Row(
            "`tranche report --prometheus --since 30d --output json`: wall time (CLI in a "
            "subprocess, Prometheus's query time included)",
            f"median {median(walls):.2f} s, max {max(walls):.2f} s",
            len(walls),
            f"< {TARGET_S:.0f} s",
            median(walls) < TARGET_S,
        )
    )
    result.add(
        Row(
            "the CLI's maximum resident set (`wait4` `ru_maxrss`)",
            f"median {median(rss):.0f} MiB, max {max(rss):.0f} MiB",
            len(rss),
            f"< {TARGET_MIB:.0f} MiB",
            max(rss) < TARGET_MIB,
        )
    )
    result.add(
        Row(
            "Prometheus's CPU time per report (`/proc/<pid>/stat`)",
            f"median {median(server_cpu):.2f} s",
            len(server_cpu),
        )
    )
    nodes = {s.node for s in fleet.series}
    claims = {s.labels for s in fleet.series if s.metric.startswith("tranche_claim_")}
    restarted = sum(1 for r in fleet.restarts.values() if len(r) > 1)
    how = (
        f"written in {made['write_s']:.0f} s ({made['openmetrics_mib']:.0f} MiB of OpenMetrics), "
        f"backfilled by promtool in {made['backfill_s']:.0f} s"
        + ("; this run reused that TSDB from the cache" if made["cached"] else "")
    )
    result.setup.append(
        f"{len(nodes)} nodes of {showback_fleet.GPUS} GPUs, {len(claims)} claims, "
        f"{showback_fleet.DAYS + 1} days of samples every {showback_fleet.SCRAPE_S} s: "
        f"{made['series']} series, {made['samples']:,} samples of the plugin's metric names and "
        f"labels ({how}). Every node's plugin restarts in a rolling update on day 20, "
        f"{restarted} nodes once or twice more. A real Prometheus (`promtool tsdb "
        "create-blocks-from openmetrics`, then `prometheus` on the blocks) answers the real CLI "
        f"in a subprocess, {RUNS} runs. The last run's totals equal the samples' exact "
        f"increases: {checked}."
    )
    result.notes.append(
        "The scrape interval is 15 minutes so that the data fits the 2-core, 24 GiB machine; "
        "the CLI's work and memory depend on the groups and steps it is answered (aggregates), "
        "not on the samples; Prometheus's evaluation time grows with the samples it reads."
    )
    return result
