"""A stand-in for Prometheus that keeps the report's unit tests fast.

It answers the report's aggregate queries (``controller.report.promql.aggregate`` per step,
``window_total`` over the window) from a table of raw samples per metric: per group, the sum
of ``last - anchor`` (``last`` alone for a series born inside), as the real server computes
them for series without a drop. The drop queries answer nothing, the rules API is not served:
drops, rules and the exactness of it all are checked on the real server
(``tests/e2e/test_prometheus_report_exact.py``, ``tests/e2e/test_prometheus.py``).
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Samples = dict[float, float]  # time → counter value
Table = dict[str, list[tuple[dict[str, str], Samples]]]  # metric → (labels, samples)
_AGGREGATE = re.compile(r"^sum by \(([^)]*)\) \(\(\(last_over_time\(([a-z_]+)\[(\d+)ms\]\)")
_TOTAL = re.compile(
    r"^sum by \(([^)]*)\) \(\(last_over_time\(([a-z_]+)\[(\d+)ms\]\) - "
    r"last_over_time\([a-z_]+\[(\d+)ms\]"
)


def _last(samples: Samples, after: float, until: float) -> float | None:
    seen = [t for t in samples if after < t <= until]
    return samples[max(seen)] if seen else None


def aggregate_answer(table: Table, query: str, start: float, end: float, step: float) -> Any:
    """The ``matrix`` answer of an aggregate query, or None for any other query."""
    match = _AGGREGATE.match(query)
    if match is None:
        return None
    by = [b.strip() for b in match.group(1).split(",")]
    metric, window = match.group(2), int(match.group(3)) / 1000
    groups: dict[tuple[str, ...], dict[float, float]] = {}
    t = start
    while t <= end + 1e-6:
        for labels, samples in table.get(metric, []):
            last = _last(samples, t - window, t)
            if last is None:
                continue
            anchor = _last(samples, t - window - max(window, 3600), t - window)
            key = tuple(labels.get(b, "") for b in by)
            steps = groups.setdefault(key, {})
            steps[t] = steps.get(t, 0.0) + (
                last - anchor if anchor is not None and last >= anchor else last
            )
        t += step
    result = [
        {
            "metric": dict(zip(by, key, strict=True)),
            "values": [[at, repr(v)] for at, v in steps.items()],
        }
        for key, steps in groups.items()
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def total_answer(table: Table, query: str, at: float) -> Any:
    """The ``vector`` answer of a window-total query (``promql.window_total``), or None."""
    match = _TOTAL.match(query)
    if match is None:
        return None
    by = [b.strip() for b in match.group(1).split(",")]
    metric, window, anchor_s = (
        match.group(2),
        int(match.group(3)) / 1000,
        int(match.group(4)) / 1000,
    )
    sums: dict[tuple[str, ...], float] = {}
    for labels, samples in table.get(metric, []):
        last = _last(samples, at - window, at)
        if last is not None:
            anchor = _last(samples, at - window - anchor_s, at - window)
            key = tuple(labels.get(b, "") for b in by)
            sums[key] = sums.get(key, 0.0) + last - (anchor or 0.0)
    result = [
        {"metric": dict(zip(by, key, strict=True)), "value": [at, repr(v)]}
        for key, v in sums.items()
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def handler(answer: Callable[[str, dict[str, str]], Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parsed = urllib.parse.urlparse(self.path)
            q = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
            doc = answer(parsed.path, q)
            if doc is None:
                self.send_error(404)
                return
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


def table_answer(table: Table) -> Callable[[str, dict[str, str]], Any]:
    """Aggregates from ``table``; an empty matrix for other range queries; 404 for the rest."""

    def answer(path: str, q: dict[str, str]) -> Any:
        if path == "/api/v1/query":
            found = total_answer(table, q["query"], float(q["time"]))
            empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
            return found if found is not None else empty
        if path != "/api/v1/query_range":
            return None
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        found = aggregate_answer(table, q["query"], start, end, step)
        empty = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        return found if found is not None else empty

    return answer


@contextmanager
def serving(answer: Callable[[str, dict[str, str]], Any]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(answer))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
