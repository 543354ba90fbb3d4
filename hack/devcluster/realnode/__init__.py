"""Real nodes for the dev cluster: a containerd and a kubelet per node, with runc; the kubelet
is of the cluster's Kubernetes version (1.34 - 1.37).

``render`` holds the pure configuration rendering (containerd, kubelet, CNI, kubeconfig),
``kubelet_version`` which kubelet release a node runs and the feature gates it gets,
``images`` writes the OCI image archives imported without a registry, ``host`` records
and undoes what a node does to the machine, and ``node`` starts and stops one node.
"""
