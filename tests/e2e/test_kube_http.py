"""The plugin's thin API client on the real API server: requests and their errors, a
watch that can be closed from another thread, and a rotating service-account token."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from driver.kube.http import ApiError, ApiUnreachable, JsonTooDeep, KubeClient, undecodable
from driver.kube.kubeconfig import Credentials, from_file
from tests.e2e.conftest import Cluster
from tests.e2e.tcp_relay import TcpRelay
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_requests_answer_json_and_errors_carry_the_status_message(
    cluster: Cluster, namespace: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    with cluster.kube() as kube:
        made = kube.request("POST", base, body=configmap("one", a="1"))
        assert made["metadata"]["uid"]
        patched = kube.request(
            "PATCH",
            f"{base}/one",
            body={"data": {"b": "2"}},
            content_type="application/merge-patch+json",
        )
        assert patched["data"] == {"a": "1", "b": "2"}
        listed = kube.request("GET", base, query={"fieldSelector": "metadata.name=one"})
        assert [i["metadata"]["name"] for i in listed["items"]] == ["one"]

        with pytest.raises(ApiError) as missing:
            kube.request("GET", f"{base}/two")
        assert (missing.value.status, missing.value.reason) == (404, "Not Found")
        assert missing.value.message == 'configmaps "two" not found'
        assert '"kind":"Status"' in missing.value.body

        with pytest.raises(ApiError) as invalid:
            kube.request("POST", base, body=configmap("Bad_Name"))
        assert invalid.value.status == 422
        assert "Bad_Name" in invalid.value.message

        answer = kube.send("DELETE", f"{base}/two")
        assert (answer.ok, answer.status) == (False, 404)
        assert kube.send("DELETE", f"{base}/one").ok


def test_a_watch_streams_events_and_closes_from_another_thread(
    cluster: Cluster, namespace: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    seen: list[tuple[str, str]] = []
    ended = threading.Event()
    with cluster.kube() as kube, kube.watch(base, timeout_s=120) as watch:

        def consume() -> None:
            for event in watch:
                seen.append((event["type"], event["object"]["metadata"]["name"]))
            ended.set()

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        kube.request("POST", base, body=configmap("watched"))
        kube.request("DELETE", f"{base}/watched")
        wait_for("the deletion to be watched", lambda: ("DELETED", "watched") in seen)
        # the namespace's own kube-root-ca.crt (the controller-manager's root-CA publisher)
        # may show up too; ours are the events of "watched", in order
        assert [s for s in seen if s[1] == "watched"] == [
            ("ADDED", "watched"),
            ("DELETED", "watched"),
        ]
        watch.close()
        assert ended.wait(30), "closing the watch did not end its iteration"


def test_a_watch_refused_by_the_api_server_is_an_api_error(cluster: Cluster) -> None:
    with cluster.kube() as kube, pytest.raises(ApiError) as e:
        kube.watch("/api/v1/namespaces/x/nosuchthings")
    assert e.value.status == 404


def _token(kube: KubeClient, namespace: str, account: str) -> str:
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    got = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    return str(got["status"]["token"])


def _whoami(kube: KubeClient) -> str:
    review = kube.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


def test_a_rotated_token_file_is_read_again(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """As in a pod: CA file and token file; the kubelet replaces the token file."""
    admin = from_file(Path(cluster.kubeconfig))
    ca = tmp_path / "ca.crt"
    ca.write_text(admin.ca_data or "")
    token = tmp_path / "token"
    with cluster.kube() as kube:
        token.write_text(_token(kube, namespace, "first"))
        second = _token(kube, namespace, "second")
    creds = Credentials(cluster.server, ca_file=str(ca), token_file=str(token))
    with KubeClient(creds, token_refresh_s=0) as pod:
        assert _whoami(pod) == f"system:serviceaccount:{namespace}:first"
        token.write_text(second)
        assert _whoami(pod) == f"system:serviceaccount:{namespace}:second"
    with KubeClient(creds, token_refresh_s=3600) as cached:
        assert _whoami(cached) == f"system:serviceaccount:{namespace}:second"
        token.write_text("garbage")
        assert _whoami(cached) == f"system:serviceaccount:{namespace}:second"


def test_a_claim_nested_too_deep_fails_alone_and_a_list_names_it(
    cluster: Cluster, namespace: str
) -> None:
    """4 KiB of nested arrays in a claim's opaque parameters: the API server stores it; the
    client refuses that claim by name and lists the others."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"

    def claim(name: str, parameters: bytes) -> bytes:
        return (
            b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"'
            + name.encode()
            + b'"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":'
            b'"gpu.tranche.dev"}}],"config":[{"requests":["gpu"],"opaque":{"driver":'
            b'"gpu.tranche.dev","parameters":{"deep":' + parameters + b"}}}]}}}"
        )

    with cluster.kube() as kube:
        for name, parameters in (("ok", b"[]"), ("deep", b"[" * 2048 + b"]" * 2048)):
            made = kube.send("POST", base, body=claim(name, parameters))
            assert made.status == 201, made.message()
        with pytest.raises(JsonTooDeep) as info:
            kube.request("GET", f"{base}/deep")
        assert str(info.value).startswith(
            f"ResourceClaim {namespace}/deep: spec.devices.config[0].opaque.parameters.deep[0]"
        )
        listed = kube.request("GET", base)
        notes = {i["metadata"]["name"]: undecodable(i) for i in listed["items"]}
        assert notes["ok"] is None
        assert (notes["deep"] or "").startswith(f"ResourceClaim {namespace}/deep: spec.devices")


def test_the_tls_server_name_is_the_name_checked_not_the_host_dialled(cluster: Cluster) -> None:
    """A kubeconfig's ``tls-server-name``: the server is dialled at its address and its
    certificate checked against that name (the dev cluster's is valid for ``kubernetes``)."""
    admin = from_file(Path(cluster.kubeconfig))
    server = cluster.server.replace("127.0.0.1", "localhost")
    named = replace(admin, server=server, tls_server_name="kubernetes")
    with KubeClient(named) as kube:
        assert kube.request("GET", "/version")["major"] == "1"
    wrong = replace(admin, tls_server_name="not-this-server.example")
    with KubeClient(wrong) as kube, pytest.raises(ApiUnreachable, match="certificate verify"):
        kube.request("GET", "/version")


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Kept-alive connections are reused; one the server (here a relay standing for it)
    dropped while idle is replaced, and the next request is answered."""
    admin = from_file(Path(cluster.kubeconfig))
    relay = TcpRelay(cluster.server)
    relay.up()
    try:
        via = replace(admin, server=relay.url)
        with KubeClient(via) as kube:
            for _ in range(5):
                kube.request("GET", "/version")
            assert relay.accepted == 1
            relay.down()  # drops the kept-alive connection
            relay.up()
            assert kube.request("GET", "/version")["major"] == "1"
            assert relay.accepted == 2
    finally:
        relay.down()
