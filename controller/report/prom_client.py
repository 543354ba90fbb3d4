"""The Prometheus HTTP API as ``tranche report`` asks it: range, instant and sample queries,
and the recording rules a server has loaded."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.report.sources import SourceError, answer, short

Labels = tuple[tuple[str, str], ...]
Rows = list[tuple[dict[str, str], float, float]]


@dataclass
class Client:
    """Queries of one server; counts what the exact path had to read apart."""

    base: str
    timeout_s: float
    get: Callable[[str, float], bytes]
    sampled: int = 0  # (series, step) pairs read sample by sample
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _call(self, path: str, params: dict[str, str]) -> tuple[str, bytes]:
        # Plain seconds: Prometheus reads a number as seconds, but a duration only in whole
        # units ("2.5s" is refused as bad_data, so every query of --timeout 2.5 failed).
        params = {**params, "timeout": f"{self.timeout_s:g}"}
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        return url, self.get(url, self.timeout_s)

    def range(self, query: str, first_ms: int, end_ms: int, step_ms: int) -> Rows:
        url, body = self._call(
            "query_range",
            {
                "query": query,
                "start": ms_text(first_ms),
                "end": ms_text(end_ms),
                "step": ms_text(step_ms),
            },
        )
        return answer(url, body)

    def instant(self, query: str, at_ms: int) -> Rows:
        url, body = self._call("query", {"query": query, "time": ms_text(at_ms)})
        return answer(url, body)

    def samples(self, query: str, at_ms: int) -> list[tuple[dict[str, str], list[float]]]:
        """The raw samples of a range-vector query (values in time order)."""
        url, body = self._call("query", {"query": query, "time": ms_text(at_ms)})
        try:
            doc: Any = json.loads(body)
            if doc.get("status") != "success":
                raise SourceError(f"{short(url)}: Prometheus answered {doc.get('error', doc)}")
            return [
                (
                    {str(k): str(v) for k, v in s["metric"].items()},
                    [float(v) for _, v in s["values"]],
                )
                for s in doc["data"]["result"]
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SourceError(f"{short(url)}: not a Prometheus query answer: {err!r}") from err

    def recording_rules(self) -> set[str] | None:
        """Names of the recording rules the server has loaded and evaluates without error;
        None when it serves no rules API (an answer that is not Prometheus's)."""
        url = f"{self.base}/api/v1/rules?{urllib.parse.urlencode({'type': 'record'})}"
        try:
            doc: Any = json.loads(self.get(url, self.timeout_s))
            groups = doc["data"]["groups"]
            return {
                str(r["name"])
                for g in groups
                for r in g.get("rules", [])
                if r.get("type") == "recording" and r.get("health") in ("ok", "unknown")
            }
        except SourceError as err:
            if "HTTP 4" in str(err):  # 404: not served (a Prometheus-compatible store)
                return None
            raise
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def ms_text(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def series_key(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))
