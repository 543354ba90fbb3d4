"""The kubelet's DRA node service (``DRAPlugin``), v1 and v1beta1, over a :class:`DraDriver`.

Both versions share one implementation: the request's claims become
:class:`~driver.api.ClaimRef` values, the driver answers per claim, and the
answers go back into the version's messages (v1beta1 has no ``share_id``).

Rules the kubelet relies on (see ``docs/kubelet-grpc.md``):

* every requested claim gets an entry, keyed by UID; a claim the driver did not
  answer gets an error naming it, and an answer for a claim that was not
  requested is dropped (the kubelet treats it as an error);
* ``request_names`` carry main request names only: a ``/sub-request`` suffix is
  stripped here as well, in case the driver left one;
* a gRPC error only when the whole call fails: a malformed request
  (``INVALID_ARGUMENT``), or the driver raising (``UNAVAILABLE`` for retryable
  errors, ``FAILED_PRECONDITION`` for permanent ones, ``INTERNAL`` otherwise).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

import grpc

from driver.api import ClaimRef, DraDriver, PreparedDevice, PrepareResult, UnprepareResult
from driver.errors import PermanentError, RetryableError
from kubelet_plugin.in_flight import InFlight
from proto.gen.dra.v1 import api_pb2 as v1
from proto.gen.dra.v1 import api_pb2_grpc as v1_grpc
from proto.gen.dra.v1beta1 import api_pb2 as v1beta1
from proto.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

DRA_SERVICE_V1 = "v1.DRAPlugin"
DRA_SERVICE_V1BETA1 = "v1beta1.DRAPlugin"


class _ClaimMessage(Protocol):
    namespace: str
    uid: str
    name: str


def claim_refs(claims: Sequence[_ClaimMessage], context: grpc.ServicerContext) -> list[ClaimRef]:
    """The request's claims as :class:`ClaimRef`, duplicates dropped; aborts on a missing field."""
    refs: list[ClaimRef] = []
    seen: set[str] = set()
    remaining = context.time_remaining()  # None without a deadline (the kubelet sets 45 s)
    deadline = None if remaining is None else time.monotonic() + remaining
    for index, claim in enumerate(claims):
        for field in ("uid", "namespace", "name"):
            if not getattr(claim, field):
                _abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"claims[{index}].{field} is empty (claim {claim.namespace}/{claim.name} "
                    f"uid={claim.uid!r}); the kubelet always sets it",
                )
        if claim.uid in seen:
            continue
        seen.add(claim.uid)
        refs.append(
            ClaimRef(uid=claim.uid, namespace=claim.namespace, name=claim.name, deadline=deadline)
        )
    return refs


def main_request_names(names: Sequence[str]) -> list[str]:
    """``["gpu/large", "gpu/small", "nic"]`` → ``["gpu", "nic"]``: the names the kubelet matches."""
    out: list[str] = []
    for name in names:
        base = name.split("/", 1)[0]
        if base not in out:
            out.append(base)
    return out


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("grpc.ServicerContext.abort returned")  # abort always raises


