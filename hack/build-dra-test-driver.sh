#!/usr/bin/env bash
# Build upstream's DRA test driver (k8s.io/kubernetes v1.37.2, test/e2e/dra/test-driver: a
# kubelet plugin on the kubeletplugin helper of k8s.io/dynamic-resource-allocation), the Go
# driver the benchmarks measure side by side with Tranche (hack/bench/go_driver.py). Built from
# the module hack/dratestdriver/ through the Go module proxy, like the control plane. Same cache
# root and locking as hack/build-k8s.sh: the binary lands in
# <cache root>/dra-test-driver-<key>/bin, keyed by the module and the build recipe (the two
# most recent builds are kept), and concurrent callers are serialised with an exclusive flock
# on <cache root>/.build.lock.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
mod="$here/dratestdriver"
recipe="dra-test-driver k8s=v1.37.2 CGO_ENABLED=0 -trimpath ldflags='-s -w' go=$(go env GOVERSION 2>/dev/null || echo none)"
key=$( { cat "$mod/go.mod" "$mod/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/dra-test-driver-$key/bin"
stamp="$bin/.stamp"

complete() { [ -f "$stamp" ] && [ -x "$bin/dra-test-driver" ]; }

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "dra-test-driver" "$cache_root" "$bin"
begin_build build-dra-test-driver "$bin"

step "download modules" "$mod" -- go mod download
step "dra-test-driver" "$mod" -- \
  go build -trimpath -ldflags "-s -w" -o "$bin/dra-test-driver" \
    k8s.io/kubernetes/test/e2e/dra/test-driver

[ -x "$bin/dra-test-driver" ] || { echo "build-dra-test-driver: step 'check outputs': $bin/dra-test-driver missing after build" >&2; exit 1; }
echo "dra-test-driver built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-dra-test-driver: built in $(( $(date +%s) - start ))s into $bin" >&2
prune_cache "$cache_root" "dra-test-driver-" 2 bin/.stamp  # this build and the one before it
echo "$bin"
