"""The dev-cluster launcher's parts that need no control plane: flags, certificates,
and process clean-up that never touches a process it did not start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import ValidationError

from hack.devcluster.components import apiserver, controller_manager
from hack.devcluster.config import (
    ClusterConfig,
    Layout,
    Ports,
    parse_gates,
    parse_runtime_config,
)
from hack.devcluster.errors import ClusterError
from hack.devcluster.launcher import DevCluster
from hack.devcluster.pki import Pki, ensure_pki
from hack.devcluster.processes import alive, group_members, owned, stop_group


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("A=true", {"A": True}),
        ("A=true, B=False", {"A": True, "B": False}),
    ],
)
def test_parse_gates(text: str, expected: dict[str, bool]) -> None:
    assert parse_gates(text) == expected


@pytest.mark.parametrize("text", ["A", "A=yes", "A=true,=x"])
def test_parse_gates_names_the_flag_and_item(text: str) -> None:
    with pytest.raises(ValueError, match=r"--feature-gates: .* is not NAME=true\|false"):
        parse_gates(text)


def test_extra_gates_override_the_dra_defaults(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        state_dir=tmp_path,
        bin_dir=tmp_path,
        feature_gates={"DRAConsumableCapacity": False, "DRADerivedAttributes": True},
    )
    gates = dict(item.split("=") for item in cfg.gate_string().split(","))
    assert gates["DRAConsumableCapacity"] == "false"
    assert gates["DRADerivedAttributes"] == "true"
    assert gates["DRADeviceTaintRules"] == "true"


def test_bad_gate_name_is_rejected_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="feature_gates"):
        ClusterConfig(state_dir=tmp_path, bin_dir=tmp_path, feature_gates={"no-such gate": True})


def test_pki_chain_and_identities(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki")
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_cert.read_bytes())
    for cert in (server, admin):
        cert.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:masters"
    )
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    assert oct(pki.admin_key.stat().st_mode & 0o777) == "0o600"


def test_pki_is_reused_so_kubeconfigs_stay_valid(tmp_path: Path) -> None:
    first = ensure_pki(tmp_path).ca_cert.read_bytes()
    assert ensure_pki(tmp_path).ca_cert.read_bytes() == first


def test_stop_group_ends_the_whole_group(tmp_path: Path) -> None:
    # A shell that ignores SIGTERM and has a child: both must be gone afterwards.
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(proc.pid)) == 2
    stop_group(proc.pid, timeout_s=0.5)
    proc.wait(timeout=5)
    assert group_members(proc.pid) == []


def _cluster(tmp_path: Path) -> DevCluster:
    return DevCluster(ClusterConfig(state_dir=tmp_path, bin_dir=tmp_path / "bin"))


def test_down_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    layout = Layout(tmp_path.resolve())
    layout.pid_file("etcd").parent.mkdir(parents=True)
    layout.pid_file("etcd").write_text(f"{os.getpid()}\n")  # a recycled pid: this test
    assert _cluster(tmp_path).down() == []
    assert alive(os.getpid())
    assert not layout.pid_file("etcd").exists()


def test_down_stops_a_process_started_for_this_state_dir(tmp_path: Path) -> None:
    layout = Layout(tmp_path.resolve())
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(layout.root)],
        start_new_session=True,
    )
    layout.pid_file("kube-apiserver").parent.mkdir(parents=True)
    layout.pid_file("kube-apiserver").write_text(f"{proc.pid}\n")
    # Right after exec, /proc/<pid>/cmdline can still be empty.
    deadline = time.monotonic() + 10
    while not owned(proc.pid, str(layout.root)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _cluster(tmp_path).down() == ["kube-apiserver"]
    assert not alive(proc.pid)
    proc.wait(timeout=5)


def test_up_without_binaries_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"step 'find binaries': .*bin/etcd is missing"):
        _cluster(tmp_path).up()


def test_each_matrix_version_gets_only_the_gates_it_knows_and_its_runtime_config() -> None:
    def args(version: str) -> dict[str, str]:
        cfg = ClusterConfig(state_dir=Path("/s"), bin_dir=Path("/b"), k8s_version=version)
        spec = apiserver(cfg, Layout(Path("/s")), Ports(1, 2, 3, 4, 5), Pki(Path("/s/pki")))
        return dict(a.split("=", 1) for a in spec.argv[1:] if "=" in a)

    v134 = args("1.34")
    assert "DRADeviceTaintRules" not in v134["--feature-gates"]  # no such gate in 1.34
    assert "ResourceHealthStatusMessage" not in v134["--feature-gates"]
    assert "DRAPartitionableDevices=true" in v134["--feature-gates"]
    assert v134["--runtime-config"] == "resource.k8s.io/v1alpha3=true"
    assert "DRADeviceTaintRules=true" in args("v1.35.4")["--feature-gates"]
    assert args("1.36")["--runtime-config"] == "resource.k8s.io/v1beta2=true"
    assert "--runtime-config" not in args("1.37")


def test_a_version_outside_the_matrix_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'1\.33' is not in the version matrix"):
        ClusterConfig(state_dir=Path("/s"), bin_dir=Path("/b"), k8s_version="1.33")


def test_runtime_config_adds_extra_api_versions_and_those_gates_need() -> None:
    def args(**kw: Any) -> dict[str, str]:
        cfg = ClusterConfig(state_dir=Path("/s"), bin_dir=Path("/b"), **kw)
        spec = apiserver(cfg, Layout(Path("/s")), Ports(1, 2, 3, 4, 5), Pki(Path("/s/pki")))
        return dict(a.split("=", 1) for a in spec.argv[1:] if "=" in a)

    gang = args(
        feature_gates={"GenericWorkload": True},
        runtime_config_extra={"scheduling.k8s.io/v1alpha3": True},
    )
    # the scheduler watches PodGroups in v1beta1: the gate brings it; v1alpha3 is the extra
    assert gang["--runtime-config"] == (
        "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"
    )
    assert "GenericWorkload=true" in gang["--feature-gates"]
    v134 = args(k8s_version="1.34", runtime_config_extra={"resource.k8s.io/v1alpha3": False})
    assert v134["--runtime-config"] == "resource.k8s.io/v1alpha3=false"  # the extra one wins
    assert "--runtime-config" not in args(feature_gates={"GenericWorkload": False})


@pytest.mark.parametrize("bad", ["scheduling.k8s.io", "Scheduling/v1", "api/everything", "a/b=c"])
def test_bad_runtime_config_is_refused_naming_the_flag(bad: str) -> None:
    with pytest.raises(ValidationError, match=r"--runtime-config: .* is not an API group/version"):
        ClusterConfig(state_dir=Path("/s"), bin_dir=Path("/b"), runtime_config_extra={bad: True})


def test_parse_runtime_config_names_the_flag() -> None:
    assert parse_runtime_config("scheduling.k8s.io/v1alpha3=true,v1=false") == {
        "scheduling.k8s.io/v1alpha3": True,
        "v1": False,
    }
    with pytest.raises(
        ValueError,
        match=r"--runtime-config: 'scheduling.k8s.io/v1' is not GROUP/VERSION=true\|false",
    ):
        parse_runtime_config("scheduling.k8s.io/v1")


def test_generic_workload_runs_the_podgroup_protection_controller() -> None:
    def controllers(**kw: Any) -> list[str]:
        cfg = ClusterConfig(state_dir=Path("/s"), bin_dir=Path("/b"), **kw)
        spec = controller_manager(cfg, Layout(Path("/s")), Ports(1, 2, 3, 4, 5))
        flags = dict(a.split("=", 1) for a in spec.argv[1:] if "=" in a)
        return flags["--controllers"].split(",")

    assert "podgroup-protection-controller" in controllers(feature_gates={"GenericWorkload": True})
    assert "podgroup-protection-controller" not in controllers()
    assert "podgroup-protection-controller" not in controllers(
        k8s_version="1.34", feature_gates={"GenericWorkload": True}
    )
