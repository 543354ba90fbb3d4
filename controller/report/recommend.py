"""``tranche report --recommend``: the smallest device kind each workload would have fit (pure).

Per workload (the claims of one owner, :mod:`controller.report.owners`) the measured SM use
(rate of measured GPU-seconds, in whole GPUs) and memory (rate of memory byte-seconds) over
the window give a peak and a p95. A device kind fits when the peak, plus ``headroom``, is
within the kind's compute (its multiprocessors over the GPU's) and memory. Candidates are the
MIG profiles of the same GPU model that its nodes publish and, where the tenant's trust level
allows them (:func:`driver.trust.policy.judge_request`), MPS or time-slice shares in steps of
the published ``shares`` capacity. The savings are the allocated GPU-hours the smaller kind
would not have held, and with prices what those hours cost, in :class:`~decimal.Decimal`.

A workload with fewer than ``min_samples`` samples, or none at all (plugin endpoints keep no
history), or whose device is unknown (its claims are gone), is listed as such, never guessed.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from controller.report.catalog import MIG_COMPUTE_SLICES
from controller.report.prices import Prices
from driver.errors import ConfigError
from driver.quantity import parse_quantity
from driver.trust.policy import Mechanism, Tenancy, judge_request

CENT = Decimal("0.01")
_EXACT = decimal.Context(prec=60)
DEFAULT_HEADROOM = Fraction(1, 5)
DEFAULT_MIN_SAMPLES = 10
_COMPUTE = re.compile(r"^(\d+)g\.")

Json = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """A device kind a claim can hold, with what it offers in whole GPUs of its model."""

    product: str
    mechanism: Mechanism
    compute: Fraction  # of the GPU's multiprocessors
    memory_bytes: int
    size: Fraction  # in whole GPUs as the usage series count it (MIG: slices / 7)
    profile: str | None = None  # MIG profile
    memory_share: Fraction | None = None  # MIG: memory slices / the GPU's (prices by memory)

    @property
    def name(self) -> str:
        if self.mechanism is Mechanism.MIG:
            return f"MIG {self.profile}"
        if self.mechanism is Mechanism.GPU:
            return "whole GPU"
        label = "MPS share" if self.mechanism is Mechanism.MPS else "time-slice share"
        return f"{label} {self.size.numerator}/{self.size.denominator}"


@dataclass(frozen=True)
class Model:
    """What one GPU model's nodes publish: the whole GPU, its MIG profiles, its share steps."""

    product: str
    whole: Kind
    mig: tuple[Kind, ...] = ()
    max_shares: int = 0  # 0: no share devices published
    share_mechanisms: tuple[Mechanism, ...] = ()

    def kinds(self) -> list[Kind]:
        """Every kind, small to large (ties: MIG before MPS before time-slice)."""
        out = [self.whole, *self.mig]
        for mechanism in self.share_mechanisms:
            for k in range(1, self.max_shares):
                part = Fraction(k, self.max_shares)
                out.append(
                    Kind(
                        self.product,
                        mechanism,
                        part,
                        int(self.whole.memory_bytes * part),
                        part,
                    )
                )
        order = {Mechanism.MIG: 0, Mechanism.MPS: 1, Mechanism.TIMESLICE: 2, Mechanism.GPU: 3}
        return sorted(out, key=lambda k: (k.size, k.memory_bytes, order[k.mechanism]))


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(value.get("string", "")) if isinstance(value, dict) else ""


def _capacity(device: Mapping[str, Any], name: str) -> int:
    raw = ((device.get("capacity") or {}).get(name) or {}).get("value")
    return int(parse_quantity(raw, f"capacity {name}")) if raw is not None else 0


def _memory_slices(counters: Mapping[str, Any]) -> int:
    return sum(1 for k in counters if str(k).startswith("memory-slice-"))


