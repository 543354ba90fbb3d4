#!/usr/bin/env bash
# Create the build-only modules for one more Kubernetes release of the version matrix:
#   hack/k8sbin/new-version.sh 1.35.4 3.6.6
# writes hack/k8sbin/v1.35/{go.mod,go.sum} (k8s.io/kubernetes at that release, every staging
# module replaced by its v0.X.Y twin, read from the release's own go.mod) and
# hack/etcdbin/v1.35/{go.mod,go.sum} (the etcd server that release pins in
# build/dependencies.yaml). Run once per release; the results are committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
full=${1:?usage: new-version.sh K8S_VERSION(1.35.4) ETCD_VERSION(3.6.6)}
etcd=${2:?usage: new-version.sh K8S_VERSION ETCD_VERSION}
minor=${full%.*}
staging=0.${full#1.}
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
kdir="$here/v$minor"
edir="$here/../etcdbin/v$minor"
mkdir -p "$kdir" "$edir"
gomod=$(go mod download -json "k8s.io/kubernetes@v$full" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
(
  cd "$kdir"
  rm -f go.mod go.sum
  printf '// Build-only module: pins Kubernetes v%s control-plane commands (version matrix).\nmodule tranche.dev/hack/k8sbin/v%s\n\ngo 1.26.0\n' "$full" "$minor" >go.mod
  go mod edit -require="k8s.io/kubernetes@v$full"
  for m in $(sed -n 's#^\s*\(k8s.io/[a-z-]*\) => ./staging/.*#\1#p' "$gomod"); do
    go mod edit -replace="$m=$m@v$staging"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
    go mod edit -tool="k8s.io/kubernetes/cmd/$c"
  done
  go mod tidy
)
(
  cd "$edir"
  rm -f go.mod go.sum
  printf '// Build-only module: pins the etcd server v%s that Kubernetes v%s ships with.\nmodule tranche.dev/hack/etcdbin/v%s\n\ngo 1.26.0\n' "$etcd" "$full" "$minor" >go.mod
  go mod edit -require="go.etcd.io/etcd/server/v3@v$etcd" -tool=go.etcd.io/etcd/server/v3
  go mod tidy
)
echo "new-version: wrote $kdir and $edir" >&2
