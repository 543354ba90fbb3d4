from __future__ import annotations

from driver.devices.inventory import DYNAMIC_MIG, AdvertiseConfig
from kubelet_plugin.node_labels import advertise_for

LABEL = "gpu.tranche.dev/dynamic-mig"


def _node(labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "n1", "labels": labels}}


def test_only_a_true_label_opts_the_node_in() -> None:
    default = AdvertiseConfig()
    assert advertise_for(_node({LABEL: "true"}), LABEL, default) == DYNAMIC_MIG
    for labels in ({}, {LABEL: "false"}, {LABEL: "yes"}, {"other": "true"}):
        assert advertise_for(_node(labels), LABEL, default) == default
    assert advertise_for({"metadata": {}}, LABEL, default) == default


def test_without_a_label_key_the_config_is_kept() -> None:
    assert advertise_for(_node({LABEL: "true"}), "", AdvertiseConfig()) == AdvertiseConfig()
