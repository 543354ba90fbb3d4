"""The cluster's devices from the API server: listing and admin taints.

Public: :mod:`controller.devices.cluster` (``tranche cluster-devices``),
:mod:`controller.devices.taint` (``tranche taint`` / ``untaint``: DeviceTaintRules),
:mod:`controller.devices.rules` (the rules they write and how they are found again) and
:mod:`controller.devices.lookup` (finding a device by name, UUID or node).
"""
