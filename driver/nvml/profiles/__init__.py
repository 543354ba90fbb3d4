"""Node profiles for the simulated NVML (JSON data; see docs/simulation.md)."""
