#!/usr/bin/env bash
# Build the benchmarks' kubelet client (hack/kubeletclient/: grpc-go and the stubs of the
# upstream k8s.io/kubelet module, as the kubelet calls a DRA plugin). Same cache root and
# locking as hack/build-k8s.sh: the binary lands in <cache root>/kubeletclient-<key>/bin,
# keyed by the module's sources and the build recipe (the two most recent builds are kept),
# and concurrent callers are serialised with an exclusive flock on <cache root>/.build.lock.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
recipe="kubeletclient CGO_ENABLED=0 -trimpath ldflags='-s -w' go=$(go env GOVERSION 2>/dev/null || echo none)"
key=$( { cat "$here/kubeletclient/go.mod" "$here/kubeletclient/go.sum" "$here/kubeletclient/main.go"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/kubeletclient-$key/bin"
stamp="$bin/.stamp"

complete() { [ -f "$stamp" ] && [ -x "$bin/kubeletclient" ]; }

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "kubeletclient" "$cache_root" "$bin"
begin_build build-kubeletclient "$bin"

step "kubeletclient" "$here/kubeletclient" -- \
  go build -trimpath -ldflags "-s -w" -o "$bin/kubeletclient" .

[ -x "$bin/kubeletclient" ] || { echo "build-kubeletclient: step 'check outputs': $bin/kubeletclient missing after build" >&2; exit 1; }
echo "kubeletclient built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-kubeletclient: built in $(( $(date +%s) - start ))s into $bin" >&2
prune_cache "$cache_root" "kubeletclient-" 2 bin/.stamp  # this build and the one before it
echo "$bin"
