"""GPU faults to device taints and back (``docs/health.md``).

Public: :mod:`driver.health.monitor` (``HealthMonitor``: faults from XIDs, ECC and lost GPUs,
debounced, healed), :mod:`driver.health.policy` (``HealthPolicy``: which fault class taints and
how it heals), :mod:`driver.health.watch` (the NVML event and probe loop),
:mod:`driver.health.store` (faults kept across restarts) and :mod:`driver.health.metrics`.
"""
