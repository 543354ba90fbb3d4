"""Tenant trust levels: who may share a GPU, a node or a device with whom.

Pure rules, no I/O. ``docs/trust.md`` explains the levels; the admission
policies in ``deploy/policies/`` enforce the same matrix when a claim is
created, and :func:`check_prepare` is the last line at prepare time.

A *tenant* is a namespace, or the namespaces that share the label
``gpu.tranche.dev/tenant``. Its *level* and *sharing group* come from the labels
``gpu.tranche.dev/trust-level`` and ``gpu.tranche.dev/sharing-group``. Bad labels
never fail open: they are reported and the configured safe default applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from driver.errors import TrustViolation

LABEL_TENANT = "gpu.tranche.dev/tenant"
LABEL_LEVEL = "gpu.tranche.dev/trust-level"
LABEL_SHARING_GROUP = "gpu.tranche.dev/sharing-group"

# A sharing group names published share devices (``<gpu>-ts-<group>``), so it must
# be a DNS label short enough to leave room for the GPU name (63 - len("gpu-xxxxxxxx-mps-")).
MAX_SHARING_GROUP_LENGTH = 46
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class TrustLevel(StrEnum):
    """Ordered from the strictest to the most permissive."""

    DEDICATED = "dedicated"
    ISOLATED = "isolated"
    PARTITIONED = "partitioned"
    SHARED = "shared"

    @property
    def strictness(self) -> int:
        """Higher is stricter."""
        return len(_LEVEL_ORDER) - _LEVEL_ORDER.index(self)


_LEVEL_ORDER: tuple[TrustLevel, ...] = tuple(TrustLevel)
DEFAULT_LEVEL = TrustLevel.ISOLATED


class Mechanism(StrEnum):
    """How a claim holds a GPU."""

    GPU = "gpu"  # a whole GPU, exclusively
    MIG = "mig"  # a MIG device, a hardware partition of a GPU
    TIMESLICE = "timeslice"  # a time-slice share of a GPU, no memory isolation
    MPS = "mps"  # an MPS share of a GPU, one fault domain


SHARE_MECHANISMS = frozenset({Mechanism.TIMESLICE, Mechanism.MPS})

ALLOWED_MECHANISMS: Mapping[TrustLevel, frozenset[Mechanism]] = {
    TrustLevel.DEDICATED: frozenset({Mechanism.GPU}),
    TrustLevel.ISOLATED: frozenset({Mechanism.GPU}),
    TrustLevel.PARTITIONED: frozenset({Mechanism.GPU, Mechanism.MIG}),
    TrustLevel.SHARED: frozenset(Mechanism),
}

# Levels that accept another tenant's MIG device on the same physical GPU.
_MIG_NEIGHBOUR_LEVELS = frozenset({TrustLevel.PARTITIONED, TrustLevel.SHARED})


class Reason(StrEnum):
    """Why a co-location or a request is refused; used for events and metric labels."""

    LEVEL_FORBIDS_MECHANISM = "LevelForbidsMechanism"
    DEDICATED_NODE = "DedicatedNode"
    EXCLUSIVE_GPU = "ExclusiveGpu"
    ISOLATED_GPU = "IsolatedGpu"
    LEVEL_FORBIDS_SHARING = "LevelForbidsSharing"
    DIFFERENT_SHARING_GROUP = "DifferentSharingGroup"
    TENANTS_OWN_GROUP = "TenantsOwnGroup"
    OTHER_GROUPS_DEVICE = "OtherGroupsDevice"
    NODE_DEDICATED_TO_OTHER = "NodeDedicatedToOther"
    UNKNOWN_HOLDER = "UnknownHolder"


@dataclass(frozen=True)
class Tenancy:
    """What trust rules need to know about a namespace."""

    namespace: str
    tenant: str
    level: TrustLevel
    sharing_group: str | None  # set only for the shared level

    def describe(self) -> str:
        group = f", sharing group {self.sharing_group}" if self.sharing_group else ""
        return f"tenant {self.tenant} (trust level {self.level}{group})"


@dataclass(frozen=True)
class Resolution:
    """A namespace's tenancy plus the problems found in its labels."""

    tenancy: Tenancy
    problems: tuple[str, ...] = ()


def tenant_of(namespace: str, labels: Mapping[str, str]) -> str:
    """The tenant of a namespace: its tenant label, else its own name."""
    return labels.get(LABEL_TENANT, "").strip() or namespace


