"""Where the showback report reads counters: plugin metrics endpoints or Prometheus.

* :func:`scrape` reads the text exposition of each ``--metrics-url``;
* :class:`BaselineFile` keeps earlier scrapes (one JSON object a line) so a
  later run can report the increase since ``--since`` ago;
* :func:`query_claim_series` asks a Prometheus server for each claim's use per step
  (``--recommend``); the usage report's queries are in :mod:`controller.report.prometheus`.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.report.data import (
    CLAIM_ALLOCATED,
    CLAIM_MEASURED,
    CLAIM_MEMORY,
    REPORTED,
    SeriesKey,
    Snapshot,
)
from driver.errors import PermanentError, RetryableError


class SourceError(RetryableError):
    """A metrics endpoint or Prometheus server could not be read."""


class BaselineError(PermanentError):
    """A baseline file that cannot be read as Tranche wrote it."""


def _get(url: str, timeout_s: float) -> bytes:
    if not url.startswith(("http://", "https://")):
        raise SourceError(f"{url}: only http:// and https:// URLs are read")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked)
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        raise SourceError(f"{short(url)}: HTTP {err.code} {err.reason}{_error_text(err)}") from err
    except (TimeoutError, urllib.error.URLError, OSError) as err:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, TimeoutError):
            raise SourceError(
                f"{short(url)}: no answer within {timeout_s:g} s (--timeout / TRANCHE_TIMEOUT)"
            ) from err
        raise SourceError(f"{short(url)}: cannot connect: {reason}") from err


def short(url: str, query_chars: int = 80) -> str:
    """The URL without its query string, and the start of a PromQL ``query`` if it has one."""
    parsed = urllib.parse.urlsplit(url)
    base = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path, "", ""))
    query = urllib.parse.parse_qs(parsed.query).get("query", [""])[0]
    if not query:
        return base
    more = "..." if len(query) > query_chars else ""
    return f"{base} (query {query[:query_chars]}{more})"


def _error_text(err: urllib.error.HTTPError) -> str:
    """Prometheus's own words from an error answer (``{"error": ...}``), if any."""
    try:
        doc = json.loads(err.read(4096))
        text = str(doc["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return ""
    return f": {text}"


def scrape(urls: Sequence[str], timeout_s: float, now: float) -> Snapshot:
    """One snapshot of the reported counters of every endpoint; any failure fails it all."""
    values: dict[SeriesKey, float] = {}
    for url in urls:
        text = _get(url, timeout_s).decode("utf-8", errors="replace")
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as err:
            raise SourceError(f"{url}: not a Prometheus text exposition: {err}") from err
        for family in families:
            for sample in family.samples:
                if sample.name in REPORTED:
                    labels = tuple(sorted(sample.labels.items()))
                    values[(url, sample.name, labels)] = float(sample.value)
    return Snapshot(time=now, values=values)


class BaselineFile:
    """Scrapes kept one a line: ``{"time": t, "series": [[instance, name, labels, value]]}``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[Snapshot]:
        if not self.path.exists():
            return []
        snapshots = []
        with self.path.open("rb") as f:  # decoded line by line, so a bad byte names its line
            for number, line in enumerate(f, start=1):
                if line.strip():
                    snapshots.append(self._parse(line, number))
        return snapshots

    def _parse(self, line: bytes, number: int) -> Snapshot:
        where = f"{self.path}:{number}"
        try:
            doc = json.loads(line.decode("utf-8"))
            time = float(doc["time"])
            values: dict[SeriesKey, float] = {}
            for instance, name, labels, value in doc["series"]:
                key = (
                    str(instance),
                    str(name),
                    tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                )
                values[key] = float(value)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise BaselineError(
                f"{where}: not a baseline line (want time and series[instance, name, labels, "
                f"value]): {err!r}"
            ) from err
        if not math.isfinite(time):
            raise BaselineError(f"{where}: field time is not a finite number")
        return Snapshot(time=time, values=values)

    def append(self, snapshot: Snapshot) -> None:
        series = [[i, n, dict(labels), v] for (i, n, labels), v in sorted(snapshot.values.items())]
        line = json.dumps({"time": snapshot.time, "series": series}, separators=(",", ":"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def choose_chain(history: Sequence[Snapshot], start: float) -> tuple[list[Snapshot], bool]:
    """The stored snapshots from the last one at or before ``start`` on.

    The flag is False when the history does not reach back to ``start`` (the
    chain then begins at the oldest snapshot).
    """
    ordered = sorted(history, key=lambda s: s.time)
    before = [i for i, s in enumerate(ordered) if s.time <= start]
    if before:
        return ordered[before[-1] :], True
    return ordered, False


@dataclass(frozen=True)
class ClaimSeries:
    """One claim's steps in the window: (time, SM use in whole GPUs, memory bytes), each the
    average over the step, only at steps in which the claim held its device."""

    namespace: str
    claim: str
    points: tuple[tuple[float, float, float], ...]


def recommend_step(window_s: float) -> int:
    """At most about 500 steps (a peak is a step's average), at least one minute each."""
    return max(60, math.ceil(window_s / 500 / 60) * 60)


def query_claim_series(
    base_url: str, start: float, end: float, timeout_s: float, get: Callable[[str, float], bytes]
) -> tuple[dict[tuple[str, str], ClaimSeries], int]:
    """Per claim, SM use and memory per step of ``(start, end]`` (and the step, seconds)."""
    step = recommend_step(end - start)
    # Ranges of two steps: with a one-minute scrape a one-step range can hold one sample,
    # which has no rate (a peak is then the average of two steps, a little lower).
    span = 2 * step
    queries = {
        "held": f"sum by (namespace, claim) (increase({CLAIM_ALLOCATED}[{span}s]))",
        "sm": f"sum by (namespace, claim) (rate({CLAIM_MEASURED}[{span}s]))",
        "memory": f"sum by (namespace, claim) (rate({CLAIM_MEMORY}[{span}s]))",
    }
    values: dict[str, dict[tuple[str, str, float], float]] = {}
    for name, query in queries.items():
        params = urllib.parse.urlencode(
            {"query": query, "start": f"{start + step:.3f}", "end": f"{end:.3f}", "step": str(step)}
        )
        url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
        got = values.setdefault(name, {})
        for labels, t, value in answer(url, get(url, timeout_s)):
            got[(labels.get("namespace", ""), labels.get("claim", ""), t)] = value
    points: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for (namespace, claim, t), held in sorted(values["held"].items()):
        if held <= 0:
            continue  # the claim held nothing in this step (released, or not yet prepared)
        sm = values["sm"].get((namespace, claim, t), 0.0)
        memory = values["memory"].get((namespace, claim, t), 0.0)
        points.setdefault((namespace, claim), []).append((t, sm, memory))
    return {k: ClaimSeries(*k, tuple(v)) for k, v in points.items()}, step


def answer(url: str, body: bytes) -> list[tuple[dict[str, str], float, float]]:
    """(labels, time, value) of a ``matrix`` (query_range) or ``vector`` (query) answer."""
    try:
        doc: Any = json.loads(body)
        if doc.get("status") != "success":
            raise SourceError(f"{short(url)}: Prometheus answered {doc.get('error', doc)}")
        kind = doc["data"]["resultType"]
        if kind not in ("matrix", "vector"):
            raise SourceError(f"{short(url)}: data.resultType is {kind}, not matrix or vector")
        out = []
        for series in doc["data"]["result"]:
            labels = {str(k): str(v) for k, v in series["metric"].items()}
            samples = series["values"] if kind == "matrix" else [series["value"]]
            for t, v in samples:
                value = float(v)
                if math.isfinite(value):
                    out.append((labels, float(t), value))
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise SourceError(f"{short(url)}: not a Prometheus query answer: {err!r}") from err


def http_get(url: str, timeout_s: float) -> bytes:
    return _get(url, timeout_s)
