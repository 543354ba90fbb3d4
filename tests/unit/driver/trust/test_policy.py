"""Trust levels: the level x mechanism matrix, co-location rules, tenant resolution."""

from __future__ import annotations

import pytest

from driver.errors import TrustViolation
from driver.trust.policy import (
    LABEL_LEVEL,
    LABEL_SHARING_GROUP,
    LABEL_TENANT,
    ColocationRefused,
    Consumer,
    Mechanism,
    Reason,
    Tenancy,
    TrustLevel,
    check_prepare,
    find_violations,
    resolve_namespace,
    resolve_tenants,
)

DED, ISO, PART, SHR = (
    TrustLevel.DEDICATED,
    TrustLevel.ISOLATED,
    TrustLevel.PARTITIONED,
    TrustLevel.SHARED,
)
GPU, MIG, TS, MPS = (Mechanism.GPU, Mechanism.MIG, Mechanism.TIMESLICE, Mechanism.MPS)


def tenancy(tenant: str, level: TrustLevel, group: str | None = None) -> Tenancy:
    if level is SHR and group is None:
        group = tenant
    return Tenancy(namespace=f"ns-{tenant}", tenant=tenant, level=level, sharing_group=group)


def consumer(
    tenant: str,
    level: TrustLevel,
    mechanism: Mechanism,
    *,
    gpu: str = "GPU-1",
    device: str | None = None,
    node: str = "node-a",
    group: str | None = None,
) -> Consumer:
    default_device = {GPU: gpu, MIG: f"{gpu}-mig-1g10gb-0", TS: f"{gpu}-ts", MPS: f"{gpu}-mps"}
    return Consumer(
        claim=f"ns-{tenant}/claim-{mechanism}-{device or ''}",
        tenancy=tenancy(tenant, level, group),
        mechanism=mechanism,
        node=node,
        gpu=gpu,
        device=device or default_device[mechanism],
    )


# The level x mechanism matrix of docs/trust.md, one row per level.
MATRIX = {
    DED: {GPU: True, MIG: False, TS: False, MPS: False},
    ISO: {GPU: True, MIG: False, TS: False, MPS: False},
    PART: {GPU: True, MIG: True, TS: False, MPS: False},
    SHR: {GPU: True, MIG: True, TS: True, MPS: True},
}


@pytest.mark.parametrize("level", list(MATRIX), ids=str)
def test_level_allows_exactly_its_mechanisms_on_an_empty_node(level: TrustLevel) -> None:
    for mechanism, allowed in MATRIX[level].items():
        new = consumer("team-a", level, mechanism)
        if allowed:
            check_prepare(new, [])
        else:
            with pytest.raises(ColocationRefused) as err:
                check_prepare(new, [])
            assert err.value.reason is Reason.LEVEL_FORBIDS_MECHANISM
            assert f"trust level {level}" in str(err.value)
            assert str(mechanism) in str(err.value)


# Co-location of two tenants: (new, existing, allowed, reason when refused).
C = consumer
COLOCATION = {
    "dedicated refuses another tenant on another GPU of its node": (
        C("team-b", ISO, GPU, gpu="GPU-2"),
        C("team-a", DED, GPU),
        False,
        Reason.DEDICATED_NODE,
    ),
    "dedicated tenant refused on a node where another tenant works": (
        C("team-b", DED, GPU),
        C("team-a", SHR, GPU, gpu="GPU-2"),
        False,
        Reason.DEDICATED_NODE,
    ),
    "dedicated does not care about other nodes": (
        C("team-b", SHR, TS, node="node-b"),
        C("team-a", DED, GPU),
        True,
        None,
    ),
    "isolated beside another tenant on another GPU": (
        C("team-b", SHR, TS, gpu="GPU-2"),
        C("team-a", ISO, GPU),
        True,
        None,
    ),
    "a whole GPU is never co-located": (
        C("team-b", SHR, MIG),
        C("team-a", SHR, GPU),
        False,
        Reason.EXCLUSIVE_GPU,
    ),
    "partitioned MIG beside partitioned MIG": (
        C("team-b", PART, MIG, device="GPU-1-mig-3g40gb-4"),
        C("team-a", PART, MIG, device="GPU-1-mig-3g40gb-0"),
        True,
        None,
    ),
    "partitioned MIG beside shared MIG": (
        C("team-b", SHR, MIG, device="GPU-1-mig-3g40gb-4"),
        C("team-a", PART, MIG, device="GPU-1-mig-3g40gb-0"),
        True,
        None,
    ),
    "partitioned MIG never beside a time-slice of the GPU": (
        C("team-b", SHR, TS),
        C("team-a", PART, MIG),
        False,
        Reason.LEVEL_FORBIDS_SHARING,
    ),
    "isolated tenant's device never shared (level changed after prepare)": (
        C("team-b", PART, MIG, device="GPU-1-mig-3g40gb-4"),
        C("team-a", ISO, MIG, device="GPU-1-mig-3g40gb-0"),
        False,
        Reason.ISOLATED_GPU,
    ),
    "shared time-slices within one sharing group": (
        C("team-b", SHR, TS, group="blue"),
        C("team-a", SHR, TS, group="blue"),
        True,
        None,
    ),
    "shared MPS within one sharing group": (
        C("team-b", SHR, MPS, group="blue"),
        C("team-a", SHR, MPS, group="blue"),
        True,
        None,
    ),
    "shared time-slices across sharing groups": (
        C("team-b", SHR, TS, group="green"),
        C("team-a", SHR, TS, group="blue"),
        False,
        Reason.DIFFERENT_SHARING_GROUP,
    ),
    "shared tenants without a group label share only with themselves": (
        C("team-b", SHR, MPS),
        C("team-a", SHR, MPS),
        False,
        Reason.DIFFERENT_SHARING_GROUP,
    ),
    "a label naming another tenant's default group does not join it": (
        C("team-b", SHR, TS, group="team-a"),
        C("team-a", SHR, TS),  # no label: its group is its name
        False,
        Reason.TENANTS_OWN_GROUP,
    ),
    "a tenant's default group is not joined from the other side either": (
        C("team-b", SHR, MPS),
        C("team-a", SHR, MPS, group="team-b"),
        False,
        Reason.TENANTS_OWN_GROUP,
    ),
}


