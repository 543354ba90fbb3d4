"""Why a claim is pending, and what is free: ``tranche explain pod|claim|free``.

``cel`` (DRA selectors on cel-python with the Kubernetes extensions), ``model``
(the cluster's devices, counters and allocations, parsed from API objects),
``evaluate`` (pure: per node, the first reason each request cannot be met),
``free`` (pure: free GPUs, NVLink domains and MIG placements), ``read`` (the API
reads), ``render`` (text) and ``cli`` (the command).
"""
