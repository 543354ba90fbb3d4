"""A real Prometheus server for end-to-end tests.

``prometheus_bin`` (session fixture) finds ``prometheus`` and ``promtool``:
``$TRANCHE_PROMETHEUS_BIN_DIR`` or ``hack/build-prometheus.sh`` (built once, cached).
:func:`running_prometheus` starts the server on loopback in a temporary directory,
scraping static targets as job ``tranche-kubelet-plugin`` (the job the alerts of
``deploy/prometheus/tranche-rules.yaml`` select) at a short interval, and always stops
it (SIGTERM, then SIGKILL) when the block ends; should the test process die without
its teardown, the kernel kills the server (``setpriv --pdeathsig``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import unavailable
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-prometheus.sh"
RULES = REPO / "deploy" / "prometheus" / "tranche-rules.yaml"
JOB = "tranche-kubelet-plugin"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def _die_with_parent() -> list[str]:
    """A command prefix that has the kernel SIGKILL the server if the test process dies
    without running its teardown (SIGKILL, a crash): util-linux ``setpriv --pdeathsig``.
    Not a ``preexec_fn``: Python code between fork and exec in a process with gRPC threads
    (the kubelet simulator) crashes the child and can upset the parent's channels."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The directory holding ``prometheus`` and ``promtool``."""
    override = os.environ.get("TRANCHE_PROMETHEUS_BIN_DIR")
    if override:
        missing = [b for b in ("prometheus", "promtool") if not (Path(override) / b).is_file()]
        if missing:
            unavailable(f"TRANCHE_PROMETHEUS_BIN_DIR={override} lacks {', '.join(missing)}")
        return Path(override)
    try:
        done = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        unavailable(f"cannot run {BUILD_SCRIPT}: {e} (run `make prometheus-bin`)")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        unavailable(
            f"{BUILD_SCRIPT} exited with code {done.returncode}; its stderr says why "
            "(run `make prometheus-bin`)"
        )
    return Path(lines[-1])


class PrometheusError(RuntimeError):
    """The server did not start or answered an error; the message says which."""


class PrometheusServer:
    """One Prometheus process on ``127.0.0.1:<port>`` with its data in ``root``."""

    def __init__(
        self,
        bin_dir: Path,
        root: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.bin_dir = bin_dir
        self.extra_args = tuple(extra_args)
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = root / "prometheus.yml"
        self.log_path = root / "prometheus.log"
        self.data_dir = root / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": JOB, "static_configs": [{"targets": list(targets)}]},
            ],
        }
        self.config_path.write_text(yaml.safe_dump(config))

    def start(self) -> None:
        cmd = [
            *_die_with_parent(),
            str(self.bin_dir / "prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
            *self.extra_args,
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.2)
        code = self._proc.poll()
        self.stop()
        raise PrometheusError(
            f"prometheus did not become ready (exit code {code}); last lines of "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM and wait; SIGKILL after the timeout."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """``data`` of a successful ``/api/v1/<path>`` answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"{url}: HTTP {e.code}: {e.read()[:500]!r}") from e
        if doc.get("status") != "success":
            raise PrometheusError(f"{url}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant vector query now: (labels, value) per series."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: result type {data['resultType']}, not vector")
        return [(dict(s["metric"]), float(s["value"][1])) for s in data["result"]]

    def target_health(self) -> dict[str, str]:
        """``up``/``down``/``unknown`` per scrape URL of the active targets."""
        data = self.api("targets", state="active")
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups


@contextlib.contextmanager
def running_prometheus(
    bin_dir: Path,
    targets: Sequence[str],
    rule_files: Sequence[Path] = (),
    interval: str = "1s",
    prepare_data: Callable[[Path], None] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[PrometheusServer]:
    """A started server scraping ``targets`` (``host:port``); stopped and its directory
    removed when the block ends, whatever happened in it. ``prepare_data(dir)`` fills the
    storage directory before the start (e.g. with backfilled blocks)."""
    root = Path(tempfile.mkdtemp(prefix="prom-"))
    server = PrometheusServer(bin_dir, root, targets, rule_files, interval, extra_args)
    try:
        if prepare_data is not None:
            prepare_data(server.data_dir)
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def backfill(bin_dir: Path, text: str) -> Callable[[Path], None]:
    """A data-directory writer for the server: ``text`` (OpenMetrics) turned into TSDB blocks by
    ``promtool tsdb create-blocks-from openmetrics``."""

    def write(data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        source = data_dir.parent / "backfill.om"
        source.write_text(text)
        done = subprocess.run(
            [str(bin_dir / "promtool"), "tsdb", "create-blocks-from", "openmetrics",
             str(source), str(data_dir)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, f"promtool backfill failed: {done.stdout}{done.stderr}"

    return write
