"""Would a prepare gain by filling its claim file in a second thread while its CDI spec is written?

A prepare writes the CDI spec (not fsynced; a tmpfs on a real node), then fills a spare claim
file, ``fsync``s it, renames it to the claim's name and ``fsync``s the directory
(``docs/checkpoint.md``). Only the rename must follow the spec, so the fill and its ``fsync``
could run in a thread beside the spec's write, with the same crash guarantees. This measures
the three parts one after the other, then the fill handed to a waiting thread, alternated in
rounds, with a bare hand-off (an empty job) for its cost:

    python -m hack.bench.fsync_overlap [--rounds 6] [--calls 100]

The spec goes to ``/dev/shm`` (a tmpfs, as ``/var/run/cdi`` is), the claim files to
``/var/tmp`` (the disk, as the plugin's directory is).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hack.bench import calibration
from hack.bench.results import median

PAUSE_S = 0.0015  # about a claim GET: each call runs cold, as in the plugin
CLAIM = json.dumps({"claim": "x" * 650}).encode()
SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "k8s.gpu.tranche.dev/claim",
    "devices": [{"name": "a" * 40, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    "containerEdits": {"env": [f"NVIDIA_VAR_{i}=value" for i in range(6)]},
}


class Worker:
    """One waiting thread that runs a job when handed one."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._job: Callable[[], None] | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None:
                    self._cv.wait()
                job, self._job = self._job, None
            job()
            self.done.set()

    def submit(self, job: Callable[[], None]) -> None:
        self.done.clear()
        with self._cv:
            self._job = job
            self._cv.notify()


class Files:
    def __init__(self, spec_dir: Path, claim_dir: Path) -> None:
        self.spec_dir, self.claim_dir = spec_dir, claim_dir
        self.spare = claim_dir / ".spare"
        self.spare.write_bytes(CLAIM)

    def spec(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.spec_dir, prefix=".spec")
        os.write(fd, json.dumps(SPEC).encode())
        os.close(fd)
        Path(tmp).replace(self.spec_dir / "claim.json")

    def fill(self) -> None:
        fd = os.open(self.spare, os.O_WRONLY)
        try:
            os.pwrite(fd, CLAIM, 0)
            os.ftruncate(fd, len(CLAIM))
            os.fsync(fd)
        finally:
            os.close(fd)

    def commit(self) -> None:
        claim = self.claim_dir / "claim"
        self.spare.rename(claim)
        fd = os.open(self.claim_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        claim.rename(self.spare)  # the next round's spare


def _timed(samples: list[float], call: Callable[[], None]) -> None:
    time.sleep(PAUSE_S)
    start = time.perf_counter()
    call()
    samples.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    files = Files(Path(tempfile.mkdtemp(dir="/dev/shm")), Path(tempfile.mkdtemp(dir="/var/tmp")))
    worker = Worker()
    parts: dict[str, list[float]] = {
        k: [] for k in ("spec", "fill", "commit", "in turn", "fill in a thread", "hand-off")
    }

    def in_turn() -> None:
        files.spec()
        files.fill()
        files.commit()

    def overlapped() -> None:
        worker.submit(files.fill)
        files.spec()
        worker.done.wait()
        files.commit()

    def handoff() -> None:
        worker.submit(lambda: None)
        worker.done.wait()

    before = median(calibration.measure())
    for _ in range(args.rounds):
        for _ in range(args.calls):
            _timed(parts["spec"], files.spec)
            _timed(parts["fill"], files.fill)
            _timed(parts["commit"], files.commit)
            _timed(parts["in turn"], in_turn)
            _timed(parts["fill in a thread"], overlapped)
            _timed(parts["hand-off"], handoff)
    after = median(calibration.measure())
    print(f"calibration p50 {before * 1e3:.1f} ms before, {after * 1e3:.1f} ms after")
    for name, samples in parts.items():
        print(f"{name:>17}: p50 {median(samples) * 1e3:.3f} ms (n={len(samples)})")


if __name__ == "__main__":
    main()
