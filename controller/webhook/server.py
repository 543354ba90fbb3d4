"""The controller's HTTPS webhook endpoint (stdlib ``http.server`` + ``ssl``).

``POST /mutate-pods`` answers ``admission.k8s.io/v1`` AdmissionReviews with the
legacy-resource rewrite of :mod:`controller.webhook.pods`. The TLS context is
taken per connection from :class:`WebhookTls`, so a renewed certificate is
served without a restart.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from kubernetes import client

from controller.kube_client import Json
from controller.metrics import ControllerMetrics
from controller.webhook.pods import PodRejected, mutate_pod
from controller.webhook.templates import DEFAULT_INTERVAL_S, TemplateWriter
from controller.webhook.tls import WebhookTls
from driver.errors import TrancheError
from driver.http_server import HttpServer

log = logging.getLogger(__name__)

MUTATE_PODS_PATH = "/mutate-pods"
MAX_BODY = 3 * 1024 * 1024  # the API server sends at most a few MiB per review


def _response(uid: str, allowed: bool, message: str = "", patch: Any = None) -> Json:
    resp: Json = {"uid": uid, "allowed": allowed}
    if message:
        resp["status"] = {"message": message, "code": 200 if allowed else 403}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


class NotAReview(ValueError):
    """The body is JSON but no AdmissionReview with a request: answered 400."""


def review_pod(review: object, writer: TemplateWriter, metrics: ControllerMetrics) -> Json:
    """The AdmissionReview answer for one pod review. Writes nothing: the templates the
    rewrite names are checked here and created by ``writer`` once the pod exists.
    NotAReview when ``review`` has no ``request`` object to answer; a pod of the wrong shape
    is denied, naming the field."""
    req = review.get("request") if isinstance(review, dict) else None
    if not isinstance(req, dict):
        raise NotAReview("the body is not an AdmissionReview: request must be an object")
    uid = str(req.get("uid", ""))
    pod = {} if req.get("object") is None else req["object"]
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    namespace = str(req.get("namespace") or meta.get("namespace") or "")
    name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
    try:
        if not isinstance(pod, dict):
            raise PodRejected("request.object: must be an object (the pod)")
        mutation = mutate_pod(pod)
        if mutation is None:
            metrics.admissions.labels(result="unchanged").inc()
            return _response(uid, True)
        for template in mutation.templates:
            writer.check(namespace, template)
    except PodRejected as e:
        metrics.admissions.labels(result="rejected").inc()
        log.info("pod rejected namespace=%s pod=%s reason=%r", namespace, name, str(e))
        return _response(uid, False, f"pod {namespace}/{name}: {e}")
    except TrancheError as e:
        metrics.admissions.labels(result="error").inc()
        log.warning("pod review failed namespace=%s pod=%s error=%r", namespace, name, str(e))
        return _response(uid, False, f"pod {namespace}/{name}: tranche controller: {e}")
    if mutation.templates and not req.get("dryRun"):
        writer.wake()
    metrics.admissions.labels(result="mutated").inc()
    log.info("pod rewritten namespace=%s pod=%s resources=%s", namespace, name, mutation.summary)
    return _response(uid, True, patch=list(mutation.patch))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 15

    def do_POST(self) -> None:
        if self.path.split("?")[0] != MUTATE_PODS_PATH:
            self._send(404, {"message": f"no webhook at {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            self._send(400, {"message": f"Content-Length {length} out of range"})
            return
        try:
            review = json.loads(self.rfile.read(length))
        except ValueError as e:
            self._send(400, {"message": f"body is not JSON: {e}"})
            return
        try:
            with self.server.metrics.admission_seconds.time():
                answer = review_pod(review, self.server.writer, self.server.metrics)
        except NotAReview as e:
            self._send(400, {"message": str(e)})
            return
        except Exception as e:  # an answer, never a dropped connection
            log.exception("pod review crashed peer=%s", self.client_address[0])
            self._send(500, {"message": f"tranche controller: {type(e).__name__}: {e}"})
            return
        self._send(200, answer)

    def _send(self, status: int, body: Json) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook request %s", format % args)


class _Server(HttpServer):
    def __init__(
        self,
        address: tuple[str, int],
        tls: WebhookTls,
        writer: TemplateWriter,
        metrics: ControllerMetrics,
    ) -> None:
        self.tls, self.writer, self.metrics = tls, writer, metrics
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        ctx = self.tls.context()
        if ctx is None:
            sock.close()
            raise OSError("no serving certificate yet")
        # The handshake runs on the first read, in the request's own thread.
        return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("webhook connection failed peer=%s", client_address)


class WebhookServer:
    """The HTTPS server in a background thread, and the writer of the templates it names."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: WebhookTls,
        api: client.ApiClient,
        metrics: ControllerMetrics,
        *,
        template_interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.templates = TemplateWriter(api, template_interval_s, metrics)
        self._server = _Server((host, port), tls, self.templates, metrics)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-server", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self.templates.start()
        self._thread.start()
        log.info("webhook server listening port=%d path=%s", self.port, MUTATE_PODS_PATH)

    def stop(self) -> None:
        """Stop serving and close the socket; also after a start that never happened."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()
        self.templates.stop()
