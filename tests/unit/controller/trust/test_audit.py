"""``tranche trust check``: consumers from claims and slices, co-locations, the report."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from controller.trust.audit import (
    class_mechanism,
    colocations,
    consumers,
    forbidden_alone,
    holdings,
)
from controller.trust.cli import TrustCheckSettings, check, render_json, render_text
from controller.trust.cli import command as trust_command
from driver.devices.inventory import gpu_names, mig_name
from driver.sharing.devices import share_name
from driver.trust.policy import LABEL_LEVEL, LABEL_SHARING_GROUP, Mechanism, Reason, resolve_tenants


def share(name: str, group: str, uuid: str, sharing: str = "timeslice") -> dict[str, Any]:
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {
            "type": {"string": "gpu"},
            "sharing": {"string": sharing},
            "sharingGroup": {"string": group},
            "parentUUID": {"string": uuid},
        },
    }


SLICES: list[dict[str, Any]] = [
    {
        "spec": {
            "driver": "gpu.tranche.dev",
            "nodeName": "node-a",
            "pool": {"name": "node-a"},
            "devices": [
                {
                    "name": "gpu-aaaa",
                    "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-A"}},
                },
                share("gpu-aaaa-ts-blue", "blue", "GPU-A"),
                share("gpu-aaaa-ts-red", "red", "GPU-A"),
                {
                    "name": "gpu-bbbb-mig-1g10gb-0",
                    "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": "GPU-B"}},
                },
            ],
        }
    },
    {"spec": {"driver": "other.example.com", "nodeName": "node-a", "devices": [{"name": "x"}]}},
]


def claim(ns: str, name: str, device: str, driver: str = "gpu.tranche.dev") -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver, "pool": "node-a", "device": device}
                    ]
                }
            }
        },
    }


def shared(group: str) -> dict[str, str]:
    return {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: group}


def test_consumers_take_gpu_and_mechanism_from_the_slices() -> None:
    res = resolve_tenants({"a": shared("blue")})
    found = consumers(
        [claim("a", "c1", "gpu-aaaa-ts-blue"), claim("a", "c2", "x", driver="other.example.com")],
        SLICES,
        res,
        res["a"].tenancy.level,
    )
    assert [(c.claim, c.mechanism, c.gpu, c.node) for c in found] == [
        ("a/c1", Mechanism.TIMESLICE, "GPU-A", "node-a")
    ]


def test_report_flags_a_gpu_shared_across_sharing_groups_and_passes_one_group() -> None:
    res = resolve_tenants({"a": shared("blue"), "b": shared("blue"), "c": shared("red"), "d": None})
    claims = [
        claim("a", "c1", "gpu-aaaa-ts-blue"),
        claim("b", "c2", "gpu-aaaa-ts-blue"),
        claim("d", "c4", "gpu-bbbb-mig-1g10gb-0"),  # alone on GPU-B: not a co-location
    ]
    found = colocations(consumers(claims, SLICES, res, res["d"].tenancy.level))
    assert [(co.gpu, co.tenants, co.allowed) for co in found] == [("GPU-A", ("a", "b"), True)]

    claims.append(claim("c", "c3", "gpu-aaaa-ts-red"))
    found = colocations(consumers(claims, SLICES, res, res["d"].tenancy.level))
    assert [(co.gpu, co.tenants, co.allowed) for co in found] == [("GPU-A", ("a", "b", "c"), False)]
    reasons = {v.reason for _, _, v in found[0].verdicts}
    assert reasons == {Reason.DIFFERENT_SHARING_GROUP}

    text = io.StringIO()
    render_text(found, res, text)
    assert "node node-a GPU GPU-A: tenants a, b, c: FORBIDDEN" in text.getvalue()
    assert "a/c1 + c/c3: DifferentSharingGroup" in text.getvalue()
    doc = io.StringIO()
    render_json(found, res, doc)
    parsed = json.loads(doc.getvalue())
    assert parsed["colocations"][0]["allowed"] is False


def test_report_lists_label_problems() -> None:
    res = resolve_tenants({"a": {LABEL_LEVEL: "trusted"}})
    out = io.StringIO()
    render_text([], res, out)
    assert (
        "label problem: namespace a: label gpu.tranche.dev/trust-level='trusted'" in out.getvalue()
    )


def test_dedicated_node_shared_with_another_tenant_is_reported() -> None:
    res = resolve_tenants({"a": {LABEL_LEVEL: "dedicated"}, "b": None})
    claims = [claim("a", "c1", "gpu-aaaa"), claim("b", "c2", "gpu-bbbb-mig-1g10gb-0")]
    found = colocations(consumers(claims, SLICES, res, res["b"].tenancy.level))
    assert len(found) == 1 and found[0].gpu is None and not found[0].allowed
    assert {v.reason for _, _, v in found[0].verdicts} == {Reason.DEDICATED_NODE}


def test_an_admin_access_claim_beside_an_isolated_tenant_is_not_judged() -> None:
    # A monitoring claim with admin access on an isolated tenant's whole GPU: prepare and
    # docs/trust.md do not judge it, so neither does the audit.
    res = resolve_tenants({"team-a": None, "gpu-monitoring": None})
    monitor = claim("gpu-monitoring", "dcgm", "gpu-aaaa")
    monitor["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    claims = [claim("team-a", "train", "gpu-aaaa"), monitor]
    found = colocations(consumers(claims, SLICES, res, res["team-a"].tenancy.level))
    assert found == []
    out = io.StringIO()
    render_text(found, res, out)
    assert "FORBIDDEN" not in out.getvalue()


def test_trust_check_with_the_api_server_down_names_the_request_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    parser = argparse.ArgumentParser()
    trust_command.add_arguments(parser)
    args = parser.parse_args(["check", "--kubeconfig", str(kubeconfig)])
    assert trust_command.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tranche trust check: cannot read the cluster: list resourceclaims: ")
    assert "cannot be reached" in err


def test_a_custom_driver_name_is_audited_not_ignored() -> None:
    # Before: the audit kept only gpu.tranche.dev results, so a cluster installed with
    # another driver name always read "no GPU used by more than one tenant".
    res = resolve_tenants({"a": shared("blue"), "c": shared("red")})
    custom = [{**s, "spec": {**s["spec"], "driver": "gpu.example.com"}} for s in SLICES[:1]]
    claims = [
        claim("a", "c1", "gpu-aaaa-ts-blue", driver="gpu.example.com"),
        claim("c", "c3", "gpu-aaaa-ts-red", driver="gpu.example.com"),
    ]
    found = colocations(consumers(claims, custom, res, res["a"].tenancy.level, "gpu.example.com"))
    assert [(co.gpu, co.allowed) for co in found] == [("GPU-A", False)]


@pytest.mark.parametrize(
    ("name", "mechanism"),
    [
        ("gpu.example.com", Mechanism.GPU),
        ("dedicated.gpu.example.com", Mechanism.GPU),
        ("mig.gpu.example.com", Mechanism.MIG),
        ("mig-1g.18gb.gpu.example.com", Mechanism.MIG),
        ("mig-1g.10gb-me.gpu.example.com", Mechanism.MIG),
        ("timeslice.gpu.example.com", Mechanism.TIMESLICE),
        ("mps.gpu.example.com", Mechanism.MPS),
        ("mps.gpu.tranche.dev", Mechanism.GPU),  # another driver's class
    ],
)
def test_class_mechanisms_follow_the_driver_name(name: str, mechanism: Mechanism) -> None:
    assert class_mechanism(name, "gpu.example.com") == mechanism


def test_a_share_device_gone_from_the_slices_is_still_placed_on_its_gpu() -> None:
    # Group red was dropped from the sharing config: its share device is in no slice any more,
    # but the red claim still holds it. Before: counted as a GPU of its own, so the two groups
    # on GPU-A were not reported.
    res = resolve_tenants({"a": shared("blue"), "c": shared("red")})
    slices = [{"spec": {**SLICES[0]["spec"], "devices": SLICES[0]["spec"]["devices"][:2]}}]
    claims = [claim("a", "c1", "gpu-aaaa-ts-blue"), claim("c", "c3", "gpu-aaaa-ts-red")]
    held = holdings(claims, slices, res, res["a"].tenancy.level)
    assert held.unjudged == []
    found = colocations(held.consumers)
    assert [(co.gpu, co.tenants, co.allowed) for co in found] == [("GPU-A", ("a", "c"), False)]
    assert {v.reason for _, _, v in found[0].verdicts} == {Reason.DIFFERENT_SHARING_GROUP}


def recorded(c: dict[str, Any], gpu_uuid: str, mode: str = "MIG") -> dict[str, Any]:
    """``c`` with the ``status.devices`` entry the plugin writes at prepare."""
    result = c["status"]["allocation"]["devices"]["results"][0]
    data = {"uuid": f"MIG-{c['metadata']['name']}", "gpuUUID": gpu_uuid, "mode": mode}
    c["status"]["devices"] = [{k: result[k] for k in ("driver", "pool", "device")} | {"data": data}]
    return c


def test_devices_of_a_node_without_slices_are_placed_by_the_recorded_gpu_then_the_name() -> None:
    # The node's slices were deleted. A partitioned and a shared tenant hold MIG devices of one
    # GPU (allowed), an isolated tenant a time-slice share of the same GPU (forbidden). One
    # claim's status records the GPU, the others are known by their names only.
    uuid = "GPU-12345678-9abc-def0-1234-56789abcdef0"
    res = resolve_tenants({"p": {LABEL_LEVEL: "partitioned"}, "s": shared("blue"), "i": None})
    claims = [
        recorded(claim("p", "c1", "gpu-12345678-mig-1g10gb-0"), uuid),
        claim("s", "c2", "gpu-12345678-mig-1g10gb-1"),
        claim("i", "c3", "gpu-12345678-ts-blue"),
    ]
    held = holdings(claims, [], res, res["i"].tenancy.level)
    assert held.unjudged == []
    assert [(c.mechanism, c.gpu) for c in held.consumers] == [
        (Mechanism.MIG, uuid),
        (Mechanism.MIG, uuid),
        (Mechanism.TIMESLICE, uuid),
    ]
    (co,) = colocations(held.consumers)
    assert (co.node, co.tenants, co.allowed) == ("node-a", ("i", "p", "s"), False)
    assert {(a.claim, b.claim, v.reason) for a, b, v in co.verdicts} == {
        ("i/c3", "i/c3", Reason.LEVEL_FORBIDS_MECHANISM),
        ("p/c1", "i/c3", Reason.ISOLATED_GPU),
        ("s/c2", "i/c3", Reason.ISOLATED_GPU),
    }
    assert forbidden_alone(held.consumers) == []  # reported once, in its GPU's co-location


def test_a_device_nothing_places_is_reported_as_not_judged_and_the_check_exits_3(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    res_labels = {"a": shared("blue"), "c": shared("red")}
    mystery = claim("c", "c3", "spare-7")  # in no slice, no status, not a name of the plugin's
    claims = [claim("a", "c1", "gpu-aaaa-ts-blue"), mystery]
    namespaces = [{"metadata": {"name": ns, "labels": lb}} for ns, lb in res_labels.items()]
    monkeypatch.setattr("controller.trust.cli._read", lambda _api: (namespaces, claims, SLICES[:1]))
    out = io.StringIO()
    assert check(TrustCheckSettings(), cast(Any, None), out) == 3
    text = out.getvalue()
    assert (
        "not judged: node node-a: c/c3: tenant c (trust level shared, sharing group red) "
        "holds gpu spare-7: cannot be judged (not in any ResourceSlice)"
    ) in text
    assert "audit incomplete: 1 allocated device(s) could not be judged" in text

    doc = io.StringIO()
    assert check(TrustCheckSettings(output="json"), cast(Any, None), doc) == 3
    parsed = json.loads(doc.getvalue())
    assert parsed["complete"] is False
    (entry,) = parsed["unjudged"]
    assert (entry["claim"], entry["device"], entry["node"]) == ("c/c3", "spare-7", "node-a")
    assert entry["reason"].startswith("cannot be judged (not in any ResourceSlice)")

    # A forbidden co-location found elsewhere still exits 1; a complete, allowed audit 0.
    claims.append(claim("c", "c4", "gpu-aaaa-ts-red"))
    assert check(TrustCheckSettings(), cast(Any, None), io.StringIO()) == 1
    claims[1:] = []
    doc = io.StringIO()
    assert check(TrustCheckSettings(output="json"), cast(Any, None), doc) == 0
    assert json.loads(doc.getvalue())["complete"] is True


def test_the_plugins_own_device_names_are_placed_without_slices() -> None:
    # The audit parses device names itself (the controller does not import the sharing
    # code); these are the names the plugin publishes, made by its own functions, so a
    # change of the plugin's naming fails here instead of leaving claims unjudged.
    uuid = "GPU-0badc0de-9abc-def0-1234-56789abcdef0"
    gpu = gpu_names([uuid])[uuid]
    names = {
        gpu: Mechanism.GPU,
        mig_name(gpu, "1g.10gb", 3): Mechanism.MIG,
        share_name(gpu, "TimeSlicing", "blue"): Mechanism.TIMESLICE,
        share_name(gpu, "MPS", "blue"): Mechanism.MPS,
        share_name(gpu, "MPS", "a-group-name-long-enough-to-be-hashed-at-the-end"): Mechanism.MPS,
    }
    res = resolve_tenants({"s": shared("blue")})
    claims = [claim("s", f"c{i}", name) for i, name in enumerate(names)]
    held = holdings(claims, [], res, res["s"].tenancy.level)
    assert held.unjudged == []
    assert [c.mechanism for c in held.consumers] == list(names.values())
    assert {c.gpu for c in held.consumers} == {gpu}


@pytest.mark.parametrize(
    ("labels", "device", "forbidden"),
    [
        # Relabelled after prepare: the claim still holds what its old level allowed.
        ({LABEL_LEVEL: "isolated"}, "gpu-aaaa-ts-blue", "isolated, which does not allow timeslice"),
        ({LABEL_LEVEL: "isolated"}, "gpu-aaaa-mps-blue", "isolated, which does not allow mps"),
        ({LABEL_LEVEL: "partitioned"}, "gpu-aaaa-ts-blue", "partitioned, which does not allow"),
        ({LABEL_LEVEL: "isolated"}, "gpu-bbbb-mig-1g10gb-0", "isolated, which does not allow mig"),
        ({LABEL_LEVEL: "dedicated"}, "gpu-bbbb-mig-1g10gb-0", "dedicated, which does not allow"),
        ({LABEL_LEVEL: "partitioned"}, "gpu-bbbb-mig-1g10gb-0", None),
        (shared("blue"), "gpu-aaaa-ts-blue", None),
        (shared("blue"), "gpu-aaaa-mps-blue", None),
        ({LABEL_LEVEL: "isolated"}, "gpu-aaaa", None),
        ({LABEL_LEVEL: "dedicated"}, "gpu-aaaa", None),
    ],
)
def test_a_holding_its_level_forbids_is_reported_with_no_other_tenant_on_the_gpu(
    monkeypatch: pytest.MonkeyPatch, labels: dict[str, str], device: str, forbidden: str | None
) -> None:
    # Before: only GPUs of several tenants were listed, so a namespace relabelled isolated
    # while its claim still held a share device (or a MIG device) read "no GPU ... used by
    # more than one tenant" and exit 0, although the share device still lets its group's
    # other tenants land next to it.
    namespaces = [{"metadata": {"name": "a", "labels": labels}}]
    claims = [claim("a", "c1", device)]
    mps = share("gpu-aaaa-mps-blue", "blue", "GPU-A", sharing="mps")
    slices = [{"spec": {**SLICES[0]["spec"], "devices": [*SLICES[0]["spec"]["devices"], mps]}}]
    monkeypatch.setattr("controller.trust.cli._read", lambda _api: (namespaces, claims, slices))
    out = io.StringIO()
    status = check(TrustCheckSettings(), cast(Any, None), out)
    assert status == (0 if forbidden is None else 1), out.getvalue()
    doc = io.StringIO()
    assert check(TrustCheckSettings(output="json"), cast(Any, None), doc) == status
    alone = json.loads(doc.getvalue())["forbiddenAlone"]
    if forbidden is None:
        assert "FORBIDDEN" not in out.getvalue()
        assert alone == []
        return
    gpu = "GPU-B" if "mig" in device else "GPU-A"
    assert f"node node-a GPU {gpu}: tenant a: FORBIDDEN" in out.getvalue()
    assert (
        "  forbidden: a/c1: LevelForbidsMechanism: namespace a has trust level " in out.getvalue()
    )
    assert forbidden in out.getvalue()
    (block,) = alone
    (entry,) = block["forbidden"]
    assert (block["gpu"], block["tenants"], block["allowed"]) == (gpu, ["a"], False)
    assert (entry["claims"], entry["reason"]) == (["a/c1"], "LevelForbidsMechanism")
    assert forbidden in entry["detail"]
