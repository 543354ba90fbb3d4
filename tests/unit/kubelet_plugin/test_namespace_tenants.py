"""Prepare applies the strictest level of every namespace of the claim's tenant, the
unlabelled namespace named after the tenant included (docs/trust.md, "Tenants and labels").

Both namespace readers are the plugin's own: the direct read and the watch cache, against
a :class:`KubeClient` whose transport answers from a table of namespaces (the real API
server is in ``tests/e2e/test_namespace_cache.py``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path

import pytest

from driver.errors import ApiUnavailable
from driver.faults import NO_FAULTS
from driver.kube.http import KubeClient, RawAnswer, Watch
from driver.kube.kubeconfig import Credentials
from driver.nvml.sim import create_state
from driver.trust.policy import LABEL_LEVEL, LABEL_TENANT
from kubelet_plugin.dra_driver import PluginDriver
from kubelet_plugin.namespace_cache import WatchedNamespaces
from kubelet_plugin.namespace_reader import ApiNamespaceReader, NamespaceReader
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.kubelet_plugin.test_trust import TS, Claims
from tests.unit.state_child import device_state

NAMESPACES = "/api/v1/namespaces"


class NamespaceKube(KubeClient):
    """Answers namespace reads and lists (``labelSelector`` ``k=v``) from ``namespaces``;
    the first watch delivers ``events``, then nothing until it is closed."""

    def __init__(
        self,
        namespaces: Mapping[str, Mapping[str, str]],
        events: list[dict[str, object]] | None = None,
    ) -> None:
        super().__init__(Credentials("https://127.0.0.1:9"))
        self._namespaces = namespaces
        self._events = events or []
        self.delivered = threading.Event()

    def send(self, method: str, path: str, **kw: object) -> RawAnswer:
        query = kw.get("query")
        if path == NAMESPACES:
            selector = dict(query or {}).get("labelSelector", "")  # type: ignore[call-overload]
            key, _, value = selector.partition("=")
            items = [
                _namespace(n, labels)
                for n, labels in self._namespaces.items()
                if not key or labels.get(key) == value
            ]
            return _answer(200, {"items": items, "metadata": {"resourceVersion": "1"}})
        name = path.removeprefix(NAMESPACES + "/")
        if name not in self._namespaces:
            return _answer(404, {"kind": "Status", "message": f'namespaces "{name}" not found'})
        return _answer(200, _namespace(name, self._namespaces[name]))

    def watch(self, path: str, query: Mapping[str, str] | None = None, **_: object) -> Watch:
        events, self._events = self._events, []
        return _IdleWatch(events, self.delivered)  # type: ignore[return-value]


class _IdleWatch:
    def __init__(self, events: list[dict[str, object]], delivered: threading.Event) -> None:
        self._events = events
        self._delivered = delivered
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, object]]:
        yield from self._events
        if self._events:
            self._delivered.set()
        self._closed.wait(30)

    def close(self) -> None:
        self._closed.set()


def _namespace(name: str, labels: Mapping[str, str]) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": dict(labels)}}


def _answer(status: int, body: object) -> RawAnswer:
    return RawAnswer(status, "OK" if status == 200 else "Not Found", json.dumps(body).encode())


def _direct(kube: KubeClient) -> Generator[NamespaceReader]:
    yield ApiNamespaceReader(kube)


def _cached(kube: KubeClient) -> Generator[WatchedNamespaces]:
    cache = WatchedNamespaces(kube, fallback=_Unused())
    cache.start()
    try:
        deadline = time.monotonic() + 10
        while not cache.synced and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.synced
        yield cache
    finally:
        cache.stop()


class _Unused:
    synced = False

    def tenant_labels(self, namespace: str) -> dict[str, Mapping[str, str]]:
        raise AssertionError(f"the cache read namespace {namespace} directly")


READERS: dict[str, Callable[[KubeClient], Generator[NamespaceReader]]] = {
    "direct": _direct,
    "cache": _cached,
}


def _prepare_share(
    tmp_path: Path, namespaces: Mapping[str, Mapping[str, str]], namespace: str, how: str
) -> str:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    obj = claim(
        "u1", [result(ds.inventory.gpus[0].name, shareID="s-1")], [config(TS)], namespace=namespace
    )
    kube = NamespaceKube(namespaces)
    readers = READERS[how](kube)
    driver = PluginDriver(ds, Claims(obj), next(readers))
    try:
        return driver.prepare([ref_of(obj)])["u1"].error
    finally:
        driver.close()
        readers.close()
        kube.close()


@pytest.mark.parametrize("how", READERS)
def test_the_unlabelled_namespace_named_after_the_tenant_makes_it_stricter(
    tmp_path: Path, how: str
) -> None:
    namespaces = {
        "acme": {},  # tenant acme, isolated by default
        "acme-train": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared"},
    }
    error = _prepare_share(tmp_path, namespaces, "acme-train", how)
    assert error.startswith(
        "claim acme-train/train: namespace acme-train has trust level isolated, which does not "
        "allow timeslice"
    )


@pytest.mark.parametrize("how", READERS)
def test_a_claim_in_the_unlabelled_namespace_gets_its_labelled_namespaces_level(
    tmp_path: Path, how: str
) -> None:
    namespaces = {
        "acme": {LABEL_LEVEL: "shared"},
        "acme-prod": {LABEL_TENANT: "acme", LABEL_LEVEL: "isolated"},
    }
    error = _prepare_share(tmp_path, namespaces, "acme", how)
    assert error.startswith(
        "claim acme/train: namespace acme has trust level isolated, which does not allow timeslice"
    )


@pytest.mark.parametrize("how", READERS)
def test_a_namespace_named_like_the_tenant_but_labelled_another_is_no_member(
    tmp_path: Path, how: str
) -> None:
    namespaces = {
        "acme": {LABEL_TENANT: "other"},  # isolated, but of tenant other
        "acme-train": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared"},
    }
    assert _prepare_share(tmp_path, namespaces, "acme-train", how) == ""


def test_the_direct_read_fails_closed_when_the_tenants_namespace_is_unreadable(
    tmp_path: Path,
) -> None:
    class Broken(NamespaceKube):
        def send(self, method: str, path: str, **kw: object) -> RawAnswer:
            if path == f"{NAMESPACES}/acme":
                return RawAnswer(500, "Internal Server Error", b"{}")
            return super().send(method, path, **kw)

    kube = Broken({"acme-train": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared"}})
    try:
        with pytest.raises(
            ApiUnavailable, match="namespace acme, of the tenant of namespace acme-tr"
        ):
            ApiNamespaceReader(kube).tenant_labels("acme-train")
    finally:
        kube.close()


def test_the_cache_follows_the_tenants_namespaces_as_they_change(tmp_path: Path) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    obj = claim(
        "u1",
        [result(ds.inventory.gpus[0].name, shareID="s-1")],
        [config(TS)],
        namespace="acme-train",
    )
    events: list[dict[str, object]] = [
        {"type": "ADDED", "object": _namespace("acme", {})},  # created later: isolated
        {"type": "MODIFIED", "object": _namespace("acme-dev", {LABEL_TENANT: "other"})},
    ]
    kube = NamespaceKube(
        {
            "acme-train": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared"},
            "acme-dev": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared"},
        },
        events,
    )
    readers = _cached(kube)
    cache = next(readers)
    driver = PluginDriver(ds, Claims(obj), cache)
    try:
        assert kube.delivered.wait(10)
        assert sorted(cache.tenant_labels("acme-train")) == ["acme", "acme-train"]
        error = driver.prepare([ref_of(obj)])["u1"].error
    finally:
        driver.close()
        readers.close()
        kube.close()
    assert "namespace acme-train has trust level isolated" in error
