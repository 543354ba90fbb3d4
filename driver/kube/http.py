"""A thin Kubernetes API client over ``http.client``: JSON requests and watches.

The kubelet plugin talks to the API server only through this module, so its process
never imports the generated ``kubernetes`` client (about 44 MiB of model classes).
Objects stay raw JSON, so fields newer than any client library are never lost.

* :meth:`KubeClient.request` answers the decoded JSON object; an HTTP error status is an
  :class:`ApiError` (``status``, ``reason``, ``body``, the ``Status`` ``message``).
* :meth:`KubeClient.send` answers every status as a :class:`RawAnswer`.
* :meth:`KubeClient.watch` streams a watch's events, one decoded JSON object each.
* A transport failure (refused, reset, timed out, TLS) is an :class:`ApiUnreachable`,
  a :class:`driver.errors.ApiUnavailable`.

A bearer token from a file (the in-cluster service account token, which the kubelet
rotates) is read again every ``token_refresh_s`` seconds. Connections are kept alive and
reused (:mod:`driver.kube.connections`); a watch has a connection of its own.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from driver.errors import ApiUnavailable, ConfigError, TrancheError
from driver.kube.connections import TRANSPORT_ERRORS, ConnectionPool, shut_down
from driver.kube.json_doc import JsonTooDeep, decode_object, undecodable
from driver.kube.kubeconfig import Credentials, choose, read, unusable

log = logging.getLogger(__name__)

__all__ = [
    "RESOURCE_V1",
    "ApiError",
    "ApiUnreachable",
    "JsonTooDeep",
    "KubeClient",
    "RawAnswer",
    "Watch",
    "undecodable",
]

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
TOKEN_REFRESH_S = 60.0
POOL_SIZE = 16
READ_SIZE = 64 * 1024  # a watch's read: what has arrived, up to this
Json = dict[str, Any]


@dataclass(frozen=True)
class RawAnswer:
    """The API server's answer to one request, undecoded."""

    status: int
    reason: str
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299

    def json(self) -> Json:
        """The body as a JSON object (``{}`` when empty), nesting bounded
        (:func:`driver.kube.json_doc.decode_object`: a list's too-deep item is marked, read
        it with :func:`undecodable`); ValueError (:class:`JsonTooDeep` included, naming the
        object and field) when it is not one. Never RecursionError."""
        return decode_object(self.body)

    def message(self) -> str:
        """The ``message`` of a ``Status`` answer, else the start of the body."""
        with contextlib.suppress(ValueError, LookupError, TypeError):
            return str(decode_object(self.body)["message"])
        return self.body.decode(errors="replace")[:300]


class ApiError(TrancheError):
    """The API server answered an error status. ``body`` is the answer as text, ``message``
    the ``Status`` message (else the start of the body)."""

    def __init__(self, method: str, path: str, answer: RawAnswer) -> None:
        self.status = answer.status
        self.reason = answer.reason
        self.body = answer.body.decode(errors="replace")
        self.message = answer.message()
        super().__init__(f"{method} {path}: HTTP {self.status} {self.reason}: {self.message}")


class ApiUnreachable(ApiUnavailable):
    """No answer from the API server; ``detail`` is the transport error."""

    def __init__(self, method: str, path: str, server: str, error: BaseException) -> None:
        self.detail = f"{type(error).__name__}: {error}"
        super().__init__(f"{method} {path}: the API server {server} is unreachable ({self.detail})")


