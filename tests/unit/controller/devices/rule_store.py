"""An API server for ``tranche taint`` and ``untaint`` in unit tests: the devices its slices
publish, the DeviceTaintRules it stores (created, replaced and deleted by the commands'
own requests) and the claims it lists."""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.devices import taint
from controller.devices.lookup import ClusterDevice, ClusterView
from controller.kube_client import ApiCallError

RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
Json = dict[str, Any]

# A rule as ``tranche taint`` wrote it before it recorded the UUID and the driver in the name
# (node-a's gpu-1a2b3c4d of gpu.tranche.dev).
OLD_RULE: Json = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceTaintRule",
    "metadata": {
        "name": "tranche-node-a-gpu-1a2b3c4d",
        "resourceVersion": "3",
        "labels": {"app.kubernetes.io/managed-by": "tranche"},
        "annotations": {
            "gpu.tranche.dev/node": "node-a",
            "gpu.tranche.dev/device": "gpu-1a2b3c4d",
            "gpu.tranche.dev/reason": "maint",
        },
    },
    "spec": {
        "deviceSelector": {"driver": "gpu.tranche.dev", "pool": "node-a", "device": "gpu-1a2b3c4d"},
        "taint": {"key": "gpu.tranche.dev/admin", "effect": "NoSchedule"},
    },
}


@dataclass
class RuleStore:
    devices: Sequence[ClusterDevice] = ()
    rules: dict[str, Json] = field(default_factory=dict)
    claims: list[Json] | None = field(default_factory=list)  # None: listing them is refused
    writes: list[tuple[str, str]] = field(default_factory=list)  # (verb, rule name)
    dry_runs: list[tuple[str, str]] = field(default_factory=list)  # writes with dryRun=All
    refuse_writes: bool = False  # a role without create and update on the rules

    def request(
        self,
        api: object,
        what: str,
        verb: str,
        path: str,
        body: Json | None = None,
        query: Mapping[str, str] | None = None,
        **_: Any,
    ) -> Json | None:
        if path.endswith("/resourceclaims"):
            if self.claims is None:
                raise ApiCallError(f"{what}: 403 Forbidden: cannot list", 403)
            return {"items": self.claims}
        name = path.removeprefix(RULES).lstrip("/")
        if verb == "GET":
            if not name:
                return {"items": [copy.deepcopy(r) for r in self.rules.values()]}
            return copy.deepcopy(self.rules.get(name))
        assert body is not None or verb == "DELETE"
        if self.refuse_writes:
            raise ApiCallError(f"{what}: 403 Forbidden: cannot {verb.lower()}", 403)
        if verb == "POST":
            assert body is not None
            name = body["metadata"]["name"]
            if name in self.rules:
                raise ApiCallError(f"{what}: 409 Conflict: already exists", 409)
        if (query or {}).get("dryRun") == "All":  # checked, answered, not stored
            self.dry_runs.append((verb, name))
            return copy.deepcopy(body) if body is not None else self.rules.get(name)
        if verb == "PUT" and name not in self.rules:
            return None  # 404: ``request`` answers None for an object that is absent
        self.writes.append((verb, name))
        if verb == "DELETE":
            return self.rules.pop(name)
        stored = copy.deepcopy(body)
        assert stored is not None
        stored["metadata"]["resourceVersion"] = str(len(self.writes))
        self.rules[name] = stored
        return stored

    def view(self, driver: str) -> ClusterView:
        """What ``read_view`` reads: the slices of ``driver`` (a field selector), every rule."""
        listed = self.request(None, "DeviceTaintRules", "GET", RULES) or {}
        devices = tuple(d for d in self.devices if d.driver == driver)
        return ClusterView(devices=devices, rules=tuple(listed["items"]))

    def tranche(
        self,
        monkeypatch: pytest.MonkeyPatch,
        command: str,
        *argv: str,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """``tranche taint|untaint ARGV`` against this store, with only the ``TRANCHE_*``
        variables of ``env`` set."""
        for name in [n for n in os.environ if n.startswith("TRANCHE_")]:
            monkeypatch.delenv(name)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(taint, "api_client", lambda kubeconfig: object())
        monkeypatch.setattr(taint, "rules_api", lambda api: ("resource.k8s.io/v1", RULES))
        monkeypatch.setattr(taint, "read_view", lambda api, driver, rules_path: self.view(driver))
        monkeypatch.setattr(taint, "request", self.request)
        cmd = taint.taint_command if command == "taint" else taint.untaint_command
        parser = argparse.ArgumentParser()
        cmd.add_arguments(parser)
        rc: int = cmd.run(parser.parse_args(list(argv)))
        return rc