def models_from_slices(slices: Iterable[Mapping[str, Any]]) -> dict[str, Model]:
    """The GPU models the driver's ResourceSlices publish, by product name."""
    wholes: dict[str, tuple[int, int]] = {}  # product -> (multiprocessors, memory)
    migs: dict[str, dict[str, tuple[int, int, Fraction | None]]] = {}
    shares: dict[str, tuple[int, set[Mechanism]]] = {}
    slices = list(slices)
    totals: dict[str, int] = {}
    for s in slices:
        for counter_set in (s.get("spec") or {}).get("sharedCounters") or []:
            totals[str(counter_set.get("name", ""))] = _memory_slices(
                counter_set.get("counters") or {}
            )
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            product = _attr(d, "productName")
            if not product:
                continue
            sharing = _attr(d, "sharing")
            if sharing:
                n, mechanisms = shares.setdefault(product, (_capacity(d, "shares"), set()))
                mechanisms.add(Mechanism.MPS if sharing == "mps" else Mechanism.TIMESLICE)
                continue
            sms, memory = _capacity(d, "multiprocessors"), _capacity(d, "memory")
            if _attr(d, "type") == "mig":
                share = None
                for use in d.get("consumesCounters") or []:
                    total = totals.get(str(use.get("counterSet", "")), 0)
                    taken = _memory_slices(use.get("counters") or {})
                    if total and taken:
                        share = Fraction(taken, total)
                migs.setdefault(product, {})[_attr(d, "profile")] = (sms, memory, share)
            else:
                wholes[product] = (sms, memory)
    out = {}
    for product, (sms, memory) in wholes.items():
        whole = Kind(product, Mechanism.GPU, Fraction(1), memory, Fraction(1))
        mig = []
        for profile, (p_sms, p_memory, share) in sorted(migs.get(product, {}).items()):
            match = _COMPUTE.match(profile)
            if not match or not sms:
                continue
            mig.append(
                Kind(
                    product,
                    Mechanism.MIG,
                    Fraction(p_sms, sms),
                    p_memory,
                    Fraction(int(match.group(1)), MIG_COMPUTE_SLICES),
                    profile,
                    share,
                )
            )
        n, mechanisms = shares.get(product, (0, set()))
        out[product] = Model(
            product,
            whole,
            tuple(mig),
            n if n > 1 else 0,
            tuple(m for m in (Mechanism.MPS, Mechanism.TIMESLICE) if m in mechanisms),
        )
    return out


@dataclass(frozen=True)
class Sample:
    """One step of one claim: measured SM use (whole GPUs) and memory (bytes), averages."""

    time: float
    sm: float
    memory_bytes: float


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..100, of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Stats:
    samples: int
    sm_peak: float
    sm_p95: float
    memory_peak: float
    memory_p95: float


def stats(samples: Sequence[Sample]) -> Stats:
    sm = [s.sm for s in samples]
    memory = [s.memory_bytes for s in samples]
    return Stats(len(samples), max(sm), percentile(sm, 95), max(memory), percentile(memory, 95))


def fits(kind: Kind, sm_peak: float, memory_peak: float, headroom: Fraction) -> bool:
    """The peak plus headroom is within the kind's compute and memory."""
    scale = 1 + float(headroom)
    return sm_peak * scale <= float(kind.compute) and memory_peak * scale <= kind.memory_bytes


@dataclass(frozen=True)
class Choice:
    kind: Kind | None  # the smallest allowed kind that fits; None: nothing fits
    forbidden: tuple[tuple[Kind, str], ...] = ()  # smaller fitting kinds the trust level refuses


def smallest_fit(
    model: Model,
    sm_peak: float,
    memory_peak: float,
    tenancy: Tenancy,
    headroom: Fraction = DEFAULT_HEADROOM,
) -> Choice:
    forbidden: list[tuple[Kind, str]] = []
    seen: set[Mechanism] = set()
    for kind in model.kinds():
        if not fits(kind, sm_peak, memory_peak, headroom):
            continue
        verdict = judge_request(tenancy, kind.mechanism)
        if verdict.allowed:
            return Choice(kind, tuple(forbidden))
        if kind.mechanism not in seen:  # one per mechanism: the smallest
            seen.add(kind.mechanism)
            forbidden.append((kind, verdict.detail))
    return Choice(None, tuple(forbidden))


