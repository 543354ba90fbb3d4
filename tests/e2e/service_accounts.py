"""A service account of a test namespace, and credentials that act as it on the real API
server: what a plugin with less RBAC than the chart's sees."""

from __future__ import annotations

from pathlib import Path

from driver.kube.http import KubeClient
from driver.kube.kubeconfig import Credentials, from_file
from tests.e2e.conftest import Cluster


def service_account_credentials(
    cluster: Cluster, kube: KubeClient, namespace: str, workdir: Path, name: str = "plugin"
) -> Credentials:
    """Create service account ``name`` in ``namespace`` (``kube``: an admin client) and
    return credentials with a token of it, the CA and token written to ``workdir``."""
    admin = from_file(Path(cluster.kubeconfig))
    ca = workdir / "ca.crt"
    ca.write_text(admin.ca_data or "")
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
    )
    token = workdir / "token"
    token.write_text(
        kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"},
        )["status"]["token"]
    )
    return Credentials(cluster.server, ca_file=str(ca), token_file=str(token))
