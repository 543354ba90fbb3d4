"""The node process: kubelet gRPC servers, ResourceSlice publisher, the kubelet-plugin command."""
