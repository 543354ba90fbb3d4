#!/usr/bin/env bash
# Build the control-plane binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl) from the pinned Go modules under hack/.
# Binaries land in a cache directory outside the repository, keyed by the
# go.sum files and the build recipe (versions, flags), so a warm run builds
# nothing and editing this script's comments or locking does not force a rebuild.
#
# Concurrent callers are serialised with an exclusive flock on
# <cache root>/.build.lock: the second waits, then finds the finished cache.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

# Version matrix: --version 1.35 (or TRANCHE_K8S_VERSION=1.35) builds that release from its own
# build modules under hack/k8sbin/v1.35 and hack/etcdbin/v1.35 (hack/k8sbin/new-version.sh makes
# them). The default, 1.37, uses hack/k8sbin and hack/etcdbin themselves.
# shellcheck source=hack/k8s-versions.sh
. "$here/k8s-versions.sh"
pick_k8s_version build-k8s "$@"
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

ldf=$(k8s_ldflags)
recipe="k8s=$K8S_VERSION etcd=$ETCD_VERSION CGO_ENABLED=0 -trimpath etcd-ldflags='-s -w' k8s-ldflags='$ldf'"
key=$( { cat "$kmod/go.sum" "$emod/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$key/bin"
stamp="$bin/.stamp"

complete() {
  [ -f "$stamp" ] || return 1
  for b in "${want[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "control plane binaries" "$cache_root" "$bin"
begin_build build-k8s "$bin"

step "download modules" "$kmod" -- go mod download
step "download etcd modules" "$emod" -- go mod download
step "etcd $ETCD_VERSION" "$emod" -- \
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
step "kube-apiserver kube-controller-manager kube-scheduler kubectl $K8S_VERSION" "$kmod" -- \
  go build -trimpath -ldflags "$ldf" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl

for b in "${want[@]}"; do
  [ -x "$bin/$b" ] || { echo "build-k8s: step 'check outputs': $bin/$b missing after build" >&2; exit 1; }
done
echo "k8s=$K8S_VERSION etcd=$ETCD_VERSION built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-k8s: all binaries built in $(( $(date +%s) - start ))s into $bin" >&2
echo "$bin"
