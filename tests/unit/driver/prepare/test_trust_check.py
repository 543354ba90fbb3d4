"""Trust levels at prepare: the guard's verdicts, fail-closed records, the executor's record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver.api import ClaimRef
from driver.checkpoint.store import Checkpoint, CheckpointData, ClaimRecord
from driver.errors import TrustViolation
from driver.faults import NO_FAULTS
from driver.nvml.sim import create_state
from driver.prepare.claims import ClaimAllocation
from driver.prepare.config import Sharing
from driver.prepare.plan import Plan, PlannedDevice
from driver.prepare.trust_check import check_claim
from driver.trust.policy import ColocationRefused, Reason, Tenancy, TrustLevel
from driver.usage.records import checkpoint_records
from tests.unit.claim_values import claim, config, ref_of, result
from tests.unit.sharing_node import sharing_state
from tests.unit.state_child import device_state

NODE = "node-a"
GPU1, GPU2 = "GPU-1111", "GPU-2222"


def tenancy(spec: str) -> Tenancy:
    """``"tenant:level[:group]"``; the namespace is ``ns-<tenant>``."""
    tenant, level, *group = spec.split(":")
    lv = TrustLevel(level)
    sharing_group = (group[0] if group else tenant) if lv is TrustLevel.SHARED else None
    return Tenancy(f"ns-{tenant}", tenant, lv, sharing_group)


def device(mech: str, gpu: str, slot: int = 0, admin: bool = False) -> PlannedDevice:
    """A planned device held through ``mech``: gpu, gpu+ts (own time-slicing), mig, ts, mps."""
    name = f"gpu-{gpu[-4:]}"
    kind: dict[str, Any] = {"type": "gpu", "device": name}
    if mech == "mig":
        kind = {"type": "mig", "device": f"{name}-mig-1g10gb-{slot}"}
    elif mech == "gpu+ts":
        kind["sharing"] = Sharing(strategy="TimeSlicing")
    elif mech in ("ts", "mps"):
        strategy = "MPS" if mech == "mps" else "TimeSlicing"
        kind |= {"share_id": f"share-{slot}", "sharing": Sharing(strategy=strategy)}
    return PlannedDevice(
        request="gpu", pool=NODE, gpu_uuid=gpu, uuid=gpu, minor=0, admin_access=admin, **kind
    )


def allocation(uid: str, namespace: str) -> ClaimAllocation:
    return ClaimAllocation(ClaimRef(uid, namespace, f"claim-{uid}"), (), ())


def record(uid: str, t: Tenancy | None, dev: PlannedDevice, **fields: Any) -> ClaimRecord:
    values: dict[str, Any] = {"tenant": t.tenant, "trust_level": t.level.value} if t else {}
    if t and t.sharing_group:
        values["sharing_group"] = t.sharing_group
    values |= fields
    return ClaimRecord(
        uid=uid,
        namespace=t.namespace if t else "ns-old",
        name=f"secret-name-{uid}",
        state="PrepareCompleted",
        plan=Plan(claim_uid=uid, devices=(dev,), steps=()),
        started_at=1.0,
        **values,
    )


def judge(new: Tenancy, new_dev: PlannedDevice, *held: ClaimRecord) -> None:
    state = CheckpointData(claims={r.uid: r for r in held})
    plan = Plan(claim_uid="new", devices=(new_dev,), steps=())
    check_claim(allocation("new", new.namespace), plan, state, new, NODE)


# (new claim, its device, the claim already prepared, its device) → refusal reason or None
CASES: dict[str, tuple[str, PlannedDevice, str, PlannedDevice, Reason | None]] = {
    "isolated GPUs side by side": (
        "a:isolated", device("gpu", GPU1), "b:isolated", device("gpu", GPU2), None
    ),
    "one whole GPU for two tenants": (
        "a:shared", device("gpu", GPU1), "b:shared", device("gpu", GPU1), Reason.EXCLUSIVE_GPU
    ),
    "isolated tenant time-slices its own GPU": (
        "a:isolated", device("gpu+ts", GPU1), "b:isolated", device("gpu", GPU2), None
    ),
    "isolated tenant asks for a time-slice share": (
        "a:isolated", device("ts", GPU1), "b:isolated", device("gpu", GPU2),
        Reason.LEVEL_FORBIDS_MECHANISM,
    ),
    "isolated tenant asks for MIG": (
        "a:isolated", device("mig", GPU1), "b:isolated", device("gpu", GPU2),
        Reason.LEVEL_FORBIDS_MECHANISM,
    ),
    "partitioned MIG neighbours": (
        "a:partitioned", device("mig", GPU1, 0), "b:partitioned", device("mig", GPU1, 1), None
    ),
    "shared and partitioned MIG neighbours": (
        "a:shared", device("mig", GPU1, 0), "b:partitioned", device("mig", GPU1, 1), None
    ),
    "MPS share beside a partitioned MIG device": (
        "a:shared", device("mps", GPU1), "b:partitioned", device("mig", GPU1),
        Reason.LEVEL_FORBIDS_SHARING,
    ),
    "time-slice share beside an isolated whole GPU": (
        "a:shared", device("ts", GPU1), "b:isolated", device("gpu", GPU1), Reason.EXCLUSIVE_GPU
    ),
    "time-slice share beside an isolated tenant's MIG device": (
        "a:shared", device("ts", GPU1), "b:isolated", device("mig", GPU1), Reason.ISOLATED_GPU
    ),
    "time-slice shares of one sharing group": (
        "a:shared:blue", device("ts", GPU1, 0), "b:shared:blue", device("ts", GPU1, 1), None
    ),
    "time-slice shares of two sharing groups": (
        "a:shared:blue", device("ts", GPU1, 0), "b:shared:red", device("ts", GPU1, 1),
        Reason.DIFFERENT_SHARING_GROUP,
    ),
    "MPS and time-slice shares of one group": (
        "a:shared:blue", device("mps", GPU1, 0), "b:shared:blue", device("ts", GPU1, 1), None
    ),
    "a dedicated tenant's node": (
        "a:isolated", device("gpu", GPU1), "b:dedicated", device("gpu", GPU2),
        Reason.DEDICATED_NODE,
    ),
    "a dedicated tenant's second GPU": (
        "b:dedicated", device("gpu", GPU1), "b:dedicated", device("gpu", GPU2), None
    ),
    "an admin-access device is not judged": (
        "a:isolated", device("gpu", GPU1, admin=True), "b:isolated", device("gpu", GPU1), None
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_verdicts(case: str) -> None:
    new_spec, new_dev, held_spec, held_dev, reason = CASES[case]
    new, held = tenancy(new_spec), tenancy(held_spec)
    if reason is None:
        judge(new, new_dev, record("held", held, held_dev))
        return
    with pytest.raises(ColocationRefused) as err:
        judge(new, new_dev, record("held", held, held_dev))
    assert err.value.reason is reason
    assert err.value.tenant == new.tenant
    message = str(err.value)
    assert message.startswith(f"claim {new.namespace}/claim-new: ")
    assert "secret-name-held" not in message
    if reason is Reason.LEVEL_FORBIDS_MECHANISM:
        assert f"namespace {new.namespace} has trust level {new.level}" in message
        assert err.value.other_tenant is None
    else:
        assert f"tenant {new.tenant} " in message
        assert f"tenant {held.tenant} " in message
        assert err.value.other_tenant == held.tenant


@pytest.mark.parametrize(
    "fields",
    [{}, {"tenant": "b", "trust_level": "trusted"}, {"trust_level": "shared"}],
    ids=["no tenancy recorded", "unknown level recorded", "no tenant recorded"],
)
def test_records_without_tenancy_fail_closed(fields: dict[str, Any]) -> None:
    """An old record counts as a dedicated tenant of its own: nobody else on the node."""
    old = record("old", None, device("ts", GPU2), **fields)
    for new in (tenancy("a:shared"), Tenancy("ns-old", "ns-old", TrustLevel.SHARED, "ns-old")):
        with pytest.raises(ColocationRefused) as err:
            judge(new, device("gpu", GPU1), old)
        assert err.value.reason is Reason.DEDICATED_NODE
        assert err.value.other_tenant == "unrecorded:ns-old"


def test_a_record_of_the_same_tenant_with_an_unknown_level_still_fails_closed() -> None:
    """Records of the new claim's own tenant are skipped, but only when their tenancy is known."""
    old = record("old", None, device("ts", GPU2), tenant="b", trust_level="trusted")
    with pytest.raises(ColocationRefused) as err:
        judge(Tenancy("ns-b", "b", TrustLevel.SHARED, "g"), device("gpu", GPU1), old)
    assert err.value.other_tenant == "unrecorded:ns-old"
    held = record("same", tenancy("b:isolated"), device("gpu", GPU1))
    judge(Tenancy("ns-b", "b", TrustLevel.ISOLATED, None), device("gpu", GPU1), held)
    with pytest.raises(ColocationRefused):
        judge(Tenancy("ns-c", "c", TrustLevel.ISOLATED, None), device("gpu", GPU1), held)


