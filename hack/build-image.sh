#!/usr/bin/env bash
# Build the Tranche image from deploy/Containerfile without Docker or a registry.
#
# * Builder: Debian's buildah (daemonless, STORAGE_DRIVER=vfs), installed with apt-get when
#   missing (root, or sudo).
# * Base: the Containerfile's default (python:3.12-slim) when a registry answers; otherwise
#   one made here from Debian packages with mmdebstrap and the machine's own apt sources
#   (Debian's python3, stripped of docs, man pages, locales and apt lists), passed as
#   --build-arg BASE. TRANCHE_IMAGE_BASE=local|registry forces either.
# * Output: the image localhost/tranche:<version> in buildah's storage and an OCI archive,
#   cached in <cache root>/image-<version>-<key>/tranche-image.tar, where <key> hashes the
#   Containerfile, pyproject.toml, README.md, LICENSE, the source tree (tracked and untracked files of
#   driver/ proto/ kubelet_plugin/ controller/, as they are on disk) and this recipe. The archive
#   is copied to dist/tranche-image.tar; its path is the last line of stdout. The image the tag
#   named before a new build is removed from buildah's storage once the build is archived.
#
# Concurrent callers are serialised with an exclusive flock on <cache root>/.image.lock. A new
# build leaves the TRANCHE_IMAGE_CACHE_KEEP (3) most recently used images in the cache.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_root=${TRANCHE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tranche}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -n1)
tag=${TRANCHE_IMAGE_TAG:-$version}
image="localhost/tranche:$tag"
base_mode=${TRANCHE_IMAGE_BASE:-auto}
registry_base=docker.io/library/python:3.12-slim
local_base_name=localhost/tranche-base
suite=bookworm
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

say() { echo "build-image: $*" >&2; }
fail() { say "step '$1' failed${2:+: $2}"; exit 1; }

recipe="recipe=4 suite=$suite base_mode=$base_mode tag=$tag"
sources=$(cd "$repo" && git ls-files -co --exclude-standard -- driver proto kubelet_plugin controller \
  | while read -r f; do [ -f "$f" ] && echo "$f"; done | LC_ALL=C sort)
key=$( { echo "$recipe"; cat "$here/build-image.sh" "$repo/deploy/Containerfile" \
          "$repo/pyproject.toml" "$repo/README.md" "$repo/LICENSE";
        (cd "$repo" && echo "$sources" | xargs -d '\n' sha256sum); } | sha256sum | cut -c1-12)
out="$cache_root/image-$tag-$key"
archive="$out/tranche-image.tar"
dist="$repo/dist/tranche-image.tar"

# The archive into dist/ under a temporary name of this run's own, then renamed: a caller never
# reads half a file or another run's, and a failed copy (a full disk) fails the script instead
# of printing the path of whatever dist/ held before.
publish() {
  local tmp=""
  if ! { mkdir -p "$repo/dist" && tmp=$(mktemp "$dist.XXXXXX") && cp "$archive" "$tmp" &&
         chmod 644 "$tmp" && mv -f "$tmp" "$dist"; }; then
    [ -z "$tmp" ] || rm -f "$tmp"
    fail "publish" "cannot copy $archive to $dist"
  fi
  echo "$dist"
}

# shellcheck source=hack/cache-lib.sh
. "$here/cache-lib.sh"
keep=${TRANCHE_IMAGE_CACHE_KEEP:-3}  # images kept in the cache, the most recently used

complete() { [ -f "$out/.stamp" ] && [ -f "$archive" ]; }
if complete; then
  say "cached in $out ($(cat "$out/.stamp"))"
  touch "$out/.stamp"  # recently used: kept by the next build's pruning
  publish
  exit 0
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.image.lock"
if ! flock -n 9; then
  say "another build holds $cache_root/.image.lock; waiting for it"
  flock 9
fi
if complete; then publish; exit 0; fi

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
need_pkg() {  # need_pkg COMMAND PACKAGE
  command -v "$1" >/dev/null && return 0
  say "installing Debian package $2 (for $1)"
  $sudo apt-get update -qq >&2 || fail "apt-get update"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$2" >&2 \
    || fail "apt-get install $2"
}
need_pkg buildah buildah
b() { $sudo env STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot buildah "$@"; }

start=$(date +%s)
mkdir -p "$out"
log="$out/build.log"
: >"$log"

