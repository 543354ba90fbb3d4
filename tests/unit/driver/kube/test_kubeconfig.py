"""Finding the API server and credentials without the kubernetes client: kubeconfig
contexts, data and files, the in-cluster service account, and the selection rule."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.errors import ApiUnavailable, ConfigError
from driver.kube.http import ApiUnreachable, KubeClient
from driver.kube.kubeconfig import Credentials, load

CA = "-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write(tmp_path: Path, doc: dict[str, Any], name: str = "kubeconfig") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def config(
    current: str = "work", user: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://other:6443"}},
            {"name": "main", "cluster": {"server": "https://10.0.0.1:6443/", **(cluster or {})}},
        ],
        "users": [{"name": "me", "user": user or {"token": "t0ken"}}],
        "contexts": [
            {"name": "home", "context": {"cluster": "other", "user": "me"}},
            {"name": "work", "context": {"cluster": "main", "user": "me"}},
        ],
        "current-context": current,
    }


def test_the_current_context_picks_cluster_and_user(tmp_path: Path) -> None:
    creds = load(
        write(tmp_path, config(cluster={"certificate-authority-data": b64(CA)})), environ={}
    )
    assert creds == Credentials(server="https://10.0.0.1:6443", ca_data=CA, token="t0ken")
    assert load(write(tmp_path, config("home")), environ={}).server == "https://other:6443"


def test_files_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    user = {"client-certificate": "pki/me.crt", "client-key": "/abs/me.key", "tokenFile": "tok"}
    doc = config(user=user, cluster={"certificate-authority": "pki/ca.crt"})
    creds = load(write(tmp_path, doc), environ={})
    assert creds.ca_file == str(tmp_path / "pki/ca.crt")
    assert creds.cert_file == str(tmp_path / "pki/me.crt")
    assert creds.key_file == "/abs/me.key"
    assert creds.token_file == str(tmp_path / "tok")
    assert creds.token is None


def test_insecure_and_server_name_are_kept(tmp_path: Path) -> None:
    doc = config(cluster={"insecure-skip-tls-verify": True, "tls-server-name": "kubernetes"})
    creds = load(write(tmp_path, doc), environ={})
    assert creds.insecure
    assert creds.tls_server_name == "kubernetes"


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"apiVersion": "v1"}, "current-context is not set"),
        (config("nowhere"), "context 'nowhere' is not in contexts"),
        (config(user={"exec": {"command": "aws"}}), "user 'me': exec credentials"),
        (config(user={"username": "a", "password": "b"}), "username credentials"),
        (config(cluster={"certificate-authority-data": "%%%"}), "not base64-encoded PEM"),
    ],
)
def test_an_unusable_kubeconfig_names_the_flag_the_file_and_the_problem(
    tmp_path: Path, doc: dict[str, Any], says: str
) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError, match=f"--kubeconfig {path}: cannot build") as e:
        load(path, environ={})
    assert says in str(e.value)


def test_a_file_that_is_not_yaml_names_the_flag_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: [\n  {name: main\n")
    with pytest.raises(ConfigError, match=f"--kubeconfig {path}: cannot build") as e:
        load(path, environ={})
    assert "expected ',' or '}'" in str(e.value)


def test_a_json_kubeconfig_reads_as_its_yaml_twin(tmp_path: Path) -> None:
    doc = config(cluster={"certificate-authority-data": b64(CA)})
    as_json = tmp_path / "kubeconfig.json"
    as_json.write_text(json.dumps(doc, indent=2))
    assert load(as_json, environ={}) == load(write(tmp_path, doc), environ={})


def test_a_cluster_without_a_server_is_refused(tmp_path: Path) -> None:
    doc = config()
    doc["clusters"][1]["cluster"] = {}
    with pytest.raises(ConfigError, match="cluster 'main' has no server"):
        load(write(tmp_path, doc), environ={})


def test_a_missing_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--kube-api: file '.*/nope' does not exist"):
        load(tmp_path / "nope", flag="--kube-api", environ={})


def test_without_a_flag_KUBECONFIG_then_the_default_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, config("home"))
    assert load(None, environ={"KUBECONFIG": str(path)}).server == "https://other:6443"
    with pytest.raises(ConfigError, match="no --kubeconfig, not in a cluster") as e:
        load(None, environ={"KUBECONFIG": str(tmp_path / "absent")})
    assert str(tmp_path / "absent") in str(e.value)


def service_account(tmp_path: Path, token: str = "sa-token") -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_text(CA)
    return sa


def test_in_a_pod_the_service_account_is_used(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = load(None, environ=env, service_account_dir=sa)
    assert creds == Credentials(
        "https://10.96.0.1:443", ca_file=str(sa / "ca.crt"), token_file=str(sa / "token")
    )
    v6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert load(None, environ=v6, service_account_dir=sa).server == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("env", "token", "says"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "x", "KUBERNETES_SERVICE_PORT must both be set"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, "", "is empty"),
    ],
)
def test_an_incomplete_pod_environment_is_a_config_error(
    tmp_path: Path, env: dict[str, str], token: str, says: str
) -> None:
    sa = service_account(tmp_path, token)
    with pytest.raises(ConfigError, match="in-cluster configuration: cannot build") as e:
        load(None, environ=env, service_account_dir=sa)
    assert says in str(e.value)


def test_a_pod_without_a_service_account_token_is_a_config_error(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match=r"in-cluster configuration: .*/token does not exist"):
        load(None, environ=env, service_account_dir=tmp_path)


def test_no_answer_is_api_unavailable_naming_the_request_and_server() -> None:
    with KubeClient(Credentials("https://127.0.0.1:9")) as kube, pytest.raises(ApiUnavailable) as e:
        kube.request("GET", "/api/v1/nodes/n1", timeout_s=2)
    assert isinstance(e.value, ApiUnreachable)
    assert str(e.value).startswith(
        "GET /api/v1/nodes/n1: the API server https://127.0.0.1:9 is unreachable ("
    )
    assert "Connection refused" in e.value.detail


def test_a_token_file_that_cannot_be_read_is_api_unavailable(tmp_path: Path) -> None:
    creds = Credentials("https://127.0.0.1:9", token_file=str(tmp_path / "gone"))
    with (
        KubeClient(creds) as kube,
        pytest.raises(ApiUnavailable, match=r"bearer token file .*/gone"),
    ):
        kube.request("GET", "/api", timeout_s=2)
