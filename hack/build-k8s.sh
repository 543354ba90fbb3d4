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
minor=${TRANCHE_K8S_VERSION:-1.37}
while [ $# -gt 0 ]; do
  case $1 in
    --version) minor=${2:?--version needs a value such as 1.35}; shift 2 ;;
    --version=*) minor=${1#--version=}; shift ;;
    *) echo "build-k8s: unknown argument '$1' (usage: build-k8s.sh [--version 1.34|1.35|1.36|1.37])" >&2; exit 2 ;;
  esac
done
minor=${minor#v}
minor=$(echo "$minor" | cut -d. -f1,2)
case $minor in
  1.37) K8S_VERSION=v1.37.2 ETCD_VERSION=v3.7.3 kmod="$here/k8sbin" emod="$here/etcdbin" ;;
  1.36) K8S_VERSION=v1.36.3 ETCD_VERSION=v3.6.8 kmod="$here/k8sbin/v1.36" emod="$here/etcdbin/v1.36" ;;
  1.35) K8S_VERSION=v1.35.4 ETCD_VERSION=v3.6.6 kmod="$here/k8sbin/v1.35" emod="$here/etcdbin/v1.35" ;;
  1.34) K8S_VERSION=v1.34.4 ETCD_VERSION=v3.6.5 kmod="$here/k8sbin/v1.34" emod="$here/etcdbin/v1.34" ;;
  *) echo "build-k8s: step 'pick version': Kubernetes '$minor' is not in the matrix (1.34, 1.35, 1.36, 1.37)" >&2; exit 2 ;;
esac
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${minor#1.} -X $p.gitTreeState=clean"
done
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
