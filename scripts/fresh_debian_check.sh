#!/usr/bin/env bash
# Runs the README's two commands on a fresh Debian 12: a minimal bookworm
# made by debootstrap, a clean clone of HEAD inside it, and (as on every
# machine of this project) the host's /usr/local/cuda. Anything the build or
# the tests need that scripts/setup.sh does not install fails here, where it
# passes on a machine that has it by hand. As root; takes ~15 minutes
# (everything built from scratch, no ccache).
# Usage: bash scripts/fresh_debian_check.sh [DIR]   (default /tmp/kvtier-fresh;
# it is emptied first). The logs: DIR/test.log and DIR/demo.log.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/tmp/kvtier-fresh}
root=$dir/root

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh_debian_check: needs root (debootstrap, chroot, mounts)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { apt-get update && apt-get install -y --no-install-recommends debootstrap; }

unmount_all() {
  for m in usr/local/cuda dev sys proc; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -R "$root/$m"
  done
  return 0
}
trap unmount_all EXIT
[ -d "$root" ] && unmount_all
rm -rf "$dir"
mkdir -p "$dir"

echo "fresh_debian_check: debootstrap bookworm into $root"
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$dir/debootstrap.log"
# This machine's package sources (its mirror), and name resolution.
if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
  rm -f "$root/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$root/etc/"
# debootstrap writes no /etc/hosts; an installed Debian has localhost in it.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
# And its certificate authorities and npm settings, where it reaches the
# registries through a proxy of its own (installed into the root's trust
# store when setup installs ca-certificates).
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
[ -f /etc/npmrc ] && cp /etc/npmrc "$root/etc/"
git clone -q "$repo" "$root/repo"
if [ -e /usr/local/cuda ]; then
  mkdir -p "$root/usr/local/cuda"
  mount --bind "$(readlink -f /usr/local/cuda)" "$root/usr/local/cuda"
fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"

in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    /bin/bash -c "cd /repo && $1"
}
rc=0
echo "fresh_debian_check: the test command (log: $dir/test.log)"
in_root "bash .ci/run" >"$dir/test.log" 2>&1 || rc=$?
grep -E "tests passed|tests failed" "$dir/test.log" || tail -20 "$dir/test.log"
echo "fresh_debian_check: the main job (log: $dir/demo.log)"
in_root "bash scripts/demo.sh" >"$dir/demo.log" 2>&1 || rc=$?
grep -E "^turn|ids:|stopped cleanly" "$dir/demo.log" || tail -20 "$dir/demo.log"
echo "fresh_debian_check: $([ $rc = 0 ] && echo passed || echo FAILED)"
exit $rc
