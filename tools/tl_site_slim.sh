#!/usr/bin/env bash
# Slims the TileLang site that ../shared/device/pack-tilelang.sh packs (.device/tl_site.tar.xz,
# about 39 MB) so that a device call can carry it: the device tool refuses a call whose
# working tree (tracked files, plus the paths named in carry) passes 64 MiB, and the tracked
# files alone were 28.9 MB at session 51, when the unslimmed site first pushed a call over.
#   bash tools/tl_site_slim.sh [TAR]      (default .device/tl_site.tar.xz; rewritten in place)
# Removes what no kernel build or launch reads: TVM's C++ sources
# (tilelang/3rdparty/tvm/src; the libraries are prebuilt) and CUTLASS's tools
# (tilelang/3rdparty/cutlass/tools; kernels include cutlass/include only), then recompresses
# with xz -9e (about 2 minutes): 38.9 MB -> 35.6 MB at session 51. Session 51 built
# TileLang's D = 128 kernel for sm_90a with both folders moved away, and ran the device calls
# of that session on the slimmed site.
set -euo pipefail
tar_in=${1:-.device/tl_site.tar.xz}
if [ ! -f "$tar_in" ]; then
  echo "tl_site_slim: no $tar_in (../shared/device/pack-tilelang.sh makes it)" >&2
  exit 1
fi
tmp=$(mktemp -d)
# the new tar is written beside the old one, so the last step is a rename on one file system:
# an interrupted or failed run leaves the old tar whole (an absolute path: the tar is written
# from inside $tmp/site, where a relative one would not resolve)
out=$(mktemp "$(cd "$(dirname "$tar_in")" && pwd)/.tl_site_slim.XXXXXX")
trap 'rm -rf "$tmp"; rm -f "$out"' EXIT
mkdir "$tmp/site"
tar xJf "$tar_in" -C "$tmp/site"
[ -d "$tmp/site/tilelang" ] || { echo "tl_site_slim: $tar_in holds no tilelang/" >&2; exit 1; }
rm -rf "$tmp/site/tilelang/3rdparty/tvm/src" "$tmp/site/tilelang/3rdparty/cutlass/tools"
(cd "$tmp/site" && tar cf - . | xz -T0 -9e > "$out")
xz -t "$out"
before=$(stat -c %s "$tar_in")
mv -f "$out" "$tar_in"
echo "tl_site_slim: $tar_in $before -> $(stat -c %s "$tar_in") bytes"