registry_reachable() {
  timeout 60 env STORAGE_DRIVER=vfs buildah pull -q "$registry_base" >>"$log" 2>&1
}

make_local_base() {
  if b inspect --type image "$local_base" >/dev/null 2>&1; then
    say "local base $local_base already in buildah's storage"
    return
  fi
  need_pkg mmdebstrap mmdebstrap
  local apt_sources=/etc/apt/sources.list.d/debian.sources
  [ -f "$apt_sources" ] || apt_sources=/etc/apt/sources.list
  local rootfs="$out/base-rootfs.tar"
  say "making base $local_base from Debian $suite packages (mmdebstrap, sources $apt_sources)"
  # python3 (full standard library), python3-venv (ensurepip, for the build stage), the CA
  # certificates, and unshare and mount (util-linux, mount: each MPS daemon's /dev/shm shared
  # with its clients, driver/sharing/mps_shm.py); no docs, man pages, locales or apt lists.
  $sudo mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,mount,util-linux \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    --customize-hook='find "$1"/usr/lib/python3* -name __pycache__ -prune -exec rm -rf {} +' \
    --customize-hook='rm -rf "$1"/usr/share/perl "$1"/usr/lib/*-linux-gnu/perl "$1"/usr/lib/*-linux-gnu/libperl.so* "$1"/usr/bin/perl5* "$1"/usr/lib/*-linux-gnu/gconv' \
    "$suite" "$rootfs" "$apt_sources" >>"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "mmdebstrap"; }
  local ctr
  ctr=$(b from scratch) || fail "buildah from scratch"
  b add "$ctr" "$rootfs" / >>"$log" 2>&1 || fail "buildah add rootfs"
  b config --env PATH=/usr/local/bin:/usr/bin:/bin --cmd /bin/sh "$ctr" >>"$log" 2>&1
  b commit --rm "$ctr" "$local_base" >>"$log" 2>&1 || fail "buildah commit base"
  rm -f "$rootfs"
}

# The local base's tag follows its recipe, so a changed recipe makes a new one.
local_base="$local_base_name:$suite-python3-$(declare -f make_local_base | sha256sum | cut -c1-8)"
base=$registry_base
case "$base_mode" in
  registry) registry_reachable || fail "pull $registry_base" ;;
  local) base=$local_base; make_local_base ;;
  *)
    if registry_reachable; then
      say "base $registry_base from its registry"
    else
      say "no registry reachable for $registry_base"
      base=$local_base
      make_local_base
    fi ;;
esac

# pip inside the build stage trusts what the host's pip trusts (a proxy's CA, for one).
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
ca_args=()
[ -f "$ca" ] && ca_args=(-v "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)

say "building $image from deploy/Containerfile on $base"
# The image the tag names before this build: untagged by it, removed after it, or every change
# of the sources would leave one more image (about 130 MB of layers) in buildah's storage.
previous=$(b images --quiet --no-trunc "$image" 2>/dev/null | head -n1 || true)
rm -f "$out/image-id"
(cd "$repo" && b bud --network=host --layers=false --build-arg "BASE=$base" "${ca_args[@]}" \
  --iidfile "$out/image-id" -f deploy/Containerfile -t "$image" .) >>"$log" 2>&1 \
  || { tail -n 30 "$log" >&2; fail "buildah bud"; }
id=$(cat "$out/image-id") && [ -n "$id" ] || fail "buildah bud" "no image id in $out/image-id"
rm -f "$archive.tmp"
# By id, not by tag: the archive holds this build's image whatever else tags it meanwhile.
b push "$id" "oci-archive:$archive.tmp:$image" >>"$log" 2>&1 || fail "buildah push oci-archive"
mv "$archive.tmp" "$archive"
if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
  b rmi "$previous" >>"$log" 2>&1 || say "kept the previous image $previous (still in use or tagged elsewhere)"
fi
size=$(b images --noheading --format '{{.Size}}' "$image" 2>/dev/null | head -n1 | tr -d ' ')
echo "image=$image id=$id base=$base built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - start )) archive_bytes=$(stat -c %s "$archive") image_bytes=$size" >"$out/.stamp"
say "built $image in $(( $(date +%s) - start ))s: $(cat "$out/.stamp")"
prune_cache "$cache_root" "image-" "$keep"
publish
