"""``tranche trust check``: audit a cluster's claims against the trust levels.

Public: :mod:`controller.trust.cli` (the command) over :mod:`controller.trust.audit` (pure).
"""
