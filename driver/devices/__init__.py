"""The node's devices as the scheduler sees them (``docs/devices.md``).

Public: :mod:`driver.devices.inventory` (GPUs, MIG placements and devices from NVML facts:
``build_inventory``, ``Inventory``, ``AdvertiseConfig``), :mod:`driver.devices.slices`
(ResourceSlices with NVIDIA-compatible attributes and counter sets: ``build_slices``) and
:mod:`driver.devices.bridge` (the extended-resource bridge DeviceClasses).
"""
