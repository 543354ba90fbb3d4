"""The list-then-watch loop behind the plugin's views of API objects.

:class:`ListWatch` runs one thread. It lists a collection (narrowed by a field selector),
hands the items to :meth:`ListWatch._listed`, then watches from the list's
``resourceVersion`` and hands each change to :meth:`ListWatch._changed`; when the server
ends a watch (its ``timeoutSeconds``), the next one resumes from the last version seen
(or, with ``resync``, the loop lists again).
Any failure (an API error, a ``410 Gone`` ERROR event, a broken connection, an answer
that is not JSON) calls :meth:`ListWatch._forget` and :meth:`ListWatch._failed`, and the
loop relists after an exponential back-off, for as long as the plugin runs. A refusal
(401, 403: the service account lacks ``list`` or ``watch``) is logged once, as an error
saying what is missing (:meth:`ListWatch._refusal`), until a list succeeds again: it lasts
until someone changes RBAC, and a warning at every retry would bury it.
:meth:`ListWatch.stop` ends the thread, closing a watch in progress from outside.

Subclasses: the namespace labels of the trust check (``namespace_cache``), this node's
pods for runtime errors (``runtime_errors``), this node's Node for the dynamic-MIG label
(``node_labels``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from driver.kube.http import ApiError, KubeClient, Watch
from kubelet_plugin.publisher import Backoff

log = logging.getLogger(__name__)

Json = dict[str, Any]
CHANGES = ("ADDED", "MODIFIED", "DELETED")


class WatchEnded(Exception):
    """The watch sent an ERROR event (``410 Gone``: its version is too old); relist."""


class ListWatch:
    """List ``path`` once, then watch it; see the module. ``start()`` runs the thread."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        query: Mapping[str, str] | None = None,
        *,
        thread_name: str,
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        watch_seconds: int = 300,
        resync: bool = False,
    ) -> None:
        """``resync``: list again after every watch the server ends, not only after a
        failure (every ``watch_seconds``), so that each object is seen again."""
        self._kube = kube
        self._path = path
        self._query = dict(query or {})
        self._thread_name = thread_name
        self._backoff = backoff or Backoff()
        self._timeout_s = request_timeout_s
        self._watch_seconds = watch_seconds
        self._resync = resync
        self._version = ""  # of the last list or event; empty: list next
        self._refused = False  # the last failure was a refusal, already logged
        self._stop = threading.Event()
        self._watch_lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    # what a subclass does with what it sees -----------------------------------------

    def _listed(self, items: list[Json], version: str) -> None:
        """The whole collection at ``version``, at the start and after each failure; by
        default each item goes to :meth:`_seen`."""
        for item in items:
            self._seen(item)

    def _changed(self, kind: str, obj: Json) -> None:
        """One ADDED, MODIFIED or DELETED object; by default an object that is still there
        goes to :meth:`_seen`."""
        if kind != "DELETED":
            self._seen(obj)

    def _seen(self, obj: Json) -> None:
        """One object as it is now (listed, added or modified), for a subclass that judges
        each object alone."""

    def _forget(self) -> None:
        """After a failure, before the relist (also when stopping)."""

    def _failed(self, e: Exception) -> None:
        log.warning("watch failed; relisting path=%s error=%s", self._path, describe(e))

    def _refusal(self) -> str:
        """What a refused list or watch means here (logged once with the error)."""
        return f"watch refused: the plugin's service account needs list and watch on {self._path}"

    def watching(self) -> bool:
        """True while the thread has the collection listed and follows its changes: not
        before the first list, not from a failure (a refusal included) until the relist
        succeeds, not once stopped."""
        return bool(self._version) and self._thread is not None and not self._stop.is_set()

    # the thread ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._close_watch()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._version:
                    self._list()
                self._watch_once()
                self._backoff.reset()
                if self._resync:
                    self._version = ""
            except Exception as e:  # the loop must outlive any API or decoding failure
                self._version = ""
                self._forget()
                if self._stop.is_set():
                    return
                if isinstance(e, ApiError) and e.status in (401, 403):
                    if not self._refused:  # once: it stays refused until RBAC changes
                        log.error("%s error=%s", self._refusal(), describe(e))
                    self._refused = True
                else:
                    self._failed(e)
                self._stop.wait(self._backoff.next())
            finally:
                self._close_watch()

    def _list(self) -> None:
        listed = self._kube.request(
            "GET", self._path, query=self._query or None, timeout_s=self._timeout_s
        )
        items = listed.get("items")
        meta = listed.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(version, str) or not version:
            raise ValueError(f"the list of {self._path} has no metadata.resourceVersion")
        found = [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
        self._refused = False
        self._listed(found, version)
        self._version = version

    def _watch_once(self) -> None:
        """One watch from the last version seen; returns when the server ends it."""
        if self._stop.is_set():
            return
        watch = self._kube.watch(
            self._path,
            {**self._query, "resourceVersion": self._version, "allowWatchBookmarks": "true"},
            timeout_s=self._watch_seconds,
            connect_timeout_s=self._timeout_s,
        )
        with self._watch_lock:
            self._watch = watch
        if self._stop.is_set():
            return
        for event in watch:
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                raise WatchEnded(
                    f"watch ended by the API server: HTTP {obj.get('code')} {obj.get('message')}"
                )
            meta = obj.get("metadata")
            version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
            if isinstance(kind, str) and kind in CHANGES:
                self._changed(kind, obj)
            if isinstance(version, str) and version:
                self._version = version

    def _close_watch(self) -> None:
        with self._watch_lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


def describe(e: BaseException) -> str:
    """An API error as its status and message, anything else as its type and text."""
    if isinstance(e, ApiError):
        return f"HTTP {e.status}: {e.message}"
    return f"{type(e).__name__}: {e}"