def test_a_claims_own_record_is_not_its_neighbour() -> None:
    """A half-prepared attempt of the same claim (rolled back later) never refuses it."""
    me = tenancy("a:isolated")
    judge(me, device("gpu", GPU1), record("new", tenancy("b:isolated"), device("gpu", GPU1)))


# ---- through the executor, on the simulated node ---------------------------------------

TS = {
    "apiVersion": "gpu.tranche.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing"},
}


def test_executor_records_tenancy_and_refuses_another_group(tmp_path: Path) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    gpu = ds.inventory.gpus[0].name
    blue = Tenancy("team-a", "acme", TrustLevel.SHARED, "blue")
    red = Tenancy("team-r", "rival", TrustLevel.SHARED, "red")

    def share(uid: str, namespace: str) -> dict[str, Any]:
        return claim(
            uid, [result(gpu, shareID=f"s-{uid}")], [config(TS)], name=f"c-{uid}",
            namespace=namespace,
        )  # fmt: skip

    a, b = share("ua", "team-a"), share("ub", "team-r")
    refused: list[TrustViolation] = []
    assert ds.prepare(a, ref_of(a), blue, refused.append).error == ""
    error = ds.prepare(b, ref_of(b), red, refused.append).error
    assert error.startswith("claim team-r/c-ub: trust levels forbid tenant rival")
    assert "tenant acme (trust level shared, sharing group blue)" in error
    assert "c-ua" not in error
    (refusal,) = refused
    assert isinstance(refusal, ColocationRefused)
    assert (refusal.reason, refusal.tenant, refusal.other_tenant) == (
        Reason.DIFFERENT_SHARING_GROUP, "rival", "acme"
    )  # fmt: skip

    state, _ = Checkpoint(tmp_path / "checkpoint.json", boot_id="boot-1").load()
    (kept,) = state.claims.values()
    assert (kept.uid, kept.tenant, kept.trust_level, kept.sharing_group) == (
        "ua", "acme", "shared", "blue"
    )  # fmt: skip
    assert kept.allocation is not None and kept.allocation.tenant == "acme"
    assert not (tmp_path / "cdi" / "gpu.tranche.dev-claim_ub.json").exists()

    # Without a tenancy (callers that know no tenants) the executor checks no trust,
    # and attribution falls back to the namespace mapping for that record.
    assert ds.prepare(b, ref_of(b)).error == ""
    records = checkpoint_records(tmp_path / "checkpoint.json", lambda ns: f"mapped-{ns}")()
    assert {r.name: r.tenant for r in records} == {"c-ua": "acme", "c-ub": "mapped-team-r"}

    # The level applies to new claims: the prepared claim keeps its answer.
    isolated = Tenancy("team-a", "acme", TrustLevel.ISOLATED, None)
    assert ds.prepare(a, ref_of(a), isolated).error == ""


