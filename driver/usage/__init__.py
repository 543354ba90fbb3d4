"""Who held which GPU and who used it: per-claim attribution (``docs/metrics.md``).

Public: :mod:`driver.usage.attribution` (``UsageSampler``, ``split_device``: allocated and
measured GPU-seconds per claim, idle and unattributed per device) and
:mod:`driver.usage.records` (the checkpoint's allocation records as the sampler's input).
"""
