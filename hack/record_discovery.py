"""Record an API server's discovery documents for the feature-decision unit tests.

    .venv/bin/python -m hack.record_discovery KUBECONFIG tests/fixtures/discovery/1.35

writes ``version.json``, ``group.json`` (``/apis/resource.k8s.io``), one ``<version>.json`` per
served ``resource.k8s.io`` version, and ``probe.json`` and ``probe-fields.json`` (status and
body of the dry runs of :func:`driver.kube.features.probe_slice` and ``fields_probe_slice``;
nothing is stored).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from driver.kube.features import GROUP, fields_probe_slice, probe_slice
from driver.kube.http import KubeClient


def record(kubeconfig: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with KubeClient.connect(kubeconfig) as kube:
        docs = {
            "version": kube.request("GET", "/version"),
            "group": kube.request("GET", f"/apis/{GROUP}"),
        }
        for v in docs["group"].get("versions", ()):
            docs[v["version"]] = kube.request("GET", f"/apis/{GROUP}/{v['version']}")
        answer = kube.send(
            "POST",
            f"/apis/{GROUP}/v1/resourceslices",
            body=probe_slice("probe-node", "gpu.tranche.dev"),
            query={"dryRun": "All"},
        )
        docs["probe"] = {"status": answer.status, "body": answer.json() if answer.body else {}}
        answer = kube.send(
            "POST",
            f"/apis/{GROUP}/v1/resourceslices",
            body=fields_probe_slice("probe-node", "gpu.tranche.dev"),
            query={"dryRun": "All"},
        )
        docs["probe-fields"] = {
            "status": answer.status,
            "body": answer.json() if answer.body else {},
        }
    for name, doc in docs.items():
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(sys.argv[1], Path(sys.argv[2]))
