"""Real nodes for the dev cluster: a containerd and a kubelet v1.37.2 per node, with runc.

``render`` holds the pure configuration rendering (containerd, kubelet, CNI, kubeconfig),
``images`` writes the OCI image archives imported without a registry, ``host`` records
and undoes what a node does to the machine, and ``node`` starts and stops one node.
"""
