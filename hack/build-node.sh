#!/usr/bin/env bash
# Build and cache what a real node of the dev cluster needs (hack/dev-cluster add-node --kubelet):
#   - the kubelet of one release of the version matrix (--version 1.34|1.35|1.36|1.37, or
#     TRANCHE_K8S_VERSION; default 1.37, like hack/build-k8s.sh), from that release's pinned
#     build module (hack/k8sbin, hack/k8sbin/v1.34, ...: same replace lines, same version
#     ldflags as its control plane, CGO_ENABLED=0);
#   - containerd v2.4.2, containerd-shim-runc-v2 and ctr from the Go module
#     github.com/containerd/containerd/v2 (CGO_ENABLED=0, tags no_btrfs no_devmapper no_zfs),
#     the same for every release: built once into a cache directory of its own and linked
#     into each release's node directory, so one more kubelet costs one kubelet build;
#   - runc, the CNI plugins and a static busybox from Debian packages (runc,
#     containernetworking-plugins, busybox-static), installed with apt-get when missing.
#
# The Go binaries land in a cache directory outside the repository, keyed by the release's
# go.sum and the build recipe (versions, tags, flags), like hack/build-k8s.sh; the same flock
# on <cache root>/.build.lock serialises builders.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/k8s-versions.sh
. "$here/k8s-versions.sh"
pick_k8s_version build-node "$@"
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
k8s_ldf=$(k8s_ldflags)
cd_pkg=github.com/containerd/containerd/v2
cd_ldf="-s -w -X $cd_pkg/version.Version=$CONTAINERD_VERSION -X $cd_pkg/version.Package=$cd_pkg"
cd_tags="no_btrfs no_devmapper no_zfs"
cd_recipe="containerd=$CONTAINERD_VERSION CGO_ENABLED=0 -trimpath containerd-ldflags='$cd_ldf' containerd-tags='$cd_tags'"
cd_key=$(echo "$cd_recipe" | sha256sum | cut -c1-12)
cd_bin="$cache_root/containerd-$CONTAINERD_VERSION-$cd_key/bin"
cd_want=(containerd containerd-shim-runc-v2 ctr)
recipe="k8s=$K8S_VERSION -trimpath k8s-ldflags='$k8s_ldf' $cd_recipe"
key=$( { cat "$kmod/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/node-k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-$key/bin"
stamp="$bin/.stamp"

complete() {
  [ -f "$stamp" ] || return 1
  for b in "${want[@]}"; do [ -x "$bin/$b" ] || return 1; done
}
containerd_complete() {
  [ -f "$cd_bin/.stamp" ] || return 1
  for b in "${cd_want[@]}"; do [ -x "$cd_bin/$b" ] || return 1; done
}

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "node binaries" "$cache_root" "$bin"
begin_build build-node "$bin"

step "download modules" "$kmod" -- go mod download
step "kubelet $K8S_VERSION" "$kmod" -- \
  go build -trimpath -ldflags "$k8s_ldf" -o "$bin/kubelet" k8s.io/kubernetes/cmd/kubelet
if containerd_complete; then
  echo "build-node: [containerd $CONTAINERD_VERSION] cached in $cd_bin" >&2
else
  mkdir -p "$cd_bin"
  # `go install pkg@version` builds outside any module, from containerd's own go.mod and go.sum.
  step "containerd containerd-shim-runc-v2 ctr $CONTAINERD_VERSION" "$cd_bin" -- \
    env GOBIN="$cd_bin" GOFLAGS= go install -trimpath -tags "$cd_tags" -ldflags "$cd_ldf" \
      "$cd_pkg/cmd/containerd@$CONTAINERD_VERSION" \
      "$cd_pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
      "$cd_pkg/cmd/ctr@$CONTAINERD_VERSION"
  echo "containerd=$CONTAINERD_VERSION built=$(date -u +%FT%TZ)" >"$cd_bin/.stamp"
fi
for b in "${cd_want[@]}"; do
  ln -f "$cd_bin/$b" "$bin/$b" 2>/dev/null || cp -f "$cd_bin/$b" "$bin/$b"
done

for b in "${want[@]}"; do
  [ -x "$bin/$b" ] || { echo "build-node: step 'check outputs': $bin/$b missing after build" >&2; exit 1; }
done
echo "k8s=$K8S_VERSION containerd=$CONTAINERD_VERSION built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-node: all node binaries for Kubernetes $K8S_VERSION built in $(( $(date +%s) - start ))s into $bin" >&2
echo "$bin"
