"""A local Kubernetes v1.37 control plane for development and tests; real nodes (kubelet +
containerd) on demand, see ``hack.devcluster.realnode``."""
