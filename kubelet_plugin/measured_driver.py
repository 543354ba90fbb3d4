"""Operational metrics of the kubelet's calls: latency by mode, errors by reason.

:class:`MeasuredDriver` wraps the plugin's :class:`driver.api.DraDriver`. The
latency of a call (claim and namespace reads included) is observed once per
claim it carried, labelled with the claim's sharing mode; a failed claim counts
its bounded error reason instead. The prepared claims' gauge is read at scrape time
(``Metrics.prepared_claims_from``): counting them here cost every call time in
proportion to the node's claims.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from driver.api import ClaimRef, DraDriver, PrepareResult, UnprepareResult
from driver.metrics import Metrics


class MeasuredDriver:
    def __init__(self, inner: DraDriver, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        start = time.monotonic()
        results = self._inner.prepare(claims)
        elapsed = time.monotonic() - start
        for result in results.values():
            if result.error:
                self._metrics.count_error(result.reason or "internal")
            else:
                self._metrics.observe_prepare(result.mode or "none", elapsed)
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        start = time.monotonic()
        results = self._inner.unprepare(claims)
        elapsed = time.monotonic() - start
        for result in results.values():
            if result.error:
                self._metrics.count_error(result.reason or "internal")
            elif result.mode:  # an unknown claim has no mode and costs nothing to measure
                self._metrics.observe_unprepare(result.mode, elapsed)
        return results