@pytest.mark.parametrize("case", list(COLOCATION))
def test_colocation_rules(case: str) -> None:
    new, existing, allowed, reason = COLOCATION[case]
    if allowed:
        check_prepare(new, [existing])
        return
    with pytest.raises(TrustViolation) as err:
        check_prepare(new, [existing])
    refused = err.value
    assert isinstance(refused, ColocationRefused)
    assert refused.reason is reason
    assert (refused.tenant, refused.other_tenant) == ("team-b", "team-a")
    message = str(refused)
    assert "tenant team-a" in message and "tenant team-b" in message
    assert existing.claim not in message  # the other tenant's workload stays private


def test_same_tenant_may_share_anything() -> None:
    new = consumer("team-a", SHR, TS, group="blue")
    check_prepare(new, [consumer("team-a", SHR, MPS, group="green")])


def test_other_devices_of_the_same_claim_are_ignored() -> None:
    new = consumer("team-a", ISO, GPU)
    same_claim = Consumer(new.claim, tenancy("team-b", SHR), TS, "node-a", "GPU-1", "GPU-1-ts")
    check_prepare(new, [same_claim])


def test_find_violations_reports_a_level_change_without_tearing_down() -> None:
    a = consumer("team-a", SHR, TS, group="blue")
    b = consumer("team-b", SHR, TS, group="blue")
    assert find_violations([a, b]) == []
    # team-a was relabelled isolated after both prepared.
    a_now = Consumer(a.claim, tenancy("team-a", ISO), a.mechanism, a.node, a.gpu, a.device)
    found = find_violations([a_now, b])
    reasons = {(v.first.claim, v.second.claim, v.verdict.reason) for v in found}
    assert (a.claim, a.claim, Reason.LEVEL_FORBIDS_MECHANISM) in reasons
    assert any(r is Reason.ISOLATED_GPU for *_, r in reasons)


def test_unlabelled_namespace_gets_the_safe_default() -> None:
    res = resolve_namespace("team-a", None)
    assert res.tenancy == Tenancy("team-a", "team-a", TrustLevel.ISOLATED, None)
    assert res.problems == ()
    assert resolve_namespace("x", {}, TrustLevel.DEDICATED).tenancy.level is DED


def test_labels_name_tenant_level_and_group() -> None:
    labels = {LABEL_TENANT: "acme", LABEL_LEVEL: "Shared", LABEL_SHARING_GROUP: "blue"}
    res = resolve_namespace("acme-dev", labels)
    assert res.tenancy == Tenancy("acme-dev", "acme", SHR, "blue")
    assert res.problems == ()


@pytest.mark.parametrize(
    ("labels", "expected_level", "expected_group", "problem"),
    [
        ({LABEL_LEVEL: "trusted"}, ISO, None, "'trusted' is not a trust level"),
        ({LABEL_LEVEL: "partitioned", LABEL_SHARING_GROUP: "blue"}, PART, None, "is ignored"),
        ({LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "Blue_1"}, SHR, "team-a", "not a DNS label"),
    ],
    ids=["unknown-level", "group-on-level-without-groups", "invalid-group"],
)
def test_bad_labels_are_reported_and_replaced_by_safe_values(
    labels: dict[str, str],
    expected_level: TrustLevel,
    expected_group: str | None,
    problem: str,
) -> None:
    res = resolve_namespace("team-a", labels)
    assert res.tenancy.level is expected_level
    assert res.tenancy.sharing_group == expected_group
    assert len(res.problems) == 1
    assert problem in res.problems[0] and "namespace team-a" in res.problems[0]


def test_conflicting_namespaces_of_one_tenant_take_the_strictest_level() -> None:
    resolved = resolve_tenants(
        {
            "acme-dev": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"},
            "acme-prod": {LABEL_TENANT: "acme", LABEL_LEVEL: "isolated"},
            "other": {LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"},
        }
    )
    dev, prod = resolved["acme-dev"], resolved["acme-prod"]
    assert dev.tenancy.level is ISO and prod.tenancy.level is ISO
    assert dev.tenancy.sharing_group is None
    assert any(
        "conflicting labels" in p and "using the strictest, isolated" in p for p in dev.problems
    )
    assert resolved["other"].problems == ()


def test_conflicting_sharing_groups_of_one_tenant_share_with_nobody_else() -> None:
    resolved = resolve_tenants(
        {
            "acme-dev": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "blue"},
            "acme-ml": {LABEL_TENANT: "acme", LABEL_LEVEL: "shared", LABEL_SHARING_GROUP: "red"},
        }
    )
    assert {r.tenancy.sharing_group for r in resolved.values()} == {"acme"}
    assert all(any(LABEL_SHARING_GROUP in p for p in r.problems) for r in resolved.values())
