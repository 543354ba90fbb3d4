"""Building the Kubernetes client every command uses, and reading raw answers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from driver.errors import ConfigError
from driver.kube.client import RawAnswer, api_client


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_the_named_kubeconfig_is_used(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "https://10.1.2.3:6443")
    with api_client(path, environ={}) as api:
        assert api.configuration.host == "https://10.1.2.3:6443"


def test_a_missing_kubeconfig_names_the_flag_and_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--kubeconfig: file '.*/nope' does not exist"):
        api_client(tmp_path / "nope", environ={})


def test_an_unusable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(ConfigError, match=f"--kubeconfig {path}: cannot build"):
        api_client(path, environ={})


def test_outside_a_cluster_KUBECONFIG_is_the_fallback(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "https://10.9.9.9:6443")
    with api_client(None, environ={"KUBECONFIG": str(path)}) as api:
        assert api.configuration.host == "https://10.9.9.9:6443"


def test_outside_a_cluster_without_any_kubeconfig_the_error_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(ConfigError, match="no --kubeconfig, not in a cluster") as e:
        api_client(None, environ={"KUBECONFIG": str(missing)})
    assert str(missing) in str(e.value)


def test_inside_a_pod_without_a_service_account_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="in-cluster configuration"):
        api_client(None, environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


def test_a_status_answer_gives_its_message() -> None:
    status = b'{"kind":"Status","message":"resourceslices is forbidden","code":403}'
    assert RawAnswer(403, "Forbidden", status).message() == "resourceslices is forbidden"
    assert RawAnswer(502, "Bad Gateway", b"<html>proxy</html>").message() == "<html>proxy</html>"
    assert not RawAnswer(502, "Bad Gateway", b"").ok
    assert RawAnswer(200, "OK", b"").json() == {}
