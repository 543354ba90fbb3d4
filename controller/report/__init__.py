"""``tranche report``: per-claim and per-tenant GPU usage as a showback report.

Public: :mod:`controller.report.cli` (the command). Inside: :mod:`controller.report.sources`
(plugin endpoints or Prometheus), :mod:`controller.report.data` (rows and totals),
:mod:`controller.report.prices` (the price file), :mod:`controller.report.catalog` (what each
device UUID is, from the ResourceSlices), :mod:`controller.report.cost` (cost allocation,
pure), :mod:`controller.report.render` (table, CSV, JSON), :mod:`controller.report.html` (the
showback page), :mod:`controller.report.chart` (SVG); ``--recommend``:
:mod:`controller.report.recommend` (pure: kinds, fit, savings), :mod:`controller.report.owners`
(claims to workloads, what each claim holds) and :mod:`controller.report.advice` (text, JSON).
"""
