#!/usr/bin/env bash
# Build and cache what a real node of the dev cluster needs (hack/dev-cluster add-node --kubelet):
#   - kubelet v1.37.2 from the same pinned Go module as the control plane (hack/k8sbin:
#     same replace lines, same version ldflags, CGO_ENABLED=0);
#   - containerd v2.4.2, containerd-shim-runc-v2 and ctr from the Go module
#     github.com/containerd/containerd/v2 (CGO_ENABLED=0, tags no_btrfs no_devmapper no_zfs);
#   - runc, the CNI plugins and a static busybox from Debian packages (runc,
#     containernetworking-plugins, busybox-static), installed with apt-get when missing.
#
# The Go binaries land in a cache directory outside the repository, keyed by
# hack/k8sbin/go.sum and the build recipe (versions, tags, flags), like
# hack/build-k8s.sh; the same flock on <cache root>/.build.lock serialises builders.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
DEBIAN_PACKAGES=(runc containernetworking-plugins busybox-static)
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
want=(kubelet containerd containerd-shim-runc-v2 ctr)

# --- Debian packages (machine-wide; not part of the cache) -------------------
missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-node: [apt] installing ${missing[*]}" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "build-node: step 'apt-get install': not root; run: apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >&2; then
    echo "build-node: step 'apt-get install ${missing[*]}' failed (output above)" >&2
    exit 1
  fi
  echo "build-node: [apt] installed ${missing[*]}" >&2
else
  echo "build-node: [apt] ${DEBIAN_PACKAGES[*]} already installed" >&2
fi
for f in /usr/sbin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback /bin/busybox; do
  [ -x "$f" ] || { echo "build-node: step 'check packages': $f missing after install" >&2; exit 1; }
done

# --- Go binaries (cached) ----------------------------------------------------
k8s_ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldf="$k8s_ldf -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=37 -X $p.gitTreeState=clean"
done
cd_pkg=github.com/containerd/containerd/v2
cd_ldf="-s -w -X $cd_pkg/version.Version=$CONTAINERD_VERSION -X $cd_pkg/version.Package=$cd_pkg"
cd_tags="no_btrfs no_devmapper no_zfs"
recipe="k8s=$K8S_VERSION containerd=$CONTAINERD_VERSION CGO_ENABLED=0 -trimpath k8s-ldflags='$k8s_ldf' containerd-ldflags='$cd_ldf' containerd-tags='$cd_tags'"
key=$( { cat "$here/k8sbin/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/node-k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-$key/bin"
stamp="$bin/.stamp"

complete() {
  [ -f "$stamp" ] || return 1
  for b in "${want[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "node binaries" "$cache_root" "$bin"
begin_build build-node "$bin"

step "download modules" "$here/k8sbin" -- go mod download
step "kubelet $K8S_VERSION" "$here/k8sbin" -- \
  go build -trimpath -ldflags "$k8s_ldf" -o "$bin/kubelet" k8s.io/kubernetes/cmd/kubelet
# `go install pkg@version` builds outside any module, from containerd's own go.mod and go.sum.
step "containerd containerd-shim-runc-v2 ctr $CONTAINERD_VERSION" "$bin" -- \
  env GOBIN="$bin" GOFLAGS= go install -trimpath -tags "$cd_tags" -ldflags "$cd_ldf" \
    "$cd_pkg/cmd/containerd@$CONTAINERD_VERSION" \
    "$cd_pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$cd_pkg/cmd/ctr@$CONTAINERD_VERSION"

for b in "${want[@]}"; do
  [ -x "$bin/$b" ] || { echo "build-node: step 'check outputs': $bin/$b missing after build" >&2; exit 1; }
done
echo "k8s=$K8S_VERSION containerd=$CONTAINERD_VERSION built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-node: all node binaries built in $(( $(date +%s) - start ))s into $bin" >&2
echo "$bin"