def _whole_call_failed(
    context: grpc.ServicerContext, method: str, refs: Sequence[ClaimRef], err: Exception
) -> NoReturn:
    claims = ",".join(f"{r.namespace}/{r.name}" for r in refs)
    if isinstance(err, RetryableError):
        code = grpc.StatusCode.UNAVAILABLE
    elif isinstance(err, PermanentError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    else:
        code = grpc.StatusCode.INTERNAL
    log.error(
        "dra call failed method=%s claims=%s code=%s error=%s",
        method,
        claims,
        code.name,
        err,
        exc_info=code is grpc.StatusCode.INTERNAL,
    )
    _abort(context, code, f"{method} for claims {claims} failed: {err}")


def _missing(method: str, ref: ClaimRef) -> str:
    return (
        f"{method}: the driver returned no result for claim {ref.namespace}/{ref.name} "
        f"(uid {ref.uid})"
    )


def _fill_device(message: Any, device: PreparedDevice, with_share_id: bool) -> None:
    message.request_names.extend(main_request_names(device.request_names))
    message.pool_name = device.pool_name
    message.device_name = device.device_name
    message.cdi_device_ids.extend(device.cdi_device_ids)
    if with_share_id and device.share_id is not None:
        message.share_id = device.share_id


class _DraCalls:
    """The version-independent part of both servicers."""

    def __init__(
        self, driver: DraDriver, pb: Any, with_share_id: bool, in_flight: InFlight
    ) -> None:
        self._driver = driver
        self._pb = pb
        self._with_share_id = with_share_id
        self.in_flight = in_flight

    def prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.in_flight:
            return self._prepare(request, context)

    def unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.in_flight:
            return self._unprepare(request, context)

    def _prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        refs = claim_refs(request.claims, context)
        try:
            results: dict[str, PrepareResult] = self._driver.prepare(refs) if refs else {}
        except Exception as err:
            _whole_call_failed(context, "NodePrepareResources", refs, err)
        response = self._pb.NodePrepareResourcesResponse()
        for ref in refs:
            entry = response.claims[ref.uid]
            result = results.get(ref.uid)
            if result is None:
                entry.error = _missing("NodePrepareResources", ref)
            elif result.error:
                entry.error = result.error
            else:
                for device in result.devices:
                    _fill_device(entry.devices.add(), device, self._with_share_id)
            _log_claim("prepare", ref, entry.error, len(entry.devices))
        _log_unrequested("NodePrepareResources", refs, results)
        return response

    def _unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        refs = claim_refs(request.claims, context)
        try:
            results: dict[str, UnprepareResult] = self._driver.unprepare(refs) if refs else {}
        except Exception as err:
            _whole_call_failed(context, "NodeUnprepareResources", refs, err)
        response = self._pb.NodeUnprepareResourcesResponse()
        for ref in refs:
            entry = response.claims[ref.uid]
            result = results.get(ref.uid)
            entry.error = (
                _missing("NodeUnprepareResources", ref) if result is None else result.error
            )
            _log_claim("unprepare", ref, entry.error, 0)
        _log_unrequested("NodeUnprepareResources", refs, results)
        return response


def _log_claim(action: str, ref: ClaimRef, error: str, devices: int) -> None:
    if error:
        log.warning(
            "%s failed claim_uid=%s namespace=%s name=%s error=%s",
            action,
            ref.uid,
            ref.namespace,
            ref.name,
            error,
        )
    else:
        log.info(
            "%s done claim_uid=%s namespace=%s name=%s devices=%d",
            action,
            ref.uid,
            ref.namespace,
            ref.name,
            devices,
        )


def _log_unrequested(method: str, refs: Sequence[ClaimRef], results: dict[str, Any]) -> None:
    extra = sorted(set(results) - {r.uid for r in refs})
    if extra:
        log.warning("%s: dropped results for claims not requested claim_uids=%s", method, extra)


class DraServicerV1(v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` (advertised as ``v1.DRAPlugin``)."""

    def __init__(self, driver: DraDriver, in_flight: InFlight) -> None:
        self._calls = _DraCalls(driver, v1, with_share_id=True, in_flight=in_flight)

    def NodePrepareResources(  # noqa: N802 (gRPC method name)
        self, request: v1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        response: v1.NodePrepareResourcesResponse = self._calls.prepare(request, context)
        return response

    def NodeUnprepareResources(  # noqa: N802 (gRPC method name)
        self, request: v1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1.NodeUnprepareResourcesResponse:
        response: v1.NodeUnprepareResourcesResponse = self._calls.unprepare(request, context)
        return response


class DraServicerV1beta1(v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (advertised as ``v1beta1.DRAPlugin``)."""

    def __init__(self, driver: DraDriver, in_flight: InFlight) -> None:
        self._calls = _DraCalls(driver, v1beta1, with_share_id=False, in_flight=in_flight)

    def NodePrepareResources(  # noqa: N802 (gRPC method name)
        self, request: v1beta1.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodePrepareResourcesResponse:
        response: v1beta1.NodePrepareResourcesResponse = self._calls.prepare(request, context)
        return response

    def NodeUnprepareResources(  # noqa: N802 (gRPC method name)
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        response: v1beta1.NodeUnprepareResourcesResponse = self._calls.unprepare(request, context)
        return response


def add_dra_services(server: grpc.Server, driver: DraDriver, in_flight: InFlight) -> list[str]:
    """Register both versions on ``server``, each call counted in ``in_flight``; returns
    their ``supported_versions`` strings."""
    v1_grpc.add_DRAPluginServicer_to_server(DraServicerV1(driver, in_flight), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraServicerV1beta1(driver, in_flight), server)
    return [DRA_SERVICE_V1, DRA_SERVICE_V1BETA1]
