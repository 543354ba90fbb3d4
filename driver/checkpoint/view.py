"""The checkpoint as one process holds it in memory: :class:`View`.

The claims and ended records parsed from the files, with the indexes a prepare asks
(claims by GPU, by tenant) built at the first question and kept up to date by each write.
:class:`driver.checkpoint.store.Checkpoint` keeps one View, read under the node lock, and
trusts it while the generation counter says no other process changed the files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from driver.checkpoint.holds import Hold
from driver.checkpoint.records import AllocationRecord, CheckpointData, ClaimRecord

HistoryKey = tuple[str, float]
TenantKey = tuple[str | None, str | None]  # a record's tenant and trust level


def history_key(record: AllocationRecord) -> HistoryKey:
    return record.claim_uid, record.prepared_at


def _gpus(record: ClaimRecord) -> set[str]:
    return {d.gpu_uuid for d in record.plan.devices}


def _tenant_key(record: ClaimRecord) -> TenantKey:
    return record.tenant, record.trust_level


def _index(
    by_gpu: dict[str, set[str]], by_tenant: dict[TenantKey, set[str]], uid: str, r: ClaimRecord
) -> None:
    for gpu in _gpus(r):
        by_gpu.setdefault(gpu, set()).add(uid)
    by_tenant.setdefault(_tenant_key(r), set()).add(uid)


@dataclass
class View:
    """The parsed checkpoint as of ``generation``."""

    generation: int | None
    found: bool  # any checkpoint file existed when it was read
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    boot_ids: dict[str, str] = field(default_factory=dict)
    history: dict[HistoryKey, AllocationRecord] = field(default_factory=dict)
    history_lines: int = 0
    started: set[str] = field(default_factory=set)  # claims whose record is in the journal
    holds: dict[str, Hold] = field(default_factory=dict)  # by claim uid
    # Built at the first query, then kept up to date by set_claim and drop_claim.
    _by_gpu: dict[str, set[str]] | None = None
    _by_tenant: dict[TenantKey, set[str]] | None = None
    _other_boot: str | None = None
    _other_boot_known: bool = False

    def set_claim(self, uid: str, record: ClaimRecord) -> None:
        self.drop_claim(uid)
        self.claims[uid] = record
        if self._by_gpu is not None and self._by_tenant is not None:
            _index(self._by_gpu, self._by_tenant, uid, record)

    def other_boot(self, boot_id: str) -> str | None:
        """A boot id other than ``boot_id`` some claim was written in (cached: writes only
        ever record ``boot_id``, so only a dropped claim can change the answer)."""
        if not self._other_boot_known:
            self._other_boot = next((b for b in self.boot_ids.values() if b != boot_id), None)
            self._other_boot_known = True
        return self._other_boot

    def drop_claim(self, uid: str) -> None:
        if self._other_boot is not None:
            self._other_boot_known = False
        record = self.claims.pop(uid, None)
        if record is None or self._by_gpu is None or self._by_tenant is None:
            return
        for gpu in _gpus(record):
            self._by_gpu[gpu].discard(uid)
        self._by_tenant[_tenant_key(record)].discard(uid)

    def indexes(self) -> tuple[dict[str, set[str]], dict[TenantKey, set[str]]]:
        if self._by_gpu is None or self._by_tenant is None:
            self._by_gpu, self._by_tenant = {}, {}
            for uid, record in self.claims.items():
                _index(self._by_gpu, self._by_tenant, uid, record)
        return self._by_gpu, self._by_tenant

    def add_history(self, records: Iterable[AllocationRecord]) -> None:
        for record in records:
            self.history.pop(history_key(record), None)  # a retried unprepare appends it again
            self.history[history_key(record)] = record
            self.history_lines += 1

    def forget_history(self, before: float) -> None:
        """Keep in memory only the ended records that ended at ``before`` or later."""
        # Records are kept in the order they ended, so most calls (every load, a prepare's
        # included) look at the oldest one only; in place, so nothing is copied.
        oldest = next(iter(self.history.values()), None)
        if oldest is None or (oldest.unprepared_at or oldest.prepared_at) >= before:
            return
        ended = [k for k, r in self.history.items() if (r.unprepared_at or r.prepared_at) < before]
        for key in ended:
            del self.history[key]

    def data(self, history_limit: int) -> CheckpointData:
        history = list(self.history.values())[-history_limit:] if history_limit else []
        return CheckpointData.model_construct(claims=dict(self.claims), history=history)


def current_keys(claims: Mapping[str, ClaimRecord]) -> set[HistoryKey]:
    return {history_key(c.allocation) for c in claims.values() if c.allocation is not None}