def share_device(gpu: str, group: str, strategy: str = "TimeSlicing") -> PlannedDevice:
    return PlannedDevice(
        request="gpu", pool=NODE, device=f"gpu-{gpu[-4:]}-ts-{group}", type="gpu", gpu_uuid=gpu,
        uuid=gpu, minor=0, share_id="s-1", sharing=Sharing(strategy=strategy),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("new", "dev", "dedicated_to", "reason"),
    [
        ("red:shared:red", share_device(GPU1, "blue"), None, Reason.OTHER_GROUPS_DEVICE),
        ("red:shared:blue", share_device(GPU1, "blue"), None, None),
        ("blue:shared", share_device(GPU1, "blue"), None, None),
        ("a:isolated", device("gpu", GPU1), "acme", Reason.NODE_DEDICATED_TO_OTHER),
        ("acme:dedicated", device("gpu", GPU1), "acme", None),
        ("acme:isolated", device("gpu", GPU1), "acme", None),
        ("a:isolated", device("gpu", GPU1, admin=True), "acme", None),
        ("a:isolated", device("gpu", GPU1), None, None),
    ],
)
def test_placement_checks_the_devices_group_and_the_nodes_tenant(
    new: str, dev: PlannedDevice, dedicated_to: str | None, reason: Reason | None
) -> None:
    t = tenancy(new)
    plan = Plan(claim_uid="new", devices=(dev,), steps=())
    groups = {share_device(GPU1, "blue").device: "blue"}
    args = (allocation("new", t.namespace), plan, CheckpointData(claims={}), t, NODE)
    if reason is None:
        check_claim(*args, device_groups=groups, dedicated_to=dedicated_to)
        return
    with pytest.raises(ColocationRefused) as refused:
        check_claim(*args, device_groups=groups, dedicated_to=dedicated_to)
    assert refused.value.reason is reason and refused.value.tenant == t.tenant
    assert str(refused.value).startswith(f"claim {t.namespace}/claim-new: ")
    assert dev.device in str(refused.value)


