"""The cluster's devices from the API server: listing and admin taints.

Public: :mod:`controller.devices.cluster` (``tranche cluster-devices``),
:mod:`controller.devices.taint` (``tranche taint`` / ``untaint``: DeviceTaintRules) and
:mod:`controller.devices.lookup` (finding a device by name, UUID or node).
"""
