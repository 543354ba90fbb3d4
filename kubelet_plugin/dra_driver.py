"""The plugin's :class:`driver.api.DraDriver`: claim reads, then the executor.

NodePrepareResources carries only claim references. The claims are read from
the API server first, concurrently and before the node-wide lock (slow reads
must not serialise behind device work); each is then prepared by
:class:`driver.state.DeviceState`. A claim that cannot be read fails alone,
with the reason (gone, API server unreachable) in its ``error``.
NodeUnprepareResources needs no read: the checkpoint has everything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import urllib3
from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from driver.api import ClaimRef, PrepareResult, UnprepareResult
from driver.errors import ApiUnavailable, ClaimError, TrancheError
from driver.state import DeviceState

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0


class ClaimReader(Protocol):
    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        """The claim as JSON; ClaimError when it is gone, ApiUnavailable when unreadable."""
        ...


class ApiClaimReader:
    """Reads ResourceClaims (``resource.k8s.io/v1``) as raw JSON from the API server."""

    def __init__(self, api_client: ApiClient, timeout_s: float = READ_TIMEOUT_S) -> None:
        self._api = ResourceV1Api(api_client)
        self._timeout_s = timeout_s

    def read(self, ref: ClaimRef) -> Mapping[str, Any]:
        key = f"{ref.namespace}/{ref.name}"
        try:
            response: Any = self._api.read_namespaced_resource_claim(
                ref.name,
                ref.namespace,
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
            body = json.loads(response.data)
        except ApiException as e:
            if e.status == 404:
                raise ClaimError(
                    f"claim {key}: not found on the API server (deleted before it was prepared)"
                ) from e
            raise ApiUnavailable(
                f"claim {key}: reading it from the API server failed: HTTP {e.status} {e.reason}"
            ) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiUnavailable(
                f"claim {key}: the API server is unreachable ({type(e).__name__}: {e})"
            ) from e
        except ValueError as e:
            raise ApiUnavailable(f"claim {key}: the API server sent invalid JSON: {e}") from e
        if not isinstance(body, dict):
            raise ApiUnavailable(f"claim {key}: the API server sent {type(body).__name__}")
        return body


class PluginDriver:
    """Implements :class:`driver.api.DraDriver` over a claim reader and a DeviceState."""

    def __init__(self, state: DeviceState, reader: ClaimReader, read_workers: int = 8) -> None:
        self._state = state
        self._reader = reader
        self._pool = ThreadPoolExecutor(max_workers=read_workers, thread_name_prefix="claim-read")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        reads: dict[str, Future[Mapping[str, Any]]] = {
            ref.uid: self._pool.submit(self._reader.read, ref) for ref in claims
        }
        results: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                claim = reads[ref.uid].result()
            except TrancheError as e:
                log.warning(
                    "claim read failed claim_uid=%s namespace=%s name=%s error=%s",
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    e,
                )
                results[ref.uid] = PrepareResult(error=str(e))
                continue
            results[ref.uid] = self._state.prepare(claim, ref)
            if results[ref.uid].error:
                log.warning(
                    "prepare failed claim_uid=%s namespace=%s name=%s error=%s",
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    results[ref.uid].error,
                )
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        return {ref.uid: self._state.unprepare(ref) for ref in claims}