class KubeClient:
    """One API server and its credentials; thread-safe; :meth:`close` releases connections."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        pool_size: int = POOL_SIZE,
        token_refresh_s: float = TOKEN_REFRESH_S,
    ) -> None:
        self.server = credentials.server.rstrip("/")
        self._creds = credentials
        self._token_refresh_s = token_refresh_s
        self._token_lock = threading.Lock()
        self._token: tuple[float, str | None] = (-1.0, credentials.token)
        tls = self.server.startswith("https:")
        self._pool = ConnectionPool(
            self.server,
            size=pool_size,
            context=_ssl_context(credentials) if tls else None,
            server_hostname=credentials.tls_server_name,
        )

    @classmethod
    def connect(
        cls,
        kubeconfig: str | Path | None,
        *,
        flag: str = "--kubeconfig",
        environ: Mapping[str, str] | None = None,
    ) -> KubeClient:
        """A client for the kubeconfig the selection rule picks (:mod:`driver.kube.kubeconfig`);
        ConfigError naming ``flag`` or the file when there is none usable, or when its server
        is not a URL or its CA, client certificate or key does not load (naming the field)."""
        env = os.environ if environ is None else environ
        choice = choose(kubeconfig, flag=flag, environ=env)
        credentials = read(choice, env)
        try:
            return cls(credentials)
        except (ValueError, OSError) as e:  # ssl.SSLError is an OSError
            raise ConfigError(unusable(choice, e)) from e

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
        accept: str = "application/json",
    ) -> RawAnswer:
        """One request; every HTTP status comes back as an answer. ``accept``: the answer's
        format (``application/vnd.kubernetes.protobuf`` for :mod:`driver.kube.wire`)."""
        target = self._target(path, query)
        headers = self._headers(content_type if body is not None else None, accept)
        conn = self._pool.take(timeout_s)
        try:
            conn.request(method, target, body=_encode(body), headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except TRANSPORT_ERRORS as e:
            conn.close()
            raise ApiUnreachable(method, path, self.server, e) from e
        except BaseException:
            conn.close()
            raise
        self._pool.give_back(conn, resp)
        return RawAnswer(resp.status, str(resp.reason or ""), data)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Json:
        """The answer as a JSON object (``{}`` when empty). ApiError for an error status,
        ApiUnreachable without an answer, ValueError when the answer is not a JSON object."""
        answer = self.send(
            method, path, body=body, query=query, content_type=content_type, timeout_s=timeout_s
        )
        if not answer.ok:
            raise ApiError(method, path, answer)
        return answer.json()

    def watch(
        self,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        timeout_s: int = 300,
        connect_timeout_s: float = 10.0,
    ) -> Watch:
        """Open a watch of the collection at ``path``; the server ends it after ``timeout_s``."""
        params = {**(query or {}), "watch": "true", "timeoutSeconds": str(timeout_s)}
        target = self._target(path, params)
        headers = self._headers(None)
        conn = self._pool.new(connect_timeout_s)
        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s + 10.0)
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
            if not 200 <= resp.status <= 299:
                answer = RawAnswer(resp.status, str(resp.reason or ""), resp.read())
                conn.close()
                raise ApiError("WATCH", path, answer)
        except TRANSPORT_ERRORS as e:
            conn.close()
            raise ApiUnreachable("WATCH", path, self.server, e) from e
        except BaseException:
            conn.close()
            raise
        return Watch(conn, resp, path, self.server)

    def _target(self, path: str, query: Mapping[str, str] | None) -> str:
        return f"{self._pool.prefix}{path}" + (f"?{urlencode(query)}" if query else "")

    def _headers(
        self, content_type: str | None, accept: str = "application/json"
    ) -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type is not None:
            headers["Content-Type"] = content_type
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _bearer(self) -> str | None:
        path = self._creds.token_file
        if path is None:
            return self._creds.token
        with self._token_lock:
            read_at, token = self._token
            now = time.monotonic()
            if read_at < 0 or now - read_at >= self._token_refresh_s:
                try:
                    token = Path(path).read_text().strip() or token
                except OSError as e:  # keep the last token; the next request tries again
                    log.warning("token file unreadable path=%s error=%s", path, e)
                    if token is None:
                        raise ApiUnavailable(f"bearer token file {path}: {e}") from e
                else:
                    self._token = (now, token)
            return token


class Watch:
    """The events of one watch, each a decoded JSON object (``type``, ``object``).

    Iterate in one thread; :meth:`close` from any thread ends the iteration quietly.
    Lines that are not JSON objects are skipped. The watch has its connection to itself;
    the iterating thread closes it when the iteration ends, :meth:`close` when none runs.
    """

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        path: str,
        server: str,
    ) -> None:
        self._conn = conn
        self._resp = response
        self._path = path
        self._server = server
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._reading = False

    def __iter__(self) -> Iterator[Json]:
        with self._lock:
            if self._closed.is_set():
                return
            self._reading = True
        pending = b""
        try:
            while chunk := self._resp.read1(READ_SIZE):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    event = _event(line)
                    if event is not None:
                        yield event
                if self._closed.is_set():
                    return
            event = _event(pending)
            if event is not None:
                yield event
        except (*TRANSPORT_ERRORS, ValueError) as e:
            if self._closed.is_set():
                return
            raise ApiUnreachable("WATCH", self._path, self._server, e) from e
        finally:
            with self._lock:
                self._reading = False
                self._closed.set()
            self._conn.close()

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            reading = self._reading
        shut_down(self._conn)
        if not reading:
            self._conn.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()


def _event(line: bytes) -> Json | None:
    line = line.strip()
    if not line:
        return None
    try:
        event = decode_object(line)
    except JsonTooDeep as e:
        log.warning("watch event skipped error=%s", e)
        return None
    except ValueError:
        log.debug("watch line is not JSON line=%r", line[:200])
        return None
    obj = event.get("object")
    note = undecodable(obj) if isinstance(obj, dict) else None
    if note is not None:
        log.warning("watch event skipped error=%s", note)
        return None
    return event


def _encode(body: object) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    return json.dumps(body, separators=(",", ":")).encode()


def _ssl_context(creds: Credentials) -> ssl.SSLContext:
    """The TLS settings of ``creds``; ValueError naming the CA, certificate or key field (and
    its file) that does not load."""
    try:
        ctx = ssl.create_default_context(cafile=creds.ca_file, cadata=creds.ca_data)
    except OSError as e:  # ssl.SSLError included
        ca = _pem_field("certificate-authority", creds.ca_data, creds.ca_file)
        raise ValueError(f"{ca}: not a readable PEM CA certificate: {_reason(e)}") from e
    if creds.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert, key = creds.cert_data or creds.cert_file, creds.key_data or creds.key_file
    if cert and key:
        try:
            with (
                _pem_path(creds.cert_data, creds.cert_file) as c,
                _pem_path(creds.key_data, creds.key_file) as k,
            ):
                ctx.load_cert_chain(c, k)
        except OSError as e:
            pair = " and ".join(
                (
                    _pem_field("client-certificate", creds.cert_data, creds.cert_file),
                    _pem_field("client-key", creds.key_data, creds.key_file),
                )
            )
            raise ValueError(f"{pair}: not a readable PEM certificate and key: {_reason(e)}") from e
    return ctx


def _pem_field(field: str, data: str | None, path: str | None) -> str:
    """How an error names a kubeconfig field: ``field-data``, or ``field PATH``."""
    named = ([f"{field}-data"] if data else []) + ([f"{field} {path}"] if path else [])
    return ", ".join(named)


def _reason(e: OSError) -> str:
    """An OSError's reason without its errno; an SSLError's as OpenSSL gives it."""
    return str(e) if isinstance(e, ssl.SSLError) or not e.strerror else e.strerror


@contextlib.contextmanager
def _pem_path(data: str | None, path: str | None) -> Iterator[str]:
    """A file name for PEM ``data`` (``ssl`` loads keys only from files): an anonymous
    in-memory file where Linux has them, else a private temporary file; removed after."""
    if data is None:
        if path is None:
            raise ValueError("no PEM data and no file")
        yield path
        return
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tranche-pem")
        try:
            os.write(fd, data.encode())
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, name = tempfile.mkstemp(prefix="tranche-pem-")
    try:
        os.write(fd, data.encode())
        os.close(fd)
        yield name
    finally:
        Path(name).unlink()
