"""Tranche's cluster process and cluster-facing commands (webhooks, taints, reports)."""
