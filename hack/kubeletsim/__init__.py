"""A kubelet stand-in that speaks the kubelet's DRA gRPC protocols (tests and demo only)."""

from hack.kubeletsim.client import STYLES, ClaimRequest, KubeletStyle, Registration
from hack.kubeletsim.simulator import CallRecord, HealthUpdate, KubeletSimulator

__all__ = [
    "STYLES",
    "CallRecord",
    "ClaimRequest",
    "HealthUpdate",
    "KubeletSimulator",
    "KubeletStyle",
    "Registration",
]
