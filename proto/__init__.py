"""The kubelet gRPC protos and the Python code generated from them (proto/gen)."""
