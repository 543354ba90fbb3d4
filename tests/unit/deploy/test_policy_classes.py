"""Every device class that hands out this driver's devices is judged by the trust policy."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def _class_names(folder: Path) -> set[str]:
    return {
        doc["metadata"]["name"]
        for f in sorted(folder.glob("*.yaml"))
        for doc in yaml.safe_load_all(f.read_text())
        if doc and doc.get("kind") == "DeviceClass"
    }


def test_the_trust_policy_knows_every_shipped_device_class() -> None:
    policy = (REPO / "deploy/policies/claim-trust.yaml").read_text()
    shipped = _class_names(REPO / "deploy/deviceclasses") | _class_names(REPO / "deploy/bridge")
    unjudged = sorted(name for name in shipped if f"'{name}':" not in policy)
    assert unjudged == [], "a claim through these classes would skip admission"