def test_executor_refuses_another_groups_share_device_and_a_node_dedicated_to_another(
    tmp_path: Path,
) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    ds, node, _ = sharing_state(tmp_path)
    gpu = ds.inventory.gpus[0].name
    blue_device = f"{gpu}-ts-blue"
    assert node.shares[blue_device].sharing_group == "blue"
    red = Tenancy("team-r", "rival", TrustLevel.SHARED, "red")
    obj = claim(
        "ur", [result(blue_device, shareID="s-r")], [config(TS)], name="c-ur", namespace="team-r"
    )
    refused: list[TrustViolation] = []
    error = ds.prepare(obj, ref_of(obj), red, refused.append).error
    assert error.startswith(f"claim team-r/c-ur: device {blue_device} on node node-a is a share")
    assert "sharing group blue" in error and "tenant rival" in error
    (refusal,) = refused
    assert isinstance(refusal, ColocationRefused)
    assert refusal.reason is Reason.OTHER_GROUPS_DEVICE
    assert not (tmp_path / "cdi" / "gpu.tranche.dev-claim_ur.json").exists()
    # A level that forbids the mechanism is the reason given, wherever the claim landed:
    # a partitioned tenant never time-slices, whichever group's device it was put on.
    partitioned = Tenancy("team-p", "parts", TrustLevel.PARTITIONED, None)
    forced = claim(
        "up", [result(blue_device, shareID="s-p")], [config(TS)], name="c-up", namespace="team-p"
    )
    ds.prepare(forced, ref_of(forced), partitioned, refused.append)
    assert isinstance(refused[-1], ColocationRefused)
    assert refused[-1].reason is Reason.LEVEL_FORBIDS_MECHANISM
    blue = Tenancy("team-b", "bluecorp", TrustLevel.SHARED, "blue")
    ok = claim(
        "ub", [result(blue_device, shareID="s-b")], [config(TS)], name="c-ub", namespace="team-b"
    )
    assert ds.prepare(ok, ref_of(ok), blue).error == ""

    ds.dedicated_to = "acme"  # --dedicated-to acme
    whole = claim("ui", [result(ds.inventory.gpus[1].name)], name="c-ui", namespace="team-i")
    isolated = Tenancy("team-i", "other", TrustLevel.ISOLATED, None)
    error = ds.prepare(whole, ref_of(whole), isolated, refused.append).error
    assert error.startswith("claim team-i/c-ui: node node-a is dedicated to tenant acme")
    last = refused[-1]
    assert isinstance(last, ColocationRefused) and last.reason is Reason.NODE_DEDICATED_TO_OTHER
    acme = Tenancy("team-i", "acme", TrustLevel.ISOLATED, None)
    assert ds.prepare(whole, ref_of(whole), acme).error == ""


