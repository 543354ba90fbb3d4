#!/usr/bin/env bash
# Build the helm command from the pinned Go module under hack/helmbin/.
# Same cache root and locking as hack/build-k8s.sh: the binary lands in
# <cache root>/helm-<version>-<key>/bin, keyed by go.sum and the build recipe,
# and concurrent callers are serialised with an exclusive flock on
# <cache root>/.build.lock.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
HELM_VERSION=v4.3.2
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
ldf="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
recipe="helm=$HELM_VERSION CGO_ENABLED=0 -trimpath ldflags='$ldf'"
key=$( { cat "$here/helmbin/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/helm-$HELM_VERSION-$key/bin"
stamp="$bin/.stamp"

complete() { [ -f "$stamp" ] && [ -x "$bin/helm" ]; }

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "helm" "$cache_root" "$bin"
log="$bin/../build.log"
: >"$log"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
start=$(date +%s)
echo "build-helm: building helm $HELM_VERSION (a cold build takes a few minutes)" >&2
if ! (cd "$here/helmbin" && go mod download && \
      go build -trimpath -ldflags "$ldf" -o "$bin/helm" helm.sh/helm/v4/cmd/helm) >>"$log" 2>&1; then
  echo "build-helm: step 'go build helm.sh/helm/v4/cmd/helm' failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
[ -x "$bin/helm" ] || { echo "build-helm: step 'check outputs': $bin/helm missing after build" >&2; exit 1; }
echo "helm=$HELM_VERSION built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-helm: helm built in $(( $(date +%s) - start ))s into $bin" >&2
echo "$bin"
