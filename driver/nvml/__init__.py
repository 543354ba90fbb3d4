"""NVML access: the facade (:mod:`driver.nvml.facade`, built from the ``*calls`` modules beside
it), its value types, and the simulation."""