def resolve_namespace(
    namespace: str,
    labels: Mapping[str, str] | None,
    default_level: TrustLevel = DEFAULT_LEVEL,
) -> Resolution:
    """Read one namespace's labels; bad values are reported and replaced by safe ones."""
    labels = labels or {}
    problems: list[str] = []
    where = f"namespace {namespace}"
    tenant = tenant_of(namespace, labels)

    raw_level = labels.get(LABEL_LEVEL)
    if raw_level is None:
        level = default_level
    else:
        try:
            level = TrustLevel(raw_level.strip().lower())
        except ValueError:
            level = default_level
            problems.append(
                f"{where}: label {LABEL_LEVEL}={raw_level!r} is not a trust level "
                f"({', '.join(_LEVEL_ORDER)}); using the default {default_level}"
            )

    raw_group = labels.get(LABEL_SHARING_GROUP)
    group: str | None = None
    if level is TrustLevel.SHARED:
        group = tenant
        if raw_group is not None:
            if _valid_group(raw_group):
                group = raw_group
            else:
                problems.append(
                    f"{where}: label {LABEL_SHARING_GROUP}={raw_group!r} is not a DNS label of "
                    f"at most {MAX_SHARING_GROUP_LENGTH} characters; "
                    "the tenant shares only with itself"
                )
    elif raw_group is not None:
        problems.append(
            f"{where}: label {LABEL_SHARING_GROUP}={raw_group!r} is ignored: trust level {level} "
            f"has no sharing group (only {TrustLevel.SHARED} has)"
        )
    return Resolution(Tenancy(namespace, tenant, level, group), tuple(problems))


def resolve_tenants(
    namespaces: Mapping[str, Mapping[str, str] | None],
    default_level: TrustLevel = DEFAULT_LEVEL,
) -> dict[str, Resolution]:
    """Resolve every namespace (name → labels) and reconcile namespaces of one tenant.

    Namespaces of one tenant that disagree take the strictest level among them;
    if they name different sharing groups the tenant shares only with itself.
    """
    single = {ns: resolve_namespace(ns, labels, default_level) for ns, labels in namespaces.items()}
    by_tenant: dict[str, list[Resolution]] = {}
    for res in single.values():
        by_tenant.setdefault(res.tenancy.tenant, []).append(res)

    out: dict[str, Resolution] = {}
    for tenant, members in by_tenant.items():
        levels = {m.tenancy.level for m in members}
        level = max(levels, key=lambda lv: lv.strictness)
        extra: list[str] = []
        if len(levels) > 1:
            listing = ", ".join(
                f"{m.tenancy.namespace} ({m.tenancy.level})"
                for m in sorted(members, key=lambda m: m.tenancy.namespace)
            )
            extra.append(
                f"tenant {tenant}: conflicting labels {LABEL_LEVEL} on namespaces {listing}; "
                f"using the strictest, {level}"
            )
        group: str | None = None
        if level is TrustLevel.SHARED:
            groups = {m.tenancy.sharing_group for m in members}
            group = next(iter(groups)) if len(groups) == 1 else tenant
            if len(groups) > 1:
                extra.append(
                    f"tenant {tenant}: conflicting labels {LABEL_SHARING_GROUP} on its namespaces; "
                    "the tenant shares only with itself"
                )
        for m in members:
            t = m.tenancy
            out[t.namespace] = Resolution(
                Tenancy(t.namespace, tenant, level, group), m.problems + tuple(extra)
            )
    return out


def _valid_group(value: str) -> bool:
    return len(value) <= MAX_SHARING_GROUP_LENGTH and bool(_DNS_LABEL.match(value))


@dataclass(frozen=True)
class Consumer:
    """One claim's hold on one device, as the checkpoint or an allocation records it."""

    claim: str  # "<namespace>/<name>" or the claim UID: identifies, never shown to others
    tenancy: Tenancy
    mechanism: Mechanism
    node: str
    gpu: str  # the physical GPU (UUID or published whole-GPU name)
    device: str  # the published device (whole GPU, MIG device or share device)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: Reason | None = None
    detail: str = ""


_ALLOWED = Verdict(True)


def judge_request(tenancy: Tenancy, mechanism: Mechanism) -> Verdict:
    """May this tenancy hold a device through ``mechanism`` at all?"""
    allowed = ALLOWED_MECHANISMS[tenancy.level]
    if mechanism in allowed:
        return _ALLOWED
    names = ", ".join(m for m in Mechanism if m in allowed)
    return Verdict(
        False,
        Reason.LEVEL_FORBIDS_MECHANISM,
        f"namespace {tenancy.namespace} has trust level {tenancy.level}, which does not allow "
        f"{mechanism} (allowed: {names})",
    )


