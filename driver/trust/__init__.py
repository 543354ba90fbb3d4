"""Tenant trust levels and sharing groups (``docs/trust.md``).

Public: :mod:`driver.trust.policy` (``TrustLevel``, ``Tenancy``, ``check_prepare``: which
tenants may share a GPU by which mechanism). Pure: no I/O. Prepare applies it through
:mod:`driver.prepare.trust_check`; the controller audits a cluster with it.
"""