def hour_price(kind: Kind, prices: Prices) -> Decimal:
    """What one hour of ``kind`` costs (a MIG device: explicit, else by its memory slices;
    a share: its part of the GPU)."""
    product = prices.products.get(kind.product)
    if product is None:
        known = ", ".join(repr(p) for p in sorted(prices.products)) or "none"
        raise ConfigError(
            f"price file {prices.source}: field products: no price for product "
            f"{kind.product!r}; the file prices {known}"
        )
    if kind.mechanism is Mechanism.GPU:
        return product.gpu_hour
    if kind.mechanism is Mechanism.MIG:
        explicit = product.mig.get(kind.profile or "")
        if explicit is not None:
            return explicit
        if kind.memory_share is None:
            raise ConfigError(
                f"price file {prices.source}: field products.{kind.product}.mig: the memory "
                f"slices of {kind.profile} are unknown; give its price explicitly"
            )
        return _decimal(Fraction(product.gpu_hour) * kind.memory_share)
    return _decimal(Fraction(product.gpu_hour) * kind.size)


def _decimal(f: Fraction) -> Decimal:
    return _EXACT.divide(Decimal(f.numerator), Decimal(f.denominator))


@dataclass(frozen=True)
class Savings:
    gpu_hours: Decimal  # allocated GPU-hours the smaller kind would not have held
    cost: Decimal | None  # with prices: held now minus held as the smaller kind, to the cent


def exact_savings(
    allocated_s: float, current: Kind, candidate: Kind, prices: Prices | None = None
) -> tuple[Fraction, Fraction | None]:
    """GPU-hours and money saved, exact (hours and prices as fractions)."""
    allocated_h = Fraction(Decimal(repr(max(allocated_s, 0.0)))) / 3600
    wall_h = allocated_h / current.size
    saved_h = allocated_h - wall_h * candidate.size
    if prices is None:
        return saved_h, None
    now = Fraction(hour_price(current, prices))
    after = Fraction(hour_price(candidate, prices))
    return saved_h, wall_h * (now - after)


def savings(
    allocated_s: float,
    current: Kind,
    candidate: Kind,
    prices: Prices | None = None,
) -> Savings:
    """``allocated_s`` GPU-seconds held as ``current`` → the same wall time as ``candidate``;
    money rounded once, to the cent (half up)."""
    hours, cost = exact_savings(allocated_s, current, candidate, prices)
    return Savings(_decimal(hours), _money(cost) if cost is not None else None)


def _money(amount: Fraction) -> Decimal:
    cents = Fraction(amount * 100)
    whole, rest = divmod(abs(cents.numerator), cents.denominator)
    if 2 * rest >= cents.denominator:
        whole += 1
    return (Decimal(whole if cents >= 0 else -whole) / 100).quantize(CENT)


@dataclass(frozen=True)
class ClaimData:
    """One claim of a workload: its allocated GPU-seconds in the window, what it holds, its
    samples (``None``: the source keeps no history)."""

    namespace: str
    name: str
    allocated_s: float
    kind: Kind | None  # None: the device is unknown (claim gone, or not this driver's)
    samples: tuple[Sample, ...] | None


@dataclass(frozen=True)
class Workload:
    namespace: str
    kind: str  # Deployment, Job, StatefulSet, PodGroup, Pod, ResourceClaim
    name: str
    tenancy: Tenancy
    claims: tuple[ClaimData, ...]
    notes: tuple[str, ...] = ()  # e.g. "pods gone: grouped by the claim's owner"


