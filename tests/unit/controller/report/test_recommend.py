"""``tranche report --recommend``, the pure parts: kinds from the published slices of the
simulated dgx-h100 (its real MIG profiles), which kind fits which peak with headroom, trust
levels that forbid shares or MIG, savings in Decimal, too little data, owners of claims."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from controller.report.owners import Cluster, Owner, claim_kinds, group
from controller.report.prices import parse_prices
from controller.report.recommend import (
    ClaimData,
    Kind,
    Model,
    Sample,
    Workload,
    advise,
    fits,
    models_from_slices,
    savings,
    smallest_fit,
    stats,
)
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import DEFAULT_DRIVER_NAME, build_slices
from driver.nvml.sim import create_state, open_simulated
from driver.sharing.devices import share_devices
from driver.sharing.settings import SharingConfig
from driver.trust.policy import Mechanism, Tenancy, TrustLevel

GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
NODE = "node-a"
PRICES = parse_prices(f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 3.00\n", "prices.yaml")
PRICES_MIG = parse_prices(
    f"currency: EUR\nproducts:\n  {H100}:\n    gpu_hour: 3.00\n    mig:\n      1g.10gb: 0.50\n",
    "prices.yaml",
)


def h100_slices(max_shares: int = 8) -> list[dict[str, Any]]:
    """The slices a dgx-h100 node publishes: GPU 0 whole (with MPS and time-slice shares of
    group ``team``), GPU 1 in MIG mode (every profile's placements)."""
    nvml = open_simulated(create_state("dgx-h100"))
    gpus = nvml.list_gpus()
    nvml.set_mig_mode(gpus[1].uuid, True)
    inventory = build_inventory(nvml.list_gpus()[:2], nvml.system_info(), DYNAMIC_MIG)
    config = SharingConfig(groups=("team",), max_shares=max_shares)
    return build_slices(inventory, NODE, extra_devices=share_devices(inventory, config))


@pytest.fixture(scope="module")
def model() -> Model:
    return models_from_slices(h100_slices())[H100]


def tenancy(level: TrustLevel) -> Tenancy:
    return Tenancy("ml", "blue", level, "blue" if level is TrustLevel.SHARED else None)


def test_the_models_are_the_published_profiles(model: Model) -> None:
    assert model.whole.memory_bytes == 81559 * (1 << 20)
    profiles = {k.profile: (k.compute, k.memory_bytes // (1 << 20), k.size) for k in model.mig}
    assert profiles["1g.10gb"] == (Fraction(16, 132), 9984, Fraction(1, 7))
    assert profiles["3g.40gb"] == (Fraction(60, 132), 40448, Fraction(3, 7))
    assert profiles["7g.80gb"] == (Fraction(1), 81152, Fraction(1))
    one = next(k for k in model.mig if k.profile == "3g.40gb")
    assert one.memory_share == Fraction(4, 8)
    assert (model.max_shares, model.share_mechanisms) == (8, (Mechanism.MPS, Mechanism.TIMESLICE))


# Peak SM use (whole GPUs) and memory (GiB) -> the smallest kind, 20 % headroom.
@pytest.mark.parametrize(
    ("sm", "memory_gib", "level", "expected"),
    [
        (0.05, 4, TrustLevel.PARTITIONED, "MIG 1g.10gb"),  # 0.06 <= 16/132, 4.8 GiB <= 9.75
        (0.05, 9, TrustLevel.PARTITIONED, "MIG 1g.20gb"),  # 10.8 GiB > 1g.10gb's 9.75
        (0.11, 4, TrustLevel.PARTITIONED, "MIG 1g.20gb"),  # 0.132 > 16/132; 1g.20gb has 26/132
        (0.30, 30, TrustLevel.PARTITIONED, "MIG 3g.40gb"),
        (0.40, 30, TrustLevel.PARTITIONED, "MIG 4g.40gb"),  # 0.48 > 60/132
        (0.50, 40, TrustLevel.PARTITIONED, "MIG 7g.80gb"),  # 48 GiB > 39.5 GiB
        (0.05, 4, TrustLevel.SHARED, "MPS share 1/8"),  # smaller than any MIG device
        (0.20, 4, TrustLevel.SHARED, "MPS share 1/4"),  # 0.24 <= 2/8, smaller than 2g (2/7)
        (0.05, 4, TrustLevel.ISOLATED, "whole GPU"),
        (0.05, 4, TrustLevel.DEDICATED, "whole GPU"),
        (0.90, 70, TrustLevel.SHARED, None),  # 1.08 GPUs: no single device fits
    ],
)
def test_the_smallest_kind_that_fits_with_headroom(
    model: Model, sm: float, memory_gib: float, level: TrustLevel, expected: str | None
) -> None:
    choice = smallest_fit(model, sm, memory_gib * GIB, tenancy(level), Fraction(1, 5))
    assert (choice.kind.name if choice.kind else None) == expected


@pytest.mark.parametrize(
    ("level", "forbidden"),
    [
        (TrustLevel.SHARED, []),
        (TrustLevel.PARTITIONED, ["MPS share 1/8", "time-slice share 1/8"]),
        (TrustLevel.ISOLATED, ["MIG 1g.10gb", "MPS share 1/8", "time-slice share 1/8"]),
    ],
)
def test_a_trust_level_that_forbids_a_kind_says_so(
    model: Model, level: TrustLevel, forbidden: list[str]
) -> None:
    choice = smallest_fit(model, 0.05, 4 * GIB, tenancy(level))
    assert sorted(k.name for k, _ in choice.forbidden) == sorted(forbidden)
    for _, why in choice.forbidden:
        assert f"trust level {level}" in why


def test_headroom_is_on_top_of_the_peak(model: Model) -> None:
    one_g = next(k for k in model.mig if k.profile == "1g.10gb")
    limit = float(Fraction(16, 132))
    assert fits(one_g, limit, GIB, Fraction(0))
    assert not fits(one_g, limit, GIB, Fraction(1, 100))
    assert fits(one_g, limit / 1.2, GIB, Fraction(1, 5))


@pytest.mark.parametrize(
    ("hours", "candidate", "prices", "gpu_hours", "cost"),
    [
        # 10 h of a whole GPU as a 1g.10gb: 10 - 10/7 GPU-h; 30.00 - 10 x 3.00 x 1/8.
        (10, "1g.10gb", PRICES, "8.571", Decimal("26.25")),
        # explicit 0.50 an hour: 30.00 - 5.00.
        (10, "1g.10gb", PRICES_MIG, "8.571", Decimal("25.00")),
        # 3g.40gb holds 4 of 8 memory slices: 30.00 - 15.00.
        (10, "3g.40gb", PRICES, "5.714", Decimal("15.00")),
        # a third of an hour: 1.00 - 0.125 = 0.875, rounded half up.
        (Fraction(1, 3), "1g.10gb", PRICES, "0.286", Decimal("0.88")),
        (10, "3g.40gb", None, "5.714", None),
    ],
)
def test_savings_arithmetic_is_decimal(
    model: Model,
    hours: float,
    candidate: str,
    prices: Any,
    gpu_hours: str,
    cost: Decimal | None,
) -> None:
    kind = next(k for k in model.mig if k.profile == candidate)
    s = savings(float(hours) * 3600, model.whole, kind, prices)
    assert s.gpu_hours.quantize(Decimal("0.001")) == Decimal(gpu_hours)
    assert s.cost == cost


def test_savings_of_a_share(model: Model) -> None:
    share = next(k for k in model.kinds() if k.mechanism is Mechanism.MPS)
    s = savings(8 * 3600.0, model.whole, share, PRICES)
    assert (s.gpu_hours, s.cost) == (Decimal(7), Decimal("21.00"))  # 8 h at 1/8 of 3.00


def samples(n: int, sm: float, memory_gib: float) -> tuple[Sample, ...]:
    return tuple(Sample(60.0 * i, sm * (i % 2 + 1) / 2, memory_gib * GIB) for i in range(n))


def workload(level: TrustLevel, claims: tuple[ClaimData, ...]) -> Workload:
    return Workload("ml", "Deployment", "serve", tenancy(level), claims)


def test_advice_for_a_workload(model: Model) -> None:
    claims = (
        ClaimData("ml", "a", 7200.0, model.whole, samples(20, 0.08, 6)),
        ClaimData("ml", "b", 3600.0, model.whole, samples(20, 0.04, 3)),
    )
    a = advise(workload(TrustLevel.PARTITIONED, claims), {H100: model}, prices=PRICES)
    assert a.status == "recommend"
    assert a.candidate is not None and a.candidate.name == "MIG 1g.10gb"
    assert a.stats is not None
    assert (a.stats.samples, a.stats.sm_peak, a.stats.memory_peak) == (40, 0.08, 6 * GIB)
    assert a.stats.sm_p95 == 0.08 and a.stats.memory_p95 == 6 * GIB
    assert a.savings is not None
    assert a.savings.gpu_hours.quantize(Decimal("0.001")) == Decimal("2.571")  # 3 h x 6/7
    assert a.savings.cost == Decimal("7.88")  # 6.00 - 0.75 and 3.00 - 0.375 (rounded up)
    doc = a.as_json("EUR")
    assert (doc["recommended"], doc["saved_cost"], doc["claims"]) == (
        "MIG 1g.10gb",
        "7.88",
        ["a", "b"],
    )


@pytest.mark.parametrize(
    ("claims", "status", "reason"),
    [
        ((ClaimData("ml", "a", 60.0, None, None),), "too-little-data", "no history"),
        ((ClaimData("ml", "a", 60.0, None, samples(9, 0.1, 1)),), "too-little-data", "9 samples"),
        ((ClaimData("ml", "a", 60.0, None, ()),), "too-little-data", "0 samples"),
        ((ClaimData("ml", "a", 60.0, None, samples(10, 0.1, 1)),), "unknown-device", "unknown"),
    ],
)
def test_too_little_data_is_never_guessed(
    model: Model, claims: tuple[ClaimData, ...], status: str, reason: str
) -> None:
    a = advise(workload(TrustLevel.SHARED, claims), {H100: model}, min_samples=10)
    assert (a.status, a.candidate, a.savings) == (status, None, None)
    assert reason in a.reason


def test_a_busy_workload_is_told_it_fits_now_or_nothing_fits(model: Model) -> None:
    busy = (ClaimData("ml", "a", 3600.0, model.whole, samples(10, 0.9, 70)),)
    a = advise(workload(TrustLevel.SHARED, busy), {H100: model})
    assert a.status == "no-fit"
    mid = (ClaimData("ml", "a", 3600.0, model.whole, samples(10, 0.35, 30)),)
    assert advise(workload(TrustLevel.SHARED, mid), {H100: model}).status == "recommend"
    big = (ClaimData("ml", "a", 3600.0, model.whole, samples(10, 0.5, 40)),)
    a = advise(workload(TrustLevel.PARTITIONED, big), {H100: model})
    assert (a.status, a.savings) == ("fits-now", None)  # a 7g.80gb is no smaller
    one_g = next(k for k in model.mig if k.profile == "1g.10gb")
    small = (ClaimData("ml", "a", 3600.0, one_g, samples(10, 0.05, 4)),)
    assert advise(workload(TrustLevel.PARTITIONED, small), {H100: model}).status == "fits-now"


def test_stats_peak_and_p95() -> None:
    points = [Sample(float(i), i / 100, float(i)) for i in range(1, 101)]
    s = stats(points)
    assert (s.samples, s.sm_peak, s.sm_p95, s.memory_peak, s.memory_p95) == (
        100,
        1.0,
        0.95,
        100.0,
        95.0,
    )


def meta(ns: str, name: str, uid: str = "", owner: tuple[str, str] | None = None) -> Any:
    m: dict[str, Any] = {"namespace": ns, "name": name, "uid": uid or f"uid-{name}"}
    if owner:
        m["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return m


def pod(name: str, claim: str, owner: tuple[str, str] | None = None, **spec: Any) -> Any:
    return {
        "metadata": meta("ml", name, owner=owner),
        "spec": spec,
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]},
    }


def claim(name: str, owner: tuple[str, str] | None = None, reserved: str = "") -> Any:
    status = {"reservedFor": [{"resource": "pods", "name": reserved, "uid": f"uid-{reserved}"}]}
    return {"metadata": meta("ml", name, owner=owner), "status": status if reserved else {}}


def test_owners_of_claims() -> None:
    cluster = Cluster(
        claims=(
            claim("c-deploy"),
            claim("c-job"),
            claim("c-sts"),
            claim("c-gang"),
            claim("c-bare"),
            claim("c-reserved", reserved="reserver"),
            claim("c-template", owner=("Pod", "gone-pod")),
            claim("c-alone"),
        ),
        pods=(
            pod("web-1", "c-deploy", ("ReplicaSet", "web-7d9")),
            pod("train-x", "c-job", ("Job", "train")),
            pod("db-0", "c-sts", ("StatefulSet", "db")),
            pod("gang-0", "c-gang", workloadRef={"name": "gang", "podGroup": "workers"}),
            pod("bare", "c-bare"),
            {"metadata": meta("ml", "reserver", owner=("Job", "other")), "spec": {}},
        ),
        replicasets=({"metadata": meta("ml", "web-7d9", owner=("Deployment", "web"))},),
    )
    keys = [
        ("ml", n)
        for n in (
            "c-deploy",
            "c-job",
            "c-sts",
            "c-gang",
            "c-bare",
            "c-reserved",
            "c-template",
            "c-alone",
            "c-deleted",
        )
    ]
    got = group(keys, cluster)
    assert [(o.kind, o.name, o.note) for o in (got[k] for k in keys)] == [
        ("Deployment", "web", ""),
        ("Job", "train", ""),
        ("StatefulSet", "db", ""),
        ("PodGroup", "gang/workers", ""),
        ("Pod", "bare", ""),
        ("Job", "other", ""),
        ("Pod", "gone-pod", "pods gone: grouped by the claim's owner"),
        ("ResourceClaim", "c-alone", "pods gone"),
        ("ResourceClaim", "c-deleted", "claim gone"),
    ]
    assert got[("ml", "c-deploy")] == Owner("ml", "Deployment", "web")


def test_a_finished_pods_bridge_claim_belongs_to_its_job() -> None:
    """A pod asking for nvidia.com/gpu through the bridge names its claim only in
    status.extendedResourceClaimStatus; once it finished, its claim lost reservedFor (or
    was deleted), and the claim still belongs to the pod's Job, as a template's claim does."""
    name = "train-x-extended-resources-k2x7q"
    bridged = {
        "metadata": meta("ml", "train-x", owner=("Job", "train")),
        "spec": {},
        "status": {
            "phase": "Succeeded",
            "extendedResourceClaimStatus": {
                "resourceClaimName": name,
                "requestMappings": [
                    {"containerName": "main", "resourceName": "nvidia.com/gpu",
                     "requestName": "container-0-request-0"}],
            },
        },
    }  # fmt: skip
    left = claim(name, owner=("Pod", "train-x"))
    for cluster in (Cluster(pods=(bridged,), claims=(left,)), Cluster(pods=(bridged,))):
        assert group([("ml", name)], cluster) == {("ml", name): Owner("ml", "Job", "train")}


def test_owners_of_gang_pods_and_claims_reserved_for_their_podgroup() -> None:
    """Kubernetes 1.37: a pod names its PodGroup in spec.schedulingGroup; a claim declared on
    the PodGroup is reserved for the group (status.reservedFor podgroups), not its pods."""
    group_ref = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "trainers"}
    shared = {
        "metadata": meta("ml", "c-shared"),
        "status": {"reservedFor": [{**group_ref, "uid": "pg-uid"}]},
    }
    orphan = {
        "metadata": meta("ml", "c-orphan"),
        "status": {"reservedFor": [{**group_ref, "name": "done", "uid": "pg-done"}]},
    }
    cluster = Cluster(
        claims=(shared, orphan, claim("c-own", owner=("PodGroup", "trainers")), claim("c-solo")),
        pods=(
            {
                "metadata": meta("ml", "trainer-0"),
                "spec": {
                    "schedulingGroup": {"podGroupName": "trainers"},
                    "resourceClaims": [{"name": "shared", "resourceClaimName": "c-shared"}],
                },
            },
            pod("solo-0", "c-solo", schedulingGroup={"podGroupName": "unknown-group"}),
        ),
        pod_groups=(
            {
                "metadata": meta("ml", "trainers"),
                "spec": {"workloadRef": {"workloadName": "train", "templateName": "workers"}},
            },
            {
                "metadata": meta("ml", "done"),
                "spec": {"workloadRef": {"workloadName": "finetune", "templateName": "w"}},
            },
        ),
    )
    keys = [("ml", n) for n in ("c-shared", "c-orphan", "c-own", "c-solo")]
    got = group(keys, cluster)
    assert [(o.kind, o.name, o.note) for o in (got[k] for k in keys)] == [
        ("Workload", "train", ""),
        ("Workload", "finetune", ""),  # reserved for the group, its pods gone
        ("Workload", "train", "pods gone: grouped by the claim's owner"),
        ("PodGroup", "unknown-group", ""),  # the PodGroup is not readable: shown by name
    ]


def allocated(name: str, device: str, **extra: Any) -> Any:
    result = {"driver": DEFAULT_DRIVER_NAME, "pool": NODE, "device": device, "request": "gpu"}
    result |= extra
    return {
        "metadata": meta("ml", name),
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_the_kind_a_claim_holds_comes_from_its_allocation() -> None:
    slices = h100_slices()
    models = models_from_slices(slices)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    whole = next(n for n in names if "-mig-" not in n and "-mps-" not in n and "-ts-" not in n)
    mig = next(n for n in names if "-mig-3g40gb-" in n)
    mps = next(n for n in names if "-mps-" in n)
    cluster = Cluster(
        claims=(
            allocated("whole", whole),
            allocated("mig", mig),
            allocated("mps", mps, consumedCapacity={"shares": "2"}),
            allocated("gone-device", "gpu-ffffffff"),
            {"metadata": meta("ml", "pending"), "status": {}},
        ),
        slices=tuple(slices),
    )
    keys = [("ml", n) for n in ("whole", "mig", "mps", "gone-device", "pending", "deleted")]
    kinds = claim_kinds(keys, cluster, models)
    named = {k[1]: (v[0].name if v[0] else v[1]) for k, v in kinds.items()}
    assert named == {
        "whole": "whole GPU",
        "mig": "MIG 3g.40gb",
        "mps": "MPS share 1/4",
        "gone-device": "device gpu-ffffffff is no longer published",
        "pending": "not allocated",
        "deleted": "claim gone",
    }


def test_a_kind_is_named() -> None:
    k = Kind(H100, Mechanism.TIMESLICE, Fraction(3, 8), GIB, Fraction(3, 8))
    assert k.name == "time-slice share 3/8"
