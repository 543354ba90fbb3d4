"""Cost allocation: the price of the GPU-hours held, split among tenants and the platform.

Pure: a :class:`~controller.report.data.Report`, what each device is
(:mod:`controller.report.catalog`) and the prices in; money out, in
:class:`~decimal.Decimal`.

The price of the held GPU-hours is split on every node (the tenant series are
per node, not per device) into

* each tenant's **used** part: its measured GPU-hours, and its allocated GPU-hours on
  devices NVML could not read (unmeasured: the tenant held them, whether it used them is
  unknown, so they are neither idle nor the platform's; a note names them);
* **unattributed**: busy time of processes outside every claim, the platform's;
* **idle**: the rest of the held time, split by the idle policy:
  ``proportional`` to the tenants' allocated GPU-hours on the node, ``owner``
  to the platform, ``none`` to nobody (shown as not charged).

On a node whose devices cost the same per GPU-hour each tenant pays exactly its
own hours times the price; on a node that mixes prices (a whole GPU beside MIG
devices priced by memory) the tenants there pay the node's average rate, and the
report says so. Every line is rounded to the cent by largest remainder, so the
tenants, the platform and the part not charged add up to the held price exactly.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Literal

from controller.report.catalog import DeviceInfo
from controller.report.data import Report
from controller.report.prices import Prices
from driver.errors import ConfigError

IdlePolicy = Literal["proportional", "owner", "none"]
IDLE_POLICIES: tuple[IdlePolicy, ...] = ("proportional", "owner", "none")
CENT = Decimal("0.01")
HOUR = Decimal(3600)
_CONTEXT = decimal.Context(prec=60)


class PricingError(ConfigError):
    """The data holds a device the prices or the device catalog cannot price."""


@dataclass(frozen=True)
class TenantCost:
    namespace: str
    tenant: str
    used: Decimal  # measured and unmeasured GPU-hours at the node's rate
    idle: Decimal  # idle charged to this tenant by the policy

    @property
    def total(self) -> Decimal:
        return self.used + self.idle


@dataclass(frozen=True)
class DeviceCost:
    instance: str
    uuid: str
    product: str
    profile: str | None
    rate: Decimal  # per GPU-hour as the usage series count it
    held: Decimal
    idle: Decimal


@dataclass(frozen=True)
class CostReport:
    currency: str
    policy: IdlePolicy
    tenants: tuple[TenantCost, ...]
    unattributed: Decimal  # the platform's: busy time outside every claim
    platform_idle: Decimal  # idle charged to the platform (policy owner, or no allocation)
    not_charged: Decimal  # idle nobody pays (policy none)
    held: Decimal  # the price of every GPU-hour held in the window
    devices: tuple[DeviceCost, ...]
    notes: tuple[str, ...] = ()

    @property
    def platform(self) -> Decimal:
        return self.unattributed + self.platform_idle

    @property
    def idle(self) -> Decimal:
        """The idle line: held time no claim kept busy, whoever pays for it."""
        charged = sum((t.idle for t in self.tenants), Decimal(0))
        return charged + self.platform_idle + self.not_charged

    @property
    def tenants_total(self) -> Decimal:
        return sum((t.total for t in self.tenants), Decimal(0))

    def reconciles(self) -> bool:
        return self.tenants_total + self.platform + self.not_charged == self.held


def largest_remainder(values: Sequence[Decimal], total: Decimal) -> list[Decimal]:
    """``values`` rounded to cents so that they add up to ``total`` (a whole number of cents).

    Each value is rounded down, then the cents left go one each to the values that lost the
    most (the earlier one first on a tie).
    """
    floors = [v.quantize(CENT, rounding=ROUND_FLOOR) for v in values]
    left = int((total - sum(floors, Decimal(0))) / CENT)
    if not 0 <= left <= len(values):
        raise ValueError(f"cannot round {len(values)} values to a total of {total}")
    order = sorted(range(len(values)), key=lambda i: (floors[i] - values[i], i))
    for i in order[:left]:
        floors[i] += CENT
    return floors


def device_rate(info: DeviceInfo, prices: Prices, instance: str) -> Decimal:
    """The price of one GPU-hour of ``info`` as the usage series count it (MIG: slices / 7)."""
    where = f"device {info.uuid} on {instance or 'the node'}"
    product = prices.products.get(info.product)
    if product is None:
        known = ", ".join(repr(p) for p in sorted(prices.products)) or "none"
        raise PricingError(
            f"price file {prices.source}: field products: no price for product "
            f"{info.product!r} ({where}); the file prices {known}"
        )
    if info.profile is None:
        return product.gpu_hour
    size = Decimal(info.size.numerator) / Decimal(info.size.denominator)
    explicit = product.mig.get(info.profile)
    if explicit is not None:
        return _CONTEXT.divide(explicit, size)
    if info.memory_share is None:
        raise PricingError(
            f"price file {prices.source}: field products.{info.product}.mig: {where} is a "
            f"{info.profile} MIG device whose memory slices are unknown; give its price "
            f"explicitly under mig: {info.profile}"
        )
    share = _fraction(info.memory_share)
    return _CONTEXT.divide(_CONTEXT.multiply(product.gpu_hour, share), size)


def _fraction(f: Fraction) -> Decimal:
    return _CONTEXT.divide(Decimal(f.numerator), Decimal(f.denominator))


def _hours(seconds: float) -> Decimal:
    return _CONTEXT.divide(Decimal(max(seconds, 0.0)), HOUR)


def _share(amount: Decimal, part: Decimal, whole: Decimal) -> Decimal:
    if whole == 0:
        return Decimal(0)
    return _CONTEXT.divide(_CONTEXT.multiply(amount, part), whole)


@dataclass
class _Exact:
    used: dict[tuple[str, str], Decimal]
    idle: dict[tuple[str, str], Decimal]
    unattributed: Decimal = Decimal(0)
    platform_idle: Decimal = Decimal(0)
    not_charged: Decimal = Decimal(0)


def allocate(
    report: Report,
    catalog: Mapping[str, DeviceInfo],
    prices: Prices,
    policy: IdlePolicy,
) -> CostReport:
    """Price the report's held GPU-hours and split them (see the module docstring)."""
    devices: list[DeviceCost] = []
    node_price: dict[str, Decimal] = {}
    node_held: dict[str, Decimal] = {}
    node_unattributed: dict[str, Decimal] = {}
    node_rates: dict[str, set[Decimal]] = {}
    for d in report.device_rows:
        if d.held_s <= 0 and d.idle_s <= 0 and d.unattributed_s <= 0:
            # Not held in the window (its series outlives its use): nothing to price.
            continue
        info = catalog.get(d.uuid)
        if info is None:
            raise PricingError(
                f"device {d.uuid} on {d.instance or 'the node'} was held in the window but is "
                "in no ResourceSlice of the driver nor in a prepared claim's status (a MIG "
                "device whose claim is gone), so its product is unknown"
            )
        rate = device_rate(info, prices, d.instance)
        held_h, idle_h = _hours(d.held_s), _hours(d.idle_s)
        held = _CONTEXT.multiply(held_h, rate)
        devices.append(
            DeviceCost(
                d.instance,
                d.uuid,
                info.product,
                info.profile,
                rate,
                held.quantize(CENT, rounding=ROUND_HALF_UP),
                _CONTEXT.multiply(idle_h, rate).quantize(CENT, rounding=ROUND_HALF_UP),
            )
        )
        node_price[d.instance] = node_price.get(d.instance, Decimal(0)) + held
        node_held[d.instance] = node_held.get(d.instance, Decimal(0)) + held_h
        node_unattributed[d.instance] = node_unattributed.get(d.instance, Decimal(0)) + _hours(
            d.unattributed_s
        )
        if d.held_s > 0:
            node_rates.setdefault(d.instance, set()).add(rate)

    unpriced = sorted({n.instance for n in report.node_rows if n.allocated_s > 0} - set(node_price))
    if unpriced:
        raise PricingError(
            f"{', '.join(i or 'a node' for i in unpriced)}: tenant usage but no device series "
            "(tranche_device_held_seconds_total) in the window, so the devices cannot be priced"
        )
    exact = _Exact(used={}, idle={})
    for r in report.rows:
        exact.used[(r.namespace, r.tenant)] = Decimal(0)
        exact.idle[(r.namespace, r.tenant)] = Decimal(0)
    notes: list[str] = []
    for instance, price in sorted(node_price.items()):
        on_node = [n for n in report.node_rows if n.instance == instance]
        measured = {(n.namespace, n.tenant): _hours(n.measured_s + n.unmeasured_s) for n in on_node}
        allocated = {(n.namespace, n.tenant): _hours(n.allocated_s) for n in on_node}
        unattributed = node_unattributed[instance]
        whole = max(node_held[instance], sum(measured.values(), Decimal(0)) + unattributed)
        used = {k: _share(price, m, whole) for k, m in measured.items()}
        platform = _share(price, unattributed, whole)
        idle = max(price - sum(used.values(), Decimal(0)) - platform, Decimal(0))
        for k, v in used.items():
            exact.used[k] = exact.used.get(k, Decimal(0)) + v
        exact.unattributed += platform
        allocated_total = sum(allocated.values(), Decimal(0))
        if policy == "none":
            exact.not_charged += idle
        elif policy == "owner" or allocated_total == 0:
            exact.platform_idle += idle
        else:
            for k, a in allocated.items():
                exact.idle[k] = exact.idle.get(k, Decimal(0)) + _share(idle, a, allocated_total)
        notes += [
            f"{instance or 'the node'}: {n.namespace}/{n.tenant} held "
            f"{n.unmeasured_s / 3600:.3f} GPU-h on devices NVML could not read, charged as used"
            for n in on_node
            if n.unmeasured_s > 0
        ]
        if len(node_rates.get(instance, ())) > 1:
            notes.append(
                f"{instance or 'the node'}: devices at different prices per GPU-hour; tenant "
                "usage is exported per node, so its tenants pay the node's average rate"
            )

    keys = sorted(set(exact.used) | set(exact.idle))
    lines = [exact.used.get(k, Decimal(0)) for k in keys]
    lines += [exact.idle.get(k, Decimal(0)) for k in keys]
    lines += [exact.unattributed, exact.platform_idle, exact.not_charged]
    held = sum(lines, Decimal(0)).quantize(CENT, rounding=ROUND_HALF_UP)
    rounded = largest_remainder(lines, held)
    n = len(keys)
    tenants = tuple(
        TenantCost(ns, tenant, rounded[i], rounded[n + i]) for i, (ns, tenant) in enumerate(keys)
    )
    return CostReport(
        currency=prices.currency,
        policy=policy,
        tenants=tenants,
        unattributed=rounded[2 * n],
        platform_idle=rounded[2 * n + 1],
        not_charged=rounded[2 * n + 2],
        held=held,
        devices=tuple(devices),
        notes=tuple(notes),
    )
