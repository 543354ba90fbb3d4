"""Why a claim is pending, and what is free: ``tranche explain pod|claim|free``.

``cel`` (DRA selectors on cel-python with the Kubernetes extensions), ``model`` (the
cluster's devices, counters and allocations, parsed from API objects), ``evaluate``
(pure: per node, the first reason each request cannot be met; a pod's claims together)
over ``funnel`` (one request's checks in order), ``search`` (all requests placed
together), ``nodes`` (the pod's nodeSelector and affinity) and ``verdict`` (the types),
``recommend`` (pure: single changes that would fit now), ``free`` (pure: free GPUs,
NVLink domains and MIG placements), ``read`` (the API reads), ``render`` (text) and
``cli`` (the command). docs/pending.md is the user's guide.
"""
