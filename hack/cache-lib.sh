# Shared by the hack/build-*.sh scripts (sourced, not run).
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

# begin_build NAME BIN_DIR
#   After use_cache_or_lock: BIN_DIR's stamp removed (a rebuild over an entry that lost a
#   binary must not leave the old stamp on half-written files if it is cut short), the build
#   log next to BIN_DIR (emptied), Go's settings for a reproducible static build, the start
#   time, and the heartbeat's clean-up on exit.
begin_build() {
  build_name=$1
  rm -f "$2/.stamp"
  log="$2/../build.log"
  : >"$log"
  export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
  start=$(date +%s)
  beat=
  trap '[ -z "$beat" ] || kill "$beat" 2>/dev/null || true' EXIT
}

# step NAME DIR -- COMMAND...
#   Runs COMMAND in DIR with its output in the build log, printing when it starts, a
#   heartbeat every minute (a cold build takes many minutes on 2 cores) and when it is done;
#   on failure names the step and the command, prints the log's last lines and exits 1.
step() {
  local name=$1 dir=$2; shift 3
  local t0; t0=$(date +%s)
  echo "$build_name: [$name] started (total elapsed $(( t0 - start ))s)" >&2
  # The heartbeat takes its sleep down with it, and the sleep holds no pipe: one left behind
  # would keep the caller's stderr pipe open for up to a minute after the build.
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 60 </dev/null >/dev/null 2>&1 & nap=$!
      wait "$nap"
      echo "$build_name: [$name] still building, $(( $(date +%s) - t0 ))s" >&2
    done
  ) &
  beat=$!
  if ! (cd "$dir" && "$@") >>"$log" 2>&1; then
    echo "$build_name: step '$name' failed: (cd $dir && $*)" >&2
    echo "$build_name: last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  kill "$beat" 2>/dev/null || true
  beat=
  echo "$build_name: [$name] done in $(( $(date +%s) - t0 ))s" >&2
}

# prune_cache ROOT PREFIX KEEP [STAMP]
#   Removes the directories ROOT/PREFIX* but the KEEP most recently used or built: a finished
#   entry has its stamp file (STAMP inside the entry, default .stamp; the image's is touched
#   by every cache hit, the Go tools' bin/.stamp is written once), and an entry without one
#   is a build that did not finish. Entries keyed by content (the image's, a Go tool's)
#   would otherwise pile up, one per change of the sources. The caller holds the lock that
#   guards the entries.
prune_cache() {
  local root=$1 prefix=$2 keep=$3 rel=${4:-.stamp} dir stamp
  for dir in "$root/$prefix"*/; do
    [ -d "$dir" ] && [ ! -f "$dir/$rel" ] && rm -rf "$dir"
  done
  { ls -1dt "$root/$prefix"*/"$rel" 2>/dev/null || true; } | tail -n +"$((keep + 1))" |
  while read -r stamp; do
    rm -rf "${stamp%/"$rel"}"
  done
  return 0
}