@dataclass(frozen=True)
class Advice:
    workload: Workload
    status: str  # "recommend", "fits-now", "no-fit", "too-little-data", "unknown-device"
    reason: str
    stats: Stats | None = None
    current: Kind | None = None
    candidate: Kind | None = None
    forbidden: tuple[tuple[Kind, str], ...] = ()
    savings: Savings | None = None
    allocated_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self, currency: str | None) -> Json:
        w = self.workload
        out: Json = {
            "namespace": w.namespace,
            "kind": w.kind,
            "name": w.name,
            "tenant": w.tenancy.tenant,
            "trust_level": str(w.tenancy.level),
            "claims": [c.name for c in w.claims],
            "status": self.status,
            "reason": self.reason,
            "allocated_gpu_hours": round(self.allocated_s / 3600, 6),
            "notes": list(w.notes + self.notes),
        }
        if self.stats is not None:
            s = self.stats
            out["samples"] = s.samples
            out["sm"] = {"peak": round(s.sm_peak, 6), "p95": round(s.sm_p95, 6)}
            out["memory_bytes"] = {"peak": int(s.memory_peak), "p95": int(s.memory_p95)}
        if self.current is not None:
            out["current"] = self.current.name
            out["product"] = self.current.product
        if self.candidate is not None:
            out["recommended"] = self.candidate.name
        if self.forbidden:
            out["forbidden"] = [{"kind": k.name, "reason": r} for k, r in self.forbidden]
        if self.savings is not None:
            out["saved_gpu_hours"] = str(self.savings.gpu_hours.quantize(Decimal("0.001")))
            if self.savings.cost is not None:
                out["saved_cost"] = str(self.savings.cost)
                out["currency"] = currency
        return out


def advise(
    workload: Workload,
    models: Mapping[str, Model],
    *,
    headroom: Fraction = DEFAULT_HEADROOM,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    prices: Prices | None = None,
) -> Advice:
    """The recommendation for one workload."""
    allocated = sum(c.allocated_s for c in workload.claims)
    if any(c.samples is None for c in workload.claims):
        return Advice(
            workload,
            "too-little-data",
            "no history: plugin metrics endpoints give counters, not series over time "
            "(use --prometheus)",
            allocated_s=allocated,
        )
    samples = [s for c in workload.claims for s in c.samples or ()]
    if len(samples) < min_samples:
        return Advice(
            workload,
            "too-little-data",
            f"{len(samples)} samples in the window, fewer than --min-samples {min_samples}",
            allocated_s=allocated,
        )
    st = stats(samples)
    kinds = {c.kind for c in workload.claims}
    if None in kinds or not kinds:
        return Advice(
            workload,
            "unknown-device",
            "the device its claims hold is unknown (claims gone or not allocated): not guessed",
            st,
            allocated_s=allocated,
        )
    current = max((k for k in kinds if k is not None), key=lambda k: (k.size, k.memory_bytes))
    notes: tuple[str, ...] = ()
    if len(kinds) > 1:
        notes = ("its claims hold different kinds; compared with the largest",)
    model = models.get(current.product)
    if model is None:
        return Advice(
            workload,
            "unknown-device",
            f"no node publishes {current.product!r} now: its kinds are unknown",
            st,
            current,
            allocated_s=allocated,
        )
    choice = smallest_fit(model, st.sm_peak, st.memory_peak, workload.tenancy, headroom)
    if choice.kind is None:
        return Advice(
            workload,
            "no-fit",
            f"its peak plus {float(headroom):.0%} headroom fits no single device of "
            f"{current.product}",
            st,
            current,
            forbidden=choice.forbidden,
            allocated_s=allocated,
            notes=notes,
        )
    if choice.kind.size >= current.size:  # e.g. a 7g.80gb instead of the whole GPU saves nothing
        return Advice(
            workload,
            "fits-now",
            f"{current.name} is already the smallest kind that fits"
            + (" that its trust level allows" if choice.forbidden else ""),
            st,
            current,
            forbidden=choice.forbidden,
            allocated_s=allocated,
            notes=notes,
        )
    saved_h = Fraction(0)
    saved_cost: Fraction | None = Fraction(0) if prices is not None else None
    for c in workload.claims:  # exact per claim, rounded once for the workload
        assert c.kind is not None
        if c.kind.size <= choice.kind.size:
            continue
        hours, cost = exact_savings(c.allocated_s, c.kind, choice.kind, prices)
        saved_h += hours
        if saved_cost is not None and cost is not None:
            saved_cost += cost
    return Advice(
        workload,
        "recommend",
        f"{choice.kind.name} fits the peak with {float(headroom):.0%} headroom",
        st,
        current,
        choice.kind,
        choice.forbidden,
        Savings(_decimal(saved_h), _money(saved_cost) if saved_cost is not None else None),
        allocated,
        notes,
    )
