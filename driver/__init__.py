"""Tranche core: GPU inventory, device model, sharing plans, checkpoint and CDI.

This package is pure domain logic. It talks to GPUs only through
:mod:`driver.nvml` and never imports gRPC, the kubelet plugin or the
controller (enforced by import-linter contracts in ``pyproject.toml``).
"""
