"""Preparing a claim: from an allocation to CDI devices, crash-safe.

Public: :mod:`driver.prepare.claims` (``parse_claim``), :mod:`driver.prepare.config`
(the opaque config API), :mod:`driver.prepare.plan` (``build_plan``: pure, typed steps),
:mod:`driver.prepare.executor` (``DeviceState``: checkpoint-first two-phase prepare and
unprepare, step handlers by kind; its parts in :mod:`~driver.prepare.prepare_path`,
:mod:`~driver.prepare.unprepare_path` and :mod:`~driver.prepare.recovery`),
:mod:`driver.prepare.cdi` (CDI spec files) and :mod:`driver.prepare.trust_check` (the trust
levels checked again at prepare).
"""
