"""``tranche trust check`` over a claim list holding a claim whose JSON nests too deep: the
claim is reported and the check goes on.

The API server's answers are canned at the transport (``controller.kube_client.send``);
the real API server runs these commands in ``tests/e2e/test_controller.py``.
"""

from __future__ import annotations

import io
import json

from kubernetes import client

from controller.trust.cli import TrustCheckSettings, check


def test_trust_check_reports_the_unreadable_claim_and_judges_the_rest(
    canned_api: client.ApiClient,
) -> None:
    api = canned_api
    out = io.StringIO()
    assert check(TrustCheckSettings(), api, out) == 0
    text = out.getvalue()
    assert "unreadable: ResourceClaim b/deep: spec.devices.config[0].opaque.parameters" in text
    assert "node node-a GPU GPU-A: tenants a, b: allowed" in text  # its allocation still counts

    doc = io.StringIO()
    assert check(TrustCheckSettings(output="json"), api, doc) == 0
    (note,) = json.loads(doc.getvalue())["unreadable"]
    assert note.startswith("ResourceClaim b/deep: spec.devices.config[0]")
