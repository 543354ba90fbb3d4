"""NVML access: the facade (:mod:`driver.nvml.facade`), its value types, and the simulation."""
