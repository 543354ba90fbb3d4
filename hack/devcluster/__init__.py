"""A local Kubernetes v1.37 control plane for development and tests (no kubelet)."""
