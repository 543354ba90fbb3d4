"""``make bench``: the speed and memory measurements behind ``docs/performance.md``.

Each scenario lives in its own module (``discovery``, ``prepare``, ``modes``,
``health``, ``attribution``) and returns a :class:`~hack.bench.results.ScenarioResult`;
``python -m hack.bench`` runs them all (or ``--only NAME``), prints a table and
rewrites that scenario's block in ``docs/performance.md``.
"""
