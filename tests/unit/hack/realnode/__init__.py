"""Unit tests of the pure pieces of hack/devcluster/realnode (no root, no binaries)."""
