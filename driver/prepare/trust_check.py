"""Trust levels at prepare: the new claim against every claim the checkpoint holds.

Pure: :func:`check_claim` turns the new claim's plan and every recorded claim into
:class:`driver.trust.policy.Consumer` values and lets :func:`driver.trust.policy.check_prepare`
judge them. The executor's prepare (:mod:`driver.prepare.prepare_path`) calls it under the
node-wide lock, before any other guard, whenever the caller passes the claim's tenancy.

How a planned device is held (its :class:`~driver.trust.policy.Mechanism`):

* a share of a multi-allocatable device (the allocation has a ``shareID``):
  ``mps`` with the MPS strategy, otherwise ``timeslice``: other claims hold the
  same device at the same time;
* otherwise a MIG device is ``mig`` and a whole GPU is ``gpu``, whatever the
  sharing strategy *inside* the claim (time-slicing or MPS between one claim's
  own pods shares nothing with other tenants; two claims on one such device are
  judged as two holders of one whole GPU, which only one tenant may be);
* a device with admin access is not judged: it is a cluster administrator's
  grant, gated by the API server (``resource.kubernetes.io/admin-access``).

Before the pairs, the claim is judged against where it landed (:func:`check_placement`):
a share device belongs to one sharing group (its ``sharingGroup`` attribute) and only
that group's tenants may hold it; a node run with ``--dedicated-to <tenant>`` (every
device carries ``dedicatedTo``) takes only that tenant's claims. Admission and the
device classes normally keep such claims off; prepare is the last line when they were
bypassed (a class an administrator wrote, an allocation written by hand).

A recorded claim without tenancy (written by an older plugin) or with a level this
version does not know fails closed: it counts as a ``dedicated`` tenant of its own
that shares with nobody. A claim whose checkpoint file was corrupt (a
:class:`~driver.checkpoint.holds.Hold`) is known by its UID alone: no other claim is
prepared on the node until it is released (:func:`check_holds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from driver.checkpoint.holds import LEGACY_HOLD
from driver.checkpoint.store import CheckpointData, ClaimRecord, Hold
from driver.prepare.claims import ClaimAllocation
from driver.prepare.plan import Plan, PlannedDevice
from driver.trust.policy import (
    ColocationRefused,
    Consumer,
    Mechanism,
    Reason,
    Tenancy,
    TrustLevel,
    check_prepare,
    judge_request,
)

UNRECORDED_PREFIX = "unrecorded:"
_LEVELS = frozenset(level.value for level in TrustLevel)


def mechanism_of(device: PlannedDevice) -> Mechanism:
    """How ``device`` is held with respect to other claims."""
    if device.share_id is not None:
        return Mechanism.MPS if device.sharing.strategy == "MPS" else Mechanism.TIMESLICE
    return Mechanism.MIG if device.type == "mig" else Mechanism.GPU


def recorded_tenancy(record: ClaimRecord) -> Tenancy:
    """The tenancy a checkpoint record holds; missing or unknown data fails closed."""
    try:
        level = TrustLevel(record.trust_level) if record.trust_level is not None else None
    except ValueError:
        level = None
    if record.tenant is None or level is None:
        return Tenancy(
            record.namespace, f"{UNRECORDED_PREFIX}{record.namespace}", TrustLevel.DEDICATED, None
        )
    return Tenancy(record.namespace, record.tenant, level, record.sharing_group)


def consumers(claim: str, tenancy: Tenancy, plan: Plan, node: str) -> Iterator[Consumer]:
    """One consumer per device of ``plan`` that trust rules judge."""
    for d in plan.devices:
        if d.admin_access:
            continue
        yield Consumer(claim, tenancy, mechanism_of(d), node, d.gpu_uuid, d.device)


def _same_tenant(record: ClaimRecord, tenancy: Tenancy) -> bool:
    """Whether ``record`` is held by the new claim's tenant, whom no pair rule refuses
    (:func:`driver.trust.policy.judge_pair`): skipping such records keeps a prepare on a node
    full of one tenant's claims from judging every one of them. A record whose tenancy
    fails closed (no tenant, or a level this version does not know: see
    :func:`recorded_tenancy`) is never the same tenant."""
    return record.tenant == tenancy.tenant and record.trust_level in _LEVELS


def judged_with(tenancy: Tenancy) -> Callable[[tuple[str | None, str | None]], bool]:
    """Whether records of a recorded (tenant, trust level) are judged against a new claim of
    ``tenancy``: every one but the tenant's own (see :func:`_same_tenant`)."""

    def judged(key: tuple[str | None, str | None]) -> bool:
        tenant, level = key
        return not (tenant == tenancy.tenant and level in _LEVELS)

    return judged


