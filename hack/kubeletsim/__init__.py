"""A kubelet stand-in that speaks the kubelet's DRA gRPC protocols (tests and demo only).

A real kubelet v1.37.2 now runs in the dev cluster (``hack/dev-cluster add-node NAME
--kubelet``), and the plugin's node behaviour is tested against it
(``tests/e2e/test_real_node_plugin.py``): registration through the plugin watcher, prepare
and unprepare of every sharing mode with the container's view, health in pod status,
kubelet restarts, a plugin killed mid-prepare, device-taint eviction. Where the simulator
and the real node cover the same behaviour, the real node's test is the one that counts.

The simulator stays for what a real kubelet cannot be made to do, or not on demand:

* older kubelets: the v1beta1 DRA and v1alpha1 health services and registration
  ``supported_versions`` of earlier releases (:data:`STYLES`); the real node is v1.37.2 only;
* protocol edges on demand: a prepare or unprepare call with any claim list at any moment,
  without a pod or a container runtime (a real kubelet calls only for pods it admits);
* exact call records and timing: which claims went in one ``NodePrepareResources``, the
  health stream's messages as sent (the real kubelet only shows their effect in pod status);
* nodes without root, namespaces or containerd (CI machines that cannot run containers, and
  the demo's fallback), and many nodes at once (a real node costs a kubelet and a containerd).
"""

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
