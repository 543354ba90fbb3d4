"""``tranche report``: per-claim and per-tenant GPU usage as a showback report.

Public: :mod:`controller.report.cli` (the command). Inside: :mod:`controller.report.sources`
(plugin endpoints or Prometheus), :mod:`controller.report.data` (rows and totals),
:mod:`controller.report.render` (table, CSV, JSON) and :mod:`controller.report.chart` (SVG).
"""
