"""The ResourceClaimTemplates that rewritten pods refer to: checked at admission, written after.

The webhook endpoint accepts any caller that reaches it: an AdmissionReview can be forged by
any client on the pod network, and the API server authenticates itself to a webhook only where
the cluster operator configured client certificates for admission. So admission writes
nothing. It only checks that a template it is about to name is not someone else's
(:meth:`TemplateWriter.check`, a read), and wakes the writer.

:meth:`TemplateWriter.sync` lists the pods that really exist with the rewrite label and
creates the templates their annotation asks for, in their namespace. A forged review
therefore costs one list, never an object: nothing is written where no rewritten pod exists.
The pod waits for its template a moment (the resourceclaim controller retries), which is the
price of that guarantee. A template the API server refuses (the claim-trust policy denies an
isolated namespace's MIG template) is logged and counted, and the pass goes on with the others.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable

from kubernetes import client

from controller.kube_client import ApiCallError, Json, request
from controller.metrics import ControllerMetrics
from controller.webhook.pods import (
    ANNOTATION_REWRITTEN,
    LABEL_MANAGED_BY,
    LABEL_REWRITTEN,
    MANAGED_BY,
    PodRejected,
    TemplateSpec,
    templates_of,
)
from driver.errors import TrancheError

log = logging.getLogger(__name__)

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
DEFAULT_INTERVAL_S = 5.0  # a pass without a wake-up, for pods admitted by another replica
LOOP = "legacy-templates"  # its label in tranche_controller_loop_errors_total


def _base(namespace: str) -> str:
    return f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaimtemplates"


class TemplateWriter:
    """Checks templates for the webhook; creates them for pods that exist."""

    def __init__(
        self,
        api: client.ApiClient,
        interval_s: float = DEFAULT_INTERVAL_S,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._api = api
        self._metrics = metrics
        self._interval = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0  # completed sync passes (tests wait on it)
        self.failures = 0

    # ---- admission: read only ------------------------------------------------------------

    def check(self, namespace: str, template: TemplateSpec) -> None:
        """Refuse a rewrite whose template name is taken by an object that is not ours."""
        what = f"resourceclaimtemplate {namespace}/{template.name}"
        got = request(self._api, f"read {what}", "GET", f"{_base(namespace)}/{template.name}")
        if got is None:
            return
        labels = (got.get("metadata") or {}).get("labels") or {}
        requests = (((got.get("spec") or {}).get("spec") or {}).get("devices") or {}).get(
            "requests"
        )
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or requests != template.requests():
            raise PodRejected(
                f"{what} exists but was not written by the Tranche controller for this request "
                f"(label {LABEL_MANAGED_BY}={MANAGED_BY}, spec.spec.devices.requests="
                f"{json.dumps(template.requests())}); delete or rename it"
            )

    def wake(self) -> None:
        """Run a pass now: a pod was just rewritten (or a caller says so)."""
        self._wake.set()

    # ---- the writer ----------------------------------------------------------------------

    def sync(self) -> list[str]:
        """One pass: create the missing templates of existing rewritten pods; their names."""
        created: list[str] = []
        wanted: dict[tuple[str, str], TemplateSpec] = {}
        for pod in self._rewritten_pods():
            meta = pod.get("metadata") or {}
            namespace = str(meta.get("namespace") or "")
            summary = str((meta.get("annotations") or {}).get(ANNOTATION_REWRITTEN) or "")
            try:
                specs = templates_of(summary)
            except PodRejected as e:
                log.warning(
                    "rewritten pod with an unreadable annotation namespace=%s pod=%s error=%r",
                    namespace, meta.get("name"), str(e),
                )  # fmt: skip
                continue
            for spec in specs:
                wanted[(namespace, spec.name)] = spec
        for (namespace, name), spec in sorted(wanted.items()):
            try:
                if self._create(namespace, spec):
                    created.append(f"{namespace}/{name}")
            except ApiCallError as e:  # this template only; the API server answers the others
                log.warning(
                    "legacy template not created namespace=%s name=%s error=%r",
                    namespace, name, str(e),
                )  # fmt: skip
                self._count_error()
        return created

    def _count_error(self) -> None:
        if self._metrics is not None:
            self._metrics.loop_errors.labels(loop=LOOP).inc()

    def _rewritten_pods(self) -> Iterable[Json]:
        token = ""
        while True:
            query = {"labelSelector": f"{LABEL_REWRITTEN}=true", "limit": "500"}
            if token:
                query["continue"] = token
            page = request(self._api, "list rewritten pods", "GET", "/api/v1/pods", query=query)
            yield from (page or {}).get("items") or []
            token = ((page or {}).get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def _create(self, namespace: str, spec: TemplateSpec) -> bool:
        what = f"resourceclaimtemplate {namespace}/{spec.name}"
        if request(self._api, f"read {what}", "GET", f"{_base(namespace)}/{spec.name}"):
            return False
        try:
            body = spec.body(namespace)
            request(self._api, f"create {what}", "POST", _base(namespace), body=body)
        except ApiCallError as e:
            if e.status == 409:  # another replica was first
                return False
            raise
        log.info("template created namespace=%s name=%s", namespace, spec.name)
        return True

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=LOOP, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
            except TrancheError as e:
                self.failures += 1
                self._count_error()
                log.warning("legacy template pass failed error=%r", str(e))
            self.passes += 1