def check_placement(
    allocation: ClaimAllocation,
    plan: Plan,
    tenancy: Tenancy,
    node: str,
    *,
    device_groups: Mapping[str, str],
    dedicated_to: str | None,
) -> None:
    """Raise :class:`ColocationRefused` when the claim's tenant may not hold a device where
    it is: a node dedicated to another tenant, or another sharing group's share device.

    ``device_groups``: the sharing group of each share device of the node by name;
    ``dedicated_to``: the tenant the node is dedicated to, or None.
    """
    for d in plan.devices:
        if d.admin_access:
            continue
        if dedicated_to is not None and tenancy.tenant != dedicated_to:
            raise ColocationRefused(
                f"claim {allocation.key}: node {node} is dedicated to tenant {dedicated_to} "
                f"(device {d.device} has dedicatedTo={dedicated_to}); {tenancy.describe()} "
                "may not be prepared on it",
                Reason.NODE_DEDICATED_TO_OTHER,
                tenancy.tenant,
                dedicated_to,
            )
        group = device_groups.get(d.device)
        if group is not None and tenancy.sharing_group != group:
            raise ColocationRefused(
                f"claim {allocation.key}: device {d.device} on node {node} is a share device of "
                f"sharing group {group} (sharingGroup={group}); {tenancy.describe()} may only "
                "use its own group's share devices",
                Reason.OTHER_GROUPS_DEVICE,
                tenancy.tenant,
                None,
            )


def check_claim(
    allocation: ClaimAllocation,
    plan: Plan,
    state: CheckpointData,
    tenancy: Tenancy,
    node: str,
    *,
    device_groups: Mapping[str, str] | None = None,
    dedicated_to: str | None = None,
) -> None:
    """Raise :class:`ColocationRefused` (message naming the claim) if trust levels forbid it.

    ``state`` holds every claim prepared or being prepared on the node; the new
    claim's own record, if any, is ignored. ``device_groups`` and ``dedicated_to``:
    see :func:`check_placement`. The claim's own level is judged first (a level that
    forbids the mechanism is the reason to give, wherever the claim landed), then its
    placement, then every pair with the other tenants' consumers.
    """
    news = list(consumers(plan.claim_uid, tenancy, plan, node))
    for new in news:
        verdict = judge_request(new.tenancy, new.mechanism)
        if not verdict.allowed:
            assert verdict.reason is not None
            raise ColocationRefused(
                f"claim {allocation.key}: {verdict.detail}; refused to prepare {new.device}",
                verdict.reason,
                tenancy.tenant,
                None,
            )
    check_placement(
        allocation,
        plan,
        tenancy,
        node,
        device_groups=device_groups or {},
        dedicated_to=dedicated_to,
    )
    others = [
        c
        for record in state.claims.values()
        if record.uid != plan.claim_uid and not _same_tenant(record, tenancy)
        for c in consumers(record.uid, recorded_tenancy(record), record.plan, node)
    ]
    for new in news:
        try:
            check_prepare(new, others)
        except ColocationRefused as e:
            raise ColocationRefused(
                f"claim {allocation.key}: {e}", e.reason, e.tenant, e.other_tenant
            ) from e


def check_holds(
    allocation: ClaimAllocation, plan: Plan, tenancy: Tenancy, holds: Iterable[Hold], node: str
) -> None:
    """Raise :class:`ColocationRefused` while another claim of the node may hold devices that
    nothing records (its checkpoint file was corrupt): which GPUs, and whose, is unknown, so
    every other claim's device could be next to it. Admin-access devices are not judged."""
    if all(d.admin_access for d in plan.devices):
        return
    for hold in holds:
        if hold.uid == plan.claim_uid:
            continue  # the same claim, prepared again
        if hold.uid == LEGACY_HOLD:
            raise ColocationRefused(
                f"claim {allocation.key}: the claims of the single-file checkpoint may still "
                f"hold GPUs of node {node}, but it was corrupt (moved to {hold.moved_to}), so "
                f"which claims, GPUs and tenants are unknown; {tenancy.describe()} is not "
                f"prepared on this node until an administrator deletes {hold.path} or the "
                "node reboots (docs/checkpoint.md)",
                Reason.UNKNOWN_HOLDER,
                tenancy.tenant,
                None,
            )
        raise ColocationRefused(
            f"claim {allocation.key}: claim {hold.uid} may still hold GPUs of node {node}, but "
            f"its checkpoint file was corrupt (moved to {hold.moved_to}), so which GPUs and "
            f"which tenant are unknown; {tenancy.describe()} is not prepared on this node until "
            f"the kubelet unprepares claim {hold.uid} or an administrator deletes {hold.path} "
            "(docs/checkpoint.md)",
            Reason.UNKNOWN_HOLDER,
            tenancy.tenant,
            None,
        )
