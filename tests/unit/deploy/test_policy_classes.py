"""Every device class that hands out this driver's devices is judged by the trust policy."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
DRIVER = "gpu.tranche.dev"


def _class_names(folder: Path) -> set[str]:
    return {
        doc["metadata"]["name"]
        for f in sorted(folder.glob("*.yaml"))
        for doc in yaml.safe_load_all(f.read_text())
        if doc and doc.get("kind") == "DeviceClass"
    }


def _judged(name: str, policy: str) -> bool:
    """The policy's class table holds <driver> and '<prefix>.' + driver; every
    mig-<profile>.<driver> is MIG by its name."""
    if name == DRIVER:
        return "{variables.driver: " in policy
    prefix = name.removesuffix("." + DRIVER)
    if prefix == name:
        return False
    return prefix.startswith("mig-") or f"'{prefix}.' + variables.driver:" in policy


def test_the_trust_policy_knows_every_shipped_device_class() -> None:
    policy = (REPO / "deploy/policies/claim-trust.yaml").read_text()
    assert f"expression: \"'{DRIVER}'\"" in policy, "the policy's driver variable"
    shipped = _class_names(REPO / "deploy/deviceclasses") | _class_names(REPO / "deploy/bridge")
    unjudged = sorted(name for name in shipped if not _judged(name, policy))
    assert unjudged == [], "a claim through these classes would skip admission"
