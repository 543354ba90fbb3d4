#!/bin/sh
# Run a command inside an unpacked image's root filesystem, as a host process: the image's own
# interpreter, libraries and environment, the host's network, /tmp, /dev, /proc and /sys.
#
#   hack/run-in-rootfs.sh ROOTFS [NAME=VALUE ...] -- COMMAND [ARG ...]
#
# The environment is exactly the NAME=VALUE pairs (the image's Env); nothing of the caller's
# passes. The bind mounts live in a private mount namespace that ends with the command, and
# every step execs, so the command keeps the pid this script started with: a caller can
# signal it and read its /proc. Needs root (unshare, mount, chroot). Used by the benchmarks
# (hack/image_rootfs.py).
set -eu
usage="usage: $0 ROOTFS [NAME=VALUE ...] -- COMMAND [ARG ...]"
found=0
for arg in "$@"; do [ "$arg" = -- ] && found=1; done
[ "$found" = 1 ] && [ "$#" -ge 3 ] || { echo "$usage" >&2; exit 2; }
if [ "${TRANCHE_IN_ROOTFS_NS:-}" != 1 ]; then
  TRANCHE_IN_ROOTFS_NS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
root=$1; shift
for dir in tmp dev proc sys; do
  [ -d "$root/$dir" ] || { echo "$0: $root/$dir: no such directory in the image" >&2; exit 1; }
done
chroot_bin=$(command -v chroot)
# "NAME=VALUE ... -- COMMAND ARG ..." becomes "NAME=VALUE ... chroot ROOTFS COMMAND ARG ...".
count=$#; i=0; found=0  # checked above: there is a "--"
while [ "$i" -lt "$count" ]; do
  arg=$1; shift; i=$((i + 1))
  if [ "$found" = 0 ] && [ "$arg" = -- ]; then
    set -- "$@" "$chroot_bin" "$root"; found=1
  else
    set -- "$@" "$arg"
  fi
done
mount --rbind /tmp "$root/tmp"
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
exec env -i "$@"
