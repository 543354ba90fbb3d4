"""Node objects the scheduler binds pods to, without a kubelet.

A Node created with ``status`` already set is accepted as is (the API server
keeps status on create). With ``TaintNodesByCondition`` admission disabled and
no node-lifecycle controller, the node stays Ready and untainted.
"""

from __future__ import annotations

import datetime

from kubernetes import client

DEFAULT_ALLOCATABLE = {"cpu": "16", "memory": "64Gi", "pods": "110"}


def node_body(name: str, labels: dict[str, str] | None = None) -> client.V1Node:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **(labels or {}),
    }
    conditions = [
        client.V1NodeCondition(
            type="Ready",
            status="True",
            reason="KubeletReady",
            message="simulated node (no kubelet)",
            last_heartbeat_time=now,
            last_transition_time=now,
        )
    ]
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=all_labels),
        spec=client.V1NodeSpec(),
        status=client.V1NodeStatus(
            capacity=dict(DEFAULT_ALLOCATABLE),
            allocatable=dict(DEFAULT_ALLOCATABLE),
            conditions=conditions,
            addresses=[client.V1NodeAddress(type="InternalIP", address="127.0.0.1")],
        ),
    )


def add_node(api: client.ApiClient, name: str, labels: dict[str, str] | None = None) -> None:
    """Create a Ready node called ``name``; status is set on create."""
    core = client.CoreV1Api(api)
    created = core.create_node(node_body(name, labels))
    conditions = created.status.conditions if created.status else None
    if not any(c.type == "Ready" and c.status == "True" for c in conditions or []):
        raise RuntimeError(f"node {name}: the API server dropped status.conditions on create")


def delete_node(api: client.ApiClient, name: str) -> None:
    client.CoreV1Api(api).delete_node(name)
