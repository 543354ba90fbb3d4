"""Where a benchmark ran: date, CPUs, memory, load, Python, commit."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from pathlib import Path

from hack.bench.results import Row

REPO = Path(__file__).resolve().parents[2]


def _meminfo_gib() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    return "unknown"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def describe() -> str:
    """One line: date, nproc, memory, CPU model, load average, Python, commit."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{now}; {len(os.sched_getaffinity(0))} CPUs (nproc), {_meminfo_gib()} memory, "
        f"{_cpu_model()}; load average {load} at start; Python {platform.python_version()}; "
        f"commit {_commit()}"
    )


def rss_bytes(pid: int) -> int:
    """Resident set size (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"process {pid}: no VmRSS in /proc/{pid}/status")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far, all its threads."""
    return _cpu_ticks(pid) / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> list[int]:
    """Every CPU's time so far, by kind (the first line of ``/proc/stat``: user, nice,
    system, idle, iowait, irq, softirq, steal, ...)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _shares(before: list[int], after: list[int]) -> tuple[float, float]:
    """The share of every CPU's time busy, and the share the hypervisor took (``steal``),
    between two :func:`cpu_ticks` readings."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = max(1, sum(spent[:8]))  # guest time is counted in user already
    idle = spent[3] + spent[4]  # idle, iowait
    steal = spent[7] if len(spent) > 7 else 0
    return 1.0 - idle / total, steal / total


def _machine_busy(interval_s: float) -> float:
    """The share of every CPU's time spent busy over ``interval_s`` (``/proc/stat``)."""
    before = cpu_ticks()
    time.sleep(interval_s)
    return _shares(before, cpu_ticks())[0]


STOLEN_METRIC = "Machine: CPU time busy, and taken by the hypervisor (steal), during the scenario"


def share_row(before: list[int], after: list[int]) -> Row:
    """How busy the machine's CPUs were between two :func:`cpu_ticks` readings, and how much
    of their time the hypervisor gave to other machines (``steal``: this machine's CPUs
    wanted to run and could not). A scenario whose steal is high ran on a contended host."""
    busy, steal = _shares(before, after)
    return Row(STOLEN_METRIC, f"busy {100 * busy:.0f} %, steal {100 * steal:.1f} %")


def wait_idle(pid: int, timeout_s: float = 120.0) -> None:
    """Until the plugin used under 5 % of a core over half a second (its background status
    writes after a burst are done), then until the machine is under 25 % busy for a second
    (the API server and etcd settle for a few seconds after a burst; measured at 80-90 % for
    3 s after 1,000 claims), so each level measures prepares, not the backlog. A machine that
    stays busy (other work) is measured as it is once ``timeout_s`` has passed."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = _cpu_ticks(pid)
        time.sleep(0.5)
        if (_cpu_ticks(pid) - before) / hz < 0.025:
            break
    quiet_by = time.monotonic() + 60.0
    while time.monotonic() < min(deadline, quiet_by) and _machine_busy(1.0) > 0.25:
        pass