def test_executor_judges_other_tenants_on_every_gpu_and_skips_its_own(tmp_path: Path) -> None:
    """The executor hands the trust check only other tenants' claims (a node full of one
    tenant's claims costs a prepare nothing), but from every GPU: a dedicated tenant holds
    the whole node, so a claim of another tenant on another GPU is refused."""
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    names = [g.name for g in ds.inventory.gpus]
    acme = Tenancy("team-a", "acme", TrustLevel.DEDICATED, None)
    for i in range(3):
        mine = claim(f"ua{i}", [result(names[i])], name=f"c-ua{i}", namespace="team-a")
        assert ds.prepare(mine, ref_of(mine), acme).error == ""
    rival = Tenancy("team-r", "rival", TrustLevel.SHARED, "red")
    far = claim("ur", [result(names[6])], name="c-ur", namespace="team-r")
    error = ds.prepare(far, ref_of(far), rival).error
    assert "trust levels forbid tenant rival" in error
    assert "tenant acme" in error
    for i in range(3):
        assert ds.unprepare(ClaimRef(f"ua{i}", "team-a", f"c-ua{i}")).error == ""
    assert ds.prepare(far, ref_of(far), rival).error == ""


def _held_node(tmp_path: Path) -> tuple[Any, list[str], dict[str, Any], Tenancy]:
    """A node whose claim ``ua`` (tenant acme, a whole GPU) was prepared, then its checkpoint
    file damaged, then the plugin restarted: the claim is held, devices unknown."""
    create_state("dgx-h100", tmp_path / "sim.json")
    ds = device_state(tmp_path, NO_FAULTS)
    names = [g.name for g in ds.inventory.gpus]
    acme = Tenancy("team-a", "acme", TrustLevel.SHARED, "blue")
    held = claim("ua", [result(names[0])], name="c-ua", namespace="team-a")
    assert ds.prepare(held, ref_of(held), acme).error == ""
    (tmp_path / "checkpoint.d" / "ua.json").write_bytes(b"\x00 damaged by the disk")
    restarted = device_state(tmp_path, NO_FAULTS)
    report = restarted.recover()
    assert report.checkpoint.kind == "corrupt"
    assert "until the kubelet unprepares those claims" in report.checkpoint.message
    return restarted, names, held, acme


