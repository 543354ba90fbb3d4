# Shared by hack/build-k8s.sh and hack/build-helm.sh (sourced, not run).
#
# use_cache_or_lock LABEL CACHE_ROOT BIN_DIR
#   The caller defines complete(), true when BIN_DIR holds a finished build.
#   Prints BIN_DIR and exits 0 when it does; otherwise takes an exclusive flock on
#   CACHE_ROOT/.build.lock (a concurrent builder is waited for, and its result
#   used), checks that Go is there, creates BIN_DIR and returns: the caller builds.
use_cache_or_lock() {
  local label=$1 root=$2 bin=$3
  if complete; then
    echo "$label: cached in $bin" >&2
    echo "$bin"
    exit 0
  fi
  mkdir -p "$root"
  exec 9>"$root/.build.lock"
  if ! flock -n 9; then
    echo "$label: another build holds $root/.build.lock; waiting for it to finish" >&2
    flock 9
  fi
  if complete; then
    echo "$label: built by a concurrent caller, cached in $bin" >&2
    echo "$bin"
    exit 0
  fi
  command -v go >/dev/null || {
    echo "$label: step 'find go': 'go' is not on PATH; install Go >= 1.26" >&2
    exit 1
  }
  mkdir -p "$bin"
}
