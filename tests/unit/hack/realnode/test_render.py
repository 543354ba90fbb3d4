"""Configuration rendering of real nodes: containerd, kubelet, CNI, kubeconfig, layout."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hack.devcluster.config import DRA_FEATURE_GATES
from hack.devcluster.realnode import render
from hack.devcluster.realnode.render import NodeLayout, NodeSettings


def _node(
    name: str = "rn1", index: int = 1, state: Path = Path("/s")
) -> tuple[NodeSettings, NodeLayout]:
    return (
        NodeSettings(name=name, index=index, kubelet_port=40001, healthz_port=40002),
        NodeLayout.of(state, name),
    )


def test_containerd_config_is_version_4_with_its_own_dirs_and_sockets() -> None:
    _, layout = _node()
    doc = tomllib.loads(render.containerd_config(layout))
    assert doc["version"] == 4
    assert doc["root"] == "/s/n/rn1/ctd/root"
    assert doc["state"] == "/s/n/rn1/ctd/state"
    plugins = doc["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == "/s/n/rn1/ctd/c.sock"
    assert plugins["io.containerd.server.v1.ttrpc"]["address"] == "/s/n/rn1/ctd/c.sock.ttrpc"
    assert "grpc" not in doc and "ttrpc" not in doc  # top-level sections are ignored in 2.x
    assert "io.containerd.nri.v1.nri" in doc["disabled_plugins"]


def test_containerd_cri_settings_that_matter_here() -> None:
    _, layout = _node()
    rt = tomllib.loads(render.containerd_config(layout))["plugins"]["io.containerd.cri.v1.runtime"]
    assert rt["restrict_oom_score_adj"] is True
    assert rt["netns_mounts_under_state_dir"] is True
    assert rt["cdi_spec_dirs"] == ["/s/n/rn1/cdi"]
    runc = rt["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {
        "BinaryName": "/usr/sbin/runc",
        "Root": "/s/n/rn1/runc",
        "SystemdCgroup": False,
    }
    assert rt["cni"]["conf_dir"] == "/s/n/rn1/cni/net.d"
    assert rt["cni"]["bin_dirs"] == ["/usr/lib/cni"]


def test_containerd_pins_the_local_sandbox_image() -> None:
    _, layout = _node()
    images = tomllib.loads(render.containerd_config(layout))["plugins"][
        "io.containerd.cri.v1.images"
    ]
    assert images["pinned_images"]["sandbox"] == render.PAUSE_IMAGE
    assert images["snapshotter"] == "overlayfs"


def test_containerd_config_quotes_odd_paths() -> None:
    layout = NodeLayout(Path('/tmp/a "quoted" dir/n/x'))
    doc = tomllib.loads(render.containerd_config(layout))
    assert doc["root"] == '/tmp/a "quoted" dir/n/x/ctd/root'


def test_kubelet_config_settings_that_matter_here() -> None:
    settings, layout = _node()
    cfg = render.kubelet_config(
        settings, layout, client_ca=Path("/s/pki/ca.crt"), feature_gates=DRA_FEATURE_GATES
    )
    assert cfg["kind"] == "KubeletConfiguration"
    assert cfg["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["failCgroupV1"] is False
    assert cfg["failSwapOn"] is False
    assert cfg["makeIPTablesUtilChains"] is False
    assert cfg["cgroupRoot"] == "/tranche-rn1"
    assert cfg["containerRuntimeEndpoint"] == "unix:///s/n/rn1/ctd/c.sock"
    assert (cfg["port"], cfg["healthzPort"], cfg["readOnlyPort"]) == (40001, 40002, 0)
    assert cfg["podLogsDir"] == "/s/n/rn1/pod-logs"
    assert cfg["volumePluginDir"] == "/s/n/rn1/volume-plugins"
    assert cfg["featureGates"] == DRA_FEATURE_GATES
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/s/pki/ca.crt"


def test_kubelet_eviction_thresholds_are_low() -> None:
    settings, layout = _node()
    cfg = render.kubelet_config(settings, layout, client_ca=Path("/ca"), feature_gates={})
    assert cfg["evictionHard"]["nodefs.available"] == "1%"
    assert cfg["evictionHard"]["imagefs.available"] == "1%"
    assert cfg["imageGCHighThresholdPercent"] == 100


def test_kubelet_args_name_node_root_dir_and_files() -> None:
    settings, layout = _node()
    args = render.kubelet_args(settings, layout)
    assert "--hostname-override=rn1" in args
    assert "--root-dir=/s/n/rn1/kl" in args
    assert "--config=/s/n/rn1/kubelet/config.yaml" in args
    assert "--kubeconfig=/s/n/rn1/kubelet/kubeconfig" in args


def test_cni_bridge_without_gateway_or_masquerade() -> None:
    settings, layout = _node()
    conf = render.cni_conflist(settings, layout)
    (bridge,) = conf["plugins"]
    assert bridge["type"] == "bridge"
    assert bridge["isGateway"] is False
    assert bridge["ipMasq"] is False
    assert bridge["bridge"] == settings.bridge
    assert bridge["ipam"]["dataDir"] == "/s/n/rn1/cni/ipam"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.88.1.0/24", "gateway": "10.88.1.1"}]]
    # Only the Service network goes to the bridge's host side (no default route), where a
    # test that relays the kubernetes Service gives the bridge that address.
    assert bridge["ipam"]["routes"] == [{"dst": "10.0.0.0/24", "gw": "10.88.1.1"}]
    assert conf["name"] == "tranche-rn1"


def test_two_nodes_differ_in_everything_machine_wide() -> None:
    a, la = _node("rn1", 1)
    b, lb = _node("rn2", 2)
    assert a.bridge != b.bridge
    assert len(a.bridge) <= 15 and len(b.bridge) <= 15  # IFNAMSIZ - 1
    assert a.cgroup_root != b.cgroup_root
    assert a.pod_subnet != b.pod_subnet
    assert la.kubelet_root != lb.kubelet_root
    assert la.containerd_socket != lb.containerd_socket


def test_settings_round_trip() -> None:
    settings, _ = _node("node-7", 7)
    assert NodeSettings.from_json(settings.to_json()) == settings


@pytest.mark.parametrize("bad", ["", "Upper", "a_b", "-a", "a" * 33, "a.b"])
def test_node_name_must_be_a_short_dns_label(bad: str) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        render.check_node_name(bad)


def test_node_index_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        NodeSettings(name="a", index=0, kubelet_port=1, healthz_port=2)


def test_plugin_socket_paths_fit_a_unix_socket_under_the_default_state_dir() -> None:
    layout = NodeLayout.of(Path.home() / ".cache" / "tranche" / "dev-cluster", "a" * 32)
    longest = layout.kubelet_root / "plugins" / "gpu.tranche.dev" / "dra.sock"
    assert len(str(longest).encode()) < 108


def test_kubelet_kubeconfig_uses_the_node_identity() -> None:
    doc = render.kubelet_kubeconfig("https://127.0.0.1:6443", b"ca", b"cert", b"key", "rn1")
    (user,) = doc["users"]
    assert user["name"] == "system:node:rn1"
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert doc["contexts"][0]["context"]["user"] == "system:node:rn1"


def test_each_nodes_bridge_has_a_stable_locally_administered_mac_of_its_own() -> None:
    macs = {n: NodeSettings(name=n, index=1, kubelet_port=1, healthz_port=2).bridge_mac
            for n in ("rn1", "rn2", "bench1")}  # fmt: skip
    assert len(set(macs.values())) == 3
    for mac in macs.values():
        octets = [int(o, 16) for o in mac.split(":")]
        assert len(octets) == 6
        assert octets[0] & 0b10, "locally administered"
        assert not octets[0] & 0b1, "unicast"
    again = NodeSettings(name="rn1", index=2, kubelet_port=3, healthz_port=4)
    assert again.bridge_mac == macs["rn1"], "the MAC follows the name, not the slot"
