"""A stand-in for Prometheus that keeps the report's unit tests fast.

It answers some of the report's queries from a table of raw samples per metric: the window
totals (``controller.report.promql.window_total``: per group the sum of last values and of
anchors) and the timeline's ``rate()`` per tenant and step, as the real server computes them
for series without a drop, and those that read apart a series with a drop on a node that did
not restart (``dropped_series``, ``anchor_of``, its samples), each also several metrics at once
(``controller.report.promql.batched``). Every other query answers nothing
and the rules API is not served: drops, rules and the exactness of it all are checked on the
real server (``tests/e2e/test_prometheus_report_exact.py``, ``tests/e2e/test_prometheus.py``).
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests import local_http
from tests.local_http import reply

Samples = dict[float, float]  # time → counter value
Table = dict[str, list[tuple[dict[str, str], Samples]]]  # metric → (labels, samples)
_TOTAL = re.compile(
    r"^label_replace\(sum by \(([^)]*)\) \(last_over_time\(([a-z_]+)\[(\d+)ms\]\)\).*"
    r"last_over_time\([a-z_]+\[(\d+)ms\] offset (\d+)ms\)"
)
_RATE = re.compile(r"^sum by \(tenant\) \(rate\(([a-z_]+)\[(\d+)ms\]\)\) \* ([0-9.e+]+)$")


def _last(samples: Samples, after: float, until: float) -> float | None:
    seen = [t for t in samples if after < t <= until]
    return samples[max(seen)] if seen else None


def _matrix(result: list[dict[str, Any]]) -> Any:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def rate_answer(table: Table, query: str, start: float, end: float, step: float) -> Any:
    """Per tenant and step, the counters' average rise per second over the range, times
    the step (no resets, no extrapolation), or None for another query."""
    match = _RATE.match(query)
    if match is None:
        return None
    metric, window, times = match.group(1), int(match.group(2)) / 1000, float(match.group(3))
    groups: dict[str, dict[float, float]] = {}
    t = start
    while t <= end + 1e-6:
        for labels, samples in table.get(metric, []):
            seen = sorted(x for x in samples if t - window < x <= t)
            if len(seen) >= 2:
                rise = (samples[seen[-1]] - samples[seen[0]]) / (seen[-1] - seen[0])
                steps = groups.setdefault(labels.get("tenant", ""), {})
                steps[t] = steps.get(t, 0.0) + rise * times
        t += step
    return _matrix(
        [
            {"metric": {"tenant": k}, "values": [[at, repr(v)] for at, v in steps.items()]}
            for k, steps in groups.items()
        ]
    )


def total_answer(table: Table, query: str, at: float) -> Any:
    """The ``vector`` answer of a window-total query, or None for another query."""
    match = _TOTAL.match(query)
    if match is None:
        return None
    by = [b.strip() for b in match.group(1).split(",")]
    metric, last_range = match.group(2), int(match.group(3)) / 1000
    anchor_s, window = int(match.group(4)) / 1000, int(match.group(5)) / 1000
    sums: dict[tuple[str, ...], float] = {}
    for labels, samples in table.get(metric, []):
        key = tuple(labels.get(b, "") for b in by)
        for tag, value in (
            ("L", _last(samples, at - last_range, at)),
            ("A", _last(samples, at - window - anchor_s, at - window)),
        ):
            if value is not None:
                sums[(tag, *key)] = sums.get((tag, *key), 0.0) + value
    result = [
        {
            "metric": {**dict(zip(by, key[1:], strict=True)), "tranche_q": key[0]},
            "value": [at, repr(v)],
        }
        for key, v in sums.items()
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


_DROPPED = re.compile(r"^resets\(([a-z_]+)\[(\d+)ms\]\) > 0$")
_ONE = r"([a-z_]+)\{([^}]*)\}\[(\d+)ms\]"
_ANCHOR = re.compile(rf"^last_over_time\({_ONE}\) offset (\d+)ms\)$")
_SAMPLES = re.compile(rf"^{_ONE}$")


def _vector(result: list[dict[str, Any]]) -> Any:
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def _series(table: Table, metric: str, matchers: str) -> Samples:
    labels = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
    return next((s for ls, s in table.get(metric, []) if ls == labels), {})


def series_answer(table: Table, query: str, at: float) -> Any:
    """The series with a drop in a range, one series' anchor, or its samples in a range (a
    gap, a series removed then exported again from zero, is no sample); None otherwise."""
    if (match := _DROPPED.match(query)) is not None:
        after = at - int(match.group(2)) / 1000
        found = []
        for labels, samples in table.get(match.group(1), []):
            seen = [samples[t] for t in sorted(samples) if after < t <= at]
            drops = sum(1 for a, b in itertools.pairwise(seen) if b < a)
            if drops:
                found.append({"metric": labels, "value": [at, str(drops)]})
        return _vector(found)
    if (match := _ANCHOR.match(query)) is not None:
        samples = _series(table, match.group(1), match.group(2))
        until = at - int(match.group(4)) / 1000
        value = _last(samples, until - int(match.group(3)) / 1000, until)
        return _vector([] if value is None else [{"metric": {}, "value": [at, repr(value)]}])
    if (match := _SAMPLES.match(query)) is not None:
        samples = _series(table, match.group(1), match.group(2))
        after = at - int(match.group(3)) / 1000
        values = [[t, repr(samples[t])] for t in sorted(samples) if after < t <= at]
        return _matrix([{"metric": {}, "values": values}] if values else [])
    return None


def handler(answer: Callable[[str, dict[str, str]], Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parsed = urllib.parse.urlparse(self.path)
            q = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
            doc = answer(parsed.path, q)
            if doc is None:
                self.send_error(404)
                return
            reply(self, json.dumps(doc).encode())

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


_BATCHED = re.compile(r'label_replace\((.*?), "tranche_m", "([a-z_]+)", "", ""\)(?: or |$)')


def batched_answer(
    one: Callable[[Table, str, float], Any], table: Table, query: str, at: float
) -> Any:
    """``one``'s answer to each metric's part of a batched query, its rows tagged with the
    metric; ``one``'s answer to any other query."""
    parts = _BATCHED.findall(query)
    if not parts or "".join(_BATCHED.sub("", query)):
        return one(table, query, at)
    result = []
    for part, metric in parts:
        found = one(table, part, at)
        if found is None:
            return None
        result += [
            {**r, "metric": {**r["metric"], "tranche_m": metric}} for r in found["data"]["result"]
        ]
    return _vector(result)


def table_answer(table: Table) -> Callable[[str, dict[str, str]], Any]:
    """Window totals and timeline rates from ``table``; nothing for other queries; 404 for
    the rest of the API."""

    def answer(path: str, q: dict[str, str]) -> Any:
        if path == "/api/v1/query":
            found = batched_answer(total_answer, table, q["query"], float(q["time"]))
            if found is None:
                found = batched_answer(series_answer, table, q["query"], float(q["time"]))
            return found if found is not None else _vector([])
        if path != "/api/v1/query_range":
            return None
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        found = rate_answer(table, q["query"], start, end, step)
        return found if found is not None else _matrix([])

    return answer


@contextmanager
def serving(answer: Callable[[str, dict[str, str]], Any]) -> Iterator[str]:
    with local_http.serving(ThreadingHTTPServer(("127.0.0.1", 0), handler(answer))) as server:
        yield f"http://127.0.0.1:{server.server_port}"