def test_a_claim_whose_checkpoint_file_was_corrupt_keeps_every_other_claim_off_the_node(
    tmp_path: Path,
) -> None:
    """Its GPUs and tenant are unknown, so no claim shares the node with it, not even one of
    the same namespace on another GPU, until the kubelet unprepares it."""
    _, names, held, acme = _held_node(tmp_path)
    changed: list[int] = []
    ds = device_state(tmp_path, NO_FAULTS, on_holds_changed=lambda: changed.append(1))
    hold = tmp_path / "checkpoint.d" / "ua.hold"
    assert hold.exists()
    refused: list[TrustViolation] = []
    for n, (namespace, tenancy_) in enumerate(
        [("team-a", acme), ("team-r", Tenancy("team-r", "rival", TrustLevel.ISOLATED, None))]
    ):
        new = claim(f"ub{n}", [result(names[6])], name=f"c-ub{n}", namespace=namespace)
        error = ds.prepare(new, ref_of(new), tenancy_, refused.append).error
        assert error.startswith(f"claim {namespace}/c-ub{n}: claim ua may still hold GPUs")
        assert "ua.json.corrupt-" in error and str(hold) in error
        assert not (tmp_path / "cdi" / f"gpu.tranche.dev-claim_ub{n}.json").exists()
    assert [(r.reason, r.tenant) for r in refused if isinstance(r, ColocationRefused)] == [
        (Reason.UNKNOWN_HOLDER, "acme"), (Reason.UNKNOWN_HOLDER, "rival")
    ]  # fmt: skip

    # An admin-access device is a cluster administrator's grant: not judged.
    admin = claim("uz", [result(names[5], adminAccess=True)], name="c-uz", namespace="team-r")
    assert ds.prepare(admin, ref_of(admin), acme).error == ""

    # The kubelet unprepares the claim (its pod ended): the hold goes, the node takes claims,
    # and the node is told (its slices lose the hold's taint).
    assert changed == []
    assert ds.unprepare(ref_of(held)).error == ""
    assert not hold.exists()
    assert changed == [1]
    assert list((tmp_path / "checkpoint.d").glob("ua.json.corrupt-*"))  # kept for inspection
    new = claim("ub0", [result(names[6])], name="c-ub0", namespace="team-a")
    assert ds.prepare(new, ref_of(new), acme).error == ""
    # A second plugin process sees the release too.
    other = claim("uc", [result(names[7])], name="c-uc", namespace="team-a")
    assert device_state(tmp_path, NO_FAULTS).prepare(other, ref_of(other), acme).error == ""


def test_a_corrupt_file_found_by_a_running_plugin_holds_and_tells_the_node(
    tmp_path: Path,
) -> None:
    create_state("dgx-h100", tmp_path / "sim.json")
    changed: list[int] = []
    ds = device_state(tmp_path, NO_FAULTS, on_holds_changed=lambda: changed.append(1))
    names = [g.name for g in ds.inventory.gpus]
    acme = Tenancy("team-a", "acme", TrustLevel.SHARED, "blue")
    held = claim("ua", [result(names[0])], name="c-ua", namespace="team-a")
    assert ds.prepare(held, ref_of(held), acme).error == ""
    other = device_state(tmp_path, NO_FAULTS)  # a second plugin pod prepares a claim
    keep = claim("uk", [result(names[1])], name="c-uk", namespace="team-a")
    assert other.prepare(keep, ref_of(keep), acme).error == ""
    (tmp_path / "checkpoint.d" / "ua.json").write_bytes(b"damaged")
    new = claim("ub", [result(names[6])], name="c-ub", namespace="team-a")
    assert changed == []
    # This process reads the files again (another changed them), moves the damaged one aside
    # and holds its claim: the node is told, so that its slices carry the hold's taint.
    assert "claim ua may still hold GPUs" in ds.prepare(new, ref_of(new), acme).error
    assert changed == [1]


def test_a_failing_holds_callback_fails_no_call(tmp_path: Path) -> None:
    _, _, held, _ = _held_node(tmp_path)

    def fail() -> None:
        raise ValueError("no slices")

    ds = device_state(tmp_path, NO_FAULTS, on_holds_changed=fail)
    assert ds.unprepare(ref_of(held)).error == ""
    assert not (tmp_path / "checkpoint.d" / "ua.hold").exists()


def test_the_held_claim_prepared_again_is_known_and_its_unprepare_releases_the_hold(
    tmp_path: Path,
) -> None:
    ds, names, held, acme = _held_node(tmp_path)
    assert ds.prepare(held, ref_of(held), acme).error == ""  # the kubelet's retry: same claim
    new = claim("ub", [result(names[6])], name="c-ub", namespace="team-a")
    assert ds.prepare(new, ref_of(new), acme).error == ""  # its record is back: judged as usual
    assert ds.unprepare(ref_of(new)).error == ""
    assert ds.unprepare(ref_of(held)).error == ""
    assert not (tmp_path / "checkpoint.d" / "ua.hold").exists()  # not back once the file goes
    assert device_state(tmp_path, NO_FAULTS).prepare(new, ref_of(new), acme).error == ""


