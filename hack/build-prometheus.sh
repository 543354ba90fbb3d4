#!/usr/bin/env bash
# Build the prometheus server and promtool from the pinned Go module under
# hack/prombin/ (github.com/prometheus/prometheus v0.316.0 = Prometheus 3.16.0).
# Same cache root and locking as hack/build-k8s.sh: the binaries land in
# <cache root>/prometheus-<version>-<key>/bin, keyed by go.sum and the build
# recipe (version, tags, flags), and concurrent callers are serialised with an
# exclusive flock on <cache root>/.build.lock.
#
# Why not Debian's package: bookworm ships prometheus 2.42 (2023). Users run 3.x,
# whose range selectors are left-open and whose rate()/increase() extrapolation
# and counter-reset handling are what the report's PromQL meets in production;
# the tests should meet the same. See docs/metrics.md, "The Prometheus used in tests".
#
# Build tags: remove_all_sd drops the cloud service discoveries (AWS, Azure,
# GCE, ...: most of the cold build time); the tests only use static_configs,
# and enable_kubernetes_sd keeps Kubernetes discovery (promtool links it anyway).
# The web UI is not embedded (no builtinassets: it needs a node build); the
# HTTP API, which is all tests and `tranche report` use, is complete.
#
# Progress goes to stderr; the binary directory is the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PROM_VERSION=3.16.0
PROM_MODULE_VERSION=v0.316.0
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
tags="netgo,remove_all_sd,enable_kubernetes_sd"
ldf="-s -w -X github.com/prometheus/common/version.Version=$PROM_VERSION"
ldf="$ldf -X github.com/prometheus/common/version.Revision=module-$PROM_MODULE_VERSION"
ldf="$ldf -X github.com/prometheus/common/version.Branch=tranche-hack-prombin"
recipe="prometheus=$PROM_VERSION module=$PROM_MODULE_VERSION CGO_ENABLED=0 -trimpath tags='$tags' ldflags='$ldf'"
key=$( { cat "$here/prombin/go.sum"; echo "$recipe"; } | sha256sum | cut -c1-12)
bin="$cache_root/prometheus-$PROM_VERSION-$key/bin"
stamp="$bin/.stamp"

complete() { [ -f "$stamp" ] && [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; }

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
use_cache_or_lock "prometheus" "$cache_root" "$bin"
begin_build build-prometheus "$bin"

# No `go mod download`: go.sum lists every discovery's dependencies (go mod
# tidy ignores build tags); go build fetches only what the tagged build links.
step "prometheus promtool $PROM_VERSION" "$here/prombin" -- \
  go build -trimpath -tags "$tags" -ldflags "$ldf" -o "$bin/" \
    github.com/prometheus/prometheus/cmd/prometheus \
    github.com/prometheus/prometheus/cmd/promtool

for b in prometheus promtool; do
  [ -x "$bin/$b" ] || { echo "build-prometheus: step 'check outputs': $bin/$b missing after build" >&2; exit 1; }
done
"$bin/prometheus" --version 2>&1 | grep -q "version $PROM_VERSION" || {
  echo "build-prometheus: step 'check version': $bin/prometheus --version does not say $PROM_VERSION" >&2
  "$bin/prometheus" --version >&2 || true
  exit 1
}
echo "prometheus=$PROM_VERSION built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start ))" >"$stamp"
echo "build-prometheus: prometheus and promtool built in $(( $(date +%s) - start ))s into $bin" >&2
echo "$bin"
