"""A readable summary of cluster state, attached to the report of a failed e2e test.

Objects are read as raw JSON (not the client's typed models) so that fields the
Python client does not know yet still show, and a dump never fails on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from driver.kube.client import send

_MAX_EVENTS = 60
_LOG_LINES = 60
_OWN_PODS = "app.kubernetes.io/part-of=tranche"

Obj = dict[str, Any]


def request_json(api: client.ApiClient, method: str, path: str, body: Obj | None = None) -> Obj:
    """Send ``body`` as JSON to ``path``; return the decoded answer, raise ApiException."""
    answer = send(api, method, path, body=body)
    if not answer.ok:
        raise client.ApiException(
            status=answer.status, reason=answer.reason, body=answer.body.decode()
        )
    return answer.json()


def get_json(api: client.ApiClient, path: str) -> Obj:
    """GET ``path`` and return the decoded JSON body."""
    return request_json(api, "GET", path)


def gone(api: client.ApiClient, path: str) -> bool:
    """Whether the object at ``path`` is gone (the API server answers 404)."""
    try:
        get_json(api, path)
    except client.ApiException as e:
        return bool(e.status == 404)
    return False


def _get(api: client.ApiClient, path: str) -> list[Obj]:
    items: list[Obj] = get_json(api, path).get("items") or []
    return items


def _name(o: Obj) -> str:
    md = o.get("metadata", {})
    ns = md.get("namespace")
    return f"{ns}/{md.get('name')}" if ns else str(md.get("name"))


def _pod(o: Obj) -> str:
    st = o.get("status", {})
    conds = [
        f"{c['type']}={c['status']}" + (f"({c.get('message')})" if c.get("message") else "")
        for c in st.get("conditions", [])
    ]
    deleting = " deleting" if o["metadata"].get("deletionTimestamp") else ""
    return (
        f"{_name(o)} phase={st.get('phase')} node={o.get('spec', {}).get('nodeName')}"
        f"{deleting} {' '.join(conds)}"
    )


def _claim(o: Obj) -> str:
    st = o.get("status", {})
    results = st.get("allocation", {}).get("devices", {}).get("results", [])
    devices = [f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results]
    reserved = [r.get("name") for r in st.get("reservedFor", [])]
    return f"{_name(o)} allocated={devices or '-'} reservedFor={reserved or '-'}"


def _slice(o: Obj) -> str:
    spec = o.get("spec", {})
    pool = spec.get("pool", {})
    names = [d.get("name") for d in spec.get("devices", [])]
    return (
        f"{_name(o)} driver={spec.get('driver')} node={spec.get('nodeName')} "
        f"pool={pool.get('name')}@{pool.get('generation')} devices={names}"
    )


def _event(o: Obj) -> str:
    inv = o.get("involvedObject", {})
    when = o.get("lastTimestamp") or o.get("eventTime") or ""
    return (
        f"{when} {o.get('type')} {inv.get('kind')}/{inv.get('namespace') or ''}/"
        f"{inv.get('name')} {o.get('reason')}: {o.get('message', '').strip()}"
    )


def _rule(o: Obj) -> str:
    spec = o.get("spec", {})
    return f"{_name(o)} selector={spec.get('deviceSelector')} taint={spec.get('taint')}"


def _node(o: Obj) -> str:
    taints = [f"{t['key']}:{t['effect']}" for t in o.get("spec", {}).get("taints", [])]
    return f"{_name(o)} taints={taints or '-'}"


_SECTIONS: tuple[tuple[str, str, Callable[[Obj], str]], ...] = (
    ("nodes", "/api/v1/nodes", _node),
    ("pods", "/api/v1/pods", _pod),
    ("resourceclaims", "/apis/resource.k8s.io/v1/resourceclaims", _claim),
    ("resourceslices", "/apis/resource.k8s.io/v1/resourceslices", _slice),
    ("devicetaintrules", "/apis/resource.k8s.io/v1/devicetaintrules", _rule),
)


def dump(api: client.ApiClient) -> str:
    """Nodes, pods, claims, slices, taint rules and the latest events, one line each."""
    out: list[str] = []
    for title, path, fmt in _SECTIONS:
        try:
            lines = [fmt(o) for o in _get(api, path)]
        except Exception as e:  # a dump must never hide the test's own failure
            lines = [f"(could not list: {e})"]
        out.append(f"--- {title} ({len(lines)})")
        out.extend(lines)
    try:
        events = sorted(
            _get(api, "/api/v1/events"),
            key=lambda o: str(o.get("lastTimestamp") or o.get("eventTime") or ""),
        )[-_MAX_EVENTS:]
        lines = [_event(o) for o in events]
    except Exception as e:
        lines = [f"(could not list: {e})"]
    out.append(f"--- events (last {len(lines)})")
    out.extend(lines)
    out.extend(_own_logs(api))
    return "\n".join(out)


def _own_logs(api: client.ApiClient) -> list[str]:
    """The last lines of every container of Tranche's own pods (an installed chart's plugin
    and controller), and of the run before a restart: what a failed chart test needs."""
    out: list[str] = []
    core = client.CoreV1Api(api)
    try:
        pods = core.list_pod_for_all_namespaces(label_selector=_OWN_PODS).items
    except Exception as e:  # a dump must never hide the test's own failure
        return [f"--- tranche pod logs (could not list: {e})"]
    for pod in pods:
        meta, status = pod.metadata, pod.status
        if meta is None or status is None or not meta.name or not meta.namespace:
            continue
        for container in status.container_statuses or []:
            for previous in [False] + ([True] if container.restart_count else []):
                title = f"{meta.namespace}/{meta.name}/{container.name}"
                title += " (before its restart)" if previous else ""
                try:
                    text = core.read_namespaced_pod_log(
                        meta.name,
                        meta.namespace,
                        container=container.name,
                        previous=previous,
                        tail_lines=_LOG_LINES,
                    )
                except Exception as e:
                    text = f"(could not read: {e})"
                out.append(f"--- logs of {title}, last {_LOG_LINES} lines")
                out.extend(str(text).splitlines())
    return out