def test_a_hold_ends_with_a_reboot_or_its_file_but_an_unreadable_one_still_holds(
    tmp_path: Path,
) -> None:
    _, names, _, acme = _held_node(tmp_path)
    hold = tmp_path / "checkpoint.d" / "ua.hold"
    new = claim("ub", [result(names[6])], name="c-ub", namespace="team-a")
    hold.write_bytes(b"not json")  # fails closed, whatever boot it came from
    after_reboot = device_state(tmp_path, NO_FAULTS, boot_id="boot-2")
    after_reboot.recover()
    assert "claim ua may still hold GPUs" in after_reboot.prepare(new, ref_of(new), acme).error

    # An administrator deletes the hold file: the running plugin sees it at once.
    hold.unlink()
    assert after_reboot.prepare(new, ref_of(new), acme).error == ""

    # A readable hold of another boot is released at start-up: a reboot ended the claim's
    # containers and device state. A file moved aside by an older plugin has no hold at all.
    (tmp_path / "second").mkdir()
    _, names, _, acme = _held_node(tmp_path / "second")
    fresh = device_state(tmp_path / "second", NO_FAULTS, boot_id="boot-2")
    fresh.recover()
    assert not (tmp_path / "second" / "checkpoint.d" / "ua.hold").exists()
    assert list((tmp_path / "second" / "checkpoint.d").glob("ua.json.corrupt-*"))
    assert fresh.prepare(new, ref_of(new), acme).error == ""


def test_a_corrupt_single_file_checkpoint_keeps_every_other_claim_off_the_node(
    tmp_path: Path,
) -> None:
    """An earlier plugin's ``checkpoint.json`` that cannot be read named claims of unknown
    tenants on unknown GPUs, whose pods may still run: like a corrupt claim file, it holds
    the node (no claim is prepared on it) until an administrator deletes the hold or the
    node reboots. Starting empty put another tenant on the same GPU."""
    create_state("dgx-h100", tmp_path / "sim.json")
    (tmp_path / "checkpoint.json").write_bytes(b"\x00 damaged by the disk")
    ds = device_state(tmp_path, NO_FAULTS)
    report = ds.recover()
    assert report.checkpoint.kind == "corrupt"
    names = [g.name for g in ds.inventory.gpus]
    rival = Tenancy("team-r", "rival", TrustLevel.ISOLATED, None)
    new = claim("ub", [result(names[0])], name="c-ub", namespace="team-r")
    refused: list[TrustViolation] = []
    error = ds.prepare(new, ref_of(new), rival, refused.append).error
    hold = tmp_path / "checkpoint.d" / "checkpoint.json.hold"
    assert error.startswith("claim team-r/c-ub: the claims of the single-file checkpoint ")
    assert "checkpoint.json.corrupt-" in error and str(hold) in error
    assert [r.reason for r in refused if isinstance(r, ColocationRefused)] == [
        Reason.UNKNOWN_HOLDER
    ]
    assert not (tmp_path / "cdi" / "gpu.tranche.dev-claim_ub.json").exists()
    # The kubelet's unprepare of a claim the node does not know releases nothing.
    assert ds.unprepare(ref_of(new)).error == ""
    assert hold.exists()

    # An administrator deletes the hold, having checked that the old claims' pods are gone.
    hold.unlink()
    assert ds.prepare(new, ref_of(new), rival).error == ""

    # A reboot ends whatever the old claims held: the hold of another boot is released.
    (tmp_path / "second").mkdir()
    create_state("dgx-h100", tmp_path / "second" / "sim.json")
    (tmp_path / "second" / "checkpoint.json").write_bytes(b"garbage")
    device_state(tmp_path / "second", NO_FAULTS).recover()
    assert (tmp_path / "second" / "checkpoint.d" / "checkpoint.json.hold").exists()
    fresh = device_state(tmp_path / "second", NO_FAULTS, boot_id="boot-2")
    fresh.recover()
    assert fresh.prepare(new, ref_of(new), rival).error == ""