def judge_pair(a: Consumer, b: Consumer) -> Verdict:
    """May ``a`` and ``b`` hold what they hold at the same time? Symmetric."""
    ta, tb = a.tenancy, b.tenancy
    if ta.tenant == tb.tenant or a.node != b.node:
        return _ALLOWED
    for t in (ta, tb):
        if t.level is TrustLevel.DEDICATED:
            return Verdict(
                False,
                Reason.DEDICATED_NODE,
                f"tenant {t.tenant} has trust level dedicated: "
                "no other tenant may use GPUs on its nodes",
            )
    if a.gpu != b.gpu:
        return _ALLOWED
    if Mechanism.GPU in (a.mechanism, b.mechanism):
        return Verdict(False, Reason.EXCLUSIVE_GPU, "a whole GPU is never shared")
    for t in (ta, tb):
        if t.level is TrustLevel.ISOLATED:
            return Verdict(
                False,
                Reason.ISOLATED_GPU,
                f"tenant {t.tenant} has trust level isolated: no other tenant may use the same GPU",
            )
    if a.mechanism is Mechanism.MIG and b.mechanism is Mechanism.MIG and a.device != b.device:
        for t in (ta, tb):
            if t.level not in _MIG_NEIGHBOUR_LEVELS:
                return Verdict(
                    False,
                    Reason.LEVEL_FORBIDS_SHARING,
                    f"tenant {t.tenant} has trust level "
                    f"{t.level}, which allows no other tenant's MIG device on its GPU",
                )
        return _ALLOWED
    # Anything else shares one device or one fault domain without a hardware partition.
    for t in (ta, tb):
        if t.level is not TrustLevel.SHARED:
            return Verdict(
                False,
                Reason.LEVEL_FORBIDS_SHARING,
                f"tenant {t.tenant} has trust level "
                f"{t.level}, which never shares a GPU without a hardware partition",
            )
    if ta.sharing_group is None or ta.sharing_group != tb.sharing_group:
        return Verdict(
            False,
            Reason.DIFFERENT_SHARING_GROUP,
            f"sharing groups differ ({ta.sharing_group} and {tb.sharing_group})",
        )
    if ta.sharing_group in (ta.tenant, tb.tenant):
        # A tenant without a valid group label gets its own name as its group; another
        # tenant's label may name the same value. A group named like one of its tenants is
        # therefore that tenant's own: nobody else joins it.
        owner = ta.tenant if ta.sharing_group == ta.tenant else tb.tenant
        return Verdict(
            False,
            Reason.TENANTS_OWN_GROUP,
            f"sharing group {ta.sharing_group} is tenant {owner}'s own (the group of a tenant "
            "without a sharing-group label); another tenant may not join it",
        )
    return _ALLOWED


class ColocationRefused(TrustViolation):
    """Prepare refused by trust rules. ``reason`` and ``tenant`` label events and metrics."""

    def __init__(self, message: str, reason: Reason, tenant: str, other_tenant: str | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.tenant = tenant
        self.other_tenant = other_tenant


def check_prepare(new: Consumer, others: Iterable[Consumer]) -> None:
    """Refuse ``new`` if its level forbids its mechanism or any other consumer forbids it.

    ``others`` is every consumer on the node (all GPUs: the dedicated level is about
    nodes); consumers of the same claim are ignored. Raises :class:`ColocationRefused`.
    """
    t = new.tenancy
    verdict = judge_request(t, new.mechanism)
    if not verdict.allowed:
        assert verdict.reason is not None
        raise ColocationRefused(
            f"{verdict.detail}; refused to prepare {new.device}",
            verdict.reason,
            t.tenant,
            None,
        )
    for other in sorted(others, key=lambda c: (c.gpu, c.device, c.tenancy.tenant)):
        if other.claim == new.claim:
            continue
        verdict = judge_pair(new, other)
        if not verdict.allowed:
            assert verdict.reason is not None
            raise ColocationRefused(
                f"trust levels forbid {t.describe()} on device {new.device} of GPU {new.gpu}: "
                f"{other.tenancy.describe()} holds {other.mechanism} on GPU {other.gpu} of "
                f"node {other.node}: {verdict.detail}",
                verdict.reason,
                t.tenant,
                other.tenancy.tenant,
            )


@dataclass(frozen=True)
class Violation:
    """Two prepared or allocated consumers that the current levels do not allow together."""

    first: Consumer
    second: Consumer
    verdict: Verdict


def find_violations(consumers: Iterable[Consumer]) -> list[Violation]:
    """Report every forbidden pair (e.g. after a namespace's level changed); tear nothing down.

    Also reports a consumer whose own level no longer allows its mechanism, paired with itself.
    """
    by_node: dict[str, list[Consumer]] = {}
    for c in sorted(set(consumers), key=lambda c: (c.node, c.gpu, c.device, c.claim)):
        by_node.setdefault(c.node, []).append(c)
    found: list[Violation] = []
    for items in by_node.values():
        for c in items:
            own = judge_request(c.tenancy, c.mechanism)
            if not own.allowed:
                found.append(Violation(c, c, own))
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if a.claim == b.claim:
                    continue
                verdict = judge_pair(a, b)
                if not verdict.allowed:
                    found.append(Violation(a, b, verdict))
    return found
